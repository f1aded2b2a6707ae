"""The money simulator (issue #18): seeded workloads over billing's real core, every invariant checked after
every operation; it catches a bug put in on purpose, names the seed and prints the command that replays it.
Its workload has Pipelines (issue #22): one cap over Job stages and Sweep stages' cells."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import pytest

from nodus_billing.holding import PutPipeline, apply, encode
from nodus_billing.simulating import FAULTS, SimulationFailure, main, replay_command, simulate
from nodus_billing.standing import State

SEEDS = 300
STEPS = 120
"""300 seeds of 120 operations: about 6 s on two cores, every invariant after each of 36,000 operations."""

REACHED = (
    "PlaceHold ok",
    "PlaceHold MaxCostReached",
    "PlaceHold BudgetExceeded",
    "PlaceHold InsufficientCredits",
    "PlaceHold Conflict",
    "Charge ok",
    "ExtendHold ok",
    "Capture ok",
    "Release ok",
    "Expire ok",
    "Revoke ok",
    "Revoke InsufficientCredits",
    "runs captured",
    "runs covered whole",
    "captures refunding ticks",
    "ticks past funding",
    "blocks",
    "unblocks",
    "restarts",
    "redeliveries",
    "hold retries",
    "holds funded on redelivery",
    "outages",
    "PutPipeline ok",
    "blocks at a Pipeline's cap",
)
"""What the workload must reach in CI, or it is not testing what it is for."""
FOUND_BY = {
    "unbilled": (0,),
    "launch-failure": (0, 37),
    "budget-revived": (2,),
    "extension-month": (15,),
    "extension-labels": (36,),
}
"""The seeds that showed, in 300 steps, each problem the simulator found in billing (#18), all fixed since
(``invariants``, docs/billing.md): replayed strictly, they must pass. They are the workload without
Pipelines (``pipelines=False``), which draws seed for seed what it drew before Pipelines existed."""


@pytest.mark.slow
def test_every_invariant_holds_on_every_seed() -> None:
    counts: Counter[str] = Counter()
    for seed in range(SEEDS):
        result = simulate(seed, STEPS)
        assert result.steps == STEPS
        counts.update(result.counts)
    missing = [kind for kind in REACHED if not counts[kind]]
    assert not missing, f"the workload never reached {missing}: {sorted(counts.items())}"


@pytest.mark.slow
def test_long_lived_books() -> None:
    """Books of hundreds of runs: months turn, holds expire, Budgets bind."""
    for seed in (1000, 1001):
        simulate(seed, 1_500)


def test_a_seed_is_the_same_run_and_apply_alone_repeats_it() -> None:
    first, again = simulate(7, 400, keep_ops=True), simulate(7, 400, keep_ops=True)
    assert (first.ops, first.counts, first.simulated_ms) == (again.ops, again.counts, again.simulated_ms)
    # apply() is the whole of the books: the same operations on fresh books give the same books again.
    books: dict[str, State] = {}
    for project, op in first.ops:
        books[project], _, _ = apply(books.get(project) or State(), op)
    assert {p: encode(b) for p, b in books.items()} == {p: encode(b) for p, b in first.books.items()}


def first_failure(
    seeds: Iterable[int], steps: int, fault: str | None = None, pipelines: bool = True
) -> SimulationFailure | None:
    """The failure of the first of the seeds that fails, if any does."""
    for seed in seeds:
        try:
            simulate(seed, steps, fault=fault, pipelines=pipelines)
        except SimulationFailure as e:
            return e
    return None


@pytest.mark.parametrize("fault", FAULTS)
def test_a_broken_invariant_is_caught_with_the_seed_and_the_replay(fault: str) -> None:
    failure = first_failure(range(50), 400, fault=fault)
    assert failure is not None, f"the fault {fault} went unnoticed on 50 seeds"
    replay = f"python -m nodus_billing.simulating --seed {failure.seed} --steps 400 --fault {fault}"
    assert failure.replay == replay == replay_command(failure.seed, 400, fault)
    text = str(failure)
    assert f"seed {failure.seed}, step {failure.step} of 400, op {failure.op!r}: " in text
    assert text.endswith(f"replay: {replay}")
    # The replay fails at the same step, the same way.
    with pytest.raises(SimulationFailure) as again:
        simulate(failure.seed, 400, fault=fault)
    assert (again.value.step, again.value.problem) == (failure.step, failure.problem)


def test_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seed", "3", "--seeds", "4", "--steps", "60"]) == 0
    out = capsys.readouterr().out
    assert "4 seed(s), 240 steps in " in out and out.rstrip().endswith("steps/s")
    assert main(["--seed", "0", "--steps", "50", "--fault", "drop_entry"]) == 1
    err = capsys.readouterr().err
    assert "seed 0, step 1 of 50" in err
    assert err.rstrip().endswith(
        "replay: python -m nodus_billing.simulating --seed 0 --steps 50 --fault drop_entry"
    )
    # Every invariant is strict: there is no --strict to ask for it, nor anything to tolerate.
    with pytest.raises(SystemExit) as usage:
        main(["--seed", "0", "--steps", "50", "--strict"])
    assert usage.value.code == 2
    assert "unrecognized arguments: --strict" in capsys.readouterr().err


@pytest.mark.parametrize("problem", sorted(FOUND_BY))
def test_the_problems_found_stay_fixed(problem: str) -> None:
    """The seeds that showed the problems the simulator found in billing, replayed: every invariant holds
    strictly on them now (there is no tolerated problem left), and any recurrence fails with the replay."""
    for seed in FOUND_BY[problem]:
        assert simulate(seed, 300, pipelines=False).steps == 300


def test_the_workload_without_pipelines_has_none_and_its_replay_says_so() -> None:
    bare = simulate(7, 400, keep_ops=True, pipelines=False)
    assert not any(isinstance(op, PutPipeline) for _, op in bare.ops)
    assert not any("Pipeline" in kind for kind in bare.counts)
    assert all(not book.pipelines for book in bare.books.values())
    piped = simulate(7, 400, keep_ops=True)
    assert any(isinstance(op, PutPipeline) for _, op in piped.ops)
    replay = "python -m nodus_billing.simulating --seed 3 --steps 50 --fault drop_entry --no-pipelines"
    assert replay_command(3, 50, "drop_entry", pipelines=False) == replay
    failure = first_failure(range(5), 50, fault="drop_entry", pipelines=False)
    assert failure is not None and failure.replay.endswith(" --no-pipelines")
