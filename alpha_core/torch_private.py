"""Every private PyTorch API alpha uses, behind one small function, so an upgrade has one module to check.

torch is pinned to >=2.11,<2.14 (pyproject.toml):

- `foreach_norm` (`torch._foreach_norm`): the 2-norm of each of many tensors in one fused kernel. The flagship's
  training step clips by the global gradient norm inside a CUDA graph and torch.compile; the public
  `torch.nn.utils.get_total_norm` groups tensors by device and dtype in Python on every call, which the captured
  step cannot afford. `torch._foreach_norm` is what both public clip functions call underneath.
- `one_config_gemm_templates` (Inductor's `test_configs.max_mm_configs`): Inductor's Triton matmul templates, which
  fuse a product with the elementwise work around it, without benchmarking a dozen block configurations for each
  of the step's ~50 products. At the flagship's B=1 the candidates all time within a microsecond of each other; the
  benchmarking tripled a cold fold's compile (93 s against 12 s on an H100) for a kernel choice that does not matter.
- `one_config_reductions` (Inductor's `test_configs.force_filter_reduction_configs`): each reduction kernel with the
  one block configuration Inductor's own heuristic ranks first, instead of compiling several and timing them at the
  first run.
- `start_compile_workers` (`torch._inductor.async_compile.maybe_warm_pool`): Inductor's Triton compile workers,
  started before the first compile. Inductor starts them at its first compile, after Dynamo's trace, and compiles
  each kernel in the calling process, one after another, until they are up.

On an upgrade: check `torch._foreach_norm` keeps its signature (a list of tensors -> a list of 0-d norms), that
Inductor still has `test_configs.max_mm_configs` (without it the templates are simply not used) and
`test_configs.force_filter_reduction_configs` (without it every configuration is compiled and timed), that
`async_compile.maybe_warm_pool` is still there, and that Inductor still offers its templates from 68 SMs
(`is_big_gpu`, `TEMPLATE_MIN_SMS`), then run tests/test_train_perception.py and the CUDA test set (`pytest -m cuda`,
bench/gpu_check.sh).
"""

from __future__ import annotations

import torch
from torch import Tensor


def foreach_norm(tensors: list[Tensor]) -> list[Tensor]:
    return torch._foreach_norm(tensors)


# Inductor offers its Triton matmul templates only on GPUs with this many SMs (`torch._inductor.utils.is_big_gpu`);
# on a smaller one, Triton as the only GEMM backend would leave a product no kernel at all (NoValidChoicesError)
TEMPLATE_MIN_SMS = 68


def one_config_gemm_templates(multiprocessors: int) -> dict[str, object]:
    """torch.compile options: every product through one Triton template configuration, with its epilogue fused and
    nothing benchmarked. Empty on a GPU of fewer than `TEMPLATE_MIN_SMS` multiprocessors, and where this torch's
    Inductor cannot cap the configurations (benchmarking them all would cost more compile time than the templates
    save)."""
    from torch._inductor import config

    if multiprocessors < TEMPLATE_MIN_SMS or "test_configs.max_mm_configs" not in config.get_config_copy():
        return {}
    return {
        "max_autotune_gemm": True,
        "max_autotune_gemm_backends": "TRITON",
        "test_configs.max_mm_configs": 1,
        "benchmark_epilogue_fusion": False,
    }


def one_config_reductions() -> dict[str, object]:
    """torch.compile options: one block configuration for each reduction kernel, none timed (empty where this torch's
    Inductor lacks the option)."""
    from torch._inductor import config

    name = "test_configs.force_filter_reduction_configs"
    return {name: True} if name in config.get_config_copy() else {}


def start_compile_workers() -> None:
    """Start Inductor's Triton compile workers now. Call it after the cache folders are set (`compile_cache.use`):
    the workers keep the environment they start with."""
    from torch._inductor.async_compile import maybe_warm_pool

    maybe_warm_pool()
