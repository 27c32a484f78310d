"""Closed-form continuous-time (CfC) recurrent cell and sequence layer (Hasani et al. 2022, "Closed-form
continuous-time neural networks", Nature Machine Intelligence), the "default" mode of ncps's `CfCCell`.

Why in-house: ncps 1.0.1's batched `timespans` is broken (`timespans[:, t].squeeze()` gives [B], which does not
broadcast against [B, units]; issues #81-#83), and the flagship needs a per-sample elapsed time because MBP-10
snapshots arrive irregularly. The parameter names are ncps's, so an ncps `CfCCell` state_dict loads here with
strict=True (and an ncps `CfC(..., mode="default")` state_dict loads into `CfC`, whose cell is `rnn_cell`).

One step, for input x_t, previous state h_{t-1} and elapsed time ts (per sample, or per sample and unit):

    lecun(u) = 1.7159 * tanh(0.666 * u)
    z     = lecun(W_0 [x_t ; h_{t-1}] + b_0)            backbone.0 (then backbone.2, backbone.4, ... the same way
                                                        for backbone_layers > 1: z = lecun(W_k z + b_k))
    ff1   = tanh(W_1 z + b_1)                           ff1
    ff2   = tanh(W_2 z + b_2)                           ff2
    t_a   = W_a z + b_a                                 time_a
    t_b   = W_b z + b_b                                 time_b
    gate  = sigmoid(t_a * ts + t_b)
    h_t   = ff1 * (1 - gate) + gate * ff2               (= lerp(ff1, ff2, gate))

The output of a step is h_t itself. With a small ts the gate sits near sigmoid(t_b); as ts grows it saturates
towards 0 or 1 depending on the sign of t_a, so the state moves between the two learned targets ff1 and ff2 at a
learned, input-dependent rate: this is the closed-form stand-in for integrating an ODE for time ts.

Speed (the layer is torch.compile'd and CUDA-graph captured on the GPU):
- W_0 is split by column views into its x-part and its h-part (the parameter stays the single ncps
  `backbone.0.weight`). The x-part of all L steps is one matmul before the loop (`input_projection`); each step
  only does the h-part.
- The four heads (ff1, ff2, time_a, time_b) run as one [4H, U] matmul per step; their weights are concatenated
  once per sequence, outside the loop.
- The loop iterates `xproj.unbind(1)` / `timespans.unbind(1)` (indexing `xproj[:, t]` would make autograd
  zero-fill a full-size gradient at every step) and stacks the outputs once at the end.
- No `.item()`, no host syncs, no data-dependent Python control flow; only shape checks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["CfC", "CfCCell", "LeCun"]


class LeCun(nn.Module):
    """LeCun's scaled tanh, 1.7159 * tanh(0.666 * x) (ncps's default backbone activation)."""

    def forward(self, x: Tensor) -> Tensor:  # x [...] -> [...] (elementwise)
        return 1.7159 * torch.tanh(0.666 * x)


def _ts_column(ts: Tensor, batch: int, hidden: int) -> Tensor:
    """Elapsed time [B], [B, 1] or [B, H] as a tensor that broadcasts against [B, H]."""
    if ts.dim() == 1:
        ts = ts.unsqueeze(-1)
    if ts.dim() != 2 or ts.shape[0] != batch or ts.shape[1] not in (1, hidden):
        raise ValueError(f"ts must have shape [B], [B, 1] or [B, H] with B={batch}, H={hidden}; got {tuple(ts.shape)}")
    return ts


class CfCCell(nn.Module):
    """One CfC step (ncps `CfCCell(input_size, hidden_size, mode="default", backbone_activation="lecun_tanh")`).

    Parameters: `backbone` (nn.Sequential of Linear, LeCun, Linear, LeCun, ...; Linears at even indices), `ff1`,
    `ff2`, `time_a`, `time_b`. Initialisation is ncps's: Xavier-uniform weights, PyTorch-default biases.
    """

    def __init__(self, input_size: int, hidden_size: int, backbone_units: int = 128, backbone_layers: int = 1) -> None:
        super().__init__()
        if backbone_layers < 1:
            raise ValueError(f"backbone_layers must be >= 1, got {backbone_layers}")
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.backbone_units = backbone_units
        self.backbone_layers = backbone_layers
        layers: list[nn.Module] = [nn.Linear(input_size + hidden_size, backbone_units), LeCun()]
        for _ in range(1, backbone_layers):
            layers += [nn.Linear(backbone_units, backbone_units), LeCun()]
        self.backbone = nn.Sequential(*layers)
        self.ff1 = nn.Linear(backbone_units, hidden_size)
        self.ff2 = nn.Linear(backbone_units, hidden_size)
        self.time_a = nn.Linear(backbone_units, hidden_size)
        self.time_b = nn.Linear(backbone_units, hidden_size)
        for w in self.parameters():
            if w.dim() == 2:
                nn.init.xavier_uniform_(w)

    # -- pieces used by both the single-step API and the sequence loop --------------------------------------------
    def input_projection(self, x: Tensor) -> Tensor:
        """x [..., in] -> x-part of the first backbone Linear, W_0[:, :in] x + b_0, shape [..., U]."""
        first = self.backbone[0]
        return F.linear(x, first.weight[:, : self.input_size], first.bias)

    def _recurrent_weight(self) -> Tensor:
        """h-part of the first backbone Linear, W_0[:, in:] ([U, H], a view of `backbone.0.weight`)."""
        return self.backbone[0].weight[:, self.input_size :]

    def _head_params(self) -> tuple[Tensor, Tensor]:
        """ff1, ff2, time_a, time_b stacked into one [4H, U] weight and one [4H] bias."""
        heads = (self.ff1, self.ff2, self.time_a, self.time_b)
        return torch.cat([m.weight for m in heads]), torch.cat([m.bias for m in heads])

    def _step(self, xproj_t: Tensor, h: Tensor, ts: Tensor, w_h: Tensor, w_heads: Tensor, b_heads: Tensor) -> Tensor:
        """One step with precomputed weights; ts already broadcasts against [B, H]."""
        z = self.backbone[1](xproj_t + F.linear(h, w_h))
        for k in range(2, len(self.backbone), 2):
            z = self.backbone[k + 1](self.backbone[k](z))
        ff1, ff2, t_a, t_b = F.linear(z, w_heads, b_heads).split(self.hidden_size, dim=-1)
        gate = torch.sigmoid(t_a * ts + t_b)
        return torch.tanh(ff1) * (1.0 - gate) + gate * torch.tanh(ff2)

    # -- public API ---------------------------------------------------------------------------------------------------
    def step(self, xproj_t: Tensor, h: Tensor, ts: Tensor) -> Tensor:
        """One step given the precomputed x-part `input_projection(x_t)` [B, U]; h [B, H]; ts [B], [B, 1] or [B, H]."""
        w_heads, b_heads = self._head_params()
        ts = _ts_column(ts, h.shape[0], self.hidden_size).to(h.dtype)
        return self._step(xproj_t, h, ts, self._recurrent_weight(), w_heads, b_heads)

    def forward(self, x: Tensor, h: Tensor, ts: Tensor) -> Tensor:
        """x [B, in], h [B, H], ts [B], [B, 1] or [B, H] -> new state h_t [B, H] (also the step's output)."""
        return self.step(self.input_projection(x), h, ts)


class CfC(nn.Module):
    """A CfC layer over a batch-first sequence with per-step elapsed times.

    The cell is `rnn_cell` (ncps's name), so an ncps `CfC(input, units, mode="default", backbone_units=...,
    backbone_layers=...)` state_dict (no mixed_memory, no proj_size) loads with strict=True.
    """

    def __init__(self, input_size: int, hidden_size: int, backbone_units: int = 128, backbone_layers: int = 1) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.rnn_cell = CfCCell(input_size, hidden_size, backbone_units, backbone_layers)

    def forward(self, x: Tensor, timespans: Tensor, h0: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """x [B, L, in]; timespans [B, L], [B, L, 1] or [B, L, H]; h0 [B, H] or None (zeros).

        Returns (outputs [B, L, H], h_last [B, H]); outputs[:, t] is the state after step t.
        """
        # x [B, L, in], timespans [B, L] | [B, L, 1] | [B, L, H], h0 [B, H] -> ([B, L, H], [B, H])
        if x.dim() != 3 or x.shape[2] != self.input_size:
            raise ValueError(f"x must have shape [B, L, {self.input_size}], got {tuple(x.shape)}")
        batch, length, _ = x.shape
        hidden = self.hidden_size
        if timespans.dim() == 2:
            timespans = timespans.unsqueeze(-1)
        if timespans.dim() != 3 or timespans.shape[:2] != (batch, length) or timespans.shape[2] not in (1, hidden):
            raise ValueError(
                f"timespans must have shape [B, L], [B, L, 1] or [B, L, H] with B={batch}, L={length}, H={hidden}; "
                f"got {tuple(timespans.shape)}"
            )
        cell = self.rnn_cell
        xproj = cell.input_projection(x)  # [B, L, U]: the x-part of every step in one matmul
        timespans = timespans.to(x.dtype)  # a float64 ts must not promote a float32 state
        h = x.new_zeros(batch, hidden) if h0 is None else h0
        w_h = cell._recurrent_weight()
        w_heads, b_heads = cell._head_params()
        outputs = []
        for xproj_t, ts_t in zip(xproj.unbind(1), timespans.unbind(1), strict=True):
            h = cell._step(xproj_t, h, ts_t, w_h, w_heads, b_heads)
            outputs.append(h)
        return torch.stack(outputs, dim=1), h


def parallel_cfc(layers: Sequence[CfC], xs: Sequence[Tensor], timespans: Sequence[Tensor], fused: bool = False) -> list[Tensor]:
    """Run independent single-backbone-layer CfCs over sequences of one length in ONE loop.

    Their weights are assembled block-diagonally, so each step is one recurrent GEMM, one head GEMM and one
    set of elementwise kernels for all of them: a recurrence is a chain of small serial kernels, and halving
    that chain is what matters at small batch on a GPU. Results and gradients equal running each layer alone.
    With `fused` on CUDA (and sizes the kernels support) each layer's whole scan is instead one kernel per
    direction (cfc_triton.py, cfc_cuda.py), the layers side by side on their own streams: no chain of launches.
    Returns each layer's outputs [B, L, H_i] (from zero initial states).
    """
    cells = [layer.rnn_cell for layer in layers]
    if any(c.backbone_layers != 1 for c in cells):
        raise ValueError("parallel_cfc supports backbone_layers == 1 only")
    ts = []
    for c, t in zip(cells, timespans, strict=True):
        t = t.unsqueeze(-1) if t.dim() == 2 else t
        ts.append(t.expand(*t.shape[:2], c.hidden_size))
    if fused and xs[0].is_cuda and fused_supported(cells):
        from alpha_core.models.cfc_triton import fused_cfc_scans

        heads = [c._head_params() for c in cells]
        return fused_cfc_scans(
            [c.input_projection(x) for c, x in zip(cells, xs, strict=True)],
            ts,
            [c._recurrent_weight() for c in cells],
            [w for w, _ in heads],
            [b for _, b in heads],
        )
    sizes = [c.hidden_size for c in cells]
    xproj = torch.cat([c.input_projection(x) for c, x in zip(cells, xs, strict=True)], dim=-1)
    ts = torch.cat([t.to(xproj.dtype) for t in ts], dim=-1)
    w_h = torch.block_diag(*[c._recurrent_weight() for c in cells])
    heads = [c._head_params() for c in cells]
    weight_parts = [w.split(c.hidden_size) for (w, _), c in zip(heads, cells, strict=True)]  # ff1, ff2, t_a, t_b
    bias_parts = [b.split(c.hidden_size) for (_, b), c in zip(heads, cells, strict=True)]
    w_heads = torch.cat([torch.block_diag(*[w[k] for w in weight_parts]) for k in range(4)])
    b_heads = torch.cat([torch.cat([b[k] for b in bias_parts]) for k in range(4)])
    keep = torch.is_grad_enabled()  # inference keeps no step tensors for a backward
    return list(CfCScan.apply(xproj, ts, w_h, w_heads, b_heads, keep).split(sizes, dim=-1))


def fused_supported(cells: Sequence[CfCCell]) -> bool:
    """Triton is importable and every layer's sizes fit the fused kernel."""
    try:
        from alpha_core.models import cfc_triton
    except ImportError:  # no triton in this environment
        return False
    return all(cfc_triton.supported(c.hidden_size, c.backbone_units) for c in cells)


LECUN_A, LECUN_B = 1.7159, 0.666


class CfCScan(torch.autograd.Function):
    """The CfC recurrence with a hand-written backward that hoists the weight gradients out of the loop.

    Autograd's version of the loop spends, per step, two weight-gradient GEMMs and two accumulations into the
    shared weights; here each backward step does only the two GEMMs it cannot avoid (into z and into h), and
    the weight gradients are two large GEMMs over all steps at the end. The serial chain a small batch waits
    on gets about half as long. Inputs: xproj [B, L, U] (the x-part of the backbone), ts [B, L, H],
    w_h [U, H], w_heads [4H, U] (ff1, ff2, time_a, time_b), b_heads [4H], keep (False: no backward will run,
    so the per-step tensors are not kept: a quarter of the inference time on CPU); output: states [B, L, H].
    """

    @staticmethod
    def forward(ctx, xproj: Tensor, ts: Tensor, w_h: Tensor, w_heads: Tensor, b_heads: Tensor, keep: bool = True) -> Tensor:
        # xproj [B, L, U], ts [B, L, H], w_h [U, H], w_heads [4H, U], b_heads [4H] -> [B, L, H]
        dtype = xproj.dtype
        with torch.autocast(xproj.device.type, enabled=False):
            w_h_, w_heads_, b_heads_ = w_h.to(dtype), w_heads.to(dtype), b_heads.to(dtype)
            hidden = w_h.shape[1]
            h = xproj.new_zeros(xproj.shape[0], hidden)
            saved = {k: [] for k in ("h_prev", "u", "f1", "f2", "g", "ta")}
            outputs = []
            for xproj_t, ts_t in zip(xproj.unbind(1), ts.unbind(1), strict=True):
                u = torch.tanh(LECUN_B * (xproj_t + F.linear(h, w_h_)))
                ff1, ff2, t_a, t_b = F.linear(LECUN_A * u, w_heads_, b_heads_).split(hidden, dim=-1)
                g = torch.sigmoid(t_a * ts_t + t_b)
                f1, f2 = torch.tanh(ff1), torch.tanh(ff2)
                if keep:
                    for name, value in (("h_prev", h), ("u", u), ("f1", f1), ("f2", f2), ("g", g), ("ta", t_a)):
                        saved[name].append(value)
                h = f1 * (1.0 - g) + g * f2
                outputs.append(h)
        if keep:
            stacked = {k: torch.stack(v) for k, v in saved.items()}  # [L, B, .]
            ctx.save_for_backward(ts, w_h_, w_heads_, *stacked.values())
            ctx.weight_dtypes = (w_h.dtype, w_heads.dtype, b_heads.dtype)
        return torch.stack(outputs, dim=1)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        ts, w_h, w_heads, h_prev, u, f1, f2, g, ta = ctx.saved_tensors
        with torch.autocast(grad_out.device.type, enabled=False):
            grad_out = grad_out.to(u.dtype)
            carry = torch.zeros_like(h_prev[0])
            d_o, d_a, d_ts = [], [], []
            for t in range(grad_out.shape[1] - 1, -1, -1):
                gh = grad_out[:, t] + carry
                d_g = gh * (f2[t] - f1[t])
                d_pre = d_g * g[t] * (1.0 - g[t])
                d_o_t = torch.cat(
                    [gh * (1.0 - g[t]) * (1.0 - f1[t] ** 2), gh * g[t] * (1.0 - f2[t] ** 2), d_pre * ts[:, t], d_pre], dim=-1
                )
                d_a_t = (d_o_t @ w_heads) * (LECUN_A * LECUN_B) * (1.0 - u[t] ** 2)
                carry = d_a_t @ w_h
                d_o.append(d_o_t)
                d_a.append(d_a_t)
                d_ts.append(d_pre * ta[t])
            d_o, d_a = torch.stack(d_o[::-1]), torch.stack(d_a[::-1])  # [L, B, .]
            d_w_heads = d_o.flatten(0, 1).T @ (LECUN_A * u).flatten(0, 1)
            d_b_heads = d_o.sum(dim=(0, 1))
            d_w_h = d_a.flatten(0, 1).T @ h_prev.flatten(0, 1)
            d_xproj = d_a.transpose(0, 1)
            d_ts_all = torch.stack(d_ts[::-1], dim=1) if ctx.needs_input_grad[1] else None
        dt_h, dt_heads, dt_b = ctx.weight_dtypes
        return d_xproj, d_ts_all, d_w_h.to(dt_h), d_w_heads.to(dt_heads), d_b_heads.to(dt_b), None
