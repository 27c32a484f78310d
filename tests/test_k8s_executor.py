"""The Kubernetes path exercised without a cluster: one fold through the real K8sRunLauncher and k8s_job_executor.

A code server runs as the Helm chart runs it (DAGSTER_CURRENT_IMAGE and the code location's container context), the
instance carries the production run launcher from deploy/dagster.yaml pointed at the stand-in API
(tests/k8s_standin.py), and `dagster job launch` starts the fold's run. The stand-in schedules the pods on the
cluster's node pools, runs the run pod, whose executor creates the step pods (a GPU model's and an RL agent's), which
train and materialize their checkpoints into the mapped /output. The stand-in authorizes every API call against the
Role of deploy/k8s/rbac.yaml, so the run proves that Role is enough for the real launcher and executor.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
import yaml
from k8s_standin import KubeStandIn, Node

from alpha_assets.execution import executor, pinned_image
from alpha_core.errors import PlanError

pytestmark = pytest.mark.slow  # Dagster runs, killed processes or a browser: `make check` leaves them out

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
IMAGE = "rg.fr-par.scw.cloud/foxhunt-ci/training:3f2c1ab"  # the code location's image (a git-SHA tag)
NAMESPACE = "dagster"
MODEL = "kan"  # a cheap bar model without a search space: one step per fold
FAST = {
    "epochs": 1,
    "seq_len": 16,
    "batch_size": 64,
    "n_train_seqs": 256,
    "n_val_seqs": 128,
    "device": "cpu",
    "min_val_auc": 0.0,
}
RL_MODEL = "dqn"  # on a CPU pod by default: its device too (no `device` here)
RL_FAST = {"epochs": 1, "timesteps_per_epoch": 256, "min_val_sharpe": -1e6}
POOL = "k8s.scaleway.com/pool-name"
# the cluster's node pools (deploy/README.md), with what the kubelet leaves allocatable of each node
NODES = [
    Node("default-1", {POOL: "default"}, {"cpu": "3800m", "memory": "14Gi"}),
    Node(
        "gpu-training-1",
        {POOL: "gpu-training"},
        {"cpu": "23", "memory": "220Gi", "nvidia.com/gpu": "1"},
        (("nvidia.com/gpu", None),),
    ),
    Node("cpu-training-1", {POOL: "cpu-training"}, {"cpu": "15800m", "memory": "28Gi"}, (("alpha/cpu-training", "true"),)),
]
# the code location as deploy/helm/values.yaml declares it; the chart hands env and volumes to launched runs
LOCATION_ENV = [
    {"name": "ALPHA_EXECUTOR", "value": "k8s"},
    {"name": "ALPHA_DATA_DIR", "value": "/data"},
    {"name": "ALPHA_STORAGE_ROOT", "value": "/output"},
    {"name": "MAX_PARALLEL", "value": "2"},
]
LOCATION_VOLUMES = [
    {"name": "data", "persistentVolumeClaim": {"claimName": "training-data-pvc", "readOnly": True}},
    {"name": "output", "persistentVolumeClaim": {"claimName": "training-output-pvc"}},
]
LOCATION_MOUNTS = [{"name": "data", "mountPath": "/data", "readOnly": True}, {"name": "output", "mountPath": "/output"}]
RBAC = [doc for doc in yaml.safe_load_all((REPO / "deploy" / "k8s" / "rbac.yaml").read_text()) if doc]


def launcher_rules(account: str) -> list[dict]:
    """The rules deploy/k8s/rbac.yaml grants `account`, through its RoleBindings."""
    roles = {d["metadata"]["name"]: d["rules"] for d in RBAC if d["kind"] == "Role"}
    return [
        rule
        for d in RBAC
        if d["kind"] == "RoleBinding" and {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE} in d["subjects"]
        for rule in roles[d["roleRef"]["name"]]
    ]


def _instance_config(kubeconfig: Path, home: Path) -> dict:
    """deploy/dagster.yaml with SQLite storage and its run launcher talking to the stand-in instead of in-cluster."""
    production = yaml.safe_load((REPO / "deploy" / "dagster.yaml").read_text())
    launcher = production["run_launcher"]
    launcher["config"].update(load_incluster_config=False, kubeconfig_file=str(kubeconfig))
    return {
        "storage": {"sqlite": {"base_dir": str(home)}},
        "run_launcher": launcher,
        "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"},
        "telemetry": {"enabled": False},
    }


def _workspace_target() -> dict:
    (location,) = yaml.safe_load((REPO / "workspace.yaml").read_text())["load_from"]
    return location["python_module"]


def _fold_partition(symbol: str, fold: str) -> dg.MultiPartitionKey:
    from alpha_assets.partitions import symbol_fold_partitions

    return next(k for k in symbol_fold_partitions.get_partition_keys() if set(k.keys_by_dimension.values()) == {symbol, fold})


def _no_proxy(env) -> dict[str, str]:
    """The stand-in is on 127.0.0.1: a proxy from the environment must not carry the kubernetes client there."""
    return {k: v for k, v in env.items() if "proxy" not in k.lower()}


def _wait(what: str, done, timeout: float, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = done()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"{what} after {timeout:.0f} s" + (f":\n{log.read_text()[-4000:]}" if log else ""))


@pytest.fixture
def cluster(tmp_path, tiny_data):
    """The stand-in API, an instance using the production run launcher, and the code location's gRPC server (starting:
    call the last item to wait for it)."""
    with _cluster(tmp_path, tiny_data, isolate=False, location_env=LOCATION_ENV) as parts:
        yield parts


@contextmanager
def _cluster(tmp_path, tiny_data, isolate: bool, location_env: list[dict]):
    data, output, home = tiny_data, tmp_path / "output", tmp_path / "dagster_home"
    output.mkdir()
    home.mkdir()
    image_env = {"PATH": f"{BIN}:/usr/bin:/bin", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "LANG": "C.UTF-8"}
    # the launcher (here) and the run worker share the stand-in's one identity: alpha-run-worker's Role (alpha-dagster has
    # the same), which a step pod never gets (no token)
    with KubeStandIn(
        tmp_path / "standin",
        claims={"training-data-pvc": data, "training-output-pvc": output},
        config_maps={"dagster-instance": home},
        image_env=image_env,
        workdir=REPO,
        nodes=NODES,
        rules=launcher_rules("alpha-run-worker"),
        isolate=isolate,
    ) as standin:
        (home / "dagster.yaml").write_text(yaml.safe_dump(_instance_config(standin.kubeconfig, home)))
        # create the SQLite databases before any other process opens them (concurrent creation corrupts alembic_version)
        instance = dg.DagsterInstance.from_config(str(home))
        target, socket, server_log = _workspace_target(), tmp_path / "grpc.sock", tmp_path / "code-server.log"
        env = standin.local_env(location_env, [], {"/data": data, "/output": output})
        # what the chart's dagsterUserDeployments.k8sContainerContext hands launched runs: its ServiceAccount, with the
        # token turned on
        env.update(
            DAGSTER_HOME=str(home),
            DAGSTER_CURRENT_IMAGE=IMAGE,
            DAGSTER_CLI_API_GRPC_CONTAINER_CONTEXT=json.dumps(
                {
                    "k8s": {
                        "image_pull_policy": "IfNotPresent",
                        "namespace": NAMESPACE,
                        "service_account_name": "alpha-run-worker",
                        "env": location_env,
                        "volumes": LOCATION_VOLUMES,
                        "volume_mounts": LOCATION_MOUNTS,
                        "run_k8s_config": {"pod_spec_config": {"automount_service_account_token": True}},
                    }
                }
            ),
        )
        with server_log.open("wb") as out:
            server = subprocess.Popen(
                [
                    BIN / "dagster",
                    "api",
                    "grpc",
                    "--module-name",
                    target["module_name"],
                    "--attribute",
                    target["attribute"],
                    "--working-directory",
                    str(REPO),
                    "--socket",
                    str(socket),
                ],
                env=env,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

        def ready() -> Path:
            _wait(
                "the code server did not start",
                lambda: server.poll() is not None or "Started Dagster code server" in server_log.read_text(),
                180,
                server_log,
            )
            assert server.poll() is None, server_log.read_text()
            return socket

        try:
            yield standin, instance, data, output, ready
        finally:
            server.kill()
            server.wait()


def test_one_fold_runs_on_step_pods_of_the_code_locations_image(cluster):
    from alpha_assets.definitions import defs
    from alpha_assets.resources import DataRoot, StorageRoot

    standin, instance, data, output, code_server = cluster
    upstream = [a for a in defs.assets if a.key.to_user_string() in ("book_sidecars", "bar_sidecars", "fold_plans")]
    assert dg.materialize(
        upstream,
        partition_key="ES.FUT",
        instance=instance,
        resources={"data": DataRoot(root=str(data)), "storage": StorageRoot(root=str(output))},
    ).success  # while the server loads
    socket = code_server()

    partition, op, rl_op = _fold_partition("ES.FUT", "0"), f"checkpoints__{MODEL}", f"checkpoints__{RL_MODEL}"
    tags = {
        "dagster/partition": str(partition),
        **{f"dagster/partition/{dim}": key for dim, key in partition.keys_by_dimension.items()},
    }
    run_id = "0f0c2d1e-0000-4000-8000-000000000001"
    config = {"ops": {op: {"config": FAST}, rl_op: {"config": RL_FAST}}}
    launch = subprocess.run(
        [
            BIN / "dagster",
            "job",
            "launch",
            "--grpc-socket",
            str(socket),
            "-j",
            "fold_training",
            "-o",
            f"{op},{rl_op}",
            "--config-json",
            json.dumps(config),
            "--tags",
            json.dumps(tags),
            "--run-id",
            run_id,
        ],
        env={**_no_proxy(os.environ), "DAGSTER_HOME": instance.root_directory},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert launch.returncode == 0, launch.stderr[-4000:]

    run = _wait("the run did not finish", lambda: (r := instance.get_run_by_id(run_id)) and r.is_finished and r, 240)
    logs = {name: pod.log.read_text(errors="replace")[-3000:] for (_, name), pod in standin.pods.items() if pod.log.exists()}
    assert run.status == dg.DagsterRunStatus.SUCCESS, (run.status, [p.problem for p in standin.pods.values()], logs)
    assert standin.unhandled == [] and standin.rejected == []
    assert standin.forbidden == [], standin.forbidden  # the Role allowed every call the launcher and executor made
    # a successful run only creates Jobs (steps report through the instance); status, logs and delete are for health
    # checks, failures and termination: tests/test_k8s.py holds the Role to every call in the dagster-k8s source
    assert ("create", "batch/jobs") in standin.authorized

    jobs = {job["metadata"]["labels"].get("dagster/op", "run"): job for job in standin.jobs.values()}
    assert set(jobs) == {"run", op, rl_op}, list(standin.jobs)
    for job in jobs.values():  # the run pod and the step pods all run the code location's image
        assert job["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE
    # only the run worker holds a token (it starts the step Jobs); the steps run as the account without RBAC, tokenless
    accounts = {
        name: (
            job["spec"]["template"]["spec"]["serviceAccountName"],
            job["spec"]["template"]["spec"]["automountServiceAccountToken"],
        )
        for name, job in jobs.items()
    }
    assert accounts == {"run": ("alpha-run-worker", True), op: ("alpha-step", False), rl_op: ("alpha-step", False)}
    for job in jobs.values():
        (container,) = job["spec"]["template"]["spec"]["containers"]
        assert not [e for e in container.get("env", []) if "DATABENTO" in e["name"]], container["env"]
    nodes = {standin.jobs[key]["metadata"]["labels"].get("dagster/op", "run"): pod.node for key, pod in standin.pods.items()}
    assert nodes == {"run": "default-1", op: "gpu-training-1", rl_op: "cpu-training-1"}
    (rl_container,) = jobs[rl_op]["spec"]["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in {**rl_container["resources"]["requests"], **rl_container["resources"]["limits"]}
    step = jobs[op]
    assert step["metadata"]["labels"]["app.kubernetes.io/component"] == "step_worker"
    assert step["spec"]["backoffLimit"] == 0
    pod = step["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert (
        container["securityContext"]["readOnlyRootFilesystem"]
        and container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        and not container["securityContext"]["allowPrivilegeEscalation"]
    )
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 10001
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ALPHA_DATA_DIR"] == "/data" and env["ALPHA_STORAGE_ROOT"] == "/output" and env["ALPHA_EXECUTOR"] == "k8s"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/data", "/output", "/tmp", env["HOME"]} <= mounts
    assert env["TRITON_CACHE_DIR"].startswith("/output/") and env["TORCHINDUCTOR_CACHE_DIR"].startswith("/output/")
    # the pods exit after the run worker has seen the step succeed, as real pods do
    _wait("the pods did not exit", lambda: all(p.phase == "Succeeded" for p in standin.pods.values()), 60)

    for model in (MODEL, RL_MODEL):
        (record,) = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(["checkpoints", model]), asset_partitions=[str(partition)]), limit=5
        ).records
        assert record.run_id == run_id
        fold_dir = Path(record.asset_materialization.metadata["path"].value)
        assert fold_dir.is_relative_to(output), fold_dir  # the pod wrote to /output: the output claim
        assert {"model.safetensors", "summary.json"} <= {p.name for p in fold_dir.iterdir()}
    assert record.asset_materialization.metadata["device"].value == "cpu"  # the RL step's default device
    checks = [
        e
        for e in instance.get_records_for_run(run_id).records
        if e.event_log_entry.dagster_event and e.event_log_entry.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION"
    ]
    assert len(checks) == 2 and all(c.event_log_entry.dagster_event.event_specific_data.passed for c in checks)


def test_step_image_follows_the_code_location_unless_pinned(monkeypatch):
    monkeypatch.setenv("ALPHA_EXECUTOR", "k8s")
    monkeypatch.delenv("ALPHA_TRAINING_IMAGE", raising=False)
    assert "job_image" not in executor().config_schema.resolve_config({}).value["config"]
    monkeypatch.setenv("ALPHA_TRAINING_IMAGE", IMAGE)
    assert executor().config_schema.resolve_config({}).value["config"]["job_image"] == IMAGE
    for image in ("rg.fr-par.scw.cloud/foxhunt-ci/training:latest", "training", "localhost:5000/training"):
        with pytest.raises(PlanError, match="ALPHA_TRAINING_IMAGE"):
            pinned_image(image)
    assert pinned_image("localhost:5000/training@sha256:" + "0" * 64).endswith("0" * 64)


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "--uts", "--pid", "--fork", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _unshare_works(), reason="unshare --uts --pid is not permitted here (needs root)")
def test_a_step_lost_with_its_node_is_retried_on_another_pod_and_completes(tmp_path, tiny_data):
    """A GPU node is pre-empted while its step trains, holding the attempt's lock. Dagster's retry runs on another
    pod (another host name, another PID namespace), takes the attempt over at once and completes it."""
    from alpha_assets.definitions import defs
    from alpha_assets.resources import DataRoot, StorageRoot

    env = [*LOCATION_ENV, {"name": "ALPHA_STEP_RETRY_DELAY_S", "value": "1"}]
    with _cluster(tmp_path, tiny_data, isolate=True, location_env=env) as (standin, instance, data, output, code_server):
        upstream = [a for a in defs.assets if a.key.to_user_string() in ("book_sidecars", "bar_sidecars", "fold_plans")]
        assert dg.materialize(
            upstream,
            partition_key="ES.FUT",
            instance=instance,
            resources={"data": DataRoot(root=str(data)), "storage": StorageRoot(root=str(output))},
        ).success
        socket = code_server()
        partition, op = _fold_partition("ES.FUT", "0"), f"checkpoints__{MODEL}"
        tags = {
            "dagster/partition": str(partition),
            **{f"dagster/partition/{dim}": key for dim, key in partition.keys_by_dimension.items()},
        }
        run_id = "0f0c2d1e-0000-4000-8000-000000000002"
        launch = subprocess.run(
            [
                BIN / "dagster",
                "job",
                "launch",
                "--grpc-socket",
                str(socket),
                "-j",
                "fold_training",
                "-o",
                op,
                "--config-json",
                json.dumps({"ops": {op: {"config": {**FAST, "epochs": 3}}}}),
                "--tags",
                json.dumps(tags),
                "--run-id",
                run_id,
            ],
            env={**_no_proxy(os.environ), "DAGSTER_HOME": instance.root_directory},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert launch.returncode == 0, launch.stderr[-4000:]

        def training() -> tuple | None:  # the step pod, once it holds the attempt's lock
            locks = list(output.glob(f"*/models/{MODEL}/ES.FUT/.fold-0.attempts/{run_id}/.lock"))
            pods = [
                pod
                for key, pod in standin.pods.items()
                if standin.jobs[key]["metadata"]["labels"].get("dagster/op") == op and pod.phase == "Running"
            ]
            return (pods[0], json.loads(locks[0].read_text())) if locks and pods else None

        lost, lock = _wait("the step never took its attempt's lock", training, 240)
        assert lock["owner"].split("~")[0] == lost.name  # the pod's own host name
        standin.lose(lost)
        run = _wait("the run did not finish", lambda: (r := instance.get_run_by_id(run_id)) and r.is_finished and r, 300)
        step_pods = [
            pod for key, pod in standin.pods.items() if standin.jobs[key]["metadata"]["labels"].get("dagster/op") == op
        ]
        logs = {pod.name: pod.log.read_text(errors="replace")[-3000:] for pod in step_pods if pod.log.exists()}
        assert run.status == dg.DagsterRunStatus.SUCCESS, logs
        _wait("the retried pod did not exit", lambda: step_pods[-1].phase != "Running", 60)
        assert len(step_pods) == 2 and step_pods[0].phase == "Failed" and step_pods[1].phase == "Succeeded", logs
        events = {
            e.event_log_entry.dagster_event.event_type_value
            for e in instance.get_records_for_run(run_id).records
            if e.event_log_entry.dagster_event
        }
        assert "STEP_UP_FOR_RETRY" in events
        (record,) = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(["checkpoints", MODEL]), asset_partitions=[str(partition)]), limit=5
        ).records
        fold = Path(record.asset_materialization.metadata["path"].value)
        # the retry never wrote where the lost pod did: it took the attempt over as its next generation
        assert fold.name == f"{run_id}~g1" and (fold / "manifest.json").is_file() and not (fold / ".lock").exists()
        summary = json.loads((fold / "summary.json").read_text())
        assert summary["attempt"] == run_id and summary["epochs"] == 3
