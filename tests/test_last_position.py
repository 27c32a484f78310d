"""Evaluation reads each window's last position only, and the models that can compute just that (`last_position`,
after `position_wise` where a model has one) give what the whole forward gives there, and depend on exactly the
positions the whole forward's last output depends on."""

from __future__ import annotations

import pytest
import torch

from alpha_core.models import registry

LAST_POSITION_MODELS = sorted(
    name
    for name, spec in registry.REGISTRY.items()
    if spec.trainer == "supervised" and hasattr(spec.builder(), "last_position")
)


def _model(name: str, n_features: int = 13) -> torch.nn.Module:
    torch.manual_seed(3)
    return registry.get(name).build(n_features=n_features).eval()


def _last(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model.last_position(model.position_wise(x) if hasattr(model, "position_wise") else x)


def test_the_models_that_evaluation_runs_fastest_have_a_last_position_path():
    assert {"kan", "mamba2", "tggn", "tlob"} <= set(LAST_POSITION_MODELS)


@pytest.mark.parametrize("name", LAST_POSITION_MODELS)
@pytest.mark.parametrize("seq_len", [1, 7, 64])
def test_last_position_is_the_forward_at_the_last_position(name, seq_len):
    model = _model(name)
    x = torch.randn(5, seq_len, 13)
    with torch.inference_mode():
        want = model(x)[:, -1]
        got = _last(model, x)
    assert got.shape == want.shape == (5, len(model.cfg.horizons))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", LAST_POSITION_MODELS)
def test_last_position_depends_on_what_the_forward_depends_on(name):
    """Changing an input row moves `last_position` exactly where it moves the whole forward's last output (TGGN's
    receptive field is 15 bars: a change before it moves neither)."""
    model = _model(name)
    x = torch.randn(2, 40, 13)
    with torch.inference_mode():
        base_full, base_last = model(x)[:, -1], _last(model, x)
        for row in (0, 10, 24, 25, 39):
            y = x.clone()
            y[:, row] += 3.0
            moved_full = not torch.allclose(model(y)[:, -1], base_full, atol=1e-6)
            moved_last = not torch.allclose(_last(model, y), base_last, atol=1e-6)
            assert moved_full == moved_last, f"{name}: row {row}"


@pytest.mark.cuda
@pytest.mark.parametrize("name", LAST_POSITION_MODELS)
def test_last_position_on_cuda_matches_the_cpu(name):
    """Evaluation on a GPU takes the same path: the last position there equals the CPU forward's (TF32 off)."""
    model = _model(name)
    x = torch.randn(64, 64, 13)
    with torch.inference_mode():
        want = model(x)[:, -1]
        before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        try:
            got = _last(model.cuda(), x.cuda()).cpu()
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
