"""Weights save on every device: aliases kept once, tensors sharing one buffer (cuDNN's LSTM on CUDA) copied apart."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_model

from alpha_core.weights import load_weights, save_weights


class Flattened(torch.nn.Module):
    """Two parameters in one buffer, as cuDNN lays out an LSTM's weights on CUDA."""

    def __init__(self) -> None:
        super().__init__()
        flat = torch.arange(8, dtype=torch.float32)
        self.w_ih = torch.nn.Parameter(flat[:4])
        self.w_hh = torch.nn.Parameter(flat[4:])


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(3, 3)
        self.decoder = self.encoder


def test_tensors_sharing_one_buffer_are_saved_and_loaded(tmp_path):
    model = Flattened()
    with pytest.raises(RuntimeError):  # what broke TFT and Diffusion on the GPU
        save_model(model, str(tmp_path / "plain.safetensors"))
    save_weights(model, tmp_path / "w.safetensors")
    fresh = Flattened()
    with torch.no_grad():
        fresh.w_ih.zero_(), fresh.w_hh.zero_()
    load_weights(fresh, tmp_path / "w.safetensors")
    assert fresh.w_ih.tolist() == [0, 1, 2, 3] and fresh.w_hh.tolist() == [4, 5, 6, 7]


def test_tied_weights_are_kept_once_and_stay_tied(tmp_path):
    model = Tied()
    save_weights(model, tmp_path / "w.safetensors", metadata={"epoch": "3"})
    fresh = Tied()
    load_weights(fresh, tmp_path / "w.safetensors")
    assert torch.equal(fresh.encoder.weight, model.encoder.weight) and fresh.decoder is fresh.encoder


def test_weights_of_another_architecture_are_refused(tmp_path):
    save_weights(Tied(), tmp_path / "w.safetensors")
    with pytest.raises(RuntimeError, match="do not fit the model"):
        load_weights(Flattened(), tmp_path / "w.safetensors")
