"""Model weights as safetensors, written atomically, on any device.

`safetensors.torch.save_model`/`load_model` refuse a model whose tensors share one buffer without being the same
tensor, which is what cuDNN makes of an LSTM's weights on CUDA (it flattens them into one buffer): TFT and
Diffusion could be neither saved nor evaluated on a GPU. Here aliases (tied weights, SB3's shared extractor)
are stored once, under the first name, every other tensor is copied apart to the CPU, and loading copies each
stored tensor into the model's own (possibly shared) buffers.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from alpha_core.atomic import atomic_file


def _aliases(model: torch.nn.Module) -> dict[tuple, list[str]]:
    """The model's state names grouped by the tensor they name (a group of several: tied weights)."""
    groups: dict[tuple, list[str]] = {}
    for name, tensor in model.state_dict().items():
        key = (
            tensor.device,
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tuple(tensor.stride()),
        )
        groups.setdefault(key, []).append(name)
    return groups


def save_weights(model: torch.nn.Module, path: str | Path, metadata: dict[str, str] | None = None) -> Path:
    state = model.state_dict()
    kept = {names[0]: state[names[0]].detach().to("cpu", copy=True).contiguous() for names in _aliases(model).values()}
    with atomic_file(path) as tmp:
        save_file(kept, str(tmp), metadata=metadata)
    return Path(path)


def load_weights(model: torch.nn.Module, path: str | Path, device: str | torch.device = "cpu") -> torch.nn.Module:
    """Load `save_weights` output (or `save_model`'s) into `model`; a missing or unexpected name is an error."""
    state = load_file(str(path), device=str(device))
    missing, unexpected = model.load_state_dict(state, strict=False)
    covered = {name for names in _aliases(model).values() if any(n in state for n in names) for name in names}
    missing = [name for name in missing if name not in covered]
    if missing or unexpected:
        raise RuntimeError(f"{path}: weights do not fit the model (missing {missing[:5]}, unexpected {unexpected[:5]})")
    return model
