"""Mamba2 ensemble member: shapes, causality, safetensors round trip, learning the planted bar signal."""

from __future__ import annotations

import pytest
import torch
from model_harness import assert_causal, fit_and_score
from safetensors.torch import load_model, save_model

from alpha_core.models.mamba2_stack import Mamba2StackConfig, Mamba2StackModel


def test_shapes_gradients_and_round_trip(tmp_path):
    model = Mamba2StackModel(Mamba2StackConfig(n_features=13))
    x = torch.randn(4, 21, 13)
    out = model(x)
    assert out.shape == (4, 21, 3)
    out.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    save_model(model, str(tmp_path / "m.safetensors"))
    again = Mamba2StackModel(Mamba2StackConfig(n_features=13))
    load_model(again, str(tmp_path / "m.safetensors"))
    torch.testing.assert_close(again(x), model(x), rtol=0, atol=0)


def test_causal():
    assert_causal(Mamba2StackModel(Mamba2StackConfig(n_features=13)), 13)


@pytest.mark.slow
def test_learns_the_planted_bar_signal(tiny_sidecars):
    bars = tiny_sidecars["bars"]
    torch.manual_seed(0)  # the initial weights, whatever ran before
    aucs = fit_and_score(Mamba2StackModel(Mamba2StackConfig(n_features=13)), bars[:4], [bars[4]])
    assert aucs[0] > 0.55, aucs
