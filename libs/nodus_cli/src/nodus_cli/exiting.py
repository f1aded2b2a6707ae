"""Exit codes that scripts can trust: one table, used by every command and printed in ``nodus --help``."""

from __future__ import annotations

from typing import Final

OK: Final = 0
"""Done: the command did what was asked (for ``get -w`` of a Sweep: the Sweep Succeeded)."""
FAILED: Final = 1
"""The server refused the request (a Status), an object failed (a Sweep or Job ended Failed or
Cancelled under ``get -w`` / ``apply --wait``), or a local input was bad (a manifest, a CA file)."""
USAGE: Final = 2
"""The command line itself is wrong (argparse's usage errors)."""
BLOCKED: Final = 3
"""``nodus estimate``: the dry run says a create would be refused now (blocking reasons)."""
UNREACHABLE: Final = 4
"""No answer from the gateway: not running, wrong address, timeout, or a TLS certificate not trusted."""
INTERRUPTED: Final = 130
"""Ctrl-C (128 + SIGINT), except under ``get -w``, where Ctrl-C is the normal way out (0)."""

TABLE: Final = f"""\
exit codes:
  {OK:<3}  ok (get -w of one Sweep: it Succeeded; Ctrl-C ends any other get -w with 0)
  {FAILED:<3}  the server refused, or the object failed (Failed/Cancelled), or a bad file
  {USAGE:<3}  usage error
  {BLOCKED:<3}  blocked: nodus estimate found blocking reasons
  {UNREACHABLE:<3}  cannot reach the gateway (or its certificate is not trusted)
  {INTERRUPTED:<3}  interrupted (Ctrl-C)"""
