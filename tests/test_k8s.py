"""GPU step pods: the real V1Job dagster-k8s builds from our asset tags, validated against the Kubernetes schema."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import kubernetes
import kubernetes_validate
import pytest
from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig, construct_dagster_k8s_job

from alpha_assets.definitions import defs
from alpha_assets.execution import GPU_STEP_TAGS, executor

K8S_VERSION = "1.30.0"


def step_job(op_tags: dict) -> dict:
    job = construct_dagster_k8s_job(
        DagsterK8sJobConfig(job_image="training:latest", dagster_home="/opt/dagster/dagster_home",
                            image_pull_policy="IfNotPresent"),
        args=["dagster", "api", "execute_step"], job_name="dagster-step-abc",
        user_defined_k8s_config=UserDefinedDagsterK8sConfig.from_dict(op_tags["dagster-k8s/config"]),
    )
    return kubernetes.client.ApiClient().sanitize_for_serialization(job)


@pytest.mark.parametrize("asset", ["checkpoints/perception", "checkpoints/tft", "checkpoints/ppo", "hyperopt/mamba2"])
def test_gpu_assets_build_a_one_gpu_pod_on_the_training_pool(asset):
    node = defs.resolve_asset_graph().get(dg.AssetKey.from_user_string(asset))
    config = node.assets_def.op.tags["dagster-k8s/config"]  # dagster stores a dict tag as JSON
    manifest = step_job({"dagster-k8s/config": json.loads(config) if isinstance(config, str) else config})
    pod = manifest["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["nodeSelector"] == {"k8s.scaleway.com/pool-name": "gpu-training"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["data"]["mountPath"] == "/data" and mounts["data"]["readOnly"] is True
    assert mounts["output"]["mountPath"] == "/output" and mounts["dshm"]["mountPath"] == "/dev/shm"
    claims = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in pod["volumes"]}
    assert claims["data"] == "training-data-pvc" and claims["output"] == "training-output-pvc"
    assert node.assets_def.op.pool == "gpu"
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def test_data_assets_stay_off_the_gpu_pool():
    node = defs.resolve_asset_graph().get(dg.AssetKey("book_sidecars"))
    assert "dagster-k8s/config" not in node.assets_def.op.tags


def test_executor_is_chosen_by_environment(monkeypatch):
    assert executor().name == "multiprocess"
    monkeypatch.setenv("ALPHA_EXECUTOR", "k8s")
    assert executor().name == "k8s"


def test_gpu_tags_are_op_level_config():
    assert set(GPU_STEP_TAGS["dagster-k8s/config"]) == {"container_config", "pod_spec_config", "job_spec_config"}


def test_every_manifest_under_deploy_validates():
    import yaml

    manifests = sorted((Path(__file__).resolve().parents[1] / "deploy" / "k8s").glob("*.yaml"))
    assert [m.name for m in manifests] == ["training-data-pvc.yaml", "training-output-pvc.yaml"]
    for path in manifests:
        doc = yaml.safe_load(path.read_text())
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert yaml.safe_load(manifests[1].read_text())["spec"]["accessModes"] == ["ReadWriteMany"]
