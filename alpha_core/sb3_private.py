"""Every private stable-baselines3 API alpha uses, behind one small function, so an upgrade has one module to check.

stable-baselines3 is pinned (pyproject.toml: stable-baselines3==2.9.2).

- `subclass_with_setup` (`BaseAlgorithm._setup_model`): the lean DQN (alpha_core/rl/agents.py) adjusts the policy
  SB3 has just built (functional Q-networks, foreach Adam, no train/eval walk); SB3 builds it in `_setup_model`,
  called from the constructor and from `load`, and offers no public hook after it.

On an upgrade: check `_setup_model` is still where the policy and its optimizer are created, then run
tests/test_rl.py (the lean DQN's weights equal SB3's DQN's after the same steps).
"""

from __future__ import annotations

from collections.abc import Callable


def subclass_with_setup(base: type, hook: Callable[[object], None], name: str) -> type:
    """A subclass of the SB3 algorithm `base` that passes itself to `hook` once SB3 has built its policy."""

    def _setup_model(self) -> None:
        base._setup_model(self)
        hook(self)

    return type(name, (base,), {"_setup_model": _setup_model, "__doc__": hook.__doc__, "__module__": hook.__module__})
