"""Every private ncps API alpha uses, each behind one small function, so an upgrade has one module to check.

ncps is pinned (pyproject.toml: ncps==1.0.1). The Liquid member runs ncps's `LTCCell` through a fused kernel
(`models/ltc_triton.py`) that must compute exactly what ncps computes, so it reads the cell's parameters and solver
settings, which ncps keeps private (no public accessor exists in 1.0.1):

- `ltc_params` (`LTCCell._params`): the dict of the cell's parameters and masks (`w`, `sigma`, `mu`, `erev`, `cm`,
  `gleak`, `vleak`, the sensory ones, `output_w`/`output_b`).
- `ltc_map_inputs` (`LTCCell._map_inputs`): the input affine mapping ncps applies before the sensory synapses.
- `ltc_ode_unfolds`, `ltc_epsilon` (`LTCCell._ode_unfolds`, `LTCCell._epsilon`): the solver's unfolds per step and
  the denominator's epsilon.

On an upgrade: check each name still exists with the same meaning (ncps/torch/ltc_cell.py), then run
tests/test_model_liquid.py, which compares the fused path with ncps itself, values and gradients.
"""

from __future__ import annotations

from torch import Tensor


def ltc_params(cell) -> dict[str, Tensor]:
    return cell._params


def ltc_map_inputs(cell, x: Tensor) -> Tensor:
    return cell._map_inputs(x)


def ltc_ode_unfolds(cell) -> int:
    return cell._ode_unfolds


def ltc_epsilon(cell) -> float:
    return cell._epsilon
