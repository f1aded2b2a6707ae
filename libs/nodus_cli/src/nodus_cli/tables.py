"""Tables people can read: aligned columns, ages, wall times, and money exactly as the API spells it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal

from nodus_schema import (
    TERMINAL_PHASES,
    Sweep,
    SweepCell,
    format_gpu,
    parse_time,
)
from nodus_schema.billing import Account, Invoice, UsageList
from nodus_schema.gpus import GPURequest, has_string_form
from nodus_schema.quantities import micros_to_usd, usd_to_micros
from nodus_schema.validating import count_cells

NONE = "-"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart, as ``kubectl get`` prints them."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = [headers, *rows]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def usd(amount: str | None) -> str:
    # The API's decimal string as it is: parsing it into a float could show 0.30000000000000004.
    return f"${amount}" if amount else NONE


def wall(seconds: int | None) -> str:
    if seconds is None:
        return NONE
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def age(timestamp: str | None, now: datetime | None = None) -> str:
    """``45s``, ``12m``, ``5h``, ``3d``: Kubernetes' short ages."""
    if not timestamp:
        return NONE
    try:
        then = parse_time(timestamp)
    except ValueError:
        return NONE
    seconds = max(0, int(((now or datetime.now(UTC)) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def size_text(size: int | None) -> str:
    """Bytes as people read them: ``512 B``, ``1.5 KiB``, ``12.0 MiB``, ``3.2 GiB``."""
    if size is None:
        return NONE
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def short_digest(digest: str | None) -> str:
    """``sha256:0123456789ab…``: enough of a digest to tell blobs apart in a table."""
    if not digest:
        return NONE
    return digest[:19] + "…" if len(digest) > 19 else digest


def short_commit(commit: str | None) -> str:
    return commit[:12] if commit else NONE


def gpu_text(gpu: GPURequest | str | None) -> str:
    if gpu is None:
        return NONE
    if isinstance(gpu, str):
        return gpu
    return format_gpu(gpu) if has_string_form(gpu) else ",".join(gpu.type) + f":{gpu.count or 1}"


def phase_text(phase: str | None, reason: str | None) -> str:
    text = phase or "Pending"
    return f"{text} ({reason})" if reason else text


# ---------------------------------------------------------------------------------------------------------
# Sweeps
# ---------------------------------------------------------------------------------------------------------


def cells_done(sweep: Sweep) -> tuple[int, int]:
    """(cells in a terminal phase, all cells); before the controller lists cells, the matrix's count."""
    cells = sweep.status.cells
    done = sum(1 for c in cells if c.phase in TERMINAL_PHASES)
    return done, len(cells) or count_cells(sweep.spec)


def spent(sweep: Sweep) -> str:
    cost = sweep.status.cost
    return usd(cost.total_usd if cost else None)


def sweep_header(sweep: Sweep) -> str:
    done, total = cells_done(sweep)
    status = sweep.status
    return (
        f"Sweep {sweep.metadata.name}  {phase_text(status.phase, status.reason)}  "
        f"cells {done}/{total} done  spent {spent(sweep)}"
    )


CELL_HEADERS = ("INDEX", "JOB", "GPU", "REGION", "PARAMS", "REP", "PHASE", "WALL", "UNITS/S", "COST")


def _cell_row(sweep: Sweep, cell: SweepCell) -> list[str]:
    params = ", ".join(f"{k}={v}" for k, v in cell.params.items()) or NONE
    return [
        str(cell.index),
        cell.object or f"{sweep.metadata.name}-{cell.index}",
        cell.gpu or gpu_text(_template_gpu(sweep)),
        cell.region or NONE,
        params,
        str(cell.repetition),
        cell.phase or "Pending",
        wall(cell.wall_seconds),
        cell.units_per_second or NONE,
        usd(cell.cost_usd),
    ]


def _template_gpu(sweep: Sweep) -> GPURequest | str | None:
    resources = sweep.spec.template.spec.resources
    return resources.gpu if resources else None


def best_lines(sweep: Sweep) -> list[str]:
    best = sweep.status.best
    if best is None:
        return []
    by_index = {c.index: c for c in sweep.status.cells}
    lines = []
    if best.by_cost is not None and (cell := by_index.get(best.by_cost)) is not None:
        lines.append(f"best by cost: #{cell.index} ({_job(sweep, cell)}) {usd(cell.cost_usd)}")
    if best.by_throughput is not None and (cell := by_index.get(best.by_throughput)) is not None:
        rate = f"{cell.units_per_second} units/s" if cell.units_per_second else NONE
        lines.append(f"best by throughput: #{cell.index} ({_job(sweep, cell)}) {rate}")
    return lines


def _job(sweep: Sweep, cell: SweepCell) -> str:
    return cell.object or f"{sweep.metadata.name}-{cell.index}"


def cell_table(sweep: Sweep, sources: Mapping[str, str] | None = None) -> str:
    """The cells, one a row; with ``sources`` (a cell Job's name to the code its last Attempt ran), a
    SOURCE column too."""
    cells = sweep.status.cells
    if not cells:
        _, total = cells_done(sweep)
        return f"no cells yet: the sweep controller has not started the {total} cell(s) of the matrix"
    if sources is None:
        return table(CELL_HEADERS, [_cell_row(sweep, c) for c in cells])
    rows = [[*_cell_row(sweep, c), sources.get(_job(sweep, c), NONE)] for c in cells]
    return table((*CELL_HEADERS, "SOURCE"), rows)


def sweep_view(sweep: Sweep) -> str:
    """Header, cell table and best cells: what `nodus get sweep NAME` and its --watch draw."""
    parts = [sweep_header(sweep), "", cell_table(sweep)]
    footer = best_lines(sweep)
    if footer:
        parts += ["", *footer]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------------------
# Jobs
# ---------------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------
# Budgets, the account, usage and invoices (issue #7)
# ---------------------------------------------------------------------------------------------------------


def account_view(account: Account) -> str:
    """The balances, one per line, with the identity they always keep: granted = available + held + spent."""
    st = account.status
    rows = [
        ["granted", usd(st.granted_usd), "credits granted, less those revoked"],
        ["available", usd(st.available_usd), "what new runs may reserve"],
        ["held", usd(st.held_usd), f"reserved by {st.open_holds} open hold(s) of running Attempts"],
        ["spent", usd(st.spent_usd), "charged"],
        ["unbilled", usd(st.unbilled_usd), "absorbed by Nodus, never charged"],
    ]
    return f"Account of project {account.metadata.name}\n\n" + table(("BALANCE", "USD", ""), rows)


def usage_table(usage: UsageList) -> str:
    """One row per Attempt, then the total charged."""
    rows = [
        [
            i.month,
            i.sweep or NONE,
            i.job,
            i.attempt,
            i.offering or NONE,
            usd(i.rate_usd_per_hour),
            f"{i.billed_seconds}s",
            usd(i.cost_usd),
            usd(i.covered_usd),
        ]
        for i in usage.items
    ]
    headers = ("MONTH", "SWEEP", "JOB", "ATTEMPT", "OFFERING", "RATE/H", "BILLED", "COST", "COVERED")
    total = micros_to_usd(sum(usd_to_micros(i.cost_usd) for i in usage.items))
    return table(headers, rows) + f"\n\ntotal charged: ${total}"


def invoice_table(inv: Invoice) -> str:
    """A line per Sweep (or Job), offering and rate, then the TOTAL line."""
    rows = [
        [
            line.sweep or NONE,
            line.job or NONE,
            line.offering or NONE,
            usd(line.rate_usd_per_hour),
            str(line.attempts),
            line.quantity,
            usd(line.amount_usd),
            usd(line.covered_usd),
        ]
        for line in inv.lines
    ]
    attempts = str(sum(x.attempts for x in inv.lines))
    hours = str(sum((Decimal(x.quantity) for x in inv.lines), Decimal("0.000000")))
    rows.append(["TOTAL", "", "", "", attempts, hours, usd(inv.total_usd), usd(inv.covered_usd)])
    headers = ("SWEEP", "JOB", "OFFERING", "RATE/H", "ATTEMPTS", "HOURS", "AMOUNT", "COVERED")
    return f"Invoice of project {inv.project} for {inv.month}\n\n" + table(headers, rows)
