"""Where steps run: local processes by default, Kubernetes pods when ALPHA_EXECUTOR=k8s.

The pod spec lives on the training and hyperopt assets as op tags: dagster-k8s applies op-level
`dagster-k8s/config` to step pods, while job-level tags do not reach them. Each model's steps are placed
(`placement`) on one of two node pools, each with its Dagster pool (dagster.yaml), so pods wait for a slot
before they are created instead of piling up Pending:

- GPU steps (the supervised models): one `nvidia.com/gpu` on ALPHA_GPU_NODE_POOL, the `gpu` pool.
- CPU steps (the RL agents: SB3's MLP policies leave a GPU idle while the environment steps on the CPU, and
  measured cheaper per euro on CPU nodes, deploy/README.md "Which model runs where"): 15 CPUs, no GPU, on
  ALPHA_CPU_NODE_POOL, the `cpu_training` pool, and the device `cpu` by default. ALPHA_GPU_MODELS (model
  names, comma-separated) puts such a model back on the GPU.

Step pods run the code location's own image: the Helm chart sets DAGSTER_CURRENT_IMAGE on the code server,
`dagster api grpc` records it in the job origin, and the k8s executor falls back to that image when it has
no `job_image`. ALPHA_TRAINING_IMAGE overrides it (a pinned tag or digest, never `:latest`).
"""

import os
from dataclasses import dataclass

import dagster as dg

from alpha_core.errors import PlanError
from alpha_core.models import registry

MAX_PARALLEL = int(os.environ.get("MAX_PARALLEL", "10"))  # the spec's GPU concurrency cap
GPU_NODE_POOL = os.environ.get("ALPHA_GPU_NODE_POOL", "gpu-training")
CPU_NODE_POOL = os.environ.get("ALPHA_CPU_NODE_POOL", "cpu-training")
GPU_POOL = "gpu"  # Dagster pools: GPU steps, and training steps on CPU nodes (not `cpu`: data and report steps)
CPU_TRAINING_POOL = "cpu_training"
APP_UID = 10001  # the `alpha` user of deploy/Dockerfile
HOME = "/home/alpha"
COMPILE_CACHE = "/output/.cache/compile"  # on the output volume, shared by every step pod

# A pre-empted node takes its pod with it: Dagster sees the failed Job (or the interrupted step) and starts a new
# attempt in a new Job after ~30 s, then ~90 s (+-30 s jitter, so the steps of one lost node do not return at once).
# The Job itself keeps backoff_limit 0: Dagster owns retries, a second loop inside Kubernetes would rerun the same
# attempt behind Dagster's back. Errors that will not go away on a new node raise dg.Failure(allow_retries=False).
STEP_RETRY_POLICY = dg.RetryPolicy(max_retries=2, delay=30, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS)

_NON_ROOT = {"run_as_non_root": True, "run_as_user": APP_UID, "run_as_group": APP_UID,
             "seccomp_profile": {"type": "RuntimeDefault"}}


def _step_tags(requests: dict, limits: dict, node_pool: str, tolerations: list[dict]) -> dict:
    """The op tags of a training step pod: its resources and node pool; the rest is common to every step."""
    return {
        "dagster-k8s/config": {
            "container_config": {
                "resources": {"requests": requests, "limits": limits},
                "security_context": {**_NON_ROOT, "allow_privilege_escalation": False,
                                     "read_only_root_filesystem": True, "capabilities": {"drop": ["ALL"]}},
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
                    # compiled kernels on the shared volume: only the first pod of an image compiles the
                    # flagship (about 11 s on an H200); the caches key on torch, GPU and source, and write atomically
                    {"name": "TRITON_CACHE_DIR", "value": f"{COMPILE_CACHE}/triton"},
                    {"name": "TORCHINDUCTOR_CACHE_DIR", "value": f"{COMPILE_CACHE}/torchinductor"},
                    {"name": "MPLCONFIGDIR", "value": f"{HOME}/.config/matplotlib"},
                ],
            },
            "pod_spec_config": {
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
            # backoff_limit 0: a failed pod fails the Job and Dagster's STEP_RETRY_POLICY decides (see above)
            "job_spec_config": {"ttl_seconds_after_finished": 3600, "backoff_limit": 0},
        }
    }


GPU_STEP_TAGS = _step_tags({"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
                           {"memory": "64Gi", "nvidia.com/gpu": "1"}, GPU_NODE_POOL,
                           [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
# 15 of a 16-vCPU, 32 GB node's cores (the kubelet reserves part of a node: 16 would never fit), one step per node;
# no CPU limit, which would throttle. The pool's nodes carry CPU_NODE_TAINT, so nothing else (run workers, data steps)
# takes their cores; no GPU toleration, so these pods never take a GPU node.
CPU_NODE_TAINT = "alpha/cpu-training"
CPU_STEP_TAGS = _step_tags({"cpu": "15", "memory": "24Gi"}, {"memory": "24Gi"}, CPU_NODE_POOL,
                           [{"key": CPU_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}])


@dataclass(frozen=True)
class Placement:
    """Where a model's training and hyperopt steps run: its Dagster pool, pod spec and default torch device."""

    pool: str
    op_tags: dict
    device: str | None  # None: cuda when available

    @property
    def on_gpu(self) -> bool:
        return self.pool == GPU_POOL


GPU = Placement(GPU_POOL, GPU_STEP_TAGS, None)
CPU = Placement(CPU_TRAINING_POOL, CPU_STEP_TAGS, "cpu")


def gpu_models() -> list[str]:
    """ALPHA_GPU_MODELS: the models put on GPU pods although they default to CPU pods (e.g. `dqn`)."""
    names = [n.strip() for n in os.environ.get("ALPHA_GPU_MODELS", "").split(",") if n.strip()]
    unknown = [n for n in names if n not in registry.REGISTRY]
    if unknown:
        raise PlanError(f"ALPHA_GPU_MODELS: unknown model {', '.join(unknown)} (registered: {', '.join(registry.REGISTRY)})")
    return names


def placement(model: str) -> Placement:
    """RL agents on CPU pods (SB3 MLP policies: the GPU idles while the environment steps on the CPU, and a CPU
    node is cheaper per step, deploy/README.md), unless ALPHA_GPU_MODELS names them; every other model on a GPU."""
    return CPU if registry.get(model).group == "rl" and model not in gpu_models() else GPU


def pinned_image(image: str, variable: str = "ALPHA_TRAINING_IMAGE") -> str:
    """An image reference a node cannot silently resolve to other code: a digest, or a tag other than `latest`."""
    name = image.rsplit("/", 1)[-1]
    if "@" in name:
        return image
    if ":" not in name or name.rsplit(":", 1)[1] in ("", "latest"):
        raise PlanError(f"{variable}={image!r}: pin the image to a git-SHA tag or a digest (':latest' or no tag "
                        "lets a node run stale code)")
    return image


def executor() -> dg.ExecutorDefinition:
    """Chosen by the environment, never by default: a local run must not try to reach a cluster."""
    if os.environ.get("ALPHA_EXECUTOR", "multiprocess") == "k8s":
        from dagster_k8s import k8s_job_executor

        config: dict = {"max_concurrent": MAX_PARALLEL}
        if os.environ.get("ALPHA_TRAINING_IMAGE"):  # otherwise the code location's image (module docstring)
            config["job_image"] = pinned_image(os.environ["ALPHA_TRAINING_IMAGE"])
        return k8s_job_executor.configured(config)
    # forkserver: each step forks from a process that imported the code once, instead of importing it again
    return dg.multiprocess_executor.configured({"max_concurrent": MAX_PARALLEL, "start_method": {"forkserver": {}}})
