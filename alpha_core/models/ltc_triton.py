"""Liquid's LTC recurrence (ncps's `LTCCell`, fully connected, elapsed time 1) fused into one Triton kernel per
direction: its CUDA path.

Why: ncps steps the cell's ODE `ode_unfolds` (6) times per bar in about a dozen small ops each, so a batch of 64
bars is thousands of dependent launches forward and as many backward, and a GPU waits on launches (eager: about
6% busy on an H200; compiling the solver cost 49 s per fold, more than the fold's training). Here a program owns
one batch row, keeps the [U, U] synapse parameters and the state in registers and walks all bars and unfolds in
one loop; the backward walks them in reverse, recomputing each unfold's synapse activations from the states the
forward saved, and sums the parameter gradients per program (reduced over programs in torch: deterministic).

The math is ncps's `LTCCell._ode_solver` (Hasani et al. 2021, fused semi-implicit Euler), per unfold, with v
indexed by unit (i presynaptic, j postsynaptic):

    A_ij = W_ij sigmoid(sigma_ij (v_i - mu_ij)),     W = softplus(w) * sparsity_mask
    v_j <- (cm_t_j v_j + gleak_j vleak_j + sum_i A_ij erev_ij + ns_j) / (cm_t_j + gleak_j + sum_i A_ij + ds_j + eps)

where ns, ds (the sensory synapses' numerator and denominator) depend on the bar's input only and are computed
for all bars at once in torch, as are the input and output mappings and the softplus constraints, so autograd
carries the gradients from the kernel's inputs to ncps's parameters. Tested against ncps, values and gradients,
in Triton's interpreter on the CPU (tests/test_model_liquid.py) and on CUDA (the `cuda` test set).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from alpha_core.ncps_private import ltc_epsilon, ltc_map_inputs, ltc_ode_unfolds, ltc_params

NUM_WARPS = 2  # per program (one batch row); U = 32 is a [32, 32] tile: 16 elements per thread


@triton.jit
def _ltc_fwd_kernel(
    ns,
    ds,
    w,
    sigma,
    mu,
    erev,
    cmt,
    gleak,
    glvl,
    out,
    vs,
    L: tl.constexpr,
    U: tl.constexpr,
    UP: tl.constexpr,
    UNF: tl.constexpr,
    EPS: tl.constexpr,
    SAVE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, UP)
    j = tl.arange(0, UP)
    mj = j < U
    m2 = (i[:, None] < U) & mj[None, :]
    at2 = i[:, None] * U + j[None, :]
    W = tl.load(w + at2, mask=m2, other=0.0)
    SG = tl.load(sigma + at2, mask=m2, other=0.0)
    MU = tl.load(mu + at2, mask=m2, other=0.0)
    ER = tl.load(erev + at2, mask=m2, other=0.0)
    cm = tl.load(cmt + j, mask=mj, other=0.0)
    gl = tl.load(gleak + j, mask=mj, other=0.0)
    glv = tl.load(glvl + j, mask=mj, other=0.0)
    v = tl.zeros([UP], dtype=tl.float32)
    for t in range(L):
        base = (row * L + t) * U
        nst = tl.load(ns + base + j, mask=mj, other=0.0)
        dst = tl.load(ds + base + j, mask=mj, other=0.0)
        for k in tl.static_range(UNF):
            if SAVE:
                tl.store(vs + (base * UNF + k * U) + j, v, mask=mj)
            a = W * tl.sigmoid(SG * (v[:, None] - MU))
            num = cm * v + glv + tl.sum(a * ER, axis=0) + nst
            den = cm + gl + tl.sum(a, axis=0) + dst
            v = num / (den + EPS)
        tl.store(out + base + j, v, mask=mj)


@triton.jit
def _ltc_bwd_kernel(
    grad_out,
    out,
    vs,
    ds,
    w,
    sigma,
    mu,
    erev,
    cmt,
    gleak,
    d_ns,
    d_ds,
    part2,
    part1,
    L: tl.constexpr,
    U: tl.constexpr,
    UP: tl.constexpr,
    UNF: tl.constexpr,
    EPS: tl.constexpr,
):
    """Per row, bars and unfolds in reverse. part2 [rows, 4, U, U]: this row's sums of dL/dW, dL/derev, dz and
    dz v_i (z = sigma (v_i - mu)); part1 [rows, 3, U]: of dL/dcm_t, dL/d(gleak vleak) and dL/dgleak."""
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, UP)
    j = tl.arange(0, UP)
    mj = j < U
    m2 = (i[:, None] < U) & mj[None, :]
    at2 = i[:, None] * U + j[None, :]
    W = tl.load(w + at2, mask=m2, other=0.0)
    SG = tl.load(sigma + at2, mask=m2, other=0.0)
    MU = tl.load(mu + at2, mask=m2, other=0.0)
    ER = tl.load(erev + at2, mask=m2, other=0.0)
    cm = tl.load(cmt + j, mask=mj, other=0.0)
    gl = tl.load(gleak + j, mask=mj, other=0.0)
    acc_w = tl.zeros([UP, UP], dtype=tl.float32)
    acc_er = tl.zeros([UP, UP], dtype=tl.float32)
    acc_dz = tl.zeros([UP, UP], dtype=tl.float32)
    acc_dzv = tl.zeros([UP, UP], dtype=tl.float32)
    acc_cm = tl.zeros([UP], dtype=tl.float32)
    acc_dn = tl.zeros([UP], dtype=tl.float32)
    acc_dd = tl.zeros([UP], dtype=tl.float32)
    carry = tl.zeros([UP], dtype=tl.float32)
    for r in range(L):
        t = L - 1 - r
        base = (row * L + t) * U
        g = tl.load(grad_out + base + j, mask=mj, other=0.0) + carry
        vn = tl.load(out + base + j, mask=mj, other=0.0)
        dst = tl.load(ds + base + j, mask=mj, other=0.0)
        dns = tl.zeros([UP], dtype=tl.float32)
        dds = tl.zeros([UP], dtype=tl.float32)
        for kk in tl.static_range(UNF):
            v = tl.load(vs + (base * UNF + (UNF - 1 - kk) * U) + j, mask=mj, other=0.0)
            s = tl.sigmoid(SG * (v[:, None] - MU))
            a = W * s
            den = cm + gl + tl.sum(a, axis=0) + dst + EPS
            dn = g / den
            dd = -dn * vn
            da = dn[None, :] * ER + dd[None, :]
            dz = da * a * (1.0 - s)
            acc_w += da * s
            acc_er += a * dn[None, :]
            acc_dz += dz
            acc_dzv += dz * v[:, None]
            acc_cm += dn * v + dd
            acc_dn += dn
            acc_dd += dd
            dns += dn
            dds += dd
            g = dn * cm + tl.sum(dz * SG, axis=1)
            vn = v
        tl.store(d_ns + base + j, dns, mask=mj)
        tl.store(d_ds + base + j, dds, mask=mj)
        carry = g
    p2 = part2 + row * 4 * U * U + at2
    tl.store(p2, acc_w, mask=m2)
    tl.store(p2 + U * U, acc_er, mask=m2)
    tl.store(p2 + 2 * U * U, acc_dz, mask=m2)
    tl.store(p2 + 3 * U * U, acc_dzv, mask=m2)
    p1 = part1 + row * 3 * U + j
    tl.store(p1, acc_cm, mask=mj)
    tl.store(p1 + U, acc_dn, mask=mj)
    tl.store(p1 + 2 * U, acc_dd, mask=mj)


class LTCScan(torch.autograd.Function):
    """states [B, L, U] of the LTC recurrence from a zero state, given the sensory terms ns, ds [B, L, U] and the
    constrained parameters (W = softplus(w) * mask, sigma, mu, erev [U, U]; cm_t, gleak, gleak * vleak [U])."""

    @staticmethod
    def forward(ctx, ns, ds, w, sigma, mu, erev, cmt, gleak, glvl, unfolds: int, eps: float, save: bool):
        # ns, ds [B, L, U], w, sigma, mu, erev [U, U], cmt, gleak, glvl [U] -> states [B, L, U]
        batch, length, units = ns.shape
        out = torch.empty_like(ns)
        vs = ns.new_empty(batch, length, unfolds, units) if save else ns.new_empty(0)
        if batch:
            _ltc_fwd_kernel[(batch,)](
                ns,
                ds,
                w,
                sigma,
                mu,
                erev,
                cmt,
                gleak,
                glvl,
                out,
                vs,
                length,
                units,
                triton.next_power_of_2(units),
                unfolds,
                eps,
                save,
                num_warps=NUM_WARPS,
            )
        if save:
            ctx.save_for_backward(out, vs, ds, w, sigma, mu, erev, cmt, gleak)
            ctx.unfolds, ctx.eps = unfolds, eps
        return out

    @staticmethod
    def backward(ctx, grad_out):
        out, vs, ds, w, sigma, mu, erev, cmt, gleak = ctx.saved_tensors
        batch, length, units = out.shape
        d_ns, d_ds = torch.empty_like(out), torch.empty_like(out)
        part2 = out.new_empty(batch, 4, units, units)
        part1 = out.new_empty(batch, 3, units)
        if batch:
            _ltc_bwd_kernel[(batch,)](
                grad_out.float().contiguous(),
                out,
                vs,
                ds,
                w,
                sigma,
                mu,
                erev,
                cmt,
                gleak,
                d_ns,
                d_ds,
                part2,
                part1,
                length,
                units,
                triton.next_power_of_2(units),
                ctx.unfolds,
                ctx.eps,
                num_warps=NUM_WARPS,
            )
        d_w, d_erev, dz, dzv = part2.sum(0).unbind(0)
        d_cmt, d_glvl, d_gleak = part1.sum(0).unbind(0)
        d_sigma = dzv - mu * dz  # sum of dz (v_i - mu_ij)
        d_mu = -sigma * dz
        return d_ns, d_ds, d_w, d_sigma, d_mu, d_erev, d_cmt, d_gleak, d_glvl, None, None, None


def ltc_states(cell, x: Tensor) -> Tensor:
    """The states [B, L, U] that `ncps.torch.LTC` (from a zero state, no timespans) computes with `cell` (an
    `LTCCell`) over the inputs x [B, L, F], through the fused kernels."""
    p, positive = ltc_params(cell), cell.make_positive_fn
    x = ltc_map_inputs(cell, x.float())
    sensory = positive(p["sensory_w"]) * torch.sigmoid(p["sensory_sigma"] * (x[..., None] - p["sensory_mu"]))
    sensory = sensory * p["sensory_sparsity_mask"]  # [B, L, F, U]
    ns = (sensory * p["sensory_erev"]).sum(2).contiguous()
    ds = sensory.sum(2).contiguous()
    unfolds = ltc_ode_unfolds(cell)
    cmt = positive(p["cm"]) / (1.0 / unfolds)  # ncps's cm / (elapsed_time / unfolds), elapsed 1
    gleak = positive(p["gleak"])
    params = [positive(p["w"]) * p["sparsity_mask"], p["sigma"], p["mu"], p["erev"], cmt, gleak, gleak * p["vleak"]]
    params = [q.float().contiguous() for q in params]
    save = torch.is_grad_enabled() and any(t.requires_grad for t in (ns, ds, *params))
    return LTCScan.apply(ns, ds, *params, unfolds, ltc_epsilon(cell), save)
