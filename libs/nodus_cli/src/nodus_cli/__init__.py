"""The nodus command line: apply, get, describe and delete Sweeps and Jobs over the nodus.dev/v1 API."""

from nodus_cli.cli import main

__all__ = ["main"]
