"""Where steps run: local processes by default, Kubernetes pods when ALPHA_EXECUTOR=k8s.

The pod spec itself is `alpha_assets.pod_spec` (op tags of the training and hyperopt assets, and the executor's
`step_k8s_config` for every other step); this module picks the executor and places steps. Each model's steps are placed
(`placement`) on one of two node pools, each with its Dagster pool (dagster.yaml), so pods wait for a slot
before they are created instead of piling up Pending (the pool names, GPU_POOL, CPU_TRAINING_POOL and CPU_POOL for
every other step, are defined here and nowhere else):

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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import dagster as dg

from alpha_assets.pod_spec import CPU_STEP_TAGS, GPU_STEP_TAGS, STEP_K8S_CONFIG
from alpha_core.errors import PlanError
from alpha_core.models import registry

MAX_PARALLEL = int(os.environ.get("MAX_PARALLEL", "10"))  # the original system's GPU concurrency cap
# The Dagster pools (limits: dagster.yaml, and `alpha run` for a local instance), every asset's `pool` is one of them
GPU_POOL = "gpu"  # training and hyperopt steps on a GPU
CPU_TRAINING_POOL = "cpu_training"  # training and hyperopt steps on CPU nodes (the RL agents, `placement`)
CPU_POOL = "cpu"  # every other step: sidecars, fold plans, the report

# A pre-empted node takes its pod with it: Dagster sees the failed Job (or the interrupted step) and starts a new
# attempt in a new Job after ~30 s, then ~90 s (+-30 s jitter, so the steps of one lost node do not return at once).
# The Job itself keeps backoff_limit 0: Dagster owns retries, a second loop inside Kubernetes would rerun the same
# attempt behind Dagster's back. The retry takes the lost pod's attempt over at once (alpha_core.locks). Errors that
# will not go away on a new node raise dg.Failure(allow_retries=False). ALPHA_STEP_RETRY_DELAY_S: the first delay.
STEP_RETRY_POLICY = dg.RetryPolicy(
    max_retries=2,
    delay=float(os.environ.get("ALPHA_STEP_RETRY_DELAY_S", "30")),
    backoff=dg.Backoff.EXPONENTIAL,
    jitter=dg.Jitter.PLUS_MINUS,
)


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
        raise PlanError(
            f"{variable}={image!r}: pin the image to a git-SHA tag or a digest (':latest' or no tag lets a node run stale code)"
        )
    return image


def executor() -> dg.ExecutorDefinition:
    """Chosen by the environment, never by default: a local run must not try to reach a cluster."""
    if os.environ.get("ALPHA_EXECUTOR", "multiprocess") == "k8s":
        from dagster_k8s import k8s_job_executor

        # every step pod, training or not: the ServiceAccount without RBAC, no token (pod_spec.STEP_K8S_CONFIG)
        config: dict = {"max_concurrent": MAX_PARALLEL, "step_k8s_config": STEP_K8S_CONFIG}
        if os.environ.get("ALPHA_TRAINING_IMAGE"):  # otherwise the code location's image (module docstring)
            config["job_image"] = pinned_image(os.environ["ALPHA_TRAINING_IMAGE"])
        return k8s_job_executor.configured(config)
    # forkserver: each step forks from a process that imported the code once, instead of importing it again
    return dg.multiprocess_executor.configured({"max_concurrent": MAX_PARALLEL, "start_method": {"forkserver": {}}})


@contextmanager
def leased_device(place: Placement, context: dg.AssetExecutionContext) -> Iterator[None]:
    """A GPU step on a host with several GPUs runs on one of its own (alpha_core.devices); others run as they are."""
    if not place.on_gpu:
        yield
        return
    from alpha_core.devices import gpu_lease

    with gpu_lease(run=context.run.run_id, step=f"{context.asset_key.to_user_string()}[{context.partition_key}]") as gpu:
        if gpu is not None:
            context.log.info(f"leased GPU {gpu} of this host")
        yield
