"""The xLSTM member's sLSTM recurrence (`xlstm.slstm_step` over a sequence) fused into one Triton kernel per
direction: its CUDA path (issue 33 item 4).

Why: the sLSTM's ``R h_{t-1}`` term makes it a true recurrence, which the eager loop runs as about 30 small ops a
step forward and 70 backward: at 64 bars, over 6,000 dependent launches per training step, 96% of the member's ops
(the mLSTM block is parallel), so the GPU waits on launches and xLSTM was the ensemble's slowest fold. Here a
program owns one (batch row, head), keeps the head's four [DH, DH] blocks of R and the state in registers, and
walks the bars in one loop; the backward walks them in reverse from the states the forward saved and sums R's
gradient per program (reduced over programs in torch: deterministic).

The math is `xlstm.slstm_step`'s, per head (gates i, f, z, o; ``raw_g = wx_g + h_{t-1} R_g``)::

    m_t = max(log f_t + m_{t-1}, i~_t)      i' = exp(i~ - m_t)      f' = exp(log f_t + m_{t-1} - m_t)
    c_t = f' c_{t-1} + i' tanh(z~)          n_t = f' n_{t-1} + i'   h_t = sigmoid(o~) c_t / n_t

The backward treats the stabiliser m as a constant: h depends on the ratio c / n only, which m scales out
exactly, so m's own paths contribute nothing to the true gradient (autograd of the loop computes them, and they
cancel to round-off). Tested against the loop, values and gradients, in Triton's interpreter on the CPU
(tests/test_model_xlstm.py) and on CUDA (the `cuda` test set); CPU runs keep the loop.
"""

from __future__ import annotations

import warnings

import torch
import triton
import triton.language as tl
from torch import Tensor

from alpha_core.devices import exact_fp32


@triton.jit
def _tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _slstm_fwd_kernel(
    wx,
    R,
    out,
    cs,
    ns,
    ms,
    last,
    T: tl.constexpr,
    NH: tl.constexpr,
    DH: tl.constexpr,
    DP: tl.constexpr,
    SAVE: tl.constexpr,
):
    """wx [B, T, 4, NH, DH]; R [NH, DH, 4, DH]; out [B, T, NH, DH] (h); with SAVE, cs, ns, ms (c, n, m) likewise;
    last [3, B, NH, DH]: the final c, n, m."""
    pid = tl.program_id(0).to(tl.int64)
    b = pid // NH
    head = pid % NH
    d = tl.arange(0, DP)
    e = tl.arange(0, DP)
    me = e < DH
    m2 = (d[:, None] < DH) & me[None, :]
    r_at = (head * DH + d[:, None]) * 4 * DH + e[None, :]  # R[head, d, g, e] = r_at + g * DH
    Ri = tl.load(R + r_at, mask=m2, other=0.0)
    Rf = tl.load(R + r_at + DH, mask=m2, other=0.0)
    Rz = tl.load(R + r_at + 2 * DH, mask=m2, other=0.0)
    Ro = tl.load(R + r_at + 3 * DH, mask=m2, other=0.0)
    h = tl.zeros([DP], dtype=tl.float32)
    c = tl.zeros([DP], dtype=tl.float32)
    n = tl.zeros([DP], dtype=tl.float32)
    m = tl.full([DP], float("-inf"), dtype=tl.float32)
    for t in range(T):
        w_at = ((b * T + t) * 4 * NH + head) * DH + e  # gate g at + g * NH * DH
        hd = h[:, None]
        i_pre = tl.load(wx + w_at, mask=me, other=0.0) + tl.sum(hd * Ri, axis=0)
        f_pre = tl.load(wx + w_at + NH * DH, mask=me, other=0.0) + tl.sum(hd * Rf, axis=0)
        z_pre = tl.load(wx + w_at + 2 * NH * DH, mask=me, other=0.0) + tl.sum(hd * Rz, axis=0)
        o_pre = tl.load(wx + w_at + 3 * NH * DH, mask=me, other=0.0) + tl.sum(hd * Ro, axis=0)
        log_f = tl.minimum(f_pre, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(f_pre)))  # logsigmoid
        m_new = tl.maximum(log_f + m, i_pre)
        i_gate = tl.exp(i_pre - m_new)
        f_gate = tl.exp(log_f + m - m_new)  # exp(-inf) = 0 at the first step
        c = f_gate * c + i_gate * _tanh(z_pre)
        n = f_gate * n + i_gate
        h = tl.sigmoid(o_pre) * c / n
        m = m_new
        s_at = ((b * T + t) * NH + head) * DH + e
        tl.store(out + s_at, h, mask=me)
        if SAVE:
            tl.store(cs + s_at, c, mask=me)
            tl.store(ns + s_at, n, mask=me)
            tl.store(ms + s_at, m, mask=me)
    l_at = (b * NH + head) * DH + e
    rows = tl.num_programs(0).to(tl.int64) * DH
    tl.store(last + l_at, c, mask=me)
    tl.store(last + rows + l_at, n, mask=me)
    tl.store(last + 2 * rows + l_at, m, mask=me)


@triton.jit
def _slstm_bwd_kernel(
    grad_out,
    wx,
    R,
    out,
    cs,
    ns,
    ms,
    d_wx,
    d_R,
    T: tl.constexpr,
    NH: tl.constexpr,
    DH: tl.constexpr,
    DP: tl.constexpr,
):
    """Bars in reverse; d_wx like wx; d_R [B * NH, DH, 4, DH]: this program's sum of h_{t-1} x d raw_t."""
    pid = tl.program_id(0).to(tl.int64)
    b = pid // NH
    head = pid % NH
    d = tl.arange(0, DP)
    e = tl.arange(0, DP)
    me = e < DH
    md = d < DH
    m2 = md[:, None] & me[None, :]
    r_at = (head * DH + d[:, None]) * 4 * DH + e[None, :]
    Ri = tl.load(R + r_at, mask=m2, other=0.0)
    Rf = tl.load(R + r_at + DH, mask=m2, other=0.0)
    Rz = tl.load(R + r_at + 2 * DH, mask=m2, other=0.0)
    Ro = tl.load(R + r_at + 3 * DH, mask=m2, other=0.0)
    acc_i = tl.zeros([DP, DP], dtype=tl.float32)
    acc_f = tl.zeros([DP, DP], dtype=tl.float32)
    acc_z = tl.zeros([DP, DP], dtype=tl.float32)
    acc_o = tl.zeros([DP, DP], dtype=tl.float32)
    carry_h = tl.zeros([DP], dtype=tl.float32)
    carry_c = tl.zeros([DP], dtype=tl.float32)
    carry_n = tl.zeros([DP], dtype=tl.float32)
    for r in range(T):
        t = T - 1 - r
        s_at = ((b * T + t) * NH + head) * DH + e
        p_at = s_at - NH * DH  # the previous bar's state (t - 1)
        first = t == 0
        h_prev = tl.load(out + p_at, mask=me & (t > 0), other=0.0)
        c_prev = tl.load(cs + p_at, mask=me & (t > 0), other=0.0)
        n_prev = tl.load(ns + p_at, mask=me & (t > 0), other=0.0)
        m_prev = tl.load(ms + p_at, mask=me & (t > 0), other=0.0)
        m_prev = tl.where(first, float("-inf"), m_prev)
        c = tl.load(cs + s_at, mask=me, other=0.0)
        n = tl.load(ns + s_at, mask=me, other=1.0)
        m = tl.load(ms + s_at, mask=me, other=0.0)
        w_at = ((b * T + t) * 4 * NH + head) * DH + e
        hd = h_prev[:, None]
        i_pre = tl.load(wx + w_at, mask=me, other=0.0) + tl.sum(hd * Ri, axis=0)
        f_pre = tl.load(wx + w_at + NH * DH, mask=me, other=0.0) + tl.sum(hd * Rf, axis=0)
        z_pre = tl.load(wx + w_at + 2 * NH * DH, mask=me, other=0.0) + tl.sum(hd * Rz, axis=0)
        o_pre = tl.load(wx + w_at + 3 * NH * DH, mask=me, other=0.0) + tl.sum(hd * Ro, axis=0)
        log_f = tl.minimum(f_pre, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(f_pre)))
        i_gate = tl.exp(i_pre - m)
        f_gate = tl.exp(log_f + m_prev - m)
        tz = _tanh(z_pre)
        so = tl.sigmoid(o_pre)
        g = tl.load(grad_out + s_at, mask=me, other=0.0) + carry_h
        dc = g * so / n + carry_c
        dn = -g * so * c / (n * n) + carry_n
        d_o = g * c / n * so * (1.0 - so)
        d_fg = dc * c_prev + dn * n_prev
        d_i = (dc * tz + dn) * i_gate
        d_z = dc * i_gate * (1.0 - tz * tz)
        d_f = d_fg * f_gate * tl.sigmoid(-f_pre)  # d logsigmoid(f) / df = sigmoid(-f)
        d_i = tl.where(me, d_i, 0.0)
        d_f = tl.where(me, d_f, 0.0)
        d_z = tl.where(me, d_z, 0.0)
        d_o = tl.where(me, d_o, 0.0)
        tl.store(d_wx + w_at, d_i, mask=me)
        tl.store(d_wx + w_at + NH * DH, d_f, mask=me)
        tl.store(d_wx + w_at + 2 * NH * DH, d_z, mask=me)
        tl.store(d_wx + w_at + 3 * NH * DH, d_o, mask=me)
        acc_i += hd * d_i[None, :]
        acc_f += hd * d_f[None, :]
        acc_z += hd * d_z[None, :]
        acc_o += hd * d_o[None, :]
        carry_h = tl.sum(Ri * d_i[None, :] + Rf * d_f[None, :] + Rz * d_z[None, :] + Ro * d_o[None, :], axis=1)
        carry_h = tl.where(md, carry_h, 0.0)
        carry_c = dc * f_gate
        carry_n = dn * f_gate
    p_at = (pid * DH + d[:, None]) * 4 * DH + e[None, :]
    tl.store(d_R + p_at, acc_i, mask=m2)
    tl.store(d_R + p_at + DH, acc_f, mask=m2)
    tl.store(d_R + p_at + 2 * DH, acc_z, mask=m2)
    tl.store(d_R + p_at + 3 * DH, acc_o, mask=m2)


def _warps(dp: int) -> int:
    return 1 if dp <= 16 else 4


class SLSTMScan(torch.autograd.Function):
    """h [B, T, NH, DH] of the sLSTM from the zero state, and the final (c, n, m), given wx [B, T, 4, NH, DH]
    (``W x_t + b`` of the gates i, f, z, o) and R [NH, DH, 4, DH]; float32, contiguous, on CUDA."""

    @staticmethod
    def forward(ctx, wx: Tensor, R: Tensor, save: bool):
        # wx [B, T, 4, NH, DH], R [NH, DH, 4, DH] -> (h [B, T, NH, DH], (c, n, m) [3, B, NH, DH])
        batch, length, _, heads, dh = wx.shape
        out = wx.new_empty(batch, length, heads, dh)
        states = [wx.new_empty(batch, length, heads, dh) if save else wx.new_empty(0) for _ in range(3)]
        last = wx.new_empty(3, batch, heads, dh)
        dp = triton.next_power_of_2(dh)
        if batch and length:
            _slstm_fwd_kernel[(batch * heads,)](wx, R, out, *states, last, length, heads, dh, dp, save, num_warps=_warps(dp))
        else:  # nothing to walk: the initial state
            last[:2].zero_()
            last[2].fill_(-torch.inf)
        if save:
            ctx.save_for_backward(wx, R, out, *states)
        ctx.mark_non_differentiable(last)
        return out, last

    @staticmethod
    def backward(ctx, grad_out, _grad_last):
        wx, R, out, cs, ns, ms = ctx.saved_tensors
        batch, length, _, heads, dh = wx.shape
        d_wx = torch.zeros_like(wx)
        part = wx.new_zeros(batch * heads, dh, 4, dh)
        dp = triton.next_power_of_2(dh)
        if batch and length:
            _slstm_bwd_kernel[(batch * heads,)](
                grad_out.float().contiguous(), wx, R, out, cs, ns, ms, d_wx, part, length, heads, dh, dp, num_warps=_warps(dp)
            )
        d_R = part.view(batch, heads, dh, 4, dh).sum(0)
        return d_wx, d_R, None


def slstm_scan(wx: Tensor, R: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor, Tensor]]:
    """`SLSTMLayer`'s loop from the zero state through the fused kernels: wx [B, T, 4, NH, DH] -> (h [B, T, NH, DH],
    the final state (h, c, n, m) as `slstm_step` returns it)."""
    wx, R = wx.float().contiguous(), R.float().contiguous()
    save = torch.is_grad_enabled() and (wx.requires_grad or R.requires_grad)
    h, last = SLSTMScan.apply(wx, R, save)
    c, n, m = last.unbind(0)
    final_h = h[:, -1] if h.shape[1] else torch.zeros_like(c)
    return h, (final_h, c, n, m)


_checked: dict[tuple, bool] = {}


def usable(wx: Tensor, reference) -> bool:
    """Whether the fused kernels work for wx's device and sizes (the bars, heads and head width they are compiled
    for): once a process per such shape, three random windows of that shape go through them and through
    `reference(wx, R)` (the loop), forward and backward; an error or a mismatch warns and keeps the loop, so a kernel
    that misbehaves on a new card or Triton costs speed, not results."""
    _, length, _, heads, width = wx.shape
    key = (wx.device, length, heads, width)
    if key not in _checked:
        try:
            # evaluation calls the model without grad; every command on CUDA turns TF32 on, which the loop's
            # einsum would then use (a 2.5e-4 miss at 64 bars sent training to the loop, 6x slower, 2026-12-06)
            with torch.inference_mode(False), torch.enable_grad(), exact_fp32():
                _check(wx.device, length, heads, width, reference)
            _checked[key] = True
        except Exception as exc:  # noqa: BLE001  (any failure of the kernels: keep the loop)
            why = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"sLSTM fused kernels unusable on {wx.device} ({why}); using the loop", stacklevel=2)
            _checked[key] = False
    return _checked[key]


def _check(device: torch.device, length: int, heads: int, width: int, reference) -> None:
    """The fused kernels against `reference` on three random windows: values and both gradients (raises on a
    mismatch)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    wx = (torch.randn(3, length, 4, heads, width, generator=gen) * 2).to(device).requires_grad_()
    R = (torch.randn(heads, width, 4, width, generator=gen) * 0.3).to(device).requires_grad_()
    got, _ = slstm_scan(wx, R)
    want = reference(wx, R)
    weights = torch.randn(got.shape, generator=gen).to(device)
    g_got = torch.autograd.grad((got * weights).sum(), (wx, R))
    g_want = torch.autograd.grad((want * weights).sum(), (wx, R))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for a, b in zip(g_got, g_want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
