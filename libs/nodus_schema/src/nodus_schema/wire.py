"""The base of every wire type: msgspec Structs, camelCase on the wire, defaults left out; and the CSV that
the exports (usage, invoices, a Sweep's results) are written in."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence

import msgspec


class Wire(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    """Base of every API and bus type.

    Fields are snake_case in Python and camelCase on the wire; fields whose camelCase form differs from
    the reference (``maxCostUSD``, ``totalGPUs``, ``sha256``) set ``name=`` explicitly. ``omit_defaults``
    keeps unset optional fields off the wire, as Kubernetes' ``omitempty`` does.
    """


API_GROUP = "nodus.dev"
API_VERSION = "nodus.dev/v1"
DOCS_BASE = "https://docs.nodus.dev"


def csv_text(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """RFC 4180: comma-separated, CRLF line ends, quoted only where a value needs it."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()
