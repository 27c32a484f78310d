"""Production pods, built the way the cluster builds them and validated against the Kubernetes schema.

Run workers and step pods are the real V1Jobs dagster-k8s constructs from deploy/dagster.yaml's run launcher, the code
location's container context (deploy/helm/values.yaml), the executor's step config and the assets' op tags; the
webserver, daemon and code server pods are assembled from the Helm values the chart puts into them; deploy/k8s/ is
rendered as CI renders it. Every pod must keep the hardening and the least privilege of deploy/README.md.
"""

from __future__ import annotations

import ast
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import cel
import dagster as dg
import kubernetes
import kubernetes_validate
import pytest
import yaml
from dagster_k8s.container_context import K8sContainerContext
from dagster_k8s.job import UserDefinedDagsterK8sConfig, construct_dagster_k8s_job

from alpha_assets.definitions import defs
from alpha_assets.defs import checkpoints
from alpha_assets.execution import CPU_TRAINING_POOL, GPU_POOL, executor, placement
from alpha_assets.pod_spec import GPU_STEP_TAGS
from alpha_core.errors import PlanError

K8S_VERSION = "1.30.0"
REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
sys.path.insert(0, str(DEPLOY))
import check_images  # noqa: E402  (deploy/check_images.py: CI's refusal of unpinned images)

PG_CIDR, API_CIDR = "10.1.2.3/32", "51.15.0.10/32"  # CI variables DAGSTER_PG_CIDR, K8S_API_CIDR, as a deploy sets them
SHA = "0123456789abcdef0123456789abcdef01234567"  # a commit, as CI substitutes it for ${CI_COMMIT_SHA}
UID = 10001  # the Dockerfile's user
GPU_ASSETS = ["checkpoints/perception", "checkpoints/tft", "hyperopt/mamba2"]
CPU_TRAINING_ASSETS = ["checkpoints/ppo", "checkpoints/dqn", "hyperopt/dqn"]  # RL: deploy/README.md, which model where
CPU_ASSETS = ["raw_dbn", "book_sidecars", "fold_plans", "ensemble_report"]
FETCH_STEP = "step:raw_dbn"  # the one pod with the Databento key and the internet (deploy/k8s/databento-fetch.yaml)


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


def render_k8s(ci: dict, work: Path) -> dict[str, dict]:
    """deploy/k8s/*.yaml as CI's deploy job renders them (its own `for ... sed` line, run here): name#i -> object."""
    (line,) = [cmd for cmd in ci["deploy"]["script"] if cmd.startswith("for f in deploy/k8s/")]
    shutil.copytree(DEPLOY / "k8s", work / "deploy" / "k8s")
    env = {"DAGSTER_PG_CIDR": PG_CIDR, "K8S_API_CIDR": API_CIDR, "PATH": "/usr/bin:/bin"}
    subprocess.run(["bash", "-c", line], cwd=work, env=env, check=True)
    rendered = (work / "k8s.rendered.yaml").read_text()
    assert "${" not in rendered, "a placeholder survived the CI rendering"
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


@pytest.fixture(scope="module")
def manifests(ci, tmp_path_factory) -> dict[str, dict]:
    return render_k8s(ci, tmp_path_factory.mktemp("ci-k8s"))


@pytest.fixture(scope="module")
def accounts(manifests) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in manifests.values() if d["kind"] == "ServiceAccount"}


def bound_rules(manifests: dict, account: str) -> list[dict]:
    """The rules deploy/k8s grants a ServiceAccount through RoleBindings (and whether any ClusterRoleBinding names it)."""
    roles = {d["metadata"]["name"]: d["rules"] for d in manifests.values() if d["kind"] == "Role"}
    out = []
    for d in manifests.values():
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding") and any(
            s.get("kind") == "ServiceAccount" and s["name"] == account for s in d.get("subjects", [])
        ):
            assert d["kind"] == "RoleBinding", f"{d['metadata']['name']}: no cluster-wide grant"
            out += roles[d["roleRef"]["name"]]
    return out


@pytest.fixture(scope="module")
def instance_config() -> dict:
    return yaml.safe_load((DEPLOY / "dagster.yaml").read_text())


@pytest.fixture(scope="module")
def run_launcher(instance_config, tmp_path_factory):
    """The real K8sRunLauncher from deploy/dagster.yaml (a kubeconfig that points nowhere instead of in-cluster)."""
    home = tmp_path_factory.mktemp("dagster-home")
    kubeconfig = home / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "none",
                "clusters": [{"name": "none", "cluster": {"server": "https://127.0.0.1:9"}}],
                "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
                "users": [{"name": "none", "user": {}}],
            }
        )
    )
    launcher = instance_config["run_launcher"]
    config = {**launcher["config"], "load_incluster_config": False, "kubeconfig_file": str(kubeconfig)}
    (home / "dagster.yaml").write_text(yaml.safe_dump({"run_launcher": {**launcher, "config": config}}))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        yield instance.run_launcher


def code_location_context(deployment: dict, values: dict) -> K8sContainerContext:
    """What the chart hands launched runs from a code location (includeConfigInLaunchedRuns, the chart's
    `dagsterUserDeployments.k8sContainerContext`): pull policy, env, secrets, volumes, mounts, resources, and the
    subchart's ServiceAccount with its token turned on."""
    assert deployment["includeConfigInLaunchedRuns"]["enabled"] is True
    return K8sContainerContext.create_from_config(
        {
            "k8s": {
                "image_pull_policy": deployment["image"]["pullPolicy"],
                "env_secrets": [s["name"] for s in deployment.get("envSecrets", [])],
                "env": deployment.get("env", []),
                "volumes": deployment.get("volumes", []),
                "volume_mounts": deployment.get("volumeMounts", []),
                "resources": deployment.get("resources", {}),
                "service_account_name": values["dagster-user-deployments"]["serviceAccount"]["name"],
                "run_k8s_config": {"pod_spec_config": {"automount_service_account_token": True}},
            }
        }
    )


def image_of(image: dict) -> str:
    """The reference the chart renders (the code location's and the Dagster images' template: a digest wins)."""
    return f"{image['repository']}@{image['digest']}" if image.get("digest") else f"{image['repository']}:{image['tag']}"


def step_executor_context() -> K8sContainerContext:
    """The executor's own step config (`step_k8s_config`), from the executor the code location really builds."""
    with mock.patch.dict(os.environ, {"ALPHA_EXECUTOR": "k8s"}):
        config = executor().config_schema.resolve_config({}).value["config"]
    return K8sContainerContext(run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(config["step_k8s_config"]))


# the container args dagster-k8s passes (ExecuteRunArgs / ExecuteStepArgs.get_command_args: the code server's entry
# point `dagster`, then the command; a run's serialized arguments follow, a step's come in DAGSTER_EXECUTE_STEP_ARGS)
ARGS = {
    "run_worker": ["dagster", "api", "execute_run", '{"__class__": "ExecuteRunArgs"}'],
    "step_worker": ["dagster", "api", "execute_step"],
}


def build_job(
    run_launcher, context: K8sContainerContext, name: str, component: str, image: str, labels: dict | None = None
) -> dict:
    job = construct_dagster_k8s_job(
        context.get_k8s_job_config(job_image=image, run_launcher=run_launcher),
        args=ARGS[component],
        job_name=name,
        component=component,
        user_defined_k8s_config=context.run_k8s_config,
        labels=labels,
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
        code_location_context(deployment, values)
    )
    out = {"run-worker": build_job(run_launcher, context, "dagster-run-0f1e2d3c", "run_worker", image)}
    # as K8sStepHandler._get_container_context merges them: the run's context, the executor's, then the op tags
    steps = context.merge(step_executor_context())
    for asset in GPU_ASSETS + CPU_TRAINING_ASSETS + CPU_ASSETS:
        step = steps.merge(K8sContainerContext(run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(op_tags(asset))))
        # the executor labels each step's Job and pod with its step key (dagster_k8s.executor)
        labels = {"dagster/op": asset.replace("/", "__")}
        out[f"step:{asset}"] = build_job(run_launcher, step, "dagster-step-abc", "step_worker", image, labels)
    return out


def pod_spec(manifest: dict) -> dict | None:
    """The pod template of any workload manifest (None for objects without pods)."""
    spec = manifest.get("spec", {})
    if manifest["kind"] == "Pod":
        return spec
    if manifest["kind"] == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]["spec"]
    return spec.get("template", {}).get("spec")


@pytest.fixture(scope="module")
def client_job(tmp_path_factory) -> dict:
    """deploy/ci/alpha-run-job.yaml as deploy/ci/run-remote.sh renders it."""
    text = (DEPLOY / "ci" / "alpha-run-job.yaml").read_text()
    return yaml.safe_load(text.replace("${CI_COMMIT_SHA}", SHA).replace("${JOB_NAME}", "alpha-run-4242"))


# The chart's pod labels (selector labels + component) and ServiceAccounts, as its templates write them
CHART_LABELS = {"app.kubernetes.io/name": "dagster", "app.kubernetes.io/instance": "dagster"}


@pytest.fixture(scope="module")
def workloads(values, jobs, manifests, client_job) -> dict[str, dict]:
    """Every pod of the deployment: the chart's (the parts our values set), run workers, steps, deploy/k8s workloads
    and the CI's run client. Each as {"labels": ..., "spec": ...}, the way NetworkPolicies and admission see them."""
    chart_account = values["serviceAccount"]["name"]
    location_account = values["dagster-user-deployments"]["serviceAccount"]["name"]
    components = {
        "webserver": (values["dagsterWebserver"], "dagster-webserver", chart_account, True),
        "daemon": (values["dagsterDaemon"], "dagster-daemon", chart_account, True),
    }
    components |= {
        f"code-server:{d['name']}": (d, "user-deployments", location_account, None)
        for d in values["dagster-user-deployments"]["deployments"]
    }
    out = {}
    for name, (c, component, account, automount) in components.items():
        container = {
            "name": "main",
            "image": image_of(c["image"]),
            "imagePullPolicy": c["image"]["pullPolicy"],
            "securityContext": c["securityContext"],
            "resources": c["resources"],
            "volumeMounts": c.get("volumeMounts", []),
            "env": c.get("env", []),
        }
        spec = {
            "securityContext": c["podSecurityContext"],
            "containers": [container],
            "volumes": c.get("volumes", []),
            "serviceAccountName": account,
        }
        if automount is not None:  # the webserver's and daemon's templates set it; the code server's does not
            spec["automountServiceAccountToken"] = automount
        manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name.replace(":", "-")}, "spec": spec}
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
        labels = {**CHART_LABELS, "component": component} | ({"deployment": c["name"]} if "name" in c else {})
        out[name] = {"labels": labels, "spec": spec}
    out |= {
        name: {"labels": job["spec"]["template"]["metadata"]["labels"], "spec": job["spec"]["template"]["spec"]}
        for name, job in jobs.items()
    }
    for name, doc in [*manifests.items(), ("ci:alpha-run", client_job)]:
        if (spec := pod_spec(doc)) is not None:
            out[name] = {"labels": doc["spec"]["template"]["metadata"]["labels"], "spec": spec}
    return out


@pytest.fixture(scope="module")
def pods(workloads) -> dict[str, dict]:
    return {name: pod["spec"] for name, pod in workloads.items()}


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
    asset = checkpoints._checkpoint_asset("dqn")
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
            elif "/dagster/" in container["image"]:  # Dagster's webserver and daemon
                paths = {"/tmp", "/opt/dagster/dagster_home"}
            else:  # the authenticating proxy
                paths = {"/tmp"}
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
    """Every container runs an immutable reference: our image by its commit SHA, any other by digest; so every pod
    pulls IfNotPresent. No :latest anywhere in deploy/."""
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file()):
        assert ":latest" not in path.read_text(), path
    for name, pod in pods.items():
        for container in pod["containers"] + pod.get("initContainers", []):
            image = container["image"]
            assert image == f"{ci['variables']['TRAINING_IMAGE']}:{SHA}" or "@sha256:" in image, (name, image)
            assert container["imagePullPolicy"] == "IfNotPresent", (name, image)
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    assert image_of(deployment["image"]) == f"{ci['variables']['TRAINING_IMAGE']}:{SHA}"
    assert {"name": "ALPHA_TRAINING_IMAGE", "value": image_of(deployment["image"])} in deployment["env"]
    for image in (values["postgresql"]["image"], values["busybox"]["image"]):  # the chart's helper images
        assert "@sha256:" in image["tag"] and image["pullPolicy"] == "IfNotPresent"


def test_every_image_is_pinned_by_digest_or_refused_before_deploy(ci):
    """deploy/check_images.py, which CI runs before it deploys anything, finds every third-party image under deploy/
    and refuses each that is not pinned by a sha256 digest. What it refuses today is exactly the digests still to
    be filled in (`@sha256:TO-BE-PINNED`, deploy/README.md): nothing unpinned can reach the cluster."""
    found = {ref.split("@")[0].rsplit(":", 1)[0] for _, ref in check_images.references(DEPLOY)}
    assert {
        "nvidia/cuda",
        "docker",
        "alpine/k8s",
        "docker.io/library/postgres",
        "docker.io/library/busybox",
        "docker.io/dagster/dagster-celery-k8s",
        "quay.io/oauth2-proxy/oauth2-proxy",
        "rg.fr-par.scw.cloud/foxhunt-ci/training",
        "$TRAINING_IMAGE",
    } <= found, found
    refused = check_images.refused(DEPLOY)
    for line in refused:
        assert "@sha256:TO-BE-PINNED: not a sha256 digest" in line, line  # a placeholder, never a bare tag
    assert ci["check-images"]["needs"] == ["build-image"] and ci["deploy"]["needs"] == ["check-images"]
    assert ci["check-images"]["script"] == ["python deploy/check_images.py deploy"]


def test_the_image_check_refuses_mutable_references(tmp_path):
    digest = "sha256:" + "ab" * 32
    deploy = tmp_path / "deploy"
    (deploy / "helm").mkdir(parents=True)
    (deploy / "Dockerfile").write_text(f"FROM --platform=linux/amd64 nvidia/cuda:12.8.1@{digest} AS base\nFROM ubuntu:24.04\n")
    (deploy / "helm" / "values.yaml").write_text(
        yaml.safe_dump(
            {
                "web": {"image": {"repository": "dagster/dagster-celery-k8s", "tag": "1.13.27"}},
                "daemon": {"image": {"repository": "dagster/dagster-celery-k8s", "tag": "1.13.27", "digest": digest}},
                "pg": {"image": {"registry": "docker.io", "repository": "library/postgres", "tag": f"15.10@{digest}"}},
                "env": [
                    {"name": "ALPHA_TRAINING_IMAGE", "value": "rg.fr-par.scw.cloud/foxhunt-ci/training:${CI_COMMIT_SHA}"},
                    {"name": "OTHER_IMAGE", "value": "busybox"},
                ],
                "ci": {
                    "image": "alpine/k8s:1.34.5@sha256:TO-BE-PINNED",
                    "services": ["docker:28-dind", {"name": f"x@{digest}"}],
                },
                "pod": {"containers": [{"image": "quay.io/x/y:latest"}, {"image": f"quay.io/x/y@{digest}"}]},
            }
        )
    )
    lines = check_images.refused(deploy)
    assert [line for line in lines if line.startswith("deploy/Dockerfile")] == [
        "deploy/Dockerfile:2: ubuntu:24.04: the tag '24.04' can be re-pushed: pin it by digest (name:tag@sha256:...)"
    ]
    refused = {line.split(": ", 2)[1]: line for line in lines if line.startswith("deploy/helm/values.yaml")}
    assert sorted(refused) == ["ci.image", "ci.services[0]", "env[1].OTHER_IMAGE", "pod.containers[0].image", "web.image"]
    assert "can be re-pushed" in refused["web.image"] and "placeholder" in refused["ci.image"]
    assert "no tag and no digest" in refused["env[1].OTHER_IMAGE"]
    run = subprocess.run([sys.executable, str(DEPLOY / "check_images.py"), str(deploy)], capture_output=True, text=True)
    assert run.returncode == 1 and "6 image reference(s)" in run.stderr


def test_ci_builds_pushes_and_runs_the_commit_image(ci, client_job):
    tagged = '"$TRAINING_IMAGE:$CI_COMMIT_SHA"'
    build = ci["build-image"]["script"]
    assert any(cmd.startswith("docker build") and f"-t {tagged}" in cmd for cmd in build)
    assert f"docker push {tagged}" in build
    assert ci["deploy"]["needs"] == ["check-images"] and ci["train"]["needs"] == ["deploy"]
    assert ci["train"]["script"] == ["deploy/ci/run-remote.sh"]  # alpha run --remote, as a Job of the commit's image
    assert client_job["spec"]["template"]["spec"]["containers"][0]["image"] == f"{ci['variables']['TRAINING_IMAGE']}:{SHA}"
    assert any("helm upgrade --install" in cmd and "values.rendered.yaml" in cmd for cmd in ci["deploy"]["script"])
    (apply,) = [i for i, cmd in enumerate(ci["deploy"]["script"]) if cmd.startswith("kubectl apply -f k8s.rendered.yaml")]
    (helm,) = [i for i, cmd in enumerate(ci["deploy"]["script"]) if "helm upgrade" in cmd]
    assert apply < helm  # the ServiceAccounts, Role and NetworkPolicies exist before the chart's pods refer to them


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


def test_step_pods_need_the_database_because_execute_step_opens_the_instance(jobs):
    """Why every step pod holds the password (deploy/README.md, "Secrets"): the command dagster-k8s runs in a step pod
    opens the Dagster instance from its ref and writes the step's events there itself. Read from the installed source:
    should a release stop doing that, this fails and the password can leave the step pods."""
    import dagster._cli.api as api

    tree = ast.parse(Path(api.__file__).read_text())
    (command,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "execute_step_command"]
    opens = [
        n
        for n in ast.walk(command)
        if isinstance(n, ast.Call)
        and getattr(n.func, "id", None) == "get_instance_for_cli"
        and [k.arg for k in n.keywords] == ["instance_ref"]
    ]
    assert opens, "execute_step no longer opens the instance: step pods may not need DAGSTER_PG_PASSWORD"
    for name, job in jobs.items():
        (container,) = job["spec"]["template"]["spec"]["containers"]
        assert container["args"][:3] == ["dagster", "api", "execute_step" if name.startswith("step:") else "execute_run"]


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


def test_data_steps_stay_off_the_gpu_pool():
    node = defs.resolve_asset_graph().get(dg.AssetKey("book_sidecars"))
    assert "dagster-k8s/config" not in node.assets_def.op.tags


def test_executor_is_chosen_by_environment(monkeypatch):
    assert executor().name == "multiprocess"
    monkeypatch.setenv("ALPHA_EXECUTOR", "k8s")
    assert executor().name == "k8s"


def test_gpu_tags_are_op_level_config():
    assert set(GPU_STEP_TAGS["dagster-k8s/config"]) == {"container_config", "pod_spec_config", "job_spec_config"}


def test_every_manifest_under_deploy_validates(manifests, client_job):
    assert sorted(manifests) == [
        "Deployment/alpha-webserver-auth",
        "NetworkPolicy/code-server",
        "NetworkPolicy/daemon",
        "NetworkPolicy/databento-fetch",
        "NetworkPolicy/default-deny",
        "NetworkPolicy/dns",
        "NetworkPolicy/graphql-client",
        "NetworkPolicy/run-worker",
        "NetworkPolicy/step",
        "NetworkPolicy/webserver",
        "NetworkPolicy/webserver-auth",
        "PersistentVolumeClaim/training-data-pvc",
        "PersistentVolumeClaim/training-output-pvc",
        "Role/alpha-launcher",
        "RoleBinding/alpha-launcher",
        "Service/alpha-ui",
        "ServiceAccount/alpha-dagster",
        "ServiceAccount/alpha-run-worker",
        "ServiceAccount/alpha-step",
    ]
    for doc in [*manifests.values(), client_job]:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert manifests["PersistentVolumeClaim/training-output-pvc"]["spec"]["accessModes"] == ["ReadWriteMany"]


# -- least privilege: ServiceAccounts, tokens and the Role ---------------------------------------------------------


def holds_token(pod: dict, accounts: dict) -> bool:
    """Whether a pod gets its ServiceAccount's token: the pod's setting, else the ServiceAccount's (default true)."""
    if "automountServiceAccountToken" in pod:
        return pod["automountServiceAccountToken"]
    return accounts[pod["serviceAccountName"]].get("automountServiceAccountToken", True)


def test_the_chart_creates_no_rbac_and_runs_under_our_accounts(values, accounts):
    """The chart's Roles grant every verb on pods (and a pod creator can mount any Secret): both charts' RBAC is off and
    their pods run under deploy/k8s/rbac.yaml's accounts, never one shared account (global.serviceAccountName)."""
    location = values["dagster-user-deployments"]
    assert values["rbacEnabled"] is False and location["rbacEnabled"] is False
    assert values["serviceAccount"] == {"create": False, "name": "alpha-dagster"}
    assert location["serviceAccount"] == {"create": False, "name": "alpha-run-worker"}
    assert "serviceAccountName" not in values["global"]
    assert {"alpha-dagster", "alpha-run-worker", "alpha-step"} <= set(accounts)


def test_step_pods_have_no_token_and_their_account_no_role(jobs, accounts, manifests):
    """Every step pod, training or not, runs as alpha-step without a token; alpha-step is bound to nothing. The run
    worker keeps its token: its executor starts the step Jobs."""
    steps = {name: job["spec"]["template"]["spec"] for name, job in jobs.items() if name.startswith("step:")}
    assert len(steps) == len(GPU_ASSETS + CPU_TRAINING_ASSETS + CPU_ASSETS)
    for name, pod in steps.items():
        assert pod["serviceAccountName"] == "alpha-step" and pod["automountServiceAccountToken"] is False, name
        assert not holds_token(pod, accounts), name
    assert bound_rules(manifests, "alpha-step") == []
    run = jobs["run-worker"]["spec"]["template"]["spec"]
    assert run["serviceAccountName"] == "alpha-run-worker" and holds_token(run, accounts)


def test_only_the_pods_that_call_the_api_hold_a_token(pods, accounts, manifests):
    """The webserver (terminates runs), the daemon (launches them) and run workers (launch steps) hold a token, bound
    to the launcher Role; the code server, every step, the proxy and the CI's run client hold none."""
    with_token = {name for name, pod in pods.items() if holds_token(pod, accounts)}
    assert with_token == {"webserver", "daemon", "run-worker"}, with_token
    for name in with_token:
        assert bound_rules(manifests, pods[name]["serviceAccountName"]), name


def dagster_k8s_calls() -> set[tuple[str, str, str]]:
    """(verb, group, resource) of every Kubernetes API call in the installed dagster-k8s run launcher, step executor
    and their client: what the launcher Role must grant, read from the source itself."""
    import dagster_k8s

    source = Path(dagster_k8s.__file__).parent
    verbs = {
        "create": "create",
        "read": "get",
        "list": "list",
        "delete": "delete",
        "patch": "patch",
        "replace": "update",
        "watch": "watch",
    }
    needed = set()
    for module in ("client.py", "launcher.py", "executor.py", "job.py", "container_context.py"):
        tree = ast.parse((source / module).read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr in ("batch_api", "core_api")
            ):
                m = re.fullmatch(r"(create|read|list|delete|patch|replace)_namespaced_([a-z]+?)(_status|_log)?", node.attr)
                assert m, f"dagster_k8s/{module}: unrecognized API call {node.attr}"
                verb, kind, sub = m.groups()
                resource = {"job": "jobs", "pod": "pods", "event": "events"}[kind] + (f"/{sub[1:]}" if sub else "")
                needed.add((verbs[verb], "batch" if kind == "job" else "", resource))
    return needed


def test_the_launcher_role_grants_exactly_what_dagster_k8s_calls(manifests):
    """No Secrets, no pod creation, no wildcard: the Role is the set of calls in the dagster-k8s source, no more (a
    new call after an upgrade fails here, naming it)."""
    (role,) = [d for d in manifests.values() if d["kind"] == "Role"]
    granted = {
        (verb, group, resource)
        for rule in role["rules"]
        for verb in rule["verbs"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert granted == dagster_k8s_calls(), granted ^ dagster_k8s_calls()
    resources = {resource for _, _, resource in granted}
    assert "secrets" not in resources and "*" not in resources and ("create", "", "pods") not in granted
    assert not {verb for verb, _, _ in granted} & {"*", "watch", "update", "patch", "escalate", "bind", "impersonate"}
    assert [d for d in manifests.values() if d["kind"] in ("ClusterRole", "ClusterRoleBinding")] == []


# -- the network -------------------------------------------------------------------------------------------------

NAMESPACE = "dagster"
PG, API, INTERNET, PRIVATE = "10.1.2.3", "51.15.0.10", "140.82.112.3", "10.9.9.9"
KUBE_DNS = {"namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}}
OUTSIDER = {"namespace": "other", "labels": {"app": "anything"}}  # a pod of another namespace (or anyone in the VPC)


def _selects(selector: dict, labels: dict) -> bool:
    ok = all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
    for e in selector.get("matchExpressions", []):
        has, value = e["key"] in labels, labels.get(e["key"])
        ok &= {
            "In": has and value in e.get("values", []),
            "NotIn": not has or value not in e.get("values", []),
            "Exists": has,
            "DoesNotExist": not has,
        }[e["operator"]]
    return ok


def _peer_matches(peer: dict, target) -> bool:
    if isinstance(target, str):  # an address outside the cluster
        if "ipBlock" not in peer:
            return False
        address = ipaddress.ip_address(target)
        return address in ipaddress.ip_network(peer["ipBlock"]["cidr"]) and not any(
            address in ipaddress.ip_network(e) for e in peer["ipBlock"].get("except", [])
        )
    if "ipBlock" in peer:
        return False
    if "namespaceSelector" in peer:
        namespace_ok = _selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": target["namespace"]})
    else:
        namespace_ok = target["namespace"] == NAMESPACE
    return namespace_ok and _selects(peer.get("podSelector", {}), target["labels"])


def _side_allows(policies: list[dict], pod, peer, port: int, protocol: str, direction: str) -> bool:
    """Whether the NetworkPolicies of `pod`'s namespace let it send (Egress) to / receive (Ingress) from `peer`."""
    if isinstance(pod, str) or pod["namespace"] != NAMESPACE:
        return True  # outside the namespace: its own policies (none here) decide
    key = "to" if direction == "Egress" else "from"
    selecting = [
        p for p in policies if direction in p["spec"]["policyTypes"] and _selects(p["spec"]["podSelector"], pod["labels"])
    ]
    if not selecting:
        return True
    return any(
        (key not in rule or any(_peer_matches(peer_rule, peer) for peer_rule in rule[key]))
        and ("ports" not in rule or any(r["port"] == port and r.get("protocol", "TCP") == protocol for r in rule["ports"]))
        for policy in selecting
        for rule in policy["spec"].get(direction.lower(), [])
    )


def connects(policies: list[dict], source, destination, port: int, protocol: str = "TCP") -> bool:
    return _side_allows(policies, source, destination, port, protocol, "Egress") and _side_allows(
        policies, destination, source, port, protocol, "Ingress"
    )


def test_the_network_policy_allows_each_component_exactly_what_it_needs(manifests, workloads, values):
    """Default deny, then per component: every connection the deployment makes is allowed and the ones it must never
    make (a step to the Kubernetes API or the internet, anyone but the proxy and CI's client to the webserver) are not.
    Pods carry the labels the chart and dagster-k8s really give them."""
    policies = [d for d in manifests.values() if d["kind"] == "NetworkPolicy"]
    (deny,) = [p for p in policies if p["metadata"]["name"] == "default-deny"]
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    pods = {name: {"namespace": NAMESPACE, "labels": w["labels"]} for name, w in workloads.items()}
    steps = [name for name in pods if name.startswith("step:")]
    web, daemon, code, run = pods["webserver"], pods["daemon"], pods["code-server:alpha"], pods["run-worker"]
    auth, client = pods["Deployment/alpha-webserver-auth"], pods["ci:alpha-run"]
    web_port = values["dagsterWebserver"].get("service", {}).get("port", 80)  # the chart's `-p` and containerPort
    code_port = values["dagster-user-deployments"]["deployments"][0]["port"]
    allowed = [
        (web, PG, 5432),
        (web, API, 443),
        (web, code, code_port),
        (daemon, PG, 5432),
        (daemon, API, 6443),
        (daemon, code, code_port),
        (code, PG, 5432),
        (run, PG, 5432),
        (run, API, 443),
        (auth, web, web_port),
        (auth, INTERNET, 443),
        (client, web, web_port),
        (OUTSIDER, auth, 4180),
    ]
    allowed += [(pods[s], PG, 5432) for s in steps]
    allowed += [(pods[FETCH_STEP], INTERNET, 443)]
    denied = [
        (run, web, web_port),
        (run, code, code_port),
        (run, INTERNET, 443),
        (code, API, 443),
        (code, web, web_port),
        (daemon, web, web_port),
        (web, INTERNET, 443),
        (OUTSIDER, web, web_port),
        (OUTSIDER, code, code_port),
        (auth, PG, 5432),
        (auth, API, 443),
        (auth, PRIVATE, 443),
        (client, PG, 5432),
        (client, API, 443),
        (web, PG, 5433),
    ]
    denied += [
        (pods[s], target, port)
        for s in steps
        for target, port in ((API, 443), (API, 6443), (code, code_port), (web, web_port), (INTERNET, 443), (auth, 4180))
        if (s, target) != (FETCH_STEP, INTERNET)
    ]
    denied += [(pods[FETCH_STEP], target, 443) for target in (PRIVATE, PG, API)]
    for source, destination, port in allowed:
        assert connects(policies, source, destination, port), (source, destination, port)
    for source, destination, port in denied:
        assert not connects(policies, source, destination, port), (source, destination, port)
    for pod in pods.values():  # name resolution for everyone, and nothing else in kube-system
        assert connects(policies, pod, KUBE_DNS, 53, "UDP") and connects(policies, pod, KUBE_DNS, 53, "TCP")
        assert not connects(policies, pod, {**KUBE_DNS, "labels": {"k8s-app": "metrics-server"}}, 443)
    for policy in policies:  # the CIDRs CI substitutes are real networks
        for rule in policy["spec"].get("egress", []):
            for peer in rule.get("to", []):
                if "ipBlock" in peer:
                    ipaddress.ip_network(peer["ipBlock"]["cidr"])


# -- who can reach the UI ------------------------------------------------------------------------------------------


def test_the_webserver_is_reached_only_through_authentication(manifests, values, ci):
    """oauth2-proxy (GitLab sign-in) in front of the webserver's Service; the chart exposes nothing itself (ClusterIP,
    no ingress); the proxy's settings come from a Secret and it fails closed: no `*` email domain, no skipped routes."""
    auth = manifests["Deployment/alpha-webserver-auth"]["spec"]["template"]["spec"]
    (proxy,) = auth["containers"]
    args = dict(a[2:].split("=", 1) for a in proxy["args"])
    (deploy,) = [cmd for cmd in ci["deploy"]["script"] if "helm upgrade --install" in cmd]
    release = deploy.split("helm upgrade --install ")[1].split()[0]
    port = values["dagsterWebserver"].get("service", {}).get("port", 80)
    assert args["upstream"] == f"http://{release}-webserver.{NAMESPACE}.svc.cluster.local:{port}"
    assert args["provider"] == "gitlab" and args["cookie-secure"] == "true"
    assert not {"email-domain", "skip-auth-regex", "skip-auth-route", "skip-jwt-bearer-tokens"} & set(args)
    assert not any(k.startswith("skip-auth") for k in args)
    assert proxy["envFrom"] == [{"secretRef": {"name": "alpha-oauth2-proxy"}}]
    assert not [e for e in proxy.get("env", []) if "value" in e and "SECRET" in e["name"]]  # no secret in the manifest
    service = manifests["Service/alpha-ui"]["spec"]
    assert service["selector"] == manifests["Deployment/alpha-webserver-auth"]["spec"]["selector"]["matchLabels"]
    assert {p["containerPort"] for p in proxy["ports"]} == {4180} == {p["port"] for p in service["ports"]}
    assert values["dagsterWebserver"].get("service", {}).get("type", "ClusterIP") == "ClusterIP"
    assert not values.get("ingress", {}).get("enabled", False)


# -- secrets -------------------------------------------------------------------------------------------------------


def test_only_the_fetch_step_gets_the_databento_key(pods, values):
    """Only `alpha_core.data.fetch` reads DATABENTO_API_KEY, and only the raw_dbn step's pod gets it, from its own
    Secret through an env secretKeyRef (deploy/README.md, "Secrets"); code that starts to read it elsewhere fails here."""
    readers = sorted(
        str(p.relative_to(REPO))
        for package in ("alpha_core", "alpha_assets")
        for p in (REPO / package).rglob("*.py")
        if "DATABENTO_API_KEY" in p.read_text()
    )
    assert readers == ["alpha_assets/pod_spec.py", "alpha_core/data/fetch.py"], readers
    assert "databento" not in json.dumps(values).lower()
    for name, pod in pods.items():
        for container in pod["containers"]:
            names = [e["name"] for e in container.get("env", [])] + [
                str(e) for e in container.get("envFrom", []) if "secretRef" in e
            ]
            keys = [n for n in names if "databento" in n.lower()]
            assert keys == (["DATABENTO_API_KEY"] if name == FETCH_STEP else []), (name, names)
            secrets = {e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e}
            secrets |= {
                e["valueFrom"]["secretKeyRef"]["name"]
                for e in container.get("env", [])
                if "secretKeyRef" in e.get("valueFrom", {})
            }
            allowed = {"alpha-postgresql", "alpha-oauth2-proxy"} | ({"databento-api-key"} if name == FETCH_STEP else set())
            assert secrets <= allowed, (name, secrets)
            if name == FETCH_STEP:
                assert "databento-api-key" in secrets
            if secrets & {"alpha-oauth2-proxy"}:
                assert name == "Deployment/alpha-webserver-auth", name


# -- admission -----------------------------------------------------------------------------------------------------

RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def test_the_namespace_enforces_the_restricted_pod_security_profile_and_every_pod_meets_it(pods):
    """Whoever may create Jobs in the namespace (launcher, run workers, CI) still cannot start a privileged, root,
    host-network or hostPath pod; every pod of the deployment passes the profile."""
    namespace = yaml.safe_load((DEPLOY / "cluster" / "namespace.yaml").read_text())
    kubernetes_validate.validate(namespace, K8S_VERSION, strict=True)
    assert namespace["metadata"]["name"] == NAMESPACE
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    for name, pod in pods.items():
        assert not {"hostNetwork", "hostPID", "hostIPC"} & {k for k, v in pod.items() if v}, name
        for volume in pod.get("volumes", []):
            assert set(volume) - {"name"} <= RESTRICTED_VOLUMES, (name, volume)
        for container in pod["containers"] + pod.get("initContainers", []):
            added = set((container.get("securityContext") or {}).get("capabilities", {}).get("add", []))
            assert added <= {"NET_BIND_SERVICE"}, name
            assert not any(p.get("hostPort") for p in container.get("ports", [])), name


# -- Jobs the launchers may create (deploy/cluster/job-admission.yaml) ------------------------------------------------

LAUNCHER, RUN_WORKER = "system:serviceaccount:dagster:alpha-dagster", "system:serviceaccount:dagster:alpha-run-worker"


@pytest.fixture(scope="module")
def job_admission() -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "cluster" / "job-admission.yaml").read_text()) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    return {d["kind"]: d for d in docs}


def admission(policy: dict, job: dict, username: str) -> list[str] | None:
    """What the API server answers a Job create under `policy` (its CEL evaluated as a ValidatingAdmissionPolicy is):
    None when the policy does not apply, else the messages of the validations that fail (empty: admitted)."""
    spec = policy["spec"]
    context = {"object": job, "request": {"userInfo": {"username": username}, "operation": "CREATE"}, "variables": {}}
    if not all(cel.evaluate(m["expression"], context) for m in spec["matchConditions"]):
        return None
    for variable in spec["variables"]:  # in order: each may use the ones before it
        context["variables"][variable["name"]] = cel.evaluate(variable["expression"], context)
    return [
        cel.evaluate(v["messageExpression"], context) if "messageExpression" in v else v["message"]
        for v in spec["validations"]
        if cel.evaluate(v["expression"], context) is not True
    ]


def test_the_admission_policy_admits_the_jobs_dagster_k8s_builds_and_only_in_namespace_dagster(job_admission, jobs):
    binding, policy = job_admission["ValidatingAdmissionPolicyBinding"], job_admission["ValidatingAdmissionPolicy"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] and binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": NAMESPACE}
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert admission(policy, jobs["run-worker"], LAUNCHER) == []
    for name, job in jobs.items():
        if name.startswith("step:"):
            assert admission(policy, job, RUN_WORKER) == [], name


def _with(job: dict, change) -> dict:
    job = json.loads(json.dumps(job))
    change(job["spec"]["template"])
    return job


def _container(template: dict) -> dict:
    return template["spec"]["containers"][0]


FORBIDDEN_STEPS = {
    "a Secret volume": lambda t: t["spec"]["volumes"].append({"name": "s", "secret": {"secretName": "alpha-oauth2-proxy"}}),
    "a projected Secret": lambda t: t["spec"]["volumes"].append(
        {"name": "s", "projected": {"sources": [{"secret": {"name": "alpha-oauth2-proxy"}}]}}
    ),
    "a CSI volume": lambda t: t["spec"]["volumes"].append({"name": "s", "csi": {"driver": "secrets-store.csi.k8s.io"}}),
    "envFrom a Secret": lambda t: _container(t).setdefault("envFrom", []).append({"secretRef": {"name": "alpha-oauth2-proxy"}}),
    "another Secret's key": lambda t: _container(t)["env"].append(
        {"name": "X", "valueFrom": {"secretKeyRef": {"name": "alpha-oauth2-proxy", "key": "OAUTH2_PROXY_CLIENT_SECRET"}}}
    ),
    "the GraphQL client's label": lambda t: t["metadata"]["labels"].update({"app.kubernetes.io/component": "graphql-client"}),
    "a chart component's label": lambda t: t["metadata"]["labels"].update({"component": "dagster-webserver"}),
    "the run worker's account": lambda t: t["spec"].update({"serviceAccountName": "alpha-run-worker"}),
    "a token": lambda t: t["spec"].update({"automountServiceAccountToken": True}),
    "another image": lambda t: _container(t).update({"image": "docker.io/library/alpine:3"}),
    "a command": lambda t: _container(t).update({"command": ["sh", "-c", "cat /var/run/secrets/*"]}),
    "a run worker's args": lambda t: _container(t).update({"args": ARGS["run_worker"]}),
    "an image pull Secret": lambda t: t["spec"].update({"imagePullSecrets": [{"name": "alpha-postgresql"}]}),
    "an init container": lambda t: (
        t["spec"]
        .setdefault("initContainers", [])
        .append({"name": "x", "image": "docker.io/library/alpine:3", "args": ARGS["step_worker"]})
    ),
}


@pytest.mark.parametrize("change", FORBIDDEN_STEPS)
def test_a_run_worker_token_cannot_create_any_other_job(change, job_admission, jobs):
    """What `jobs create` would let a stolen run-worker token do, refused: other Secrets, the label the webserver lets
    past oauth2-proxy, another account or a token, another image or command."""
    policy = job_admission["ValidatingAdmissionPolicy"]
    job = _with(jobs["step:checkpoints/tft"], FORBIDDEN_STEPS[change])
    assert admission(policy, job, RUN_WORKER), change
    if change not in ("the run worker's account", "a token", "a run worker's args"):  # the launcher's own Job is as strict
        assert admission(policy, _with(jobs["run-worker"], FORBIDDEN_STEPS[change]), LAUNCHER), change


def test_only_the_fetch_step_may_carry_the_databento_key(job_admission, jobs):
    """The raw_dbn step (labelled by the executor with its op) reads DATABENTO_API_KEY from its Secret; no other step
    and no run worker may."""
    policy = job_admission["ValidatingAdmissionPolicy"]
    ref = {"name": "databento-api-key", "key": "DATABENTO_API_KEY"}
    key = {"name": "DATABENTO_API_KEY", "valueFrom": {"secretKeyRef": ref}}

    def fetch(template: dict) -> None:
        _container(template)["env"].append(key)
        template["metadata"]["labels"]["dagster/op"] = "raw_dbn"

    assert admission(policy, _with(jobs["step:book_sidecars"], fetch), RUN_WORKER) == []
    assert admission(policy, _with(jobs["step:book_sidecars"], lambda t: _container(t)["env"].append(key)), RUN_WORKER)
    assert admission(policy, _with(jobs["run-worker"], fetch), LAUNCHER)


def test_the_policy_applies_to_alpha_s_launchers_only(job_admission, jobs, client_job):
    """CI's run client carries the GraphQL label: created with CI's deploy credential, which the policy does not match
    (the launchers' accounts cannot create it); a step Job from the launcher's account is refused."""
    policy = job_admission["ValidatingAdmissionPolicy"]
    assert admission(policy, client_job, "gitlab-ci-deployer") is None
    assert admission(policy, client_job, RUN_WORKER) and admission(policy, client_job, LAUNCHER)
    assert admission(policy, jobs["step:checkpoints/tft"], LAUNCHER)  # the launcher starts run workers, not steps


# -- CI's run client -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "exit_code"), [("1::", 0), (":1:", 1)])
def test_ci_starts_alpha_run_as_a_tokenless_job_and_reports_its_result(tmp_path, status, exit_code, client_job):
    """deploy/ci/run-remote.sh, with kubectl replaced by a recorder: the original system's variables go to a ConfigMap
    (empty ones left out, as alpha run reads unset ones), the Job applied is the rendered template, and CI's exit is
    the Job's."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.jsonl"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(f"""#!{sys.executable}
import json, sys
args = sys.argv[1:]
stdin = sys.stdin.read() if args[-2:] == ["-f", "-"] else None
with open({str(calls)!r}, "a") as fh:
    fh.write(json.dumps({{"args": args, "stdin": stdin}}) + "\\n")
if "jsonpath" in " ".join(args):
    print({status!r}, end="")
""")
    kubectl.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "CI_PIPELINE_ID": "4242",
        "CI_COMMIT_SHA": SHA,
        "SYMBOLS": "ES.FUT,NQ.FUT",
        "MODELS": "all",
        "PHASE": "full",
        "MAX_PARALLEL": "10",
        "EPOCHS": "50",
        "HYPEROPT_TRIALS": "20",
        "RUN_ID": "",
    }
    run = subprocess.run(["sh", "deploy/ci/run-remote.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == exit_code, run.stderr
    recorded = [json.loads(line) for line in calls.read_text().splitlines()]
    assert recorded[0]["args"] == [
        "-n",
        "dagster",
        "create",
        "configmap",
        "alpha-run-4242",
        *(f"--from-literal={k}={env[k]}" for k in ("SYMBOLS", "MODELS", "PHASE", "MAX_PARALLEL", "EPOCHS", "HYPEROPT_TRIALS")),
    ]
    job = yaml.safe_load(recorded[1]["stdin"])
    assert job == client_job
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "alpha-step" and pod["automountServiceAccountToken"] is False
    assert pod["containers"][0]["envFrom"] == [{"configMapRef": {"name": "alpha-run-4242"}}]
    assert recorded[-1]["args"] == ["-n", "dagster", "delete", "configmap", "alpha-run-4242"]
