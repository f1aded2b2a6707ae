"""`python -m nodus_cli`, the same as the `nodus` console script."""

from nodus_cli.cli import run

run()
