"""The docker container runtime against a real engine: podman's Docker API with the busybox image.

The pure parts (create bodies, the log demultiplexer, the log cursor and reconciliation, exit
classification) are tested directly; GPU requests only as the body sent, since podman here has no
GPUs. Where a test must act while a container runs, the program waits for a file the test creates on a
bind mount: nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path

import pytest
import pytest_asyncio

from nodus_agent.attemptdir import AttemptDir
from nodus_agent.configuring import Ulimit
from nodus_agent.containerbodies import create_body
from nodus_agent.containerexits import CUSTOMER, INFRASTRUCTURE, ContainerExit, LaunchFailed, classify
from nodus_agent.containerlogs import LogCursor, reconcile_log, render
from nodus_agent.containers import ContainerRuntime
from nodus_agent.containerspec import (
    ALLOWLIST_UNENFORCED,
    LABEL_ATTEMPT,
    LABEL_EGRESS,
    LABEL_NAMESPACE,
    LABEL_NODE,
    LABEL_ROLE,
    MAIN,
    SIDECAR,
    ContainerSpec,
    InitCommand,
    Sidecar,
    attempt_mounts,
    egress_warning,
    init_name,
    parse_ulimits,
    sidecar_name,
)
from nodus_agent.dockerapi import (
    DockerAPI,
    EngineUnavailable,
    LogDemuxer,
    LogLine,
    NotFound,
    RegistryAuth,
    normalize_time,
    socket_from_docker_host,
    split_image,
    unix_time,
)
from nodus_testing.podman import SANDBOX_ULIMITS, PodmanService
from nodus_testing.waiting import eventually

NAMESPACE = "team-a"
MiB = 1024**2


def spec_for(adir: AttemptDir, image: str, **kwargs: object) -> ContainerSpec:
    fields: dict[str, object] = {
        "name": f"nodus-{adir.namespace}-{adir.attempt}",
        "namespace": adir.namespace,
        "attempt": adir.attempt,
        "image": image,
        "mounts": attempt_mounts(adir),
        "gpu_mode": "none",
    }
    fields.update(kwargs)
    return ContainerSpec(**fields)  # type: ignore[arg-type]


def log_lines(path: Path) -> list[tuple[str, str, str]]:
    """(time, stream, text) of every line of an attempt log file."""
    complete = path.read_text().split("\n")[:-1]  # a line being written is not one yet
    return [tuple(line.split(" ", 2)) for line in complete]  # type: ignore[misc]


# -- pure parts -------------------------------------------------------------------------------------------
def bare_spec(**kwargs: object) -> ContainerSpec:
    fields: dict[str, object] = {"name": "nodus-ns-a1", "namespace": "ns", "attempt": "a1", "image": "img:1"}
    fields.update(kwargs)
    return ContainerSpec(**fields)  # type: ignore[arg-type]


def test_engine_errors_map_to_what_the_runtime_handles() -> None:
    from nodus_agent.dockerapi import Conflict, DockerError, NotFound, _error

    gone = b'{"message": "container 0a81 does not exist in database: no such container"}'
    assert isinstance(_error(404, b'{"message": "no such container"}'), NotFound)
    assert isinstance(_error(500, gone), NotFound), "podman's answer to a wait on a removed container"
    assert isinstance(_error(409, b"{}"), Conflict)
    other = _error(500, b'{"message": "disk full"}')
    assert type(other) is DockerError and other.message == "disk full"


def test_gpu_device_requests_body() -> None:
    body = create_body(bare_spec(gpu_ids=("0", "3")), "n1", "main")
    assert body["HostConfig"]["DeviceRequests"] == [
        {"Driver": "nvidia", "DeviceIDs": ["0", "3"], "Capabilities": [["gpu"]]}
    ]
    assert "Runtime" not in body["HostConfig"]
    assert "NVIDIA_VISIBLE_DEVICES=0,3" in body["Env"]


def test_gpu_nvidia_runtime_body_and_env_cannot_widen_it() -> None:
    spec = bare_spec(gpu_ids=("GPU-a",), gpu_mode="nvidia-runtime", env={"NVIDIA_VISIBLE_DEVICES": "all"})
    body = create_body(spec, "n1", "main")
    assert body["HostConfig"]["Runtime"] == "nvidia"
    assert "DeviceRequests" not in body["HostConfig"]
    assert [e for e in body["Env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")] == [
        "NVIDIA_VISIBLE_DEVICES=GPU-a"
    ]


def test_no_gpus_hides_every_gpu_and_mode_none_sends_nothing() -> None:
    # A CUDA image says NVIDIA_VISIBLE_DEVICES=all; without an override it would see every GPU.
    body = create_body(bare_spec(), "n1", "main")
    assert "NVIDIA_VISIBLE_DEVICES=void" in body["Env"]
    assert "DeviceRequests" not in body["HostConfig"]
    bare = create_body(bare_spec(gpu_mode="none", gpu_ids=("0",)), "n1", "main")
    assert not any(e.startswith("NVIDIA") for e in bare["Env"])
    assert "DeviceRequests" not in bare["HostConfig"] and "Runtime" not in bare["HostConfig"]


def test_resources_ulimits_labels_and_argv_in_the_body() -> None:
    spec = bare_spec(
        cpus=Decimal("1.5"),
        memory_bytes=512 * MiB,
        shm_bytes=256 * MiB,
        command=("python", "train.py"),
        args=("--lr", "0.1"),
        labels={"team": "x", LABEL_NODE: "spoofed"},
        working_dir="/work",
    )
    ulimits = parse_ulimits("nofile=1024:2048, nproc=512")
    body = create_body(spec, "n1", "main", ulimits=ulimits)
    host = body["HostConfig"]
    assert host["NanoCpus"] == 1_500_000_000
    assert host["Memory"] == host["MemorySwap"] == 512 * MiB
    assert host["ShmSize"] == 256 * MiB
    assert host["Ulimits"] == [
        {"Name": "nofile", "Soft": 1024, "Hard": 2048},
        {"Name": "nproc", "Soft": 512, "Hard": 512},
    ]
    assert host["Init"] is True and body["Tty"] is False
    assert body["Entrypoint"] == ["python", "train.py"] and body["Cmd"] == ["--lr", "0.1"]
    assert body["WorkingDir"] == "/work"
    assert body["Labels"] == {
        "team": "x",
        LABEL_NODE: "n1",
        LABEL_NAMESPACE: "ns",
        LABEL_ATTEMPT: "a1",
        LABEL_ROLE: "main",
        LABEL_EGRESS: "Open",
    }
    assert create_body(bare_spec(cpus=Decimal("0.25")), "n1", "main")["HostConfig"]["NanoCpus"] == 250_000_000
    args_only = create_body(bare_spec(args=("x",)), "n1", "main")
    assert "Entrypoint" not in args_only and args_only["Cmd"] == ["x"]


def test_egress_policies() -> None:
    assert create_body(bare_spec(egress="Deny"), "n", "main")["HostConfig"]["NetworkMode"] == "none"
    assert create_body(bare_spec(egress="Open"), "n", "main")["HostConfig"]["NetworkMode"] == "bridge"
    allow = bare_spec(egress="AllowList", egress_allow=("pypi.org",))
    body = create_body(allow, "n", "main")
    assert body["HostConfig"]["NetworkMode"] == "bridge"
    assert body["Labels"][LABEL_EGRESS] == ALLOWLIST_UNENFORCED
    warning = egress_warning(allow)
    assert warning is not None and "not enforced" in warning and "pypi.org" in warning
    assert egress_warning(bare_spec(egress="Deny")) is None
    with pytest.raises(ValueError, match="host_network"):
        bare_spec(egress="Deny", host_network=True)


def test_init_and_sidecar_bodies() -> None:
    spec = bare_spec(
        command=("main",),
        args=("--x",),
        gpu_ids=("1",),
        memory_bytes=64 * MiB,
        init_command=InitCommand(("nvidia-smi",), 60),
        sidecars=(Sidecar("proxy", ("envoy",), {"PORT": "9"}, image="envoy:1"),),
    )
    init = create_body(spec, "n", "init")
    assert init["Entrypoint"] == ["nvidia-smi"] and init["Cmd"] == []
    assert init["HostConfig"]["DeviceRequests"] and init["HostConfig"]["Memory"] == 64 * MiB
    assert init["Labels"][LABEL_ROLE] == "init"
    side = create_body(spec, "n", "sidecar", join="abc", sidecar=spec.sidecars[0])
    assert side["Image"] == "envoy:1" and side["Entrypoint"] == ["envoy"] and "PORT=9" in side["Env"]
    assert side["HostConfig"]["NetworkMode"] == "container:abc"
    assert "DeviceRequests" not in side["HostConfig"] and "Memory" not in side["HostConfig"]
    assert side["Labels"]["nodus.dev/sidecar"] == "proxy"
    assert sidecar_name(spec, spec.sidecars[0]) == "nodus-ns-a1-sidecar-proxy"
    assert init_name(spec) == "nodus-ns-a1-init"
    with pytest.raises(ValueError, match="unique"):
        bare_spec(sidecars=(Sidecar("a"), Sidecar("a")))
    with pytest.raises(ValueError, match="name"):
        bare_spec(name="bad/name")


def test_parse_ulimits_rejects_nonsense() -> None:
    assert parse_ulimits("") == ()
    assert parse_ulimits("nofile=10") == (Ulimit("nofile", 10, 10),)
    for bad in ("nofile", "nofile=x", "=1:2"):
        with pytest.raises(ValueError, match="NAME=SOFT:HARD"):
            parse_ulimits(bad)


def test_registry_auth_header_and_image_refs() -> None:
    header = RegistryAuth("bob", "s3cret", "ghcr.io").header()
    assert json.loads(base64.urlsafe_b64decode(header)) == {
        "username": "bob",
        "password": "s3cret",
        "serveraddress": "ghcr.io",
    }
    assert "s3cret" not in repr(RegistryAuth("bob", "s3cret"))
    assert split_image("alpine") == ("alpine", "latest")
    assert split_image("ghcr.io/a/b:1.2") == ("ghcr.io/a/b", "1.2")
    assert split_image("localhost:5000/b") == ("localhost:5000/b", "latest")
    assert split_image("localhost:5000/b:v1") == ("localhost:5000/b", "v1")
    assert split_image("b@sha256:abc") == ("b@sha256:abc", "")


def test_docker_host_names_a_unix_socket() -> None:
    assert socket_from_docker_host(None) == "/var/run/docker.sock"
    assert socket_from_docker_host("unix:///run/podman/podman.sock") == "/run/podman/podman.sock"
    with pytest.raises(ValueError, match="unix socket only"):
        socket_from_docker_host("tcp://10.0.0.1:2375")


def frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(payload)) + payload


def test_demuxer_joins_split_frames_and_lines() -> None:
    raw = (
        frame(1, b"2026-11-30T13:27:46.5Z hello ")
        + frame(2, b"2026-11-30T13:27:46.6Z oops\n")
        + frame(1, b"2026-11-30T13:27:47Z world\nsecond\n")
        + frame(1, b"2026-11-30T13:27:48Z tail-without-newline")
    )
    demux = LogDemuxer(timestamps=True)
    lines: list[LogLine] = []
    for i in range(len(raw)):  # one byte at a time: headers and payloads split everywhere
        lines += demux.feed(raw[i : i + 1])
    lines += demux.close()
    assert lines == [
        LogLine("stderr", "2026-11-30T13:27:46.600000000Z", "oops"),
        # A continuation keeps the time of the line's first part.
        LogLine("stdout", "2026-11-30T13:27:46.500000000Z", "hello world"),
        LogLine("stdout", "2026-11-30T13:27:46.500000000Z", "second"),
        LogLine("stdout", "2026-11-30T13:27:48.000000000Z", "tail-without-newline"),
    ]
    plain = LogDemuxer(timestamps=False)
    assert plain.feed(frame(1, b"a b\n")) == [LogLine("stdout", None, "a b")]


def test_times_normalize_and_convert() -> None:
    assert normalize_time("2026-11-30T13:27:14Z") == "2026-11-30T13:27:14.000000000Z"
    assert normalize_time("2026-11-30T13:27:14.602733152Z") == "2026-11-30T13:27:14.602733152Z"
    assert normalize_time("2026-11-30T14:27:14.5+01:00") == "2026-11-30T13:27:14.500000000Z"
    assert unix_time("1970-01-01T00:00:10.000000042Z") == "10.000000042"
    with pytest.raises(ValueError, match="RFC 3339"):
        normalize_time("yesterday")


def test_log_cursor_resumes_without_repeats(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    assert LogCursor.resume(path).since is None
    t1, t2 = "2026-11-30T13:00:01.000000000Z", "2026-11-30T13:00:02.000000000Z"
    path.write_bytes(
        f"{t1} stdout a\n{t2} stdout b\n{t2} stderr c\n".encode() + b"2026-11-30T13:00:02.0 stdout to"
    )
    cursor = LogCursor.resume(path)
    assert (cursor.since, cursor.seen) == (t2, 2)
    assert path.read_text().endswith("stderr c\n"), "the torn last line is cut off"
    again = [
        LogLine("stdout", t1, "a"),
        LogLine("stdout", t2, "b"),
        LogLine("stderr", t2, "c"),
        LogLine("stdout", t2, "torn-then-complete"),
        LogLine("stdout", "2026-11-30T13:00:03.000000000Z", "d"),
        LogLine("stdout", t1, "late but after the resume point"),
    ]
    assert [line.text for line in cursor.admit(again)] == [
        "torn-then-complete",
        "d",
        "late but after the resume point",
    ]


def stamped(second: int, text: str, stream: str = "stdout") -> LogLine:
    return LogLine(stream, f"2026-11-30T13:00:{second:02d}.000000000Z", text)


async def batches(*groups: list[LogLine]) -> AsyncIterator[list[LogLine]]:
    for group in groups:
        yield group


@pytest.mark.parametrize(
    ("file_lines", "engine", "expect"),
    [
        # the file is a prefix (the usual case): the rest is appended
        ([(1, "a")], [[(1, "a"), (1, "b")], [(2, "c")]], ["a", "b", "c"]),
        # a followed stream dropped and mangled lines: cut where they part, then the engine's lines
        ([(1, "a"), (1, "c"), (2, "d-mangled")], [[(1, "a"), (1, "b")], [(1, "c"), (2, "d")]], list("abcd")),
        # extra lines after the engine's last one (and a torn last line) go
        ([(1, "a"), (1, "b"), (3, "junk")], [[(1, "a"), (1, "b")]], ["a", "b"]),
        # lines older than the engine's first (it rotated them away) stay
        ([(0, "old"), (1, "a")], [[(1, "a"), (2, "b")]], ["old", "a", "b"]),
        # an engine with no lines at all leaves the file alone
        ([(1, "a")], [], ["a"]),
        # an empty file gets everything
        ([], [[(1, "a")], [(1, "b")]], ["a", "b"]),
    ],
)
async def test_reconcile_log_ends_the_file_as_the_engine_log(
    tmp_path: Path,
    file_lines: list[tuple[int, str]],
    engine: list[list[tuple[int, str]]],
    expect: list[str],
) -> None:
    path = tmp_path / "log.txt"
    path.write_text("".join(render(stamped(s, t)) for s, t in file_lines))
    groups = [[stamped(s, t) for s, t in group] for group in engine]
    await reconcile_log(path, batches(*groups))
    assert [text for _, _, text in log_lines(path)] == expect
    assert path.read_text().endswith("\n")
    await reconcile_log(path, batches(*groups))  # idempotent
    assert [text for _, _, text in log_lines(path)] == expect


def test_classify_exits() -> None:
    assert classify(ContainerExit(0)).reason == "Completed"
    oom = classify(ContainerExit(137, oom_killed=True, message="out of memory"))
    assert (oom.reason, oom.kind) == ("OOMKilled", CUSTOMER)
    error = classify(ContainerExit(3))
    assert (error.reason, error.kind, error.message) == ("Error", CUSTOMER, "the program exited with code 3")
    killed = classify(ContainerExit(143))
    assert killed.message is not None and "SIGTERM" in killed.message
    lost = classify(ContainerExit(None, lost=True, message="gone"))
    assert (lost.reason, lost.kind, lost.message) == ("Lost", INFRASTRUCTURE, "gone")


async def test_missing_engine_says_which_socket_and_how_to_start_one(tmp_path: Path) -> None:
    socket = tmp_path / "nothing.sock"
    async with DockerAPI(socket) as api:
        assert await api.ping() is False
        with pytest.raises(EngineUnavailable) as caught:
            await api.inspect("x")
    assert str(socket) in caught.value.message and "podman" in caught.value.message
    runtime = ContainerRuntime(DockerAPI(socket), "n1", engine_grace_s=0.0)
    try:
        exit = await runtime.wait("x")
    finally:
        await runtime.api.close()
    assert exit.lost and exit.message is not None and str(socket) in exit.message


# -- against podman ---------------------------------------------------------------------------------------
@pytest_asyncio.fixture
async def api(podman: PodmanService) -> AsyncIterator[DockerAPI]:
    async with DockerAPI(podman.socket_path) as client:
        yield client


@pytest_asyncio.fixture
async def runtime(api: DockerAPI, unique: str) -> AsyncIterator[ContainerRuntime]:
    """A runtime for node ``unique``; every container labelled with that node is removed afterwards
    (podman's container store is shared by the machine)."""
    ulimits = [Ulimit(u["Name"], u["Soft"], u["Hard"]) for u in SANDBOX_ULIMITS]
    yield ContainerRuntime(api, unique, ulimits, sidecar_grace_s=2.0, engine_grace_s=2.0)
    leftovers = await api.list_containers({LABEL_NODE: unique})
    leftovers.sort(key=lambda c: (c.get("Labels") or {}).get(LABEL_ROLE) == SIDECAR)
    for container in leftovers:
        await api.remove(container["Id"])


@pytest.fixture
def adir(tmp_path: Path, unique: str) -> AttemptDir:
    attempt = AttemptDir(tmp_path, NAMESPACE, f"{unique}-a1")
    attempt.create()
    return attempt


@pytest.mark.containers
async def test_program_sees_env_workdir_mounts_and_limits(
    runtime: ContainerRuntime, adir: AttemptDir, busybox_image: str
) -> None:
    (adir.inputs / "given.txt").write_text("an input\n")
    script = """
        set -e
        echo "hello $NAME from $(pwd)"
        cat /nodus/inputs/given.txt
        if echo x > /nodus/inputs/new; then echo inputs-writable; exit 9; fi
        echo result > /nodus/outputs/result.txt
        echo step-7 > /nodus/state/checkpoint.txt
        echo '{"unitsPerSecond": 5}' >> /nodus/report.jsonl
        v1=/sys/fs/cgroup/memory/memory.limit_in_bytes
        echo "limit $(cat $v1 2>/dev/null || cat /sys/fs/cgroup/memory.max)"
        echo to-stderr >&2
    """
    spec = spec_for(
        adir,
        busybox_image,
        command=("sh", "-c", script),
        env={"NAME": "nodus"},
        working_dir="/nodus/outputs",
        memory_bytes=64 * MiB,
        cpus=Decimal("1.5"),
    )
    cid = await runtime.launch(spec)
    follow = asyncio.create_task(runtime.follow_logs(cid, adir.log))
    exit = await runtime.wait(cid)
    await asyncio.wait_for(follow, 10)

    assert exit == ContainerExit(0), exit
    assert classify(exit).reason == "Completed"
    lines = log_lines(adir.log)
    # In order within each stream; across the two the engine does not promise one (a full run once saw
    # the stderr line after the next stdout one, microseconds apart).
    by_stream = {s: [text for _, stream, text in lines if stream == s] for s in ("stdout", "stderr")}
    assert by_stream == {
        "stdout": ["hello nodus from /nodus/outputs", "an input", f"limit {64 * MiB}"],
        "stderr": ["sh: can't create /nodus/inputs/new: Read-only file system", "to-stderr"],
    }
    assert len(lines) == 5
    times = [stamp for stamp, _, _ in lines]
    assert times == sorted(times) and all(normalize_time(t) == t for t in times)
    assert (adir.outputs / "result.txt").read_text() == "result\n"
    assert (adir.state / "checkpoint.txt").read_text() == "step-7\n"
    assert adir.report.read_text() == '{"unitsPerSecond": 5}\n'
    assert not (adir.inputs / "new").exists()

    info = await runtime.api.inspect(cid)
    host = info["HostConfig"]
    assert host["Memory"] == host["MemorySwap"] == 64 * MiB
    assert host["NanoCpus"] == 1_500_000_000
    assert info["Config"]["Labels"][LABEL_ATTEMPT] == adir.attempt


@pytest.mark.containers
async def test_out_of_memory_is_classified_oom(
    runtime: ContainerRuntime, adir: AttemptDir, busybox_image: str
) -> None:
    spec = spec_for(
        adir, busybox_image, command=("sh", "-c", "head -c 200m /dev/zero | tail"), memory_bytes=32 * MiB
    )
    exit = await runtime.wait(await runtime.launch(spec))
    assert exit.code == 137 and exit.oom_killed, exit
    verdict = classify(exit)
    assert (verdict.reason, verdict.kind) == ("OOMKilled", CUSTOMER)
    assert verdict.message is not None and "32Mi" in verdict.message


@pytest.mark.containers
async def test_nonzero_exit_and_denied_network(
    runtime: ContainerRuntime, adir: AttemptDir, busybox_image: str
) -> None:
    spec = spec_for(adir, busybox_image, command=("sh", "-c", "ls /sys/class/net; exit 3"), egress="Deny")
    cid = await runtime.launch(spec)
    exit = await runtime.wait(cid)
    await runtime.follow_logs(cid, adir.log)
    assert exit == ContainerExit(3)
    assert (classify(exit).reason, classify(exit).kind) == ("Error", CUSTOMER)
    assert [text for _, _, text in log_lines(adir.log)] == ["lo"], "only loopback under Deny"
    assert (await runtime.api.inspect(cid))["HostConfig"]["NetworkMode"] == "none"


@pytest.mark.containers
@pytest.mark.slow
async def test_restarted_agent_adopts_the_running_container_and_its_logs(
    runtime: ContainerRuntime, api: DockerAPI, adir: AttemptDir, busybox_image: str
) -> None:
    script = (
        "echo one; echo two >&2; while ! test -f /nodus/state/go; do sleep 0.05; done; echo three; exit 7"
    )
    spec = spec_for(adir, busybox_image, command=("sh", "-c", script))
    cid = await runtime.launch(spec)
    first = asyncio.create_task(runtime.follow_logs(cid, adir.log))
    await eventually(lambda: len(log_lines(adir.log)) == 2, message="the first two lines in the log")
    first.cancel()  # the agent dies
    with pytest.raises(asyncio.CancelledError):
        await first
    with adir.log.open("a") as f:  # ... in the middle of writing a line
        f.write("2099-01-01T00:00:00.000000000Z stdout tor")

    restarted = ContainerRuntime(api, runtime.node, runtime.ulimits, engine_grace_s=2.0)
    adopted = await restarted.adoptable()
    assert [(a.id, a.namespace, a.attempt, a.running) for a in adopted] == [
        (cid, NAMESPACE, adir.attempt, True)
    ]
    assert await restarted.launch(spec) == cid, "a second launch adopts the container"
    assert len(await api.list_containers({LABEL_NODE: runtime.node})) == 1

    follow = asyncio.create_task(restarted.follow_logs(cid, adir.log))
    (adir.state / "go").touch()
    exit = await restarted.wait(cid)
    await asyncio.wait_for(follow, 10)
    assert exit == ContainerExit(7)
    assert [(s, t) for _, s, t in log_lines(adir.log)] == [
        ("stdout", "one"),
        ("stderr", "two"),
        ("stdout", "three"),
    ]


@pytest.mark.containers
async def test_launch_starts_a_container_an_earlier_agent_only_created(
    runtime: ContainerRuntime, api: DockerAPI, adir: AttemptDir, busybox_image: str
) -> None:
    spec = spec_for(adir, busybox_image, command=("sh", "-c", "exit 5"))
    created = await api.create(spec.name, runtime.body(spec, MAIN))
    assert (await runtime.adoptable())[0].state == "created"
    assert await runtime.launch(spec) == created
    assert (await runtime.wait(created)).code == 5


@pytest.mark.containers
async def test_failing_init_command_fails_the_launch(
    runtime: ContainerRuntime, api: DockerAPI, adir: AttemptDir, busybox_image: str
) -> None:
    init = InitCommand(("sh", "-c", "echo preflight broke; exit 4"), timeout_s=30)
    spec = spec_for(adir, busybox_image, command=("true",), init_command=init)
    for _ in range(2):  # a duplicate launch fails the same way and still never runs the program
        with pytest.raises(LaunchFailed) as caught:
            await runtime.launch(spec)
        assert caught.value.reason == "Error"
        assert "exited with code 4" in caught.value.message and "preflight broke" in caught.value.message
        with pytest.raises(NotFound):
            await api.inspect(spec.name)
    # Nothing to adopt, but something to clean up after a restart:
    assert await runtime.adoptable() == []
    assert await runtime.attempts_on_node() == {(NAMESPACE, adir.attempt)}
    await runtime.remove_attempt(NAMESPACE, adir.attempt)
    assert await runtime.attempts_on_node() == set()


@pytest.mark.containers
async def test_init_command_past_its_timeout_fails_the_launch(
    runtime: ContainerRuntime, api: DockerAPI, adir: AttemptDir, busybox_image: str
) -> None:
    init = InitCommand(("sleep", "300"), timeout_s=0.5)
    spec = spec_for(adir, busybox_image, command=("true",), init_command=init)
    with pytest.raises(LaunchFailed, match=r"did not finish within its timeout of 0\.5s"):
        await runtime.launch(spec)
    assert not (await api.inspect(init_name(spec)))["State"]["Running"]


@pytest.mark.containers
@pytest.mark.slow
async def test_sidecar_runs_around_the_program(
    runtime: ContainerRuntime, api: DockerAPI, adir: AttemptDir, busybox_image: str
) -> None:
    spec = spec_for(
        adir,
        busybox_image,
        command=("sh", "-c", "cat /nodus/state/init"),
        init_command=InitCommand(("sh", "-c", "echo init-ran > /nodus/state/init"), timeout_s=30),
        sidecars=(Sidecar("helper", ("sh", "-c", "echo up > /nodus/state/helper; exec sleep 300")),),
    )
    cid = await runtime.launch(spec)
    exit = await runtime.wait(cid)
    await runtime.follow_logs(cid, adir.log)
    assert exit == ContainerExit(0)
    assert [text for _, _, text in log_lines(adir.log)] == ["init-ran"]

    main = await api.inspect(cid)
    helper = await api.inspect(sidecar_name(spec, spec.sidecars[0]))
    init = await api.inspect(init_name(spec))
    assert not helper["State"]["Running"], "the sidecar is stopped once the program has exited"
    assert init["State"]["FinishedAt"] <= helper["State"]["StartedAt"] <= main["State"]["StartedAt"]
    assert main["HostConfig"]["NetworkMode"] == f"container:{helper['Id']}"
    assert (adir.state / "helper").read_text() == "up\n"

    await runtime.remove(cid)
    assert await api.list_containers({LABEL_NODE: runtime.node, LABEL_ATTEMPT: adir.attempt}) == []
    await runtime.remove(cid)  # idempotent


@pytest.mark.containers
@pytest.mark.slow
async def test_signal_then_stop_is_not_mistaken_for_oom(
    runtime: ContainerRuntime, adir: AttemptDir, busybox_image: str
) -> None:
    # Ignores SIGTERM, so the stop ends in SIGKILL (137) under a memory limit: ours, not the OOM killer's.
    script = (
        'trap "" TERM; trap "echo got-usr1 > /nodus/state/signal" USR1; touch /nodus/state/trapped; '
        "while true; do sleep 0.05; done"
    )
    spec = spec_for(adir, busybox_image, command=("sh", "-c", script), memory_bytes=64 * MiB)
    cid = await runtime.launch(spec)
    waiting = asyncio.create_task(runtime.wait(cid))
    # Signalled only once the traps are set: before that SIGUSR1's default action would end the shell.
    await eventually(lambda: (adir.state / "trapped").exists(), message="the program set its traps")
    assert await runtime.signal(cid, "SIGUSR1")
    await eventually(lambda: (adir.state / "signal").exists(), message="the program saw SIGUSR1")
    assert await runtime.stop(cid, grace_s=1)
    exit = await asyncio.wait_for(waiting, 10)
    assert exit.code == 137 and not exit.oom_killed and not exit.lost
    assert await runtime.signal(cid, "SIGUSR1") is False, "no signal to a stopped container"


@pytest.mark.containers
async def test_container_removed_behind_our_back_is_lost(
    runtime: ContainerRuntime, api: DockerAPI, adir: AttemptDir, busybox_image: str
) -> None:
    spec = spec_for(adir, busybox_image, command=("sleep", "300"))
    cid = await runtime.launch(spec)
    waiting = asyncio.create_task(runtime.wait(cid))
    await api.remove(cid)
    exit = await asyncio.wait_for(waiting, 10)
    assert exit.lost and exit.code is None
    assert classify(exit).reason == "Lost" and classify(exit).kind == INFRASTRUCTURE


@pytest.mark.containers
@pytest.mark.slow
async def test_image_that_cannot_be_pulled_fails_the_launch(
    runtime: ContainerRuntime, adir: AttemptDir
) -> None:
    spec = spec_for(adir, "localhost:1/nodus-missing:1", command=("true",))
    with pytest.raises(LaunchFailed) as caught:
        await runtime.launch(spec)
    # No registry answers at localhost:1: the node's trouble, so another node may try.
    assert caught.value.reason == "Lost"
    assert "could not pull localhost:1/nodus-missing:1" in caught.value.message


@pytest.mark.containers
@pytest.mark.slow
async def test_wait_survives_an_engine_outage_but_not_its_absence(
    runtime: ContainerRuntime, busybox_image: str, adir: AttemptDir, tmp_path: Path
) -> None:
    # A second service over the same container store, on its own socket and not started yet: to a
    # runtime talking to it, the engine is down while the container runs on (conmon watches it, as
    # containers outlive dockerd with live-restore). The session's service must stay up for the others.
    engine = PodmanService(base_dir=tmp_path, tie_to_parent=True)
    script = "while ! test -f /nodus/state/go; do sleep 0.05; done; exit 6"
    cid = await runtime.launch(spec_for(adir, busybox_image, command=("sh", "-c", script)))
    try:
        async with DockerAPI(engine.socket_path) as api:
            impatient = ContainerRuntime(api, runtime.node, runtime.ulimits, engine_grace_s=0.3)
            exit = await asyncio.wait_for(impatient.wait(cid), 10)
            assert exit.lost and exit.message is not None and "lost the container engine" in exit.message

            patient = ContainerRuntime(api, runtime.node, runtime.ulimits, engine_grace_s=60.0)
            waiting = asyncio.create_task(patient.wait(cid))  # its first request finds no engine
            await asyncio.to_thread(engine.start)
            (adir.state / "go").touch()
            assert await asyncio.wait_for(waiting, 30) == ContainerExit(6)
    finally:
        engine.close()


@pytest.mark.containers
@pytest.mark.slow
async def test_a_chatty_program_logs_every_line_once_in_order(
    runtime: ContainerRuntime, adir: AttemptDir, busybox_image: str
) -> None:
    # podman's followed stream drops lines at this volume (podman #21914): the file must still end
    # exactly as the engine's log, line for line.
    n = 30_000
    (adir.inputs / "lines.txt").write_text("".join(f"line {i:06d} {'x' * 60}\n" for i in range(n)))
    script = "while ! test -f /nodus/state/go; do sleep 0.05; done; cat /nodus/inputs/lines.txt"
    cid = await runtime.launch(spec_for(adir, busybox_image, command=("sh", "-c", script)))
    follow = asyncio.create_task(runtime.follow_logs(cid, adir.log))
    (adir.state / "go").touch()
    assert await runtime.wait(cid) == ContainerExit(0)
    await asyncio.wait_for(follow, 60)
    texts = [text for _, _, text in log_lines(adir.log)]
    assert len(texts) == n
    assert texts == [f"line {i:06d} {'x' * 60}" for i in range(n)]
