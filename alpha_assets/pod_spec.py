"""The pod spec of every step pod on Kubernetes (`dagster-k8s/config`), kept apart from where and how steps run.

dagster-k8s applies op-level `dagster-k8s/config` tags to step pods (job-level tags do not reach them), so the
training and hyperopt assets carry these as op tags; every other step (sidecars, fold plans, the report) gets
`STEP_K8S_CONFIG` from the executor (`execution.executor`). What every step pod shares:

- It runs as the ServiceAccount `alpha-step` (deploy/k8s/rbac.yaml), which has no RoleBinding, and without a
  service-account token (`automount_service_account_token: False`): a step reads /data and writes /output, it never
  calls the Kubernetes API, so a compromised step cannot create pods, read Secrets or delete other runs' Jobs.
- Non-root uid 10001, read-only root filesystem, no capabilities; writes go to emptyDirs and /output.
- No Databento API key, but for the one step that fetches data (`raw_dbn`, `FETCH_STEP_TAGS`): its pod alone reads
  `DATABENTO_API_KEY` from the Secret `databento-api-key` (deploy/README.md, "Secrets").

Training steps add their resources and node pool (`GPU_STEP_TAGS`, `CPU_STEP_TAGS`).
"""

import os

APP_UID = 10001  # the `alpha` user of deploy/Dockerfile
HOME = "/home/alpha"
COMPILE_CACHE = "/output/.cache/compile"  # on the output volume, shared by every step pod
GPU_NODE_POOL = os.environ.get("ALPHA_GPU_NODE_POOL", "gpu-training")
CPU_NODE_POOL = os.environ.get("ALPHA_CPU_NODE_POOL", "cpu-training")
# The pool's nodes carry this taint, so nothing else (run workers, data steps) takes their cores.
CPU_NODE_TAINT = "alpha/cpu-training"
STEP_SERVICE_ACCOUNT = "alpha-step"  # deploy/k8s/rbac.yaml: no RoleBinding, automountServiceAccountToken false

# What every step pod gets, training or not: merged after the run launcher's and the code location's settings, so
# it replaces the run worker's ServiceAccount (which may create Jobs) and its token.
STEP_POD_SPEC = {"service_account_name": STEP_SERVICE_ACCOUNT, "automount_service_account_token": False}
STEP_K8S_CONFIG = {"pod_spec_config": STEP_POD_SPEC}

_NON_ROOT = {
    "run_as_non_root": True,
    "run_as_user": APP_UID,
    "run_as_group": APP_UID,
    "seccomp_profile": {"type": "RuntimeDefault"},
}


def _step_tags(requests: dict, limits: dict, node_pool: str, tolerations: list[dict]) -> dict:
    """The op tags of a training step pod: its resources and node pool; the rest is common to every step."""
    return {
        "dagster-k8s/config": {
            "container_config": {
                "resources": {"requests": requests, "limits": limits},
                "security_context": {
                    **_NON_ROOT,
                    "allow_privilege_escalation": False,
                    "read_only_root_filesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volume_mounts": [
                    {"name": "data", "mount_path": "/data", "read_only": True},
                    {"name": "output", "mount_path": "/output"},
                    {"name": "dshm", "mount_path": "/dev/shm"},
                    {"name": "tmp", "mount_path": "/tmp"},
                    {"name": "home", "mount_path": HOME},
                ],
                "env": [
                    {"name": "ALPHA_DATA_DIR", "value": "/data"},
                    {"name": "ALPHA_STORAGE_ROOT", "value": "/output"},
                    # the root filesystem is read-only: every cache goes to the writable home emptyDir
                    {"name": "HOME", "value": HOME},
                    {"name": "XDG_CACHE_HOME", "value": f"{HOME}/.cache"},
                    # compiled kernels on the shared volume: every trainer moves them to
                    # $ALPHA_STORAGE_ROOT/compile-cache/<code>-<card>-torch<v>-py<v>/ (alpha_core/compile_cache.py), so
                    # only the first pod of a code version compiles; these two serve anything compiled outside a trainer
                    {"name": "TRITON_CACHE_DIR", "value": f"{COMPILE_CACHE}/triton"},
                    {"name": "TORCHINDUCTOR_CACHE_DIR", "value": f"{COMPILE_CACHE}/torchinductor"},
                    {"name": "MPLCONFIGDIR", "value": f"{HOME}/.config/matplotlib"},
                ],
            },
            "pod_spec_config": {
                **STEP_POD_SPEC,
                "security_context": {**_NON_ROOT, "fs_group": APP_UID},
                "node_selector": {"k8s.scaleway.com/pool-name": node_pool},
                "tolerations": tolerations,
                "volumes": [
                    {"name": "data", "persistent_volume_claim": {"claim_name": "training-data-pvc", "read_only": True}},
                    {"name": "output", "persistent_volume_claim": {"claim_name": "training-output-pvc"}},
                    {"name": "dshm", "empty_dir": {"medium": "Memory", "size_limit": "32Gi"}},
                    {"name": "tmp", "empty_dir": {"size_limit": "16Gi"}},
                    {"name": "home", "empty_dir": {"size_limit": "8Gi"}},  # compile caches (Triton, Inductor)
                ],
            },
            # backoff_limit 0: a failed pod fails the Job and Dagster's STEP_RETRY_POLICY decides (execution.py)
            "job_spec_config": {"ttl_seconds_after_finished": 3600, "backoff_limit": 0},
        }
    }


GPU_STEP_TAGS = _step_tags(
    {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
    {"memory": "64Gi", "nvidia.com/gpu": "1"},
    GPU_NODE_POOL,
    [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
)
# 15 of a 16-vCPU, 32 GB node's cores (the kubelet reserves part of a node: 16 would never fit), one step per node;
# no CPU limit, which would throttle; no GPU toleration, so these pods never take a GPU node.
CPU_STEP_TAGS = _step_tags(
    {"cpu": "15", "memory": "24Gi"},
    {"memory": "24Gi"},
    CPU_NODE_POOL,
    [{"key": CPU_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
)


DATABENTO_SECRET = "databento-api-key"  # created by the operator, never by the chart (deploy/README.md, "Secrets")
# The fetch step's pod (raw_dbn): the Databento key from its Secret, as an env secretKeyRef of this pod only (the code
# location's envSecrets would hand it to every run worker and step).
FETCH_STEP_TAGS = {
    "dagster-k8s/config": {
        "container_config": {
            "env": [
                {
                    "name": "DATABENTO_API_KEY",
                    "value_from": {"secret_key_ref": {"name": DATABENTO_SECRET, "key": "DATABENTO_API_KEY"}},
                }
            ]
        }
    }
}
