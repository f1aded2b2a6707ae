"""The deploy recipes (issue #9), checked as far as a machine without a container registry allows:
the kustomize base and overlay rendered by the real kubectl and validated against the Kubernetes OpenAPI
schema (kubernetes-validate, offline); the NATS chart values against the chart's own keys; the compose
file against the Compose Specification schema (check-jsonschema's vendored copy, offline) and its NATS
configs by the real nats-server; the agent's unit by systemd-analyze; the installer by bash and
shellcheck. Nothing here starts a container: no image can be pulled on these machines."""

from __future__ import annotations

import copy
import importlib.util
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).parents[2]
DEPLOY = ROOT / "deploy"
KUBE = DEPLOY / "kubernetes"
COMPOSE = DEPLOY / "compose"
AGENT = DEPLOY / "agent"
BIN = Path(sys.executable).parent

# The oldest Kubernetes minor still supported upstream when this was written, and kubectl's here: what
# renders valid for it renders valid for the newer ones the bundled schemas know.
K8S_VERSION = "1.32.0"
CONTROLLERS = {
    "nodus-gateway": "nodus_gateway",
    "nodus-sweep-controller": "nodus_sweeps",
    "nodus-scheduler": "nodus_scheduler",
    "nodus-billing": "nodus_billing",
}
NATS_SERVERS = ("nats-1", "nats-2", "nats-3")


def tool(name: str, *where: Path) -> str:
    """The path of a command-line tool, from the venv or the PATH; skips the test where it is missing.
    CI has all three: kubectl and systemd-analyze are on these machines, and `make test` installs
    shellcheck (`make system-deps`); the skip is for a developer's machine without them."""
    for d in where:
        if (d / name).exists():
            return str(d / name)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed here")
    return found


def run(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)


# -- Kubernetes: the kustomize base and the example overlay ---------------------------------------------


def kustomize(target: Path) -> list[dict[str, Any]]:
    done = run(tool("kubectl"), "kustomize", str(target))
    assert done.returncode == 0, f"kubectl kustomize {target} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module", params=["base", "overlays/example"])
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return kustomize(KUBE / request.param)


def of_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def test_every_rendered_object_is_valid_against_the_kubernetes_openapi_schema(
    rendered: list[dict[str, Any]],
) -> None:
    assert {o["kind"] for o in rendered} >= {
        "Deployment", "Service", "ServiceAccount", "ConfigMap", "PodDisruptionBudget",
    }  # fmt: skip
    for obj in rendered:
        # strict: an unknown field (a typo such as `readinesProbe`) is an error, as the API server's
        # fieldValidation=Strict would make it.
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_the_schema_check_catches_a_misspelled_field_and_a_wrong_type() -> None:
    deployment = of_kind(kustomize(KUBE / "base"), "Deployment")["nodus-scheduler"]
    typo = copy.deepcopy(deployment)
    typo["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"periodSeconds": 5}
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(typo, K8S_VERSION, strict=True)
    wrong = copy.deepcopy(deployment)
    wrong["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, K8S_VERSION, strict=True)


def test_every_controller_runs_twice_probed_resourced_and_unprivileged(
    rendered: list[dict[str, Any]],
) -> None:
    deployments = of_kind(rendered, "Deployment")
    assert set(deployments) == set(CONTROLLERS)
    settings = next(iter(of_kind(rendered, "ConfigMap").values()))["data"]
    for name, module in CONTROLLERS.items():
        d = deployments[name]
        assert d["spec"]["replicas"] >= 2, f"{name}: one replica is a single point of failure"
        pod = d["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["serviceAccountName"] in of_kind(rendered, "ServiceAccount"), name
        (c,) = pod["containers"]
        assert c["args"] == [module], name
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["health"] == int(settings["NODUS_HEALTH_PORT"]), name
        for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
            assert c[probe]["httpGet"] == {"path": path, "port": "health"}, f"{name}: {probe}"
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]), name
        assert "memory" in c["resources"]["limits"], name
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, name
        assert sc["capabilities"]["drop"] == ["ALL"], name
        # The settings come from the generated ConfigMap, its own nkey seed from its own Secret.
        assert [e["configMapRef"]["name"] for e in c["envFrom"]] == list(of_kind(rendered, "ConfigMap"))
        seed_dir = str(Path(settings["NODUS_NATS_NKEY_SEED"]).parent)
        (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == seed_dir]
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        assert volume["secret"]["secretName"] == f"nodus-nats-{c['name']}", name


def test_each_controller_has_a_disruption_budget_and_the_gateway_a_service(
    rendered: list[dict[str, Any]],
) -> None:
    deployments = of_kind(rendered, "Deployment")
    budgets = of_kind(rendered, "PodDisruptionBudget").values()
    for name, d in deployments.items():
        labels = d["spec"]["template"]["metadata"]["labels"]
        covering = [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(covering) == 1 and covering[0]["spec"]["minAvailable"] == 1, name
    (service,) = of_kind(rendered, "Service").values()
    gateway = deployments["nodus-gateway"]["spec"]["template"]
    assert service["spec"]["selector"].items() <= gateway["metadata"]["labels"].items()
    (c,) = gateway["spec"]["containers"]
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in c["ports"]}


def test_settings_name_every_nats_server_and_credentials_come_from_secrets(
    rendered: list[dict[str, Any]],
) -> None:
    (settings,) = of_kind(rendered, "ConfigMap").values()
    data = settings["data"]
    urls = data["NODUS_NATS_URL"].split(",")
    assert [u.split("//")[1].split(".")[0] for u in urls] == ["nats-0", "nats-1", "nats-2"]
    assert data["NODUS_STREAM_REPLICAS"] == "3"
    assert data["NODUS_HEALTH_HOST"] == "0.0.0.0"  # the kubelet probes the pod IP
    gateway = of_kind(rendered, "Deployment")["nodus-gateway"]["spec"]["template"]["spec"]
    env = {e["name"]: e for e in gateway["containers"][0]["env"]}
    # The admin token is never a literal in a manifest: a Secret reference.
    token = {"name": "nodus-gateway", "key": "admin-token"}
    assert env["NODUS_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == token
    assert "value" not in env["NODUS_ADMIN_TOKEN"]
    assert {"NODUS_GATEWAY_TLS_CERT", "NODUS_GATEWAY_TLS_KEY"} <= set(env)


def test_every_module_the_recipes_run_exists() -> None:
    """A misspelt module in a recipe (nodus_sweep) would only show on a real cluster."""
    compose = yaml.safe_load((COMPOSE / "compose.yaml").read_text())
    modules = {s["command"][0] for s in compose["services"].values() if "build" in s}
    modules |= set(CONTROLLERS.values())
    assert "nodus_agent.simulating" in modules
    for module in modules:
        assert importlib.util.find_spec(module) is not None, f"no module {module}"


# -- NATS on Kubernetes: values for the official chart ---------------------------------------------------

# The keys of the chart's values.yaml (nats-io/k8s helm/charts/nats, 1.x) these values may set. Below a
# `merge` key everything is free-form NATS or Kubernetes config, as the chart documents.
CHART_KEYS = {
    "config.cluster.enabled", "config.cluster.replicas", "config.cluster.merge",
    "config.jetstream.enabled", "config.jetstream.merge",
    "config.jetstream.fileStore.enabled", "config.jetstream.fileStore.dir",
    "config.jetstream.fileStore.maxSize",
    "config.jetstream.fileStore.pvc.enabled", "config.jetstream.fileStore.pvc.size",
    "config.jetstream.fileStore.pvc.storageClassName",
    "config.jetstream.memoryStore.enabled", "config.jetstream.memoryStore.maxSize",
    "config.merge", "container.image.tag", "container.image.repository", "container.merge",
    "podTemplate.topologySpreadConstraints", "podTemplate.merge", "podDisruptionBudget.enabled",
    "configMap.merge", "statefulSet.merge",
}  # fmt: skip


def leaf_paths(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        path = f"{prefix}{key}"
        if key == "merge" or path == "podTemplate.topologySpreadConstraints" or not isinstance(value, dict):
            yield path
        else:
            yield from leaf_paths(value, path + ".")


def test_nats_values_are_a_synced_three_server_jetstream_cluster_on_volumes() -> None:
    values = yaml.safe_load((KUBE / "nats" / "values.yaml").read_text())
    unknown = set(leaf_paths(values)) - CHART_KEYS
    assert not unknown, f"not keys of the NATS chart: {sorted(unknown)}"
    cluster, js = values["config"]["cluster"], values["config"]["jetstream"]
    assert cluster["enabled"] is True and cluster["replicas"] == 3
    assert js["enabled"] is True and js["fileStore"]["enabled"] is True
    assert js["fileStore"]["pvc"]["enabled"] is True and js["fileStore"]["pvc"]["size"]
    assert js["memoryStore"]["enabled"] is False
    assert js["merge"]["sync_interval"] == "always"
    assert values["config"]["merge"]["$include"] == "accounts.conf"
    major, minor = map(int, values["container"]["image"]["tag"].split("-")[0].split(".")[:2])
    assert (major, minor) >= (2, 11), "per-message TTL (leases) needs nats-server 2.11"


def test_the_real_nats_server_accepts_the_jetstream_settings_of_the_values(tmp_path: Path) -> None:
    """The chart writes `config.jetstream.merge` into the server's jetstream block: the same block,
    written by hand, must pass `nats-server -t` (an unknown or malformed key fails it)."""
    values = yaml.safe_load((KUBE / "nats" / "values.yaml").read_text())
    js = values["config"]["jetstream"]
    lines = [f"  store_dir: {js['fileStore']['dir']}"]
    lines += [f"  {k}: {v}" for k, v in js["merge"].items()]
    conf = tmp_path / "nats.conf"
    conf.write_text("jetstream {\n" + "\n".join(lines) + "\n}\n")
    done = run(nats_server(), "-t", "-c", str(conf))
    assert done.returncode == 0, done.stderr


# -- compose ---------------------------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((COMPOSE / "compose.yaml").read_text()))


def nats_server() -> str:
    return tool("nats-server", BIN)


def test_compose_validates_against_the_compose_specification(tmp_path: Path) -> None:
    checker = tool("check-jsonschema", BIN)
    done = run(checker, "--builtin-schema", "vendor.compose-spec", str(COMPOSE / "compose.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    # The same check rejects a misspelt key: it really validates (offline, from its vendored schema).
    bad = tmp_path / "compose.yaml"
    bad.write_text((COMPOSE / "compose.yaml").read_text().replace("stop_grace_period:", "stop_grace:"))
    rejected = run(checker, "--builtin-schema", "vendor.compose-spec", str(bad))
    assert rejected.returncode != 0 and "stop_grace" in rejected.stdout


def nodus_services(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run the Nodus image (built from deploy/Containerfile)."""
    return {name: s for name, s in spec["services"].items() if "build" in s}


def test_every_compose_service_names_all_nats_servers_with_r3_and_is_checked_on_readyz() -> None:
    spec = compose()
    services = nodus_services(spec)
    assert {"gateway-1", "gateway-2", "sweeps", "scheduler", "billing", "sim-fleet"} <= set(services)
    for name, s in services.items():
        env = s["environment"]
        hosts = [u.removeprefix("nats://") for u in env["NODUS_NATS_URL"].split(",")]
        assert hosts == [f"{h}:4222" for h in NATS_SERVERS], name
        assert env["NODUS_STREAM_REPLICAS"] == "3", name
        assert s["healthcheck"]["test"][0] == "CMD", name
        probe = " ".join(s["healthcheck"]["test"])
        assert f"127.0.0.1:{env['NODUS_HEALTH_PORT']}/readyz" in probe, name
        assert s["build"]["dockerfile"] == "deploy/Containerfile", name
        assert (COMPOSE / s["build"]["context"] / s["build"]["dockerfile"]).is_file(), name
        # Its own seed as /run/secrets/nats-seed, from a secret of the same service.
        (seed,) = [x for x in s["secrets"] if x["target"] == "nats-seed"]
        assert env["NODUS_NATS_NKEY_SEED"] == "/run/secrets/nats-seed", name
        assert seed["source"] in spec["secrets"], name
        # ... and no other service's (the two gateways are one service, one identity).
        sharing = {n for n, x in services.items() if x["secrets"] == s["secrets"]}
        assert sharing <= {name, "gateway-1", "gateway-2"}, name


def test_compose_runs_two_of_everything_a_simulated_fleet_and_a_published_gateway() -> None:
    services = nodus_services(compose())
    for name in ("sweeps", "scheduler", "billing"):
        assert services[name]["deploy"]["replicas"] == 2, name
    for name, host_port in (("gateway-1", "8440"), ("gateway-2", "8441")):
        assert services[name]["command"] == ["nodus_gateway"]
        (port,) = services[name]["ports"]
        assert port.split(":")[-2:] == [host_port, services[name]["environment"]["NODUS_GATEWAY_PORT"]]
    assert services["sim-fleet"]["command"] == ["nodus_agent.simulating"]
    assert int(services["sim-fleet"]["environment"]["NODUS_FLEET_NODES"].strip("${}").split("-")[-1]) > 0


def test_compose_runs_three_official_nats_servers_and_seaweedfs_with_s3() -> None:
    spec = compose()
    for name in NATS_SERVERS:
        s = spec["services"][name]
        image, tag = s["image"].rsplit(":", 1)
        assert image.endswith("library/nats")
        assert tuple(map(int, tag.split("-")[0].split(".")[:2])) >= (2, 11), name
        assert f"./nats/{name}.conf:/etc/nats/nats-server.conf:ro" in s["volumes"], name
        # accounts.conf lands beside the config, where its `include ./accounts.conf` looks.
        (accounts,) = s["secrets"]
        assert accounts["target"] == "/etc/nats/accounts.conf"
        assert "/healthz" in " ".join(s["healthcheck"]["test"])
    weed = spec["services"]["seaweedfs"]
    assert weed["image"].split(":")[0].endswith("chrislusf/seaweedfs")
    assert weed["command"][0] == "server" and "-s3" in weed["command"]


def nats_conf_blocks(text: str) -> dict[str, str]:
    """The top-level `name { ... }` blocks of a NATS config (no nested braces in ours)."""
    return {m[1]: m[2] for m in re.finditer(r"^(\w+)\s*\{(.*?)^\}", text, re.S | re.M)}


@pytest.mark.parametrize("server", NATS_SERVERS)
def test_each_nats_config_syncs_always_routes_to_all_three_and_parses(tmp_path: Path, server: str) -> None:
    text = (COMPOSE / "nats" / f"{server}.conf").read_text()
    code = "\n".join(line.split("#")[0] for line in text.splitlines())
    assert re.search(rf"^server_name:\s*{server}$", code, re.M)
    blocks = nats_conf_blocks(code)
    assert re.search(r"^\s*sync_interval:\s*always$", blocks["jetstream"], re.M), server
    routes = re.findall(r"nats://([\w-]+):6222", blocks["cluster"])
    assert routes == list(NATS_SERVERS), server
    assert re.search(r"^include \./accounts\.conf$", code, re.M)
    # The real server parses it, with an accounts file beside it as the compose secret puts one.
    shutil.copy(COMPOSE / "nats" / f"{server}.conf", tmp_path / "nats-server.conf")
    (tmp_path / "accounts.conf").write_text(
        "accounts {\n  NODUS { jetstream: enabled, users: [ {user: probe, password: probe} ] }\n"
        "  SYS { users: [ {user: sys, password: sys} ] }\n}\nsystem_account: SYS\n"
    )
    done = run(nats_server(), "-t", "-c", str(tmp_path / "nats-server.conf"))
    assert done.returncode == 0, done.stderr
    # Without the accounts file the server refuses to start: no silent fall-back to no authentication.
    (tmp_path / "accounts.conf").unlink()
    assert run(nats_server(), "-t", "-c", str(tmp_path / "nats-server.conf")).returncode != 0


def test_the_containerfile_builds_every_service_from_the_lock() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    assert re.findall(r"^FROM (\S+)", text, re.M) == ["python:3.11-slim", "python:3.11-slim"]
    assert "uv sync --frozen --all-packages --no-dev" in text
    assert re.search(r"^USER 10001", text, re.M)  # numeric: runAsNonRoot can check it
    assert "NOT BUILT IN CI" in text


# -- the node agent under systemd ------------------------------------------------------------------------


def test_the_agent_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """`systemd-analyze verify` reads the unit as systemd would. The only thing it may say about the
    original is that the agent's binary is missing on this machine; with ExecStart pointed at a binary
    that exists (same arguments), it must say nothing at all."""
    analyze = tool("systemd-analyze")
    original = (AGENT / "nodus-agent.service").read_text()
    exec_start = re.search(r"^ExecStart=(\S+)(.*)$", original, re.M)
    assert exec_start is not None
    as_shipped = tmp_path / "shipped" / "nodus-agent.service"
    as_shipped.parent.mkdir()
    as_shipped.write_text(original)
    done = run(analyze, "verify", str(as_shipped))
    complaints = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert all(f"{exec_start[1]} is not executable" in line for line in complaints), complaints

    unit = tmp_path / "nodus-agent.service"
    unit.write_text(original.replace(exec_start[0], f"ExecStart=/bin/true{exec_start[2]}"))
    done = run(analyze, "verify", str(unit))
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr
    # A setting systemd cannot read is only a warning (exit 0), which is why the output must be empty:
    # this check does see one.
    broken = tmp_path / "broken" / "nodus-agent.service"
    broken.parent.mkdir()
    broken.write_text(unit.read_text().replace("KillMode=mixed", "KillMode=sometimes"))
    assert "kill mode specification, ignoring: sometimes" in run(analyze, "verify", str(broken)).stderr


def test_the_installer_and_gpu_check_are_valid_bash() -> None:
    for script in ("install.sh", "gpu-check.sh"):
        done = run("bash", "-n", str(AGENT / script))
        assert done.returncode == 0, f"{script}: {done.stderr}"


def test_the_installer_and_gpu_check_pass_shellcheck() -> None:
    shellcheck = tool("shellcheck")
    done = run(shellcheck, "--severity=info", str(AGENT / "install.sh"), str(AGENT / "gpu-check.sh"))
    assert done.returncode == 0, done.stdout
