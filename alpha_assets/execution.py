"""Where steps run: local processes by default, Kubernetes pods (one GPU each) when ALPHA_EXECUTOR=k8s.

The GPU pod spec lives on the training and hyperopt assets as op tags: dagster-k8s applies op-level
`dagster-k8s/config` to step pods, while job-level tags do not reach them. The `gpu` pool (dagster.yaml)
caps GPU steps across runs, so pods wait for a slot before they are created instead of piling up Pending.

Step pods run the code location's own image: the Helm chart sets DAGSTER_CURRENT_IMAGE on the code server,
`dagster api grpc` records it in the job origin, and the k8s executor falls back to that image when it has
no `job_image`. ALPHA_TRAINING_IMAGE overrides it (a pinned tag or digest, never `:latest`).
"""

import os

import dagster as dg

from alpha_core.errors import PlanError

MAX_PARALLEL = int(os.environ.get("MAX_PARALLEL", "10"))  # the spec's GPU concurrency cap
GPU_NODE_POOL = os.environ.get("ALPHA_GPU_NODE_POOL", "gpu-training")
APP_UID = 10001  # the `alpha` user of deploy/Dockerfile
HOME = "/home/alpha"

# A pre-empted GPU node takes its pod with it: Dagster sees the failed Job (or the interrupted step) and starts a new
# attempt in a new Job after ~30 s, then ~90 s (+-30 s jitter, so the steps of one lost node do not return at once).
# The Job itself keeps backoff_limit 0: Dagster owns retries, a second loop inside Kubernetes would rerun the same
# attempt behind Dagster's back. Errors that will not go away on a new node raise dg.Failure(allow_retries=False).
GPU_RETRY_POLICY = dg.RetryPolicy(max_retries=2, delay=30, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS)

_NON_ROOT = {"run_as_non_root": True, "run_as_user": APP_UID, "run_as_group": APP_UID,
             "seccomp_profile": {"type": "RuntimeDefault"}}

GPU_STEP_TAGS = {
    "dagster-k8s/config": {
        "container_config": {
            "resources": {
                "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
                "limits": {"memory": "64Gi", "nvidia.com/gpu": "1"},
            },
            "security_context": {**_NON_ROOT, "allow_privilege_escalation": False, "read_only_root_filesystem": True,
                                 "capabilities": {"drop": ["ALL"]}},
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
                {"name": "TRITON_CACHE_DIR", "value": f"{HOME}/.cache/triton"},
                {"name": "TORCHINDUCTOR_CACHE_DIR", "value": f"{HOME}/.cache/torchinductor"},
                {"name": "MPLCONFIGDIR", "value": f"{HOME}/.config/matplotlib"},
            ],
        },
        "pod_spec_config": {
            "security_context": {**_NON_ROOT, "fs_group": APP_UID},
            "node_selector": {"k8s.scaleway.com/pool-name": GPU_NODE_POOL},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "volumes": [
                {"name": "data", "persistent_volume_claim": {"claim_name": "training-data-pvc", "read_only": True}},
                {"name": "output", "persistent_volume_claim": {"claim_name": "training-output-pvc"}},
                {"name": "dshm", "empty_dir": {"medium": "Memory", "size_limit": "32Gi"}},
                {"name": "tmp", "empty_dir": {"size_limit": "16Gi"}},
                {"name": "home", "empty_dir": {"size_limit": "8Gi"}},  # compile caches (Triton, Inductor)
            ],
        },
        # backoff_limit 0: a failed pod fails the Job and Dagster's GPU_RETRY_POLICY decides (see above)
        "job_spec_config": {"ttl_seconds_after_finished": 3600, "backoff_limit": 0},
    }
}


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
