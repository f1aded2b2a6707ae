"""Local processes: start a program in its own session, stop its whole process group, tell if a pid lives.

Each program leads a new session (``start_new_session``), so its pid is also its process group id and a
signal to the group reaches whatever it forked: a stop leaves nothing behind. The start time of the pid
(``/proc/<pid>/stat``) is recorded beside it, so an agent that restarts never mistakes a recycled pid
for its program.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from pathlib import Path


async def spawn(
    argv: list[str], env: dict[str, str], cwd: Path, log_path: Path
) -> asyncio.subprocess.Process:
    """Start ``argv`` with stdout and stderr appended to ``log_path``; OSError if it cannot start."""
    with log_path.open("ab") as log:
        return await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Signal a process group; False if it has no process left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # the pid was recycled by somebody else's process: not ours to signal
        return False
    return True


async def terminate(proc: asyncio.subprocess.Process, grace_s: float) -> int:
    """SIGTERM the group, SIGKILL it after ``grace_s``; the program's return code."""
    signal_group(proc.pid, signal.SIGTERM)
    try:
        return await asyncio.wait_for(proc.wait(), grace_s)
    except TimeoutError:
        signal_group(proc.pid, signal.SIGKILL)
        return await proc.wait()


def sweep_group(pgid: int) -> None:
    """SIGKILL what the program left running in its group after it exited (as a container teardown)."""
    signal_group(pgid, signal.SIGKILL)


def exit_code(returncode: int) -> int:
    """The shell's and container runtimes' form: a death by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(code: int) -> str:
    if code > 128:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(code - 128).name} (exit code {code})"
    return f"exited with code {code}"


# -- pids of programs started by an earlier agent -------------------------------------------------------
def start_ticks(pid: int) -> int | None:
    """The pid's start time in clock ticks since boot; None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone (ENOENT), or exiting while we read (ESRCH)
        return None
    # The command name (field 2) may hold spaces and parentheses: fields after the last ")" are fixed.
    fields = stat[stat.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def alive(pid: int, ticks: int | None) -> bool:
    """Is the process we started (same pid, same start time) still running?"""
    if Path("/proc").is_dir():
        now = start_ticks(pid)
        return now is not None and (ticks is None or now == ticks)
    try:  # no /proc (not Linux): pid existence is the best we can tell
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def terminate_pid(pid: int, ticks: int | None, grace_s: float, poll_s: float = 0.1) -> None:
    """Stop a program that is not our child (we cannot wait for it): signal, poll, then SIGKILL."""
    if not alive(pid, ticks):
        return
    signal_group(pid, signal.SIGTERM)
    # No child to wait on and no event to await: polling is the only way to see it go.
    for _ in range(max(1, int(grace_s / poll_s))):
        if not alive(pid, ticks):
            return
        await asyncio.sleep(poll_s)
    if alive(pid, ticks):
        signal_group(pid, signal.SIGKILL)
