"""After an index succeeds: its outputs stored in S3 (docs/checkpoints.md, "Outputs") and loaded into
their sinks (PostgreSQL tables, ADR-0020), before the attempt reports Completed.

An output that was declared but not written is the program's failure (Error: the index did not produce
what the Job promised). A store or database that cannot be reached is this node's (Lost: another
attempt runs the index again; storing the same keys again is harmless, and a sink load is recorded once
per attempt and output).
"""

from __future__ import annotations

import logging

import msgspec

from nodus_agent import outputs, preparing, sinking
from nodus_agent.attemptdir import AttemptDir
from nodus_agent.outputs import DeclaredOutput, OutputsMissing
from nodus_agent.preparing import PrepareError, Toolkit
from nodus_agent.sinking import PostgresTarget, SinkError
from nodus_schema.attempts import OutputRecord
from nodus_schema.jobs import JobOutput
from nodus_schema.messages import StartAttempt

log = logging.getLogger(__name__)


class CommitError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


async def commit(toolkit: Toolkit, msg: StartAttempt, adir: AttemptDir) -> list[OutputRecord]:
    """Store the outputs and load the sinks; the records for the Job's status. CommitError on failure."""
    declared = _declared(msg, adir)
    if toolkit.s3 is None or toolkit.store is None:
        if msg.outputs:
            raise CommitError(
                "Lost",
                "this node agent has no output store (s3.bucket in its config): the declared outputs "
                "cannot be committed here",
            )
        return []  # /nodus/outputs stays on this node's disk, as the local stack keeps it
    try:
        stored = await outputs.upload_outputs(
            toolkit.s3,
            toolkit.store.bucket,
            namespace=msg.namespace,
            job=msg.job,
            index=msg.index,
            declared=declared,
            outputs_dir=adir.outputs,
            rank=msg.node_rank,
        )
    except OutputsMissing as e:
        names = ", ".join(f"{o.name} ({o.path})" for o in e.missing)
        raise CommitError(
            "Error", f"the program succeeded but did not write its declared outputs: {names}"
        ) from None
    except ValueError as e:
        raise CommitError("Error", str(e)) from None
    except Exception as e:
        raise CommitError("Lost", f"could not store the outputs: {e}") from None
    records = [_record(o, msg.index) for o in stored]
    return await _sinks(toolkit, msg, adir, records)


def _declared(msg: StartAttempt, adir: AttemptDir) -> list[DeclaredOutput]:
    out = []
    for o in msg.outputs:
        if not o.name or not o.path:
            continue
        try:
            path = preparing.to_host(o.path, adir)
        except ValueError as e:
            raise CommitError("Error", f"output {o.name}: {e}") from None
        out.append(DeclaredOutput(name=o.name, path=path, from_ranks=o.from_ranks or outputs.ZERO))
    return out


def _record(o: outputs.OutputRecord, index: int) -> OutputRecord:
    return OutputRecord(
        name=o.name,
        index=index,
        uri=o.uri,
        size_bytes=o.size_bytes,
        sha256=o.sha256,
        archive=o.format != "file",
        rank=o.rank,
    )


async def _sinks(
    toolkit: Toolkit, msg: StartAttempt, adir: AttemptDir, records: list[OutputRecord]
) -> list[OutputRecord]:
    for spec in msg.outputs:
        if spec.sink is None or not spec.name:
            continue
        rows = await _load(toolkit, msg, adir, spec)
        records = [
            r if r.name != spec.name else msgspec.structs.replace(r, rows_loaded=rows) for r in records
        ]
    return records


async def _load(toolkit: Toolkit, msg: StartAttempt, adir: AttemptDir, spec: JobOutput) -> int:
    sink = spec.sink
    assert sink is not None and spec.name and spec.path
    if not sink.connection or not sink.table:
        raise CommitError("Error", f"output {spec.name}: its sink needs a connection and a table")
    try:
        conn, secrets = await preparing.connection_with_secrets(toolkit, msg, sink.connection)
        target = PostgresTarget.from_connection(conn, secrets)
    except PrepareError as e:
        raise CommitError(e.reason, f"output {spec.name}: {e.message}") from None
    except ValueError as e:
        raise CommitError("Error", f"output {spec.name}: {e}") from None
    path = preparing.to_host(spec.path, adir)
    try:
        rows = await sinking.load(
            path, target, sink.table, mode=sink.mode or "Append", load_id=f"{msg.attempt}/{spec.name}"
        )
    except SinkError as e:
        raise CommitError(
            "Lost" if e.retryable else "Error", f"output {spec.name} into {sink.table}: {e}"
        ) from None
    log.info("output %s loaded into %s: %d rows", spec.name, sink.table, rows, extra={"attempt": msg.attempt})
    return rows
