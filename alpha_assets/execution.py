"""Where steps run: local processes by default, Kubernetes pods (one GPU each) when ALPHA_EXECUTOR=k8s.

The GPU pod spec lives on the training and hyperopt assets as op tags: dagster-k8s applies op-level
`dagster-k8s/config` to step pods, while job-level tags do not reach them. The `gpu` pool (dagster.yaml)
caps GPU steps across runs, so pods wait for a slot before they are created instead of piling up Pending.
"""

import os

import dagster as dg

MAX_PARALLEL = int(os.environ.get("MAX_PARALLEL", "10"))  # the spec's GPU concurrency cap
GPU_NODE_POOL = os.environ.get("ALPHA_GPU_NODE_POOL", "gpu-training")
TRAINING_IMAGE = os.environ.get("ALPHA_TRAINING_IMAGE", "rg.fr-par.scw.cloud/foxhunt-ci/training:latest")

GPU_STEP_TAGS = {
    "dagster-k8s/config": {
        "container_config": {
            "resources": {
                "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
                "limits": {"memory": "64Gi", "nvidia.com/gpu": "1"},
            },
            "volume_mounts": [
                {"name": "data", "mount_path": "/data", "read_only": True},
                {"name": "output", "mount_path": "/output"},
                {"name": "dshm", "mount_path": "/dev/shm"},
            ],
            "env": [
                {"name": "ALPHA_DATA_DIR", "value": "/data"},
                {"name": "ALPHA_STORAGE_ROOT", "value": "/output"},
            ],
        },
        "pod_spec_config": {
            "node_selector": {"k8s.scaleway.com/pool-name": GPU_NODE_POOL},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "volumes": [
                {"name": "data", "persistent_volume_claim": {"claim_name": "training-data-pvc", "read_only": True}},
                {"name": "output", "persistent_volume_claim": {"claim_name": "training-output-pvc"}},
                {"name": "dshm", "empty_dir": {"medium": "Memory", "size_limit": "32Gi"}},
            ],
        },
        "job_spec_config": {"ttl_seconds_after_finished": 3600, "backoff_limit": 0},
    }
}


def executor() -> dg.ExecutorDefinition:
    """Chosen by the environment, never by default: a local run must not try to reach a cluster."""
    if os.environ.get("ALPHA_EXECUTOR", "multiprocess") == "k8s":
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor.configured({"max_concurrent": MAX_PARALLEL, "job_image": TRAINING_IMAGE})
    return dg.multiprocess_executor.configured({"max_concurrent": MAX_PARALLEL})
