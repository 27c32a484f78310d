"""Mamba2: chunked SSD against a naive sequential recurrence (fp64), and the block/stack as a trainable module."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_model, save_model

from alpha_core.models.mamba2 import (
    Mamba2,
    Mamba2Block,
    Mamba2Config,
    broadcast_einsum,
    causal_depthwise_conv,
    segsum,
    ssd_chunked,
)

F64 = torch.float64


def naive_ssd(x, dt, A, B, C, initial_state=None):
    """The recurrence itself, one step at a time: h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T ; y_t = h_t C_t."""
    b, length, h, p = x.shape
    r = h // B.shape[2]
    Bh, Ch = B.repeat_interleave(r, dim=2), C.repeat_interleave(r, dim=2)  # head i uses group i // r
    state = x.new_zeros(b, h, p, B.shape[-1]) if initial_state is None else initial_state
    ys = []
    for t in range(length):
        decay = torch.exp(dt[:, t] * A)[..., None, None]
        state = decay * state + (dt[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", state, Ch[:, t]))
    return torch.stack(ys, dim=1), state


def random_ssd_inputs(b, length, h, p, g, n, seed, with_state=False):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, length, h, p, generator=gen, dtype=F64)
    dt = torch.nn.functional.softplus(torch.randn(b, length, h, generator=gen, dtype=F64) - 1)
    A = -torch.rand(h, generator=gen, dtype=F64) * 3 - 0.1
    B = torch.randn(b, length, g, n, generator=gen, dtype=F64)
    C = torch.randn(b, length, g, n, generator=gen, dtype=F64)
    init = torch.randn(b, h, p, n, generator=gen, dtype=F64) if with_state else None
    return x, dt, A, B, C, init


@pytest.mark.parametrize("spec", ["bcsgn,bcsgrp->bcgrpn", "bclgn,bcsgn->bgcls", "bgrzc,bcgrpn->bzgrpn", "ab,cb->acb"])
def test_broadcast_einsum_is_einsum(spec):
    torch.manual_seed(3)
    sizes = dict(zip("abcgln prsz".replace(" ", ""), [2, 3, 4, 1, 5, 6, 7, 2, 5, 3], strict=True))
    first, second = spec.split("->")[0].split(",")
    x = torch.randn([sizes[ch] for ch in first], dtype=F64)
    y = torch.randn([sizes[ch] for ch in second], dtype=F64)
    torch.testing.assert_close(broadcast_einsum(spec, x, y), torch.einsum(spec, x, y), rtol=1e-12, atol=1e-12)


def test_segsum_matches_definition():
    x = torch.randn(2, 7, dtype=F64)
    out = segsum(x)
    for i in range(7):
        for j in range(7):
            want = x[:, j + 1 : i + 1].sum(-1) if i >= j else torch.full((2,), -torch.inf, dtype=F64)
            torch.testing.assert_close(out[:, i, j], want, rtol=0, atol=1e-14)


@pytest.mark.parametrize("broadcast", [False, True], ids=["matmuls", "broadcasts"])
@pytest.mark.parametrize("g", [1, 2])
@pytest.mark.parametrize("length", [1, 5, 37, 64])
@pytest.mark.parametrize("chunk", [4, 8, 16, 32])
def test_ssd_chunked_matches_recurrence(chunk, length, g, broadcast):
    x, dt, A, B, C, _ = random_ssd_inputs(2, length, 4, 3, g, 5, seed=chunk * 1000 + length * 10 + g)
    leaves = [t.requires_grad_() for t in (x, dt, A, B, C)]
    y, final = ssd_chunked(x, dt, A, B, C, chunk, broadcast=broadcast)
    y_ref, final_ref = naive_ssd(x, dt, A, B, C)
    assert y.shape == (2, length, 4, 3) and final.shape == (2, 4, 3, 5)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(final, final_ref, rtol=0, atol=1e-10)
    wy, wf = torch.randn_like(y), torch.randn_like(final)  # random cotangents: checks the full vector-Jacobian product
    grads = torch.autograd.grad((y * wy).sum() + (final * wf).sum(), leaves)
    grads_ref = torch.autograd.grad((y_ref * wy).sum() + (final_ref * wf).sum(), leaves)
    for name, got, want in zip(["x", "dt", "A", "B", "C"], grads, grads_ref, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10, msg=lambda m, name=name: f"grad {name}: {m}")


@pytest.mark.parametrize("chunk,length,g", [(4, 37, 2), (8, 64, 1), (16, 5, 1)])
def test_ssd_chunked_initial_state(chunk, length, g):
    x, dt, A, B, C, init = random_ssd_inputs(2, length, 4, 3, g, 5, seed=7, with_state=True)
    leaves = [t.requires_grad_() for t in (x, dt, A, B, C, init)]
    y, final = ssd_chunked(x, dt, A, B, C, chunk, initial_state=init)
    y_ref, final_ref = naive_ssd(x, dt, A, B, C, initial_state=init)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(final, final_ref, rtol=0, atol=1e-10)
    grads = torch.autograd.grad(y.square().sum() + final.sum(), leaves)
    grads_ref = torch.autograd.grad(y_ref.square().sum() + final_ref.sum(), leaves)
    for got, want in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_ssd_split_sequence_via_state():
    """Running [0, 20) then [20, 37) from the carried state equals one pass over [0, 37)."""
    x, dt, A, B, C, _ = random_ssd_inputs(1, 37, 4, 3, 2, 5, seed=3)
    y, final = ssd_chunked(x, dt, A, B, C, 8)
    y1, s1 = ssd_chunked(x[:, :20], dt[:, :20], A, B[:, :20], C[:, :20], 8)
    y2, s2 = ssd_chunked(x[:, 20:], dt[:, 20:], A, B[:, 20:], C[:, 20:], 8, initial_state=s1)
    torch.testing.assert_close(torch.cat([y1, y2], dim=1), y, rtol=0, atol=1e-12)
    torch.testing.assert_close(s2, final, rtol=0, atol=1e-12)


def small_cfg(**kw) -> Mamba2Config:
    base = {"d_model": 32, "d_state": 8, "d_head": 8, "expand": 2, "d_conv": 4, "n_groups": 2, "chunk_size": 8}
    return Mamba2Config(**(base | kw))


def test_config_validation():
    assert Mamba2Config().n_heads == 8
    with pytest.raises(ValueError):
        Mamba2Config(d_head=48)  # 128 not divisible by 48
    with pytest.raises(ValueError):
        Mamba2Config(n_groups=3)  # 8 heads not divisible by 3
    with pytest.raises(ValueError):
        Mamba2Config(bogus=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("length", [1, 13, 40])
def test_block_and_stack_shapes_dtypes(dtype, length):
    torch.manual_seed(0)
    u = torch.randn(3, length, 32, dtype=dtype)
    for model in (Mamba2Block(small_cfg()), Mamba2(small_cfg(n_layers=2))):
        out = model.to(dtype)(u)
        assert out.shape == u.shape and out.dtype == dtype and torch.isfinite(out).all()


@pytest.mark.parametrize("cls", [Mamba2Block, Mamba2])
def test_causal_exactly(cls):
    torch.manual_seed(1)
    model = cls(small_cfg(n_layers=2)).eval()
    u = torch.randn(2, 29, 32)
    with torch.no_grad():
        base = model(u)
        for t in (0, 7, 8, 15, 28):  # chunk boundaries and interiors
            v = u.clone()
            v[:, t:] = torch.randn_like(v[:, t:]) * 3
            out = model(v)
            assert torch.equal(out[:, :t], base[:, :t]), f"position < {t} changed"
            if t < 28:
                assert not torch.equal(out[:, t:], base[:, t:])


def test_gradient_reaches_every_parameter():
    torch.manual_seed(2)
    model = Mamba2(small_cfg(n_layers=2))
    model(torch.randn(2, 19, 32)).square().mean().backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name
    names = {n for n, _ in model.named_parameters()}
    mixer = {"in_proj.weight", "conv1d.weight", "conv1d.bias", "dt_bias", "A_log", "D", "norm.weight", "out_proj.weight"}
    assert names == {f"layers.{i}.mixer.{m}" for i in range(2) for m in mixer} | {
        f"layers.{i}.norm.weight" for i in range(2)
    } | {"norm_f.weight"}


def test_dt_and_A_init_ranges():
    block = Mamba2Block(Mamba2Config(d_model=256, d_head=8))  # 64 heads
    dt = torch.nn.functional.softplus(block.dt_bias)
    assert dt.min() >= 1e-3 * 0.999 and dt.max() <= 1e-1 * 1.001
    A = -torch.exp(block.A_log)
    assert A.min() >= -16 and A.max() <= -1


def test_safetensors_round_trip(tmp_path):
    torch.manual_seed(3)
    cfg = small_cfg(n_layers=2)
    model = Mamba2(cfg)
    u = torch.randn(2, 21, 32)
    path = tmp_path / "mamba2.safetensors"
    save_model(model, str(path))
    torch.manual_seed(99)
    fresh = Mamba2(cfg)
    assert not torch.equal(fresh(u), model(u))
    load_model(fresh, str(path))
    assert torch.equal(fresh(u), model(u))


def test_overfit_shifted_copy():
    """Learn y_t = x_{t-3} for random 1-D signals: needs memory across time, not just a per-step map."""
    torch.manual_seed(4)
    shift, length = 3, 32
    net = torch.nn.Sequential(
        torch.nn.Linear(1, 32), Mamba2(small_cfg(n_layers=1, n_groups=1, chunk_size=16)), torch.nn.Linear(32, 1)
    )
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    x = torch.randn(16, length, 1)
    target = torch.nn.functional.pad(x, (0, 0, shift, 0))[:, :length]
    losses = []
    for _ in range(100):
        loss = torch.nn.functional.mse_loss(net(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 10, (losses[0], losses[-1])


@pytest.mark.cuda
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_cuda_matches_cpu(dtype, tol):
    torch.manual_seed(5)
    model = Mamba2(small_cfg(n_layers=2)).to(dtype)
    u = torch.randn(3, 37, 32, dtype=dtype)
    with torch.no_grad():
        cpu = model(u)
        gpu = model.to("cuda")(u.to("cuda")).cpu()
    torch.testing.assert_close(gpu, cpu, rtol=tol, atol=tol)


@pytest.mark.cuda
def test_the_automatic_chunk_at_a_large_gpu_batch_computes_what_the_cpu_does():
    """Without a configured chunk a GPU batch above 64 takes chunks of 32 (faster there), the CPU 16: the same
    function, to fp32 rounding."""
    torch.manual_seed(6)
    model = Mamba2(small_cfg(n_layers=2, chunk_size=None))
    u = torch.randn(65, 64, 32)
    with torch.no_grad():
        cpu = model(u)
        gpu = model.to("cuda")(u.to("cuda")).cpu()
    torch.testing.assert_close(gpu, cpu, rtol=1e-4, atol=1e-4)


def test_causal_depthwise_conv_equals_the_padded_conv1d_values_and_gradients():
    """The block's shifted-sum conv is the Conv1d it replaced (same parameters, so old checkpoints load)."""
    torch.manual_seed(0)
    channels, width, length = 24, 4, 37
    conv = torch.nn.Conv1d(channels, channels, width, groups=channels, padding=width - 1).double()
    x = torch.randn(3, length, channels, dtype=torch.double, requires_grad=True)
    reference = conv(x.transpose(1, 2))[..., :length].transpose(1, 2)
    shifted = causal_depthwise_conv(x, conv.weight, conv.bias)
    torch.testing.assert_close(shifted, reference)
    inputs = [x, conv.weight, conv.bias]
    for a, b in zip(
        torch.autograd.grad((reference**2).sum(), inputs), torch.autograd.grad((shifted**2).sum(), inputs), strict=True
    ):
        torch.testing.assert_close(b, a)
