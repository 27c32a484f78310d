"""TGGN: the gated graph step against its equations, causality, round trip, learning the planted signal."""

from __future__ import annotations

import pytest
import torch
from model_harness import assert_causal, fit_and_score
from safetensors.torch import load_model, save_model

from alpha_core.models.tggn import TGGNConfig, TGGNModel


def test_gated_graph_step_equals_ggnn_equations():
    torch.manual_seed(0)
    model = TGGNModel(TGGNConfig(n_features=5, d_node=4)).double()
    step = model.graph[0]
    h = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    a = model.adjacency()
    assert torch.allclose(a.sum(-1), torch.ones(5, dtype=torch.float64))
    w, gru = step.message.weight, step.gru
    expected = torch.empty_like(h)
    for b in range(2):
        for k in range(3):
            for node in range(5):
                m = sum(a[node, j] * (w @ h[b, k, j]) for j in range(5))  # messages from every node
                hv = h[b, k, node]
                r = torch.sigmoid(gru.weight_ih[:4] @ m + gru.bias_ih[:4] + gru.weight_hh[:4] @ hv + gru.bias_hh[:4])
                z = torch.sigmoid(gru.weight_ih[4:8] @ m + gru.bias_ih[4:8] + gru.weight_hh[4:8] @ hv + gru.bias_hh[4:8])
                c = torch.tanh(gru.weight_ih[8:] @ m + gru.bias_ih[8:] + r * (gru.weight_hh[8:] @ hv + gru.bias_hh[8:]))
                expected[b, k, node] = (1 - z) * c + z * hv
    torch.testing.assert_close(step(h, a), expected, rtol=1e-12, atol=1e-12)


def test_shapes_gradients_round_trip_and_causality(tmp_path):
    model = TGGNModel(TGGNConfig(n_features=13))
    x = torch.randn(3, 17, 13)
    out = model(x)
    assert out.shape == (3, 17, 3)
    out.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    save_model(model, str(tmp_path / "tggn.safetensors"))
    again = TGGNModel(TGGNConfig(n_features=13))
    load_model(again, str(tmp_path / "tggn.safetensors"))
    torch.testing.assert_close(again(x), model(x), rtol=0, atol=0)
    assert_causal(model, 13)


@pytest.mark.slow
def test_learns_the_planted_bar_signal(tiny_sidecars):
    bars = tiny_sidecars["bars"]
    aucs = fit_and_score(TGGNModel(TGGNConfig(n_features=13)), bars[:4], [bars[4]])
    assert aucs[0] > 0.55, aucs
