"""The real kubectl against a real gateway, for Pipelines (issue #22): api-resources, apply, get (the Table),
explain, patch, delete. The gateway, its TLS and the kubeconfig are test_kubectl.py's."""

from __future__ import annotations

import json

from tests.gateway.test_kubectl import Kubectl, gateway, kubectl, pytestmark, tls

__all__ = ["gateway", "kubectl", "pytestmark", "tls"]  # the fixtures and marks this module runs with

PIPELINE = """\
apiVersion: nodus.dev/v1
kind: Pipeline
metadata:
  name: {name}
spec:
  maxCostUSD: "{cap}"
  stages:
  - name: prepare
    template:
      job:
        image: busybox
        command: ["true"]
        resources:
          gpu: "H100:1"
        outputs:
        - name: data
          path: /nodus/outputs/data
  - name: train
    dependsOn: [prepare]
    template:
      job:
        image: busybox
        command: ["true"]
        resources:
          gpu: "H100:1"
        inputs:
        - name: data
          fromStage: {{stage: prepare, output: data}}
"""


def manifest(kubectl: Kubectl, name: str, cap: str) -> str:
    path = kubectl.workdir / f"{name}-{cap}.yaml"
    path.write_text(PIPELINE.format(name=name, cap=cap))
    return str(path)


async def test_api_resources_and_explain(kubectl: Kubectl) -> None:
    listed = (await kubectl("api-resources", "--api-group=nodus.dev", "-o", "wide")).stdout.splitlines()
    row = next(line.split() for line in listed if line.startswith("pipelines "))
    assert row[:5] == ["pipelines", "pl", "nodus.dev/v1", "true", "Pipeline"]
    assert row[-1] == "all,nodus"
    explained = (await kubectl("explain", "pipelines.spec.stages")).stdout
    assert "KIND:       Pipeline" in explained and "dependsOn" in explained


async def test_apply_get_patch_delete(kubectl: Kubectl, unique: str) -> None:
    ns = ["-n", unique]
    first = await kubectl("apply", "-f", manifest(kubectl, "tune", "10"), *ns)
    assert first.stdout.strip() == "pipeline.nodus.dev/tune created"
    table = (await kubectl("get", "pl", *ns)).stdout.splitlines()
    assert table[0].split() == ["NAME", "STAGES", "PHASE", "COST", "AGE"]
    assert table[1].split()[:4] == ["tune", "0/2", "Pending", "-"]
    assert "tune" in (await kubectl("get", "all", *ns)).stdout

    again = await kubectl("apply", "-f", manifest(kubectl, "tune", "20"), *ns)
    assert again.stdout.strip() == "pipeline.nodus.dev/tune configured"
    got = json.loads((await kubectl("get", "pipeline", "tune", "-o", "json", *ns)).stdout)
    assert (got["spec"]["maxCostUSD"], got["metadata"]["generation"]) == ("20", 2)

    stages = got["spec"]["stages"]
    stages[1]["dependsOn"] = []
    refused = await kubectl(
        "patch", "pl", "tune", "--type=merge", "-p", json.dumps({"spec": {"stages": stages}}), *ns, ok=False
    )
    assert refused.returncode == 1 and "Pipeline" in refused.stderr and "invalid" in refused.stderr

    deleted = await kubectl("delete", "pl", "tune", *ns)
    assert deleted.stdout.strip() == 'pipeline.nodus.dev "tune" deleted'
    missing = await kubectl("get", "pl", "tune", *ns, ok=False)
    assert 'pipelines.nodus.dev "tune" not found' in missing.stderr
