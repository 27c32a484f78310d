"""Every private PyTorch API alpha uses, behind one small function, so an upgrade has one module to check.

torch is pinned to >=2.11,<2.14 (pyproject.toml):

- `foreach_norm` (`torch._foreach_norm`): the 2-norm of each of many tensors in one fused kernel. The flagship's
  training step clips by the global gradient norm inside a CUDA graph and torch.compile; the public
  `torch.nn.utils.get_total_norm` groups tensors by device and dtype in Python on every call, which the captured
  step cannot afford. `torch._foreach_norm` is what both public clip functions call underneath.

On an upgrade: check `torch._foreach_norm` keeps its signature (a list of tensors -> a list of 0-d norms), then run
tests/test_train_perception.py and the CUDA test set (`pytest -m cuda`, bench/gpu_check.sh).
"""

from __future__ import annotations

import torch
from torch import Tensor


def foreach_norm(tensors: list[Tensor]) -> list[Tensor]:
    return torch._foreach_norm(tensors)
