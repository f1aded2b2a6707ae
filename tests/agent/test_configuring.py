"""The agent's configuration (ADR-0022): a TOML file under the environment, errors that name the key and
what it expects, the command line, the example file, the systemd unit and the installer (a bash syntax
check and dry runs into a temporary root)."""

from __future__ import annotations

import configparser
import dataclasses
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nodus_agent.configuring import APPLICATION_XIDS, BY_NAME, ConfigError, Ulimit, load_file, prepare
from nodus_agent.settings import AgentSettings
from nodus_schema.quantities import parse_bytes

DEPLOY = Path(__file__).parents[2] / "deploy" / "agent"

FULL = """
node = "gpu-a-017"
offering = "h100-sxm-80g-x8-us"
pool = "vision"
region = "us"
variant = "H100-SXM-80G"
force_variant = true
gpus = 8
gpu_memory = "80Gi"
fake_gpus = false
interruptible = true
workdir = "{tmp}/work"
cwd = "{tmp}"
heartbeat_s = 1.5
stop_grace_s = 20
runtime = "docker"

[docker]
socket = "/run/podman/podman.sock"
gpu_mode = "nvidia-runtime"
ulimits = {{ nofile = "1024:2048", nproc = 512 }}

[nats]
url = "nats://a:4222,nats://b:4222"
nkey_seed = "{tmp}/agent.nk"

[s3]
endpoint = "http://127.0.0.1:8333"
region = "eu-west-1"
bucket = "ckpt"
credentials_file = "{tmp}/s3.credentials"

[input]
max_bytes = "2Gi"
parallel = 2
ca_bundle = "{tmp}/ca.pem"

[gpu_health]
enabled = false
on_fault = "finish"
ignore_xids = [13, 43]
poll_s = 2

[health]
port = 9464

[log]
level = "DEBUG"
"""


@pytest.fixture
def full(tmp_path: Path) -> Path:
    for name in ("agent.nk", "s3.credentials", "ca.pem"):
        (tmp_path / name).write_text("[default]\naws_access_key_id = AK\naws_secret_access_key = SK\n")
    path = tmp_path / "agent.toml"
    path.write_text(FULL.format(tmp=tmp_path))
    return path


def toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


# -- file and environment ----------------------------------------------------------------------------------


def test_every_setting_comes_from_the_file(full: Path, tmp_path: Path) -> None:
    s = AgentSettings.from_env({}, full)
    assert (s.node, s.offering, s.pool, s.region_class, s.variant) == (
        "gpu-a-017", "h100-sxm-80g-x8-us", "vision", "us", "H100-SXM-80G",
    )  # fmt: skip
    assert (s.force_variant, s.gpus, s.gpu_memory, s.fake_gpus, s.interruptible) == (
        True,
        8,
        "80Gi",
        False,
        True,
    )
    assert (s.workdir, s.cwd, s.heartbeat_s, s.stop_grace_s) == (tmp_path / "work", tmp_path, 1.5, 20.0)
    assert (s.runtime, s.docker_socket, s.docker_gpu_mode) == (
        "docker", Path("/run/podman/podman.sock"), "nvidia-runtime",
    )  # fmt: skip
    assert s.docker_ulimits == (Ulimit("nofile", 1024, 2048), Ulimit("nproc", 512, 512))
    assert s.docker_ulimits[0].body() == {"Name": "nofile", "Soft": 1024, "Hard": 2048}
    assert (s.nats_url, s.nats_nkey_seed) == ("nats://a:4222,nats://b:4222", tmp_path / "agent.nk")
    assert (s.s3_endpoint, s.s3_region, s.s3_bucket) == ("http://127.0.0.1:8333", "eu-west-1", "ckpt")
    assert s.s3_credentials_file == tmp_path / "s3.credentials"
    assert (s.max_input_bytes, s.input_parallel, s.ca_bundle) == (2 * 1024**3, 2, tmp_path / "ca.pem")
    assert (s.gpu_health, s.gpu_fault_action, s.gpu_ignore_xids, s.gpu_poll_s) == (
        False, "finish", frozenset({13, 43}), 2.0,
    )  # fmt: skip
    assert s.config_file == full and "docker.ulimits" in s.configured and "pool" in s.configured


def test_the_environment_wins_key_by_key(full: Path) -> None:
    env = {
        "NODUS_AGENT_GPUS": "4",
        "NODUS_AGENT_DOCKER_ULIMITS": "nofile=64",
        "NODUS_NATS_URL": "nats://c:4222",
        "NODUS_AGENT_GPU_HEALTH_IGNORE_XIDS": "",  # empty: as if unset, the file's list stays
        "NODUS_AGENT_GPU_HEALTH_ON_FAULT": "stop",
        "NODUS_AGENT_CONFIG": str(full),  # what --config sets
    }
    s = AgentSettings.from_env(env)
    assert (s.gpus, s.docker_ulimits, s.nats_url) == (4, (Ulimit("nofile", 64, 64),), "nats://c:4222")
    assert (s.gpu_ignore_xids, s.gpu_fault_action, s.node) == (frozenset({13, 43}), "stop", "gpu-a-017")


def test_without_a_file_the_defaults_hold(tmp_path: Path) -> None:
    s = AgentSettings.from_env(
        {"NODUS_AGENT_NODE": "n1", "NODUS_AGENT_REGION": "eu", "NODUS_AGENT_GPUS": "2"}
    )
    assert (s.offering, s.variant, s.gpu_memory, s.heartbeat_s, s.stop_grace_s) == (
        "h100-sxm-80g-x2-eu", "H100-SXM-80G", "80Gi", 5.0, 10.0,
    )  # fmt: skip
    assert (s.runtime, s.docker_gpu_mode, s.docker_ulimits, s.s3_bucket, s.s3_settings()) == (
        "process", "device-requests", (), None, None,
    )  # fmt: skip
    assert (s.max_input_bytes, s.gpu_health, s.gpu_fault_action) == (parse_bytes("50Gi"), True, "stop")
    assert s.gpu_ignore_xids == APPLICATION_XIDS and s.configured == {"node", "region", "gpus"}
    assert s.workdir == Path(".nodus/agent/n1").absolute() and s.config_file is None


# -- errors ------------------------------------------------------------------------------------------------


def test_an_unknown_key_is_named_with_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_file(toml(tmp_path, '[docker]\nsock = "/x"\n'))
    message = str(e.value)
    assert "unknown key 'docker.sock'" in message and "did you mean 'docker.socket'?" in message
    assert "valid keys: node, offering," in message and "gpu_health.on_fault" in message
    with pytest.raises(ConfigError, match=r"unknown key 'gpu_count'.*valid keys"):
        AgentSettings.from_env({}, toml(tmp_path, "gpu_count = 8\n"))
    with pytest.raises(ConfigError, match="unknown key 'dockr'"):
        AgentSettings.from_env({}, toml(tmp_path, "[dockr]\nsocket = 1\n"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpus = 0", "gpus = 0: expected a whole number of at least 1 (or set NODUS_AGENT_GPUS)"),
        ('runtime = "kubernetes"', "runtime = 'kubernetes': expected one of process, docker, simulate"),
        ('node = "GPU_01"', "node = 'GPU_01': expected a node name"),
        ("heartbeat_s = 0", "heartbeat_s = 0: expected a number of seconds above 0"),
        ('fake_gpus = "maybe"', "fake_gpus = 'maybe': expected true or false"),
        ('gpu_memory = "lots"', "gpu_memory = 'lots': expected a size such as 80Gi"),
        ('[docker]\nulimits = { nofile = "2048:1024" }', "the soft limit of nofile is above its hard limit"),
        (
            '[docker]\ngpu_mode = "cdi"',
            "docker.gpu_mode = 'cdi': expected one of device-requests, nvidia-runtime, none",
        ),
        ('[nats]\nurl = "localhost:4222"', "nats.url = 'localhost:4222': expected nats://host:port"),
        ('[s3]\ncredentials_file = "/nonexistent/creds"', "expected an existing file (/nonexistent/creds"),
        ('[gpu_health]\nignore_xids = ["x"]', "gpu_health.ignore_xids = ['x']: expected XID numbers"),
        ("[health]\nport = 70000", "health.port = 70000: expected a port number"),
    ],
)
def test_a_bad_value_in_the_file_names_the_key_and_what_it_expects(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = toml(tmp_path, text + "\n")
    with pytest.raises(ConfigError) as e:
        AgentSettings.from_env({}, path)
    assert str(e.value).startswith(f"{path}: ") and expected in str(e.value)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"NODUS_AGENT_GPUS": "eight"}, "NODUS_AGENT_GPUS='eight': expected a whole number of at least 1"),
        ({"NODUS_AGENT_FAKE_GPUS": "maybe"}, "NODUS_AGENT_FAKE_GPUS='maybe': expected true or false"),
        ({"NODUS_AGENT_STOP_GRACE_S": "-1"}, "NODUS_AGENT_STOP_GRACE_S='-1': expected a number of seconds"),
        ({"NODUS_AGENT_DOCKER_ULIMITS": "nofile"}, "NODUS_AGENT_DOCKER_ULIMITS='nofile': expected ulimits"),
        ({"NODUS_AGENT_NODE": "a.b"}, "NODUS_AGENT_NODE='a.b': expected a node name"),
    ],
)
def test_a_bad_variable_names_itself(env: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        AgentSettings.from_env(env)
    assert str(e.value).startswith(expected)


def test_a_missing_or_broken_file_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no such file; create it from deploy/agent/agent.toml.example"):
        AgentSettings.from_env({"NODUS_AGENT_CONFIG": str(tmp_path / "nope.toml")})
    with pytest.raises(ConfigError, match=r"agent.toml: not valid TOML"):
        AgentSettings.from_env({}, toml(tmp_path, "gpus = = 8\n"))


def test_unknown_agent_variables_are_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    AgentSettings.from_env({"NODUS_AGENT_NODE": "n1", "NODUS_AGENT_GPU": "8"})
    assert any(
        "NODUS_AGENT_GPU is not an agent setting; did you mean NODUS_AGENT_GPUS?" in r.getMessage()
        for r in caplog.records
    )


def test_s3_settings_read_an_aws_credentials_file(full: Path, tmp_path: Path) -> None:
    s3 = AgentSettings.from_env({}, full).s3_settings()
    assert s3 is not None and (s3.bucket, s3.endpoint, s3.region) == (
        "ckpt",
        "http://127.0.0.1:8333",
        "eu-west-1",
    )
    assert (s3.access_key, s3.secret_key) == ("AK", "SK") and "SK" not in repr(s3)
    (tmp_path / "s3.credentials").write_text("[other]\naws_access_key_id = AK\n")
    with pytest.raises(ConfigError, match=r"no \[default\] section"):
        AgentSettings.from_env({}, full).s3_settings()


# -- the command line ----------------------------------------------------------------------------------------


def test_prepare_points_at_the_file_and_exports_it_for_the_kit(full: Path) -> None:
    environ = {"NODUS_LOG_LEVEL": "WARNING", "NODUS_AGENT_GPUS": "4"}
    prepare(["--config", str(full)], environ)
    assert environ["NODUS_AGENT_CONFIG"] == str(full)
    assert environ["NODUS_NATS_URL"] == "nats://a:4222,nats://b:4222"  # the kit connects with this
    assert environ["NODUS_HEALTH_PORT"] == "9464" and environ["NODUS_LOG_LEVEL"] == "WARNING"  # env wins
    assert (
        environ["NODUS_AGENT_GPUS"] == "4"
        and environ["NODUS_AGENT_DOCKER_ULIMITS"] == "nofile=1024:2048,nproc=512"
    )
    assert environ["NODUS_AGENT_GPU_HEALTH_IGNORE_XIDS"] == "13,43"
    # The exported variables read back as the file did.
    from_variables = AgentSettings.from_env({**environ, "NODUS_AGENT_CONFIG": ""})
    from_file = AgentSettings.from_env({"NODUS_AGENT_GPUS": "4"}, full)
    assert from_variables == dataclasses.replace(from_file, config_file=None)


def test_check_prints_each_setting_and_where_it_came_from(
    full: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        prepare(["--config", str(full), "--check"], {"NODUS_AGENT_GPUS": "4"})
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "gpus = 4  # env NODUS_AGENT_GPUS" in out
    assert 'docker.gpu_mode = "nvidia-runtime"  # file' in out
    assert 'log.format = "json"  # default' in out and "health.port = 9464  # file" in out
    assert len(out.strip().splitlines()) == len(BY_NAME)


def test_a_bad_setting_stops_the_agent_before_it_connects(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as e:
        prepare(["--config", str(toml(tmp_path, 'runtime = "vm"\n'))], {})
    assert str(e.value.code).startswith("nodus-agent: ") and "runtime = 'vm': expected one of" in str(
        e.value.code
    )


# -- deploy/agent ---------------------------------------------------------------------------------------


def test_the_example_config_validates_and_shows_every_key(tmp_path: Path) -> None:
    example = DEPLOY / "agent.toml.example"
    s = AgentSettings.from_env({}, example)
    assert (s.region_class, s.runtime, s.workdir, s.s3_bucket) == (
        "us", "docker", Path("/var/lib/nodus/agent"), "nodus-checkpoints",
    )  # fmt: skip
    # Uncomment every "# key = value" line: the file then sets every key the agent knows, and no other.
    lines = [re.sub(r"^# (\w+ = )", r"\1", line) for line in example.read_text().splitlines()]
    assert set(load_file(toml(tmp_path, "\n".join(lines)))) == set(BY_NAME)


def test_the_unit_restarts_kills_mixed_and_outwaits_the_grace() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "nodus-agent.service")
    service = unit["Service"]
    assert service["Restart"] == "always" and service["KillMode"] == "mixed"
    assert service["User"] == "nodus" and service["EnvironmentFile"] == "-/etc/nodus/agent.env"
    assert service["ExecStart"] == "/opt/nodus/venv/bin/nodus-agent --config /etc/nodus/agent.toml"
    example = AgentSettings.from_env({}, DEPLOY / "agent.toml.example")
    assert int(service["TimeoutStopSec"]) >= example.stop_grace_s + 15
    assert "PrivateDevices" not in service  # it would hide /dev/nvidia*


def test_install_sh_is_valid_bash() -> None:
    for script in ("install.sh", "gpu-check.sh"):
        subprocess.run(["bash", "-n", str(DEPLOY / script)], check=True)
        assert os.access(DEPLOY / script, os.X_OK), f"{script} is not executable"


def install(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(DEPLOY / "install.sh"), *args], capture_output=True, text=True, timeout=30
    )


def test_install_dry_run_into_a_temp_root_says_what_it_would_do_and_changes_nothing(tmp_path: Path) -> None:
    root, wheel = tmp_path / "root", tmp_path / "nodus_agent-0.1.0-py3-none-any.whl"
    schema, kit = (
        tmp_path / "nodus_schema-0.1.0-py3-none-any.whl",
        tmp_path / "nodus_kit-0.1.0-py3-none-any.whl",
    )
    root.mkdir()
    for w in (wheel, schema, kit):
        w.write_bytes(b"PK")
    done = install("--dry-run", "--root", str(root), "--wheel", str(wheel), "--find-links", str(tmp_path))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"would run: install -d -m 0750 {root}/var/lib/nodus/agent" in out
    assert re.search(rf"would run: \S*python3? -m venv {root}/opt/nodus/venv", out)
    # The Nodus libraries beside the agent's wheel go in by path (PyPI has namesakes), then by force.
    pip = f"would run: {root}/opt/nodus/venv/bin/pip install"
    assert (
        f"{pip} --upgrade --disable-pip-version-check --find-links {tmp_path} {wheel} {schema} {kit}" in out
    )
    assert f"{pip} --force-reinstall --no-deps --disable-pip-version-check {wheel} {schema} {kit}" in out
    assert "would check: " in out and "import nodus_schema.quantities" in out
    unit = f"{root}/etc/systemd/system/nodus-agent.service"
    assert f"would run: install -D -m 0644 {DEPLOY}/nodus-agent.service {unit}" in out
    assert f"would run: install -m 0640 {DEPLOY}/agent.toml.example {root}/etc/nodus/agent.toml" in out
    assert "user: skipped under --root" in out and "systemd: skipped under --root" in out
    assert list(root.iterdir()) == []  # a dry run changes nothing

    # Run again over an installed root: what exists is kept, and said so.
    (root / "etc/nodus").mkdir(parents=True)
    (root / "etc/nodus/agent.toml").write_text('region = "eu"\n')
    (root / "etc/nodus/agent.env").write_text("")
    (root / "etc/systemd/system").mkdir(parents=True)
    shutil.copy(DEPLOY / "nodus-agent.service", root / "etc/systemd/system/nodus-agent.service")
    (root / "opt/nodus/venv/bin").mkdir(parents=True)
    (root / "opt/nodus/venv/bin/python").write_text("")
    (root / "opt/nodus/venv/bin/python").chmod(0o755)
    again = install("--dry-run", "--root", str(root), "--wheel", str(wheel)).stdout
    assert f"config: {root}/etc/nodus/agent.toml exists, kept" in again
    assert f"{root}/etc/nodus/agent.toml\n" not in again.replace("exists, kept", "")
    assert "unit: " in again and "is current" in again and "nodus-agent.service\n" not in again
    assert f"venv: {root}/opt/nodus/venv exists" in again and "-m venv" not in again
    assert (root / "etc/nodus/agent.toml").read_text() == 'region = "eu"\n'


def test_install_refuses_without_a_wheel_or_with_a_missing_one(tmp_path: Path) -> None:
    assert "give --wheel" in install("--dry-run", "--root", str(tmp_path)).stderr
    missing = install("--dry-run", "--root", str(tmp_path), "--wheel", str(tmp_path / "nope.whl"))
    assert missing.returncode == 2 and "nope.whl: no such file" in missing.stderr


def test_install_takes_the_nodes_seed_and_says_when_there_is_none(tmp_path: Path) -> None:
    """The bus refuses an agent without a credential (ADR-0026): the installer puts the node's seed in
    place (0440) and names it in agent.env, refuses what is no seed, and says so when none is given."""
    root, wheel = tmp_path / "root", tmp_path / "nodus_agent-0.1.0-py3-none-any.whl"
    root.mkdir()
    wheel.write_bytes(b"PK")
    seed = tmp_path / "agent-n1.nk"
    seed.write_bytes(b"SUAEXAMPLEONLY\n")
    done = install("--dry-run", "--root", str(root), "--wheel", str(wheel), "--nkey-seed", str(seed))
    assert done.returncode == 0, done.stderr
    assert f"would run: install -m 0440 {seed} {root}/etc/nodus/agent.nk" in done.stdout
    assert f"would add NODUS_NATS_NKEY_SEED=/etc/nodus/agent.nk to {root}/etc/nodus/agent.env" in done.stdout
    bare = install("--dry-run", "--root", str(root), "--wheel", str(wheel))
    assert "credential: none yet" in bare.stdout
    (tmp_path / "not-a-seed").write_text("hello")
    bad = install(
        "--dry-run", "--root", str(root), "--wheel", str(wheel), "--nkey-seed", str(tmp_path / "not-a-seed")
    )
    assert bad.returncode == 2 and "not a user nkey seed" in bad.stderr
