"""Compiled kernels that outlive the process (issue 33 item 2): a fold pod's torch.compile (Inductor's FX graph and
AOTAutograd caches) and Triton kernels go to `<root>/<key>/`, so the second pod of a run, and every later run of the
same code on the same card, loads them instead of compiling (a cold flagship fold spends most of its first step
compiling, bench/README.md), and so do the CfC scan's CUDA C kernels (`alpha_core/models/nvrtc.py`, about 1.3 s of
NVRTC per kernel set).

`<root>`: `$ALPHA_COMPILE_CACHE`, else `$ALPHA_STORAGE_ROOT/compile-cache` (the shared output volume of every step
pod), else none (torch's own per-machine default is left alone); `ALPHA_COMPILE_CACHE=off` turns it off. `<key>`:
the code version (a hash of alpha_core's sources), the card's name and the torch and Python versions, so a new
image, another card or another torch never reads kernels built for something else (Inductor and Triton key their
entries on the graph, the device and their own versions too: the folder only keeps generations apart, so that an
old one can be deleted whole). Every trainer calls `use` before it builds a model, from every door (the CLI,
Dagster steps, hyperopt trials). Inductor and Triton write each entry to a temporary file and rename it into place,
so a pod that dies mid-write, or two pods writing the same entry, leave no partial file.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
from pathlib import Path

ENV = "ALPHA_COMPILE_CACHE"
_active: Path | None = None  # the folder `use` chose for this process


def root() -> Path | None:
    """The cache root for this process, None when there is none (see the module's doc)."""
    explicit = os.environ.get(ENV)
    if explicit == "off":
        return None
    if explicit:
        return Path(explicit)
    storage = os.environ.get("ALPHA_STORAGE_ROOT")
    return Path(storage) / "compile-cache" if storage else None


@functools.cache
def code_version() -> str:
    """A hash of every Python source of alpha_core (its version included): any change to the code is a new key."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def key(device) -> str:
    """`<code>-<card>-torch<version>-py<major.minor>`, the card being the device's name (`cpu` off a GPU)."""
    import torch

    device = torch.device(device)
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    slug = re.sub(r"[^a-z0-9.]+", "-", f"{card}-torch{torch.__version__}".lower()).strip("-")
    return f"{code_version()}-{slug}-py{sys.version_info.major}.{sys.version_info.minor}"


def use(device) -> Path | None:
    """Point Inductor and Triton at `<root>/<key>/` for the rest of this process (before anything compiles: both
    read their folders from the environment when they write or look up an entry). Returns the folder, or None
    where there is no root."""
    base = root()
    if base is None:
        return None
    folder = base / key(device)
    (folder / "inductor").mkdir(parents=True, exist_ok=True)
    (folder / "triton").mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder / "inductor")
    os.environ["TRITON_CACHE_DIR"] = str(folder / "triton")
    global _active
    _active = folder
    return folder


def active() -> Path | None:
    """The folder `use` chose for this process (our own NVRTC kernels are kept in its `nvrtc/`), None before."""
    return _active
