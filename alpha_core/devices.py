"""Which device a command runs on (`resolve_device`), and GPU leases: on a host with several GPUs and no
Kubernetes, each GPU step runs on a GPU of its own.

A local `alpha run` runs up to MAX_PARALLEL steps at once as processes of one host; without leases every GPU step
would pick `cuda` = GPU 0. A step leases one of the GPUs this process sees (`CUDA_VISIBLE_DEVICES`, else every GPU
of the host) by holding `gpu-<id>.lock` in a host-wide lease folder (`alpha_core.locks`: a lease of a crashed step
is taken over), and for the block the step sees that GPU alone, as `cuda` (CUDA_VISIBLE_DEVICES is set before the
process initialises CUDA). With one GPU or none there is nothing to share: no lease (a Kubernetes pod sees the one
GPU its `nvidia.com/gpu` request gave it). The `gpu` pool's limit (`alpha run`) is min(MAX_PARALLEL, GPUs), so a
step finds a free GPU; one that does not waits for one.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alpha_core.errors import PlanError
from alpha_core.locks import Lock

VISIBLE = "CUDA_VISIBLE_DEVICES"


def lease_dir() -> Path:
    """Host-wide: the leases of one host's GPUs (ALPHA_GPU_LEASE_DIR, else under the temp dir)."""
    return Path(os.environ.get("ALPHA_GPU_LEASE_DIR") or Path(tempfile.gettempdir()) / "alpha-gpu-leases")


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (else 0..n-1), without initialising CUDA."""
    listed = os.environ.get(VISIBLE)
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and not d.strip().startswith("-")]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


@contextmanager
def gpu_lease(run: str, step: str, wait_s: float = 3600.0, poll_s: float = 2.0) -> Iterator[str | None]:
    """Hold one GPU for the block and make it the only one this process sees; yields its id (None: no lease
    needed, with one GPU or none). Waits up to `wait_s` for a free GPU."""
    gpus = visible_gpus()
    if len(gpus) < 2:
        yield gpus[0] if gpus else None
        return
    deadline = time.monotonic() + wait_s
    while True:
        for gpu in gpus:
            lease = Lock(lease_dir() / f"gpu-{gpu}.lock", run=run, step=step)
            if lease.try_acquire() is None:
                before = os.environ.get(VISIBLE)
                os.environ[VISIBLE] = gpu
                try:
                    with lease.hold():
                        yield gpu
                finally:  # the process's own view is restored as it was
                    if before is None:
                        os.environ.pop(VISIBLE, None)
                    else:
                        os.environ[VISIBLE] = before
                return
        if time.monotonic() > deadline:
            raise PlanError(f"no GPU of {', '.join(gpus)} came free in {wait_s:.0f} s (leases in {lease_dir()})")
        time.sleep(poll_s)


def resolve_device(name: str | None):
    """The device to train or evaluate on (default: cuda when available). On CUDA, every command keeps fp32
    storage and lets matmuls use TF32 tensor cores: the same numerics for training and evaluation, and what
    the fused CfC kernel needs to be fast."""
    import torch

    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name is None else name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PlanError(f"--device {name}: CUDA is not available on this machine")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return device


@contextmanager
def exact_fp32() -> Iterator[None]:
    """fp32 matmuls and convolutions without TF32 for the block (then as before): a kernel checked against a torch
    reference must meet the exact reference, not one rounded to TF32's 10-bit mantissa."""
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
