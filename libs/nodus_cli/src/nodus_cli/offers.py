"""``nodus offers``: the price book as ``sky show-gpus`` / ``dstack offer`` show it, from the cluster-scoped
``offerings`` resource the scheduler publishes.

Offerings are grouped by GPU family (``H100``), the families ordered by their cheapest offering, and
sorted by rate inside each family. Rates are the API's exact decimal strings (compared as Decimals, never
floats); the rate per GPU divides a node's rate exactly (rounded half-even to the micro-dollar, as billing
rounds). A family is the variant's first word (``H100-SXM-80G`` is an ``H100``), which is how the catalog
names them.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Final

import msgspec
import yaml

from nodus_cli import exiting
from nodus_cli.client import ApiError
from nodus_cli.config import Config
from nodus_cli.kinds import OFFERING
from nodus_cli.printing import interruptible_rate, on_demand_rate
from nodus_cli.reporting import status_text
from nodus_cli.requesting import Requests
from nodus_cli.tables import NONE, table
from nodus_schema.offerings import Offering

MICRO: Final = Decimal("0.000001")
OUTPUTS: Final = ("table", "wide", "json", "yaml", "name")


@dataclass(frozen=True, slots=True)
class Filters:
    gpu: str | None = None
    """A family (``H100``) or a variant (``H100-SXM-80G``), case-insensitive; ``H100:8`` also pins GPUs
    per node."""
    family: str | None = None
    region: str | None = None
    max_rate: Decimal | None = None
    """At most this on-demand rate per node-hour (with ``interruptible``: the interruptible rate)."""
    interruptible: bool = False
    """Only offerings that sell interruptible capacity."""


def family(variant: str) -> str:
    return variant.split("-", 1)[0].upper()


def rate(o: Offering, interruptible: bool) -> Decimal | None:
    text = interruptible_rate(o) if interruptible else on_demand_rate(o)
    return Decimal(text) if text else None


def _sort_rate(o: Offering) -> Decimal:
    """The rate an offering sorts by: on-demand, else (interruptible only) its interruptible rate."""
    return rate(o, False) or rate(o, True) or Decimal(0)


def matches(o: Offering, f: Filters) -> bool:
    spec = o.spec
    if f.gpu:
        wanted, _, count = f.gpu.partition(":")
        if wanted.upper() not in (family(spec.variant), spec.variant.upper()):
            return False
        if count and count != str(spec.gpus_per_node):
            return False
    if f.family and family(spec.variant) != f.family.upper():
        return False
    if f.region and spec.region_class.lower() != f.region.lower():
        return False
    if f.interruptible and rate(o, True) is None:
        return False
    if f.max_rate is not None:
        r = rate(o, f.interruptible)
        if r is None or r > f.max_rate:
            return False
    return True


def ordered(offerings: list[Offering]) -> list[Offering]:
    """Grouped by family (the cheapest family first), by rate inside a family, then by name."""
    cheapest: dict[str, Decimal] = {}
    for o in offerings:
        fam = family(o.spec.variant)
        cheapest[fam] = min(cheapest.get(fam, _sort_rate(o)), _sort_rate(o))
    return sorted(
        offerings,
        key=lambda o: (
            cheapest[family(o.spec.variant)],
            family(o.spec.variant),
            _sort_rate(o),
            o.metadata.name or "",
        ),
    )


def per_gpu(amount: Decimal | None, gpus: int) -> str:
    if amount is None or gpus <= 0:
        return NONE
    return f"${(amount / gpus).quantize(MICRO, rounding=ROUND_HALF_EVEN).normalize():f}/h"


def _usd(amount: Decimal | None) -> str:
    return f"${amount}/h" if amount is not None else NONE


def offers_table(offerings: list[Offering], *, wide: bool) -> str:
    headers = ["GPU", "VARIANT", "GPUS", "REGION", "RATE", "INTERRUPTIBLE", "OFFERING"]
    if wide:
        headers += ["RATE/GPU", "PROVIDER", "CPU", "MEMORY", "PRICEBOOK"]
    rows = []
    last_family = None
    for o in offerings:
        s = o.spec
        fam = family(s.variant)
        row = [
            fam if fam != last_family else "",  # a family's name once, at the top of its group
            s.variant,
            str(s.gpus_per_node),
            s.region_class,
            _usd(rate(o, False)),
            _usd(rate(o, True)) if not s.interruptible else f"{_usd(rate(o, True))} only",
            o.metadata.name or NONE,
        ]
        if wide:
            host = s.host
            row += [
                per_gpu(rate(o, False) or rate(o, True), s.gpus_per_node),
                s.provider,
                host.cpu if host else NONE,
                host.memory if host else NONE,
                s.pricebook_version,
            ]
        rows.append(row)
        last_family = fam
    return table(headers, rows)


def offers(api: Requests, config: Config, filters: Filters, *, output: str) -> int:
    try:
        raw = api.list(OFFERING, config.namespace)
    except ApiError as e:
        print(status_text(e.status), file=sys.stderr)
        return exiting.FAILED
    items = [msgspec.convert(item, Offering) for item in raw.get("items") or []]
    chosen = ordered([o for o in items if matches(o, filters)])
    if output in ("json", "yaml"):
        listed = {**raw, "items": [msgspec.to_builtins(o) for o in chosen]}
        print(
            json.dumps(listed, indent=2)
            if output == "json"
            else yaml.safe_dump(listed, sort_keys=False).rstrip()
        )
    elif not chosen:
        what = "no offering matches the filters" if items else "the price book has no offerings yet"
        print(f"No offerings found: {what}.", file=sys.stderr)
    elif output == "name":
        print("\n".join(OFFERING.ref(o.metadata.name or "") for o in chosen))
    else:
        print(offers_table(chosen, wide=output == "wide"))
    return exiting.OK


def parse_rate(text: str) -> Decimal:
    """``--max-rate``: a decimal USD amount per node-hour (``2.5``, ``$2.50``)."""
    try:
        value = Decimal(text.strip().removeprefix("$"))
    except InvalidOperation:
        raise ValueError(f"{text!r} is not an amount of USD per hour, such as 2.50") from None
    if not value.is_finite() or value < 0:
        raise ValueError(f"{text!r} is not an amount of USD per hour, such as 2.50")
    return value
