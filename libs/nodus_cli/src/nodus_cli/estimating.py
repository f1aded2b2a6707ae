"""``nodus estimate -f FILE``: the dry run of a create (``?dryRun=All``, ADR-031), printed for people.

For each Sweep, Job and Pipeline in the files the gateway admits the object as for a real create, asks the
scheduler and billing for ``status.estimate`` and stores nothing. Printed: the cost (p50/p90) and the
startup and teardown overhead in it, the rate and the capacity it would use, the startup times, the holds
a create must fit (the first hold, the concurrent holds of every slot that starts at once, a gang's
member holds), warnings, and each blocking reason with its fix. A Pipeline's estimate is its whole DAG's
(the stages' costs summed), with the critical path's duration (``status.estimatedDuration``).

Exit codes: 0 when every object could be created now, 3 when the estimate of one has blocking reasons
(the create would be refused), 1 when the gateway refused a dry run itself (an invalid object, no
estimate services), 4 when the gateway cannot be reached.
"""

from __future__ import annotations

import json
import sys
import textwrap
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import msgspec
import yaml

from nodus_cli import exiting, manifests
from nodus_cli.client import ApiError
from nodus_cli.config import Config
from nodus_cli.kinds import COMPUTE_KINDS, by_manifest_kind
from nodus_cli.reporting import status_text
from nodus_cli.requesting import Requests
from nodus_cli.sourcing import SourceDirs, SourceError
from nodus_cli.tables import NONE
from nodus_schema.costs import DurationBand, Estimate, USDBand


@dataclass(frozen=True, slots=True)
class Estimated:
    kind: str
    ref: str
    namespace: str
    estimate: Estimate
    etag: str
    duration: DurationBand | None = None
    """A Pipeline's ``status.estimatedDuration``: p50 and p90 of its critical path."""

    def as_json(self) -> dict[str, Any]:
        duration = {"estimatedDuration": msgspec.to_builtins(self.duration)} if self.duration else {}
        return {
            "object": self.ref,
            "kind": self.kind,
            "name": self.ref.partition("/")[2],
            "namespace": self.namespace,
            "blocked": bool(self.estimate.blocking_reasons),
            "etag": self.etag,
            "estimate": msgspec.to_builtins(self.estimate),
            **duration,
        }


def _band(band: USDBand | None) -> str:
    if band is None or (band.p50 is None and band.p90 is None):
        return NONE
    return f"p50 ${band.p50 or '?'}  p90 ${band.p90 or '?'}"


def _durations(band: DurationBand | None) -> str:
    return f"p50 {band.p50 or '?'}  p90 {band.p90 or '?'}" if band else NONE


def _money(amount: str | None) -> str:
    return f"${amount}" if amount else NONE


def view(done: Estimated) -> str:
    """The estimate as people read it: a verdict line, then one field per line."""
    e = done.estimate
    blocked = e.blocking_reasons
    verdict = f"BLOCKED ({len(blocked)} reason{'s' if len(blocked) != 1 else ''})" if blocked else "could run"
    rows: list[tuple[str, str]] = [
        ("cost", _band(e.cost_usd)),
        ("duration", _durations(done.duration) + ("  (the critical path)" if done.duration else "")),
        (
            "overhead",
            _band(e.overhead_usd) + ("  (startup and teardown, in the cost)" if e.overhead_usd else ""),
        ),
        ("rate", _rate(e)),
        ("startup", _startup(e)),
        (
            "hold",
            _money(e.hold_usd)
            + (
                "  (first hold: the funding window at the rate, at most what cap, Budgets, credits leave)"
                if e.hold_usd
                else ""
            ),
        ),
        (
            "concurrent",
            _money(e.concurrent_hold_usd)
            + ("  (holds of every slot that starts at once)" if e.concurrent_hold_usd else ""),
        ),
        ("gang hold", _money(e.gang_hold_usd)),
        ("assembly bound", _money(e.assembly_bound_usd)),
        ("minimum charge", _money(e.minimum_charge_usd)),
        ("topology", e.topology or NONE),
        (
            "price book",
            (e.pricebook_version or NONE) + (f"  (valid until {e.valid_until})" if e.valid_until else ""),
        ),
        ("placement", e.placement_preview.explain or NONE if e.placement_preview else NONE),
    ]
    shown = [(k, v) for k, v in rows if v != NONE]
    width = max((len(k) for k, _ in shown), default=0) + 2
    lines = [f"{done.ref}: {verdict}"]
    lines += [f"  {(k + ':').ljust(width)}{v}" for k, v in shown]
    lines += _holds_note(e)
    if e.warnings:
        lines.append("  warnings:")
        lines += [f"    {w.code or 'Warning'}: {w.message or ''}" for w in e.warnings]
    if blocked:
        lines.append("  blocked by:")
        for reason in blocked:
            lines.append(f"    {reason.code or 'Blocked'}: {reason.message or ''}")
            if reason.fix:
                lines.append(f"      fix: {reason.fix}")
    return "\n".join(lines)


def _holds_note(e: Estimate) -> list[str]:
    """Holds in one paragraph (docs/billing.md), with this estimate's amounts and the $2-cap example."""
    if not (e.hold_usd and e.rate_usd_per_hour and e.minimum_charge_usd):
        return []
    rate = Decimal(e.rate_usd_per_hour)
    minutes = (Decimal("2.00") / rate * 60).quantize(Decimal("1")) if rate > 0 else None
    example = (
        f' For example, maxCostUSD "2.00" at ${e.rate_usd_per_hour}/h runs about {minutes} minutes.'
        if minutes is not None
        else ""
    )
    text = (
        f"Billing sets ${e.hold_usd} aside before the run starts (ten minutes at the rate, or what your cap, "
        "Budgets and credits leave), charges what the run uses from it and tops it up as it runs. A cap "
        f"is a ceiling, not a deposit: any cap of at least ${e.minimum_charge_usd} (one second) runs until "
        "it is spent; then the object is suspended with MaxCostReached and resumes when you raise it."
        + example
    )
    return ["  holds:", *textwrap.wrap(text, width=100, initial_indent="    ", subsequent_indent="    ")]


def _rate(e: Estimate) -> str:
    if not e.rate_usd_per_hour:
        return NONE
    preview = e.placement_preview
    if preview is None or not preview.offering:
        return f"${e.rate_usd_per_hour}/h"
    where = [preview.region_class or ""]
    where.append("interruptible" if preview.interruptible else "on-demand")
    if preview.warm_reuse:
        where.append("warm")
    return f"${e.rate_usd_per_hour}/h on {preview.offering} ({', '.join(w for w in where if w)})"


def _startup(e: Estimate) -> str:
    s = e.startup
    if s is None:
        return NONE
    return f"cold {_durations(s.cold)}; warm {_durations(s.warm)}"


def estimate(
    api: Requests, config: Config, files: list[str], *, output: str, sources: SourceDirs | None = None
) -> int:
    """A dry-run create of each Job, Sweep and Pipeline of ``files``; ``sources`` resolves ``source.dir`` as
    apply does (packed and uploaded: the estimate's admission checks the blob like a create's)."""
    try:
        docs = [doc for path in files for doc in manifests.load(path)]
    except manifests.ManifestError as e:
        print(f"error: {e}\n{manifests.FIX}", file=sys.stderr)
        return exiting.FAILED
    results: list[Estimated] = []
    refused = False
    for doc in docs:
        kind = by_manifest_kind(doc.data.get("kind"))
        if kind not in COMPUTE_KINDS:
            print(
                f"{doc.source}: {doc.data.get('kind')} has no estimate (only Sweeps, Jobs and Pipelines do)",
                file=sys.stderr,
            )
            continue
        assert kind is not None
        meta = doc.data.get("metadata") if isinstance(doc.data.get("metadata"), dict) else {}
        namespace = (meta or {}).get("namespace") or config.namespace
        try:
            if sources is not None:
                doc = sources.resolve(kind, doc, namespace)
            obj, etag = api.dry_run_create(kind, namespace, doc.data)
        except SourceError as e:
            print(f"error: {doc.source}: {e}", file=sys.stderr)
            refused = True
            continue
        except ApiError as e:
            print(f"{doc.source}:\n{status_text(e.status)}", file=sys.stderr)
            refused = True
            continue
        status = obj.get("status") or {}
        raw = status.get("estimate") or {}
        duration = (
            msgspec.convert(status["estimatedDuration"], DurationBand)
            if status.get("estimatedDuration")
            else None
        )
        name = (obj.get("metadata") or {}).get("name") or "?"
        estimate = msgspec.convert(raw, Estimate)
        results.append(Estimated(kind.kind, kind.ref(name), namespace, estimate, etag, duration))
    _print(results, output)
    if refused or not results:
        if not results and not refused:
            print("error: no Sweep or Job to estimate in the files", file=sys.stderr)
        return exiting.FAILED
    return exiting.BLOCKED if any(r.estimate.blocking_reasons for r in results) else exiting.OK


def _print(results: list[Estimated], output: str) -> None:
    if not results:
        return
    if output == "json":
        print(json.dumps([r.as_json() for r in results], indent=2))
    elif output == "yaml":
        print(yaml.safe_dump([r.as_json() for r in results], sort_keys=False).rstrip())
    else:
        print("\n\n".join(view(r) for r in results))
