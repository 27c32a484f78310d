"""In-house CfC (alpha_core.models.cfc): closed-form equations, sequence loop, per-sample timespans, ncps oracle."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from alpha_core.models.cfc import CfC, CfCCell

NCPS_KEYS = {
    "backbone.0.weight", "backbone.0.bias",
    "ff1.weight", "ff1.bias", "ff2.weight", "ff2.bias",
    "time_a.weight", "time_a.bias", "time_b.weight", "time_b.bias",
}  # fmt: skip


def explicit_cell(sd: dict[str, torch.Tensor], x, h, ts, backbone_layers: int = 1):
    """The CfC equations written out from the raw weights (no calls into the module)."""
    if ts.dim() == 1:
        ts = ts[:, None]
    z = torch.cat([x, h], dim=1)
    for k in range(backbone_layers):
        z = 1.7159 * torch.tanh(0.666 * (z @ sd[f"backbone.{2 * k}.weight"].T + sd[f"backbone.{2 * k}.bias"]))
    ff1 = torch.tanh(z @ sd["ff1.weight"].T + sd["ff1.bias"])
    ff2 = torch.tanh(z @ sd["ff2.weight"].T + sd["ff2.bias"])
    t_a = z @ sd["time_a.weight"].T + sd["time_a.bias"]
    t_b = z @ sd["time_b.weight"].T + sd["time_b.bias"]
    gate = 1.0 / (1.0 + torch.exp(-(t_a * ts + t_b)))
    return ff1 * (1.0 - gate) + gate * ff2


def make_cell(in_=3, hidden=4, units=7, layers=1, seed=0) -> CfCCell:
    torch.manual_seed(seed)
    return CfCCell(in_, hidden, backbone_units=units, backbone_layers=layers).double()


def test_parameter_names_are_ncps():
    assert set(make_cell().state_dict()) == NCPS_KEYS
    two = set(make_cell(layers=2).state_dict())
    assert two == NCPS_KEYS | {"backbone.2.weight", "backbone.2.bias"}
    assert set(CfC(3, 4, 7).state_dict()) == {f"rnn_cell.{k}" for k in NCPS_KEYS}


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("ts_shape", ["B", "B1", "BH"])
def test_cell_matches_closed_form(layers, ts_shape):
    B, D, H = 5, 3, 4
    cell = make_cell(D, H, 7, layers)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, D, generator=g, dtype=torch.float64)
    h = torch.rand(B, H, generator=g, dtype=torch.float64) * 2 - 1
    ts = {
        "B": torch.tensor([0.01, 0.3, 1.0, 2.5, 7.0], dtype=torch.float64),  # a different elapsed time per sample
        "B1": torch.tensor([[0.2], [0.0], [3.0], [0.7], [1.1]], dtype=torch.float64),
        "BH": torch.rand(B, H, generator=g, dtype=torch.float64) * 4,  # and per unit
    }[ts_shape]
    want = explicit_cell(cell.state_dict(), x, h, ts, layers)
    torch.testing.assert_close(cell(x, h, ts), want, rtol=0, atol=1e-13)
    torch.testing.assert_close(cell.step(cell.input_projection(x), h, ts), want, rtol=0, atol=1e-13)
    # each sample used its own ts: recomputing sample 2 alone with sample 0's ts gives a different answer
    if ts_shape == "B":
        alone = explicit_cell(cell.state_dict(), x[2:3], h[2:3], ts[0:1], layers)
        assert (alone - want[2:3]).abs().max() > 1e-4


def test_cell_rejects_bad_ts_shape():
    cell = make_cell()
    x, h = torch.zeros(5, 3, dtype=torch.float64), torch.zeros(5, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="ts must have shape"):
        cell(x, h, torch.zeros(5, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="ts must have shape"):
        cell(x, h, torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="timespans must have shape"):
        CfC(3, 4, 7).double()(torch.zeros(5, 6, 3, dtype=torch.float64), torch.zeros(5, 5, dtype=torch.float64))


def irregular_ts(B, L, seed=2, H=None):
    g = torch.Generator().manual_seed(seed)
    shape = (B, L) if H is None else (B, L, H)
    return torch.rand(shape, generator=g, dtype=torch.float64).pow(3) * 3  # many tiny gaps, a few long ones


@pytest.mark.parametrize("per_unit", [False, True])
def test_sequence_equals_cell_loop(per_unit):
    B, L, D, H = 4, 9, 3, 5
    torch.manual_seed(3)
    m = CfC(D, H, backbone_units=8).double()
    x = torch.randn(B, L, D, dtype=torch.float64)
    ts = irregular_ts(B, L, H=H if per_unit else None)
    h0 = torch.randn(B, H, dtype=torch.float64).tanh()
    out, h_last = m(x, ts, h0)
    assert out.shape == (B, L, H) and h_last.shape == (B, H)
    h, ref = h0, []
    for t in range(L):
        h = m.rnn_cell(x[:, t], h, ts[:, t])
        ref.append(h)
    torch.testing.assert_close(out, torch.stack(ref, 1), rtol=0, atol=1e-13)
    torch.testing.assert_close(h_last, h, rtol=0, atol=1e-13)
    torch.testing.assert_close(h_last, out[:, -1], rtol=0, atol=0)


def test_per_sample_timespans_matter_and_samples_are_independent():
    B, L, D, H = 4, 6, 3, 5
    torch.manual_seed(4)
    m = CfC(D, H, backbone_units=8).double()
    x = torch.randn(1, L, D, dtype=torch.float64).expand(B, L, D)  # the same input for every sample
    ts = irregular_ts(B, L, seed=5) + 0.05
    out, _ = m(x, ts)
    for b in range(1, B):  # only the elapsed times differ, and they change the outputs
        assert (out[b] - out[0]).abs().max() > 1e-4
    solo = torch.stack([m(x[b : b + 1], ts[b : b + 1])[0][0] for b in range(B)])  # each sample alone (B=1)
    torch.testing.assert_close(out, solo, rtol=0, atol=1e-13)
    ts2 = ts.clone()
    ts2[1] *= 3  # changing sample 1's times changes sample 1 only
    out2, _ = m(x, ts2)
    assert (out2[1] - out[1]).abs().max() > 1e-4
    torch.testing.assert_close(out2[[0, 2, 3]], out[[0, 2, 3]], rtol=0, atol=0)


def test_h0_is_respected():
    B, L, D, H = 3, 5, 3, 4
    torch.manual_seed(6)
    m = CfC(D, H, backbone_units=8).double()
    x, ts = torch.randn(B, L, D, dtype=torch.float64), irregular_ts(B, L)
    out_none, _ = m(x, ts)
    out_zero, _ = m(x, ts, torch.zeros(B, H, dtype=torch.float64))
    torch.testing.assert_close(out_none, out_zero, rtol=0, atol=0)
    h0 = torch.full((B, H), 0.8, dtype=torch.float64)
    out_h0, _ = m(x, ts, h0)
    assert (out_h0[:, 0] - out_zero[:, 0]).abs().max() > 1e-3
    torch.testing.assert_close(out_h0[:, 0], m.rnn_cell(x[:, 0], h0, ts[:, 0]), rtol=0, atol=1e-13)


def test_float64_timespans_keep_a_float32_state():
    m = CfC(3, 4, 8)
    out, h = m(torch.randn(2, 5, 3), irregular_ts(2, 5))
    assert out.dtype == h.dtype == torch.float32


@pytest.mark.parametrize("layers", [1, 2])
def test_gradients_reach_every_parameter(layers):
    B, L, D, H = 3, 7, 3, 4
    torch.manual_seed(7)
    m = CfC(D, H, backbone_units=8, backbone_layers=layers).double()
    x = torch.randn(B, L, D, dtype=torch.float64, requires_grad=True)
    h0 = torch.zeros(B, H, dtype=torch.float64, requires_grad=True)
    ts = irregular_ts(B, L).requires_grad_(True)
    out, h_last = m(x, ts, h0)
    (out.pow(2).sum() + h_last.sum()).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    w0 = m.rnn_cell.backbone[0].weight.grad  # both column blocks (x-part and h-part) get gradient
    assert w0[:, :D].abs().sum() > 0 and w0[:, D:].abs().sum() > 0
    for t in (x, h0, ts):
        assert torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0


def test_gradcheck_small():
    torch.manual_seed(8)
    m = CfC(2, 3, backbone_units=4).double()
    x = torch.randn(2, 3, 2, dtype=torch.float64, requires_grad=True)
    ts = (irregular_ts(2, 3) + 0.1).requires_grad_(True)
    h0 = torch.randn(2, 3, dtype=torch.float64).tanh().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b, c: m(a, b, c)[0], (x, ts, h0))


def test_matches_ncps():
    ncps_torch = pytest.importorskip("ncps.torch")
    D, H, U, L = 5, 6, 16, 7
    torch.manual_seed(9)
    theirs_cell = ncps_torch.CfCCell(D, H, mode="default", backbone_units=U, backbone_layers=1).double()
    ours_cell = CfCCell(D, H, backbone_units=U).double()
    ours_cell.load_state_dict(theirs_cell.state_dict(), strict=True)
    x = torch.randn(1, D, dtype=torch.float64)
    h = torch.randn(1, H, dtype=torch.float64).tanh()
    ts = torch.tensor([0.37], dtype=torch.float64)
    want, _ = theirs_cell(x, h, ts)
    torch.testing.assert_close(ours_cell(x, h, ts), want, rtol=0, atol=1e-14)
    # the whole layer at B=1, the only batch size where ncps's timespans work
    theirs = ncps_torch.CfC(D, H, mode="default", backbone_units=U, backbone_layers=1).double()
    ours = CfC(D, H, backbone_units=U).double()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    xs, tss = torch.randn(1, L, D, dtype=torch.float64), irregular_ts(1, L)
    h0 = torch.zeros(1, H, dtype=torch.float64)
    want_seq, want_h = theirs(xs, h0, timespans=tss)
    got_seq, got_h = ours(xs, tss, h0)
    torch.testing.assert_close(got_seq, want_seq, rtol=0, atol=1e-13)
    torch.testing.assert_close(got_h, want_h, rtol=0, atol=1e-13)


def test_safetensors_round_trip(tmp_path):
    from safetensors.torch import load_model, save_model

    torch.manual_seed(10)
    m = CfC(3, 4, backbone_units=8, backbone_layers=2)
    save_model(m, str(tmp_path / "cfc.safetensors"))
    torch.manual_seed(11)
    m2 = CfC(3, 4, backbone_units=8, backbone_layers=2)
    x, ts = torch.randn(2, 5, 3), irregular_ts(2, 5).float()
    assert not torch.equal(m(x, ts)[0], m2(x, ts)[0])
    load_model(m2, str(tmp_path / "cfc.safetensors"))
    assert torch.equal(m(x, ts)[0], m2(x, ts)[0])


def test_learns_to_integrate_elapsed_time():
    """Input carries no timing; the target is the running sum of the irregular gaps, so only `timespans` helps."""
    torch.manual_seed(12)
    B, L, H = 64, 12, 16
    m = CfC(1, H, backbone_units=32)
    head = torch.nn.Linear(H, 1)
    opt = torch.optim.Adam([*m.parameters(), *head.parameters()], lr=1e-2)

    def batch(seed):
        g = torch.Generator().manual_seed(seed)
        ts = torch.rand(B, L, generator=g).pow(2) * 2  # gaps in [0, 2), mean 2/3
        return torch.ones(B, L, 1), ts, ts.cumsum(1) / 8

    x_val, ts_val, y_val = batch(10_000)
    baseline = F.mse_loss(y_val.mean(0, keepdim=True).expand_as(y_val), y_val).item()  # per-step mean, no ts
    for it in range(250):
        x, ts, y = batch(it)
        loss = F.mse_loss(head(m(x, ts)[0]).squeeze(-1), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        val = F.mse_loss(head(m(x_val, ts_val)[0]).squeeze(-1), y_val).item()
    assert val < 0.2 * baseline, (val, baseline)  # 0.01-0.07 over seeds; a ts-blind model stays at ~1.1


def test_dynamo_traces_one_graph():
    """fullgraph=True fails on any graph break (.item(), data-dependent control flow); the eager backend skips
    inductor, so this stays cheap on the CPU (~2 s) while checking what torch.compile and CUDA graphs need."""
    torch._dynamo.reset()
    torch.manual_seed(14)
    m = CfC(3, 4, backbone_units=8)
    x, ts = torch.randn(2, 6, 3), irregular_ts(2, 6).float()
    compiled = torch.compile(m, backend="eager", fullgraph=True)
    out, h = compiled(x, ts)
    out.sum().backward()
    torch.testing.assert_close(out, m(x, ts)[0], rtol=0, atol=0)
    torch._dynamo.reset()


@pytest.mark.cuda
def test_cuda_matches_cpu():
    B, L, D, H = 4, 10, 3, 5
    torch.manual_seed(13)
    m = CfC(D, H, backbone_units=8).double()
    x, ts = torch.randn(B, L, D, dtype=torch.float64), irregular_ts(B, L)
    out, h = m(x, ts)
    out.sum().backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad(set_to_none=True)
    mc = m.cuda()
    out_c, h_c = mc(x.cuda(), ts.cuda())
    out_c.sum().backward()
    torch.testing.assert_close(out_c.cpu(), out, rtol=0, atol=1e-12)
    torch.testing.assert_close(h_c.cpu(), h, rtol=0, atol=1e-12)
    for n, p in mc.named_parameters():
        torch.testing.assert_close(p.grad.cpu(), grads[n], rtol=1e-10, atol=1e-12)


def test_parallel_cfc_equals_each_layer_alone():
    """Block-diagonal fusion of two CfCs (the flagship's main and aux trunks): same outputs, same gradients."""
    from alpha_core.models.cfc import parallel_cfc

    torch.manual_seed(3)
    a, b = CfC(5, 6, backbone_units=7).double(), CfC(5, 4, backbone_units=3).double()
    xa, xb = (torch.randn(3, 9, 5, dtype=torch.float64, requires_grad=True) for _ in range(2))
    ta = torch.rand(3, 9, 6, dtype=torch.float64, requires_grad=True)
    tb = torch.rand(3, 9, dtype=torch.float64, requires_grad=True)
    fused = parallel_cfc([a, b], [xa, xb], [ta, tb])
    alone = [a(xa, ta)[0], b(xb, tb)[0]]
    for f, s in zip(fused, alone, strict=True):
        torch.testing.assert_close(f, s, rtol=0, atol=1e-12)
    weights = [torch.randn_like(o) for o in alone]
    params = [*a.parameters(), *b.parameters(), xa, xb, ta, tb]
    g_fused = torch.autograd.grad(sum((o * w).sum() for o, w in zip(fused, weights, strict=True)), params)
    g_alone = torch.autograd.grad(sum((o * w).sum() for o, w in zip(alone, weights, strict=True)), params)
    for gf, ga in zip(g_fused, g_alone, strict=True):
        torch.testing.assert_close(gf, ga, rtol=0, atol=1e-12)
