"""Production pods, built the way the cluster builds them and validated against the Kubernetes schema.

Run workers and step pods are the real V1Jobs dagster-k8s constructs from deploy/dagster.yaml's run launcher, the code
location's container context (deploy/helm/values.yaml) and the assets' op tags; the webserver, daemon and code server
pods are assembled from the Helm values the chart puts into them. Every pod must keep the hardening of deploy/README.md.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import dagster as dg
import kubernetes
import kubernetes_validate
import pytest
import yaml
from dagster_k8s.container_context import K8sContainerContext
from dagster_k8s.job import UserDefinedDagsterK8sConfig, construct_dagster_k8s_job

from alpha_assets import training_assets
from alpha_assets.definitions import defs
from alpha_assets.execution import CPU_TRAINING_POOL, GPU_POOL, GPU_STEP_TAGS, executor, placement
from alpha_core.errors import PlanError

K8S_VERSION = "1.30.0"
DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
SHA = "0123456789abcdef0123456789abcdef01234567"  # a commit, as CI substitutes it for ${CI_COMMIT_SHA}
UID = 10001  # the Dockerfile's user
GPU_ASSETS = ["checkpoints/perception", "checkpoints/tft", "hyperopt/mamba2"]
CPU_TRAINING_ASSETS = ["checkpoints/ppo", "checkpoints/dqn", "hyperopt/dqn"]  # RL: deploy/README.md, which model where
CPU_ASSETS = ["book_sidecars", "fold_plans", "ensemble_report"]


@pytest.fixture(scope="module")
def ci() -> dict:
    return yaml.safe_load((DEPLOY / "gitlab-ci-training.yml").read_text())


@pytest.fixture(scope="module")
def values(ci, tmp_path_factory) -> dict:
    """deploy/helm/values.yaml as the CI deploy job renders it for commit SHA (its own `sed` line, run here)."""
    (line,) = [cmd for cmd in ci["deploy"]["script"] if cmd.startswith("sed ")]
    work = tmp_path_factory.mktemp("ci-deploy")
    shutil.copytree(DEPLOY / "helm", work / "deploy" / "helm")
    subprocess.run(["bash", "-c", line], cwd=work, env={"CI_COMMIT_SHA": SHA, "PATH": "/usr/bin:/bin"}, check=True)
    rendered = (work / "values.rendered.yaml").read_text()
    assert "${" not in rendered, "a placeholder survived the CI rendering"
    return yaml.safe_load(rendered)


@pytest.fixture(scope="module")
def instance_config() -> dict:
    return yaml.safe_load((DEPLOY / "dagster.yaml").read_text())


@pytest.fixture(scope="module")
def run_launcher(instance_config, tmp_path_factory):
    """The real K8sRunLauncher from deploy/dagster.yaml (a kubeconfig that points nowhere instead of in-cluster)."""
    home = tmp_path_factory.mktemp("dagster-home")
    kubeconfig = home / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "none",
        "clusters": [{"name": "none", "cluster": {"server": "https://127.0.0.1:9"}}],
        "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
        "users": [{"name": "none", "user": {}}],
    }))
    launcher = instance_config["run_launcher"]
    config = {**launcher["config"], "load_incluster_config": False, "kubeconfig_file": str(kubeconfig)}
    (home / "dagster.yaml").write_text(yaml.safe_dump({"run_launcher": {**launcher, "config": config}}))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        yield instance.run_launcher


def code_location_context(deployment: dict) -> K8sContainerContext:
    """What the chart hands launched runs from a code location (includeConfigInLaunchedRuns, the chart's
    `dagsterUserDeployments.k8sContainerContext`): pull policy, env, secrets, volumes, mounts and resources."""
    assert deployment["includeConfigInLaunchedRuns"]["enabled"] is True
    return K8sContainerContext.create_from_config({"k8s": {
        "image_pull_policy": deployment["image"]["pullPolicy"],
        "env_secrets": [s["name"] for s in deployment.get("envSecrets", [])],
        "env": deployment.get("env", []),
        "volumes": deployment.get("volumes", []),
        "volume_mounts": deployment.get("volumeMounts", []),
        "resources": deployment.get("resources", {}),
        "run_k8s_config": {"pod_spec_config": {"automount_service_account_token": True}},
    }})


def image_of(image: dict) -> str:
    return f"{image['repository']}:{image['tag']}"


def build_job(run_launcher, context: K8sContainerContext, name: str, component: str, image: str) -> dict:
    job = construct_dagster_k8s_job(
        context.get_k8s_job_config(job_image=image, run_launcher=run_launcher), args=["dagster", "api"],
        job_name=name, component=component, user_defined_k8s_config=context.run_k8s_config,
    )
    return kubernetes.client.ApiClient().sanitize_for_serialization(job)


def op_tags(asset: str) -> dict:
    node = defs.resolve_asset_graph().get(dg.AssetKey.from_user_string(asset))
    config = node.assets_def.op.tags.get("dagster-k8s/config", {})
    return json.loads(config) if isinstance(config, str) else config  # dagster stores a dict tag as JSON


@pytest.fixture(scope="module")
def jobs(values, run_launcher) -> dict[str, dict]:
    """The run-worker Job and one step Job per asset, as the K8sRunLauncher and the k8s executor build them."""
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    image = image_of(deployment["image"])
    run = dg.DagsterRun(job_name="__ASSET_JOB", run_id="0f1e2d3c")
    context = K8sContainerContext.create_for_run(run, run_launcher, include_run_tags=False).merge(
        code_location_context(deployment))
    out = {"run-worker": build_job(run_launcher, context, "dagster-run-0f1e2d3c", "run_worker", image)}
    for asset in GPU_ASSETS + CPU_TRAINING_ASSETS + CPU_ASSETS:
        step = context.merge(K8sContainerContext(run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(op_tags(asset))))
        out[f"step:{asset}"] = build_job(run_launcher, step, "dagster-step-abc", "step_worker", image)
    return out


def pod_spec(manifest: dict) -> dict | None:
    """The pod template of any workload manifest (None for objects without pods)."""
    spec = manifest.get("spec", {})
    if manifest["kind"] == "Pod":
        return spec
    if manifest["kind"] == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]["spec"]
    return spec.get("template", {}).get("spec")


def k8s_manifests() -> dict[str, dict]:
    return {f"{p.name}#{i}": doc for p in sorted((DEPLOY / "k8s").glob("*.yaml"))
            for i, doc in enumerate(yaml.safe_load_all(p.read_text())) if doc}


@pytest.fixture(scope="module")
def pods(values, jobs) -> dict[str, dict]:
    """Every pod of the deployment: the chart's (the parts our values set), run workers, steps, deploy/k8s workloads."""
    components = {"webserver": values["dagsterWebserver"], "daemon": values["dagsterDaemon"]}
    components |= {f"code-server:{d['name']}": d for d in values["dagster-user-deployments"]["deployments"]}
    out = {}
    for name, c in components.items():
        container = {"name": "main", "image": image_of(c["image"]), "imagePullPolicy": c["image"]["pullPolicy"],
                     "securityContext": c["securityContext"], "resources": c["resources"],
                     "volumeMounts": c.get("volumeMounts", []), "env": c.get("env", [])}
        spec = {"securityContext": c["podSecurityContext"], "containers": [container], "volumes": c.get("volumes", [])}
        manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name.replace(":", "-")}, "spec": spec}
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
        out[name] = spec
    out |= {name: job["spec"]["template"]["spec"] for name, job in jobs.items()}
    out |= {name: spec for name, doc in k8s_manifests().items() if (spec := pod_spec(doc)) is not None}
    return out


@pytest.mark.parametrize("asset", GPU_ASSETS)
def test_gpu_assets_build_a_one_gpu_pod_on_the_training_pool(asset, jobs):
    manifest = jobs[f"step:{asset}"]
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
    node = defs.resolve_asset_graph().get(dg.AssetKey.from_user_string(asset))
    assert node.assets_def.op.pool == GPU_POOL


def default_device(asset: str) -> str | None:
    """The `device` default of an asset's config, as the Launchpad and a run config without it get it."""
    op = defs.resolve_asset_graph().get(dg.AssetKey.from_user_string(asset)).assets_def.op
    return op.config_schema.config_type.fields["device"].default_value


@pytest.mark.parametrize("asset", CPU_TRAINING_ASSETS)
def test_rl_assets_build_a_cpu_pod_on_the_cpu_training_pool(asset, jobs):
    pod = jobs[f"step:{asset}"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    resources = container["resources"]
    assert "nvidia.com/gpu" not in resources["requests"] and "nvidia.com/gpu" not in resources["limits"]
    assert resources["requests"]["cpu"] == "15" and "cpu" not in resources["limits"]  # no throttling
    assert pod["nodeSelector"] == {"k8s.scaleway.com/pool-name": "cpu-training"}
    assert pod["tolerations"] == [{"key": "alpha/cpu-training", "operator": "Exists", "effect": "NoSchedule"}]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["data"]["readOnly"] is True and mounts["output"]["mountPath"] == "/output"
    node = defs.resolve_asset_graph().get(dg.AssetKey.from_user_string(asset))
    assert node.assets_def.op.pool == CPU_TRAINING_POOL  # not a slot of the `gpu` pool (MAX_PARALLEL)
    assert default_device(asset) == "cpu"
    assert default_device(GPU_ASSETS[1]) is None  # a GPU step: cuda when available


def test_a_model_goes_back_to_the_gpu_by_environment(monkeypatch):
    """ALPHA_GPU_MODELS, set on the code location, moves an RL model's steps to GPU pods; a typo is a clear error."""
    assert placement("dqn").pool == CPU_TRAINING_POOL and placement("tft").pool == GPU_POOL
    monkeypatch.setenv("ALPHA_GPU_MODELS", "dqn")
    assert placement("dqn").pool == GPU_POOL and placement("ppo").pool == CPU_TRAINING_POOL
    asset = training_assets._checkpoint_asset("dqn")
    assert asset.op.pool == GPU_POOL
    assert json.loads(asset.op.tags["dagster-k8s/config"]) == GPU_STEP_TAGS["dagster-k8s/config"]
    assert asset.op.config_schema.config_type.fields["device"].default_value is None
    monkeypatch.setenv("ALPHA_GPU_MODELS", "dqn,dnq")
    with pytest.raises(PlanError, match="ALPHA_GPU_MODELS: unknown model dnq"):
        placement("dqn")


def test_every_job_validates_against_the_kubernetes_schema(jobs):
    for manifest in jobs.values():
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def test_step_and_run_jobs_leave_retries_to_dagster(jobs):
    """Kubernetes never restarts a failed pod: Dagster's RetryPolicy relaunches a pre-empted GPU step as a new Job."""
    assert {name: job["spec"]["backoffLimit"] for name, job in jobs.items()} == dict.fromkeys(jobs, 0)
    assert all(job["spec"]["template"]["spec"]["restartPolicy"] == "Never" for job in jobs.values())


def test_every_pod_runs_as_non_root_with_a_read_only_root(pods):
    assert {"webserver", "daemon", "code-server:alpha", "run-worker", "step:book_sidecars"} <= set(pods)
    for name, pod in pods.items():
        context = pod.get("securityContext") or {}
        assert context.get("runAsNonRoot") is True, name
        assert context.get("runAsUser") == UID and context.get("fsGroup") == UID, name
        assert context.get("seccompProfile") == {"type": "RuntimeDefault"}, name
        for container in pod["containers"] + pod.get("initContainers", []):
            sc = container.get("securityContext") or {}
            assert sc.get("runAsNonRoot") is True and sc.get("runAsUser") == UID, (name, container["name"])
            assert sc.get("allowPrivilegeEscalation") is False and sc.get("privileged") is False, name
            assert sc.get("readOnlyRootFilesystem") is True, name
            assert sc.get("capabilities") == {"drop": ["ALL"]}, name
            assert sc.get("seccompProfile") == {"type": "RuntimeDefault"}, name


def image_env() -> dict[str, str]:
    """The ENV of deploy/Dockerfile."""
    dockerfile = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")  # join continued lines
    return dict(re.findall(r"([A-Z_]+)=(\S+)", " ".join(re.findall(r"^ENV (.*)$", dockerfile, re.M))))


WRITTEN = ("DAGSTER_HOME", "HOME", "XDG_CACHE_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "MPLCONFIGDIR")


def test_writable_paths_are_empty_dirs_and_mounts_are_unique(pods):
    """Where a process writes besides /output (/tmp, DAGSTER_HOME, home and the compile caches) is an emptyDir; the
    training steps' compile caches are on /output, shared so that one pod compiles for all."""
    assert set(WRITTEN) <= set(image_env())
    for name, pod in pods.items():
        volumes = [v["name"] for v in pod.get("volumes", [])]
        assert len(volumes) == len(set(volumes)), (name, volumes)
        empty = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
        for container in pod["containers"]:
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            assert len(mounts) == len(container.get("volumeMounts", [])), (name, mounts)
            assert set(mounts.values()) <= set(volumes), name
            if container["image"].startswith("rg.fr-par.scw.cloud/"):  # our image: its ENV, then the pod's env
                env = image_env() | {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
                paths = {"/tmp", *(env[k] for k in WRITTEN)}
            else:  # Dagster's webserver and daemon
                paths = {"/tmp", "/opt/dagster/dagster_home"}
            for path in paths:
                mount = max((m for m in mounts if path == m or path.startswith(m + "/")), key=len, default=None)
                shared_cache = mount == "/output" and path.startswith("/output/.cache/")
                assert mount is not None and (mounts[mount] in empty or shared_cache), f"{name}: {path} is not on an emptyDir"


def test_every_container_has_requests_and_limits(pods):
    for name, pod in pods.items():
        for container in pod["containers"]:
            resources = container.get("resources") or {}
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), name
            assert "memory" in resources.get("limits", {}), name
            if "nvidia.com/gpu" in resources.get("requests", {}):
                assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"], name


def test_images_are_pinned_and_pulled_accordingly(pods, values, ci):
    """No :latest anywhere in deploy/; IfNotPresent only for commit-SHA tags (immutable), Always for any other tag."""
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file()):
        assert ":latest" not in path.read_text(), path
    for name, pod in pods.items():
        for container in pod["containers"]:
            tag = container["image"].rpartition(":")[2]
            assert "/" not in tag and tag != "latest", (name, container["image"])
            expected = "IfNotPresent" if re.fullmatch(r"[0-9a-f]{40}", tag) else "Always"
            assert container["imagePullPolicy"] == expected, (name, container["image"])
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    assert image_of(deployment["image"]) == f"{ci['variables']['TRAINING_IMAGE']}:{SHA}"
    assert {"name": "ALPHA_TRAINING_IMAGE", "value": image_of(deployment["image"])} in deployment["env"]
    for image in (values["postgresql"]["image"], values["busybox"]["image"]):  # the chart's helper images
        assert image["tag"] != "latest" and image["pullPolicy"] == "Always"


def test_ci_builds_pushes_and_runs_the_commit_image(ci):
    tagged = '"$TRAINING_IMAGE:$CI_COMMIT_SHA"'
    build = ci["build-image"]["script"]
    assert any(cmd.startswith("docker build") and f"-t {tagged}" in cmd for cmd in build)
    assert f"docker push {tagged}" in build
    assert ci["deploy"]["needs"] == ["build-image"] and ci["train"]["needs"] == ["deploy"]
    assert ci["train"]["image"] == "$TRAINING_IMAGE:$CI_COMMIT_SHA"
    assert any("helm upgrade --install" in cmd and "values.rendered.yaml" in cmd for cmd in ci["deploy"]["script"])


def password_literals(node, path="") -> list[str]:
    """Paths of every non-empty string under a password key (`postgresqlPassword`, not `..._password_secret`)."""
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in password_literals(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in password_literals(v, f"{path}[{i}]")]
    return [path] if path.rpartition(".")[2].lower().endswith("password") and isinstance(node, str) and node else []


def test_postgres_password_comes_from_a_secret(values, instance_config, jobs):
    secret = values["global"]["postgresqlSecretName"]
    assert secret and values["generatePostgresqlPasswordSecret"] is False  # an existing Secret, never a chart default
    assert password_literals(values) == [] and password_literals(instance_config) == []
    assert instance_config["storage"]["postgres"]["postgres_db"]["password"] == {"env": "DAGSTER_PG_PASSWORD"}
    for name, job in jobs.items():
        (container,) = job["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["DAGSTER_PG_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": secret, "key": "postgresql-password"}
        assert "value" not in env["DAGSTER_PG_PASSWORD"], name


def test_helm_run_launcher_matches_the_reference_instance(values, instance_config):
    """deploy/dagster.yaml is what the chart renders from values.yaml's runLauncher: the two must not drift apart."""
    helm = values["runLauncher"]["config"]["k8sRunLauncher"]
    ref = instance_config["run_launcher"]["config"]
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert helm["securityContext"] == ref["security_context"]
    assert helm["runK8sConfig"]["podSpecConfig"] == ref["run_k8s_config"]["pod_spec_config"]
    assert helm["runK8sConfig"]["jobSpecConfig"] == ref["run_k8s_config"]["job_spec_config"]
    assert (helm["imagePullPolicy"], helm["jobNamespace"]) == (ref["image_pull_policy"], ref["job_namespace"])
    assert values["global"]["postgresqlSecretName"] == ref["postgres_password_secret"]
    assert values["global"]["dagsterHome"] == ref["dagster_home"]


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
    manifests = k8s_manifests()
    assert sorted(manifests) == ["training-data-pvc.yaml#0", "training-output-pvc.yaml#0"]
    for doc in manifests.values():
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert manifests["training-output-pvc.yaml#0"]["spec"]["accessModes"] == ["ReadWriteMany"]
