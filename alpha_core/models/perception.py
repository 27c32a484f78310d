"""The flagship perception model: input projection -> Mamba2 -> CfC trunk -> per-horizon heads, plus the
auxiliary outcome path of the original system, and the small on-device controllers that steer its training.

Hooks (alpha_core/models/hooks.py): BookModel (`PerceptionModel`); trained by its own trainer (`train/perception.py`).

Forward, for a window x [B, K, F] with time steps dt [B, K] (seconds between snapshots):

    e = Mamba2(Linear(x))                                  encoder, [B, K, d]
    h = CfC(e, dt / (T * tau[bucket]))                     main trunk, [B, K, hidden], irregular time per sample
    logit[h] = head_h(h)                                   BCE target: "price up after H[h] snapshots"
    a = AuxCfC(e or stopgrad(e), dt / T)                   aux trunk (64 hidden, one bucket)
    long, short = AuxHeads(a)                              Huber target: cost-aware outcomes, in ticks

T (`time_scale`) is the median time between snapshots of the training files, so the CfC sees time in units of
a typical step whatever the product's event rate.

Controllers (all state lives in buffers on the model's device, updated inside the step without a host sync,
so a whole training step can be captured in one CUDA graph):

* ISV lambda controller. `bce_ema[h]` is an EMA of each horizon's BCE. Each head's gradient into the trunk is
  multiplied by `lambda[h] = clamp(bce_ema[h] / mean(bce_ema), 0.5, 2)` (renormalised to mean 1): a horizon
  that lags the others pulls harder on the shared trunk, while the head's own weights see the plain gradient.
* Aux stop-gradient lift. The aux trunk always trains its own weights, but its gradient into the encoder is
  blocked at first. Within the first `aux_lift_window` (200) steps, once every horizon has aux Huber EMA < 0.4
  and aux direction-accuracy EMA > 0.85, the block is lifted for good and the aux gradient adds to the
  encoder's.
* Bucket warm-up. The trunk's hidden units form one bucket per horizon, each with a learnable time constant
  `tau[b]` (CfC time input = dt / tau[b]). During warm-up all buckets share one tau (their mean); afterwards
  each bucket's tau trains on its own, so short- and long-horizon units can settle on different time
  scales. The warm-up ends at `bucket_warmup_cap_steps` when given; otherwise it is derived from the first
  100 steps: cap = 100 + 100 x CV(|change of the shared log tau per step|), clipped to [100, 1000]: the
  more erratically tau still moves, the longer the buckets stay tied.
* Output smoothness. `smooth[h]` = mean squared difference of the up-probability between adjacent
  positions; the loss adds `lambda_s[h] * smooth[h]` with `lambda_s[h] = base x H[h] / H[0]`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict
from torch import Tensor, nn

from alpha_core.bounds import Count, Dim, Layers, NonNegFloat, NonNegInt, PositiveFloat
from alpha_core.models.cfc import CfC, fused_supported, parallel_cfc
from alpha_core.models.mamba2 import Mamba2, Mamba2Config

BCE_EMA_DECAY = 0.99  # the lambda controller follows slow trends
AUX_EMA_DECAY = 0.95  # the lift decision reacts within the 200-step window
LAMBDA_MIN, LAMBDA_MAX = 0.5, 2.0
AUX_HUBER_LIFT, AUX_ACC_LIFT = 0.4, 0.85
WARMUP_PROBE_STEPS = 100
WARMUP_CAP_RANGE = (100, 1000)


class PerceptionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    n_features: Count
    horizons: tuple[int, ...] = (10, 100, 1000)
    d_model: Dim = 64
    mamba2_state_dim: Dim = 16
    mamba2_layers: Layers = 1
    cfc_hidden: Dim = 64  # split into one bucket of units per horizon
    cfc_backbone: Dim = 128
    aux_hidden: Dim = 64
    time_scale: PositiveFloat = 1.0  # seconds; the trainer sets the training files' median snapshot spacing
    aux_weight: NonNegFloat = 1.0
    aux_lift_window: Count = 200
    smoothness_base_lambda: NonNegFloat = 0.0
    bucket_warmup_cap_steps: NonNegInt | None = None
    horizon_weights: tuple[NonNegFloat, ...] | None = None

    def mamba2(self) -> Mamba2Config:
        return Mamba2Config(d_model=self.d_model, d_state=self.mamba2_state_dim, n_layers=self.mamba2_layers)


def head_logits(trunk: Tensor, weight: Tensor, bias: Tensor, lam: Tensor) -> Tensor:
    """`trunk @ weight.T + bias`, with the gradient into `trunk` scaled by lam[h] per output h.

    The head weights get their plain gradient; the two extra terms cancel in value and only route
    lam-scaled gradient into the trunk.
    """
    plain = F.linear(trunk.detach(), weight, bias)
    routed = F.linear(trunk, weight.detach()) * lam
    return plain + routed - routed.detach()


class PerceptionModel(nn.Module):
    def __init__(self, cfg: PerceptionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.fused_scan = True  # on cuda, the Triton CfC scan where available (an execution choice, not saved)
        n_h = len(cfg.horizons)
        self.input_proj = nn.Linear(cfg.n_features, cfg.d_model)
        self.encoder = Mamba2(cfg.mamba2())
        self.trunk = CfC(cfg.d_model, cfg.cfc_hidden, backbone_units=cfg.cfc_backbone)
        self.log_tau = nn.Parameter(torch.zeros(n_h))
        self.heads = nn.Linear(cfg.cfc_hidden, n_h)
        self.aux_trunk = CfC(cfg.d_model, cfg.aux_hidden, backbone_units=cfg.aux_hidden)
        self.aux_heads = nn.Linear(cfg.aux_hidden, 2 * n_h)

        bucket = torch.arange(cfg.cfc_hidden) * n_h // cfg.cfc_hidden  # unit -> bucket
        self.register_buffer("bucket_of_unit", bucket, persistent=False)
        weights = torch.tensor(cfg.horizon_weights or [1.0] * n_h, dtype=torch.float32)
        self.register_buffer("horizon_weights", weights, persistent=False)
        # a tensor, not a Python float that torch.compile would bake into the graph: every fold (each has its own
        # time scale) then compiles to the same graph, which the shared compile cache serves to the next pod
        self.register_buffer("time_scale", torch.tensor(cfg.time_scale, dtype=torch.float32), persistent=False)
        h = torch.tensor(cfg.horizons, dtype=torch.float32)
        self.register_buffer("smooth_lambda", cfg.smoothness_base_lambda * h / h[0], persistent=False)
        # controller state (persistent: part of a resumable training state)
        self.register_buffer("step", torch.zeros((), dtype=torch.long))
        self.register_buffer("bce_ema", torch.zeros(n_h))
        self.register_buffer("lambdas", torch.ones(n_h))
        self.register_buffer("aux_huber_ema", torch.zeros(n_h))
        self.register_buffer("aux_acc_ema", torch.zeros(n_h))
        self.register_buffer("aux_lifted", torch.zeros((), dtype=torch.bool))
        self.register_buffer("prev_shared_log_tau", torch.zeros(()))
        self.register_buffer("tau_change_sum", torch.zeros(()))
        self.register_buffer("tau_change_sq", torch.zeros(()))
        cap = -1 if cfg.bucket_warmup_cap_steps is None else cfg.bucket_warmup_cap_steps
        self.register_buffer("warmup_cap", torch.tensor(cap, dtype=torch.long))
        self.register_buffer("last_smooth", torch.zeros(n_h))

    # --- forward ---------------------------------------------------------------------------------------

    def buckets_tied(self) -> Tensor:
        cap = self.warmup_cap
        return (cap < 0) | (self.step < cap)

    def _encode(self, x: Tensor, dt: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(encoder output [B, K, d], time steps [B, K], the main trunk's time input per unit [B, K, hidden])."""
        enc = self.encoder(self.input_proj(x))
        log_tau = torch.where(self.buckets_tied(), self.log_tau.mean().expand_as(self.log_tau), self.log_tau)
        steps = dt / self.time_scale
        return enc, steps, steps.unsqueeze(-1) * torch.exp(-log_tau)[self.bucket_of_unit]

    def forward(self, x: Tensor, dt: Tensor) -> dict[str, Tensor]:
        # x [B, K, F], dt [B, K] -> logits, aux_long, aux_short [B, K, H]
        enc, steps, ts = self._encode(x, dt)
        aux_in = torch.where(self.aux_lifted, enc, enc.detach())
        # both trunks step in one loop (block-diagonal weights), or each in one fused kernel on cuda
        trunk, aux = parallel_cfc([self.trunk, self.aux_trunk], [enc, aux_in], [ts, steps], fused=self.fused_scan)
        logits = head_logits(trunk, self.heads.weight, self.heads.bias, self.lambdas)
        long, short = self.aux_heads(aux).chunk(2, dim=-1)
        return {"logits": logits, "aux_long": long, "aux_short": short}

    def prefetch_kernels(self, batch: int, dtype: torch.dtype) -> None:
        """Start compiling the CfC scans' CUDA kernels that training at this batch and dtype will launch (on cuda,
        with the fused scan), so that a cold process compiles them beside torch.compile's work."""
        cells = [self.trunk.rnn_cell, self.aux_trunk.rnn_cell]
        device = self.heads.weight.device
        if self.fused_scan and device.type == "cuda" and fused_supported(cells):
            from alpha_core.models import cfc_triton

            cfc_triton.prefetch([(c.hidden_size, c.backbone_units) for c in cells], batch, dtype, device)

    def last_logits(self, x: Tensor, dt: Tensor) -> Tensor:
        """forward(x, dt)["logits"][:, -1] without the aux trunk, which only training uses: what evaluation
        needs, in about 60% of forward's CPU time. The heads still run over every position, as in forward, so that
        their matmul is forward's (on CPU the report's numbers stay the same to the bit)."""
        enc, _, ts = self._encode(x, dt)
        (trunk,) = parallel_cfc([self.trunk], [enc], [ts], fused=self.fused_scan)
        return head_logits(trunk, self.heads.weight, self.heads.bias, self.lambdas)[:, -1]

    def last_aux(self, x: Tensor, dt: Tensor) -> Tensor:
        """[B, 2H] the aux heads' expected long and short outcomes (ticks, net of the labels' cost) at each window's
        last position, from the encoder and the aux trunk alone: what the decision layer's `aux` policies trade."""
        enc, steps, _ = self._encode(x, dt)
        (aux,) = parallel_cfc([self.aux_trunk], [enc], [steps], fused=self.fused_scan)
        return self.aux_heads(aux[:, -1])

    # --- losses and controller updates -----------------------------------------------------------------

    def loss(
        self, out: dict[str, Tensor], labels: Tensor, outcome_long: Tensor, outcome_short: Tensor, tick_size: float | Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Total loss and its detached parts per horizon (for the controllers, traces and validation)."""
        logits = out["logits"].float()
        mask = torch.isfinite(labels)
        target = torch.where(mask, labels, torch.zeros_like(labels))
        bce = F.binary_cross_entropy_with_logits(logits, target, reduction="none") * mask
        count = mask.sum(dim=(0, 1)).clamp_min(1)
        bce_h = bce.sum(dim=(0, 1)) / count

        prob = torch.sigmoid(logits)
        smooth_h = (prob[:, 1:] - prob[:, :-1]).pow(2).mean(dim=(0, 1))

        aux_pred = torch.stack([out["aux_long"].float(), out["aux_short"].float()])
        aux_target = torch.stack([outcome_long, outcome_short]) / tick_size
        aux_mask = torch.isfinite(aux_target)
        aux_target = torch.where(aux_mask, aux_target, torch.zeros_like(aux_target))
        aux_count = aux_mask.sum(dim=(0, 1, 2)).clamp_min(1)
        huber_h = (F.huber_loss(aux_pred, aux_target, reduction="none") * aux_mask).sum(dim=(0, 1, 2)) / aux_count
        hit = (torch.sign(aux_pred) == torch.sign(aux_target)) & aux_mask
        acc_h = hit.sum(dim=(0, 1, 2)) / aux_count

        total = (self.horizon_weights * bce_h).sum() + (self.smooth_lambda * smooth_h).sum()
        total = total + self.cfg.aux_weight * huber_h.mean()
        parts = {"bce": bce_h.detach(), "smooth": smooth_h.detach(), "aux_huber": huber_h.detach(), "aux_acc": acc_h.detach()}
        return total, parts

    @torch.no_grad()
    def update_controllers(self, parts: dict[str, Tensor]) -> None:
        """After each optimiser step: EMAs, lambdas, the aux lift, the bucket warm-up probe; then step += 1."""
        first = self.step == 0
        for ema, value, decay in (
            (self.bce_ema, parts["bce"], BCE_EMA_DECAY),
            (self.aux_huber_ema, parts["aux_huber"], AUX_EMA_DECAY),
            (self.aux_acc_ema, parts["aux_acc"], AUX_EMA_DECAY),
        ):
            ema.copy_(torch.where(first, value, decay * ema + (1 - decay) * value))
        lam = (self.bce_ema / self.bce_ema.mean().clamp_min(1e-8)).clamp(LAMBDA_MIN, LAMBDA_MAX)
        self.lambdas.copy_(lam / lam.mean())
        self.last_smooth.copy_(parts["smooth"])

        ready = (self.aux_huber_ema < AUX_HUBER_LIFT).all() & (self.aux_acc_ema > AUX_ACC_LIFT).all()
        in_window = self.step < self.cfg.aux_lift_window
        self.aux_lifted.copy_(self.aux_lifted | (ready & in_window & ~first))
        self._probe_warmup()
        self.step.add_(1)

    def _probe_warmup(self) -> None:
        """Track how the shared tau moves during the first steps, and fix the warm-up cap when they end."""
        shared = self.log_tau.mean()
        probing = (self.step >= 1) & (self.step < WARMUP_PROBE_STEPS)
        change = (shared - self.prev_shared_log_tau).abs()
        self.tau_change_sum.add_(torch.where(probing, change, torch.zeros_like(change)))
        self.tau_change_sq.add_(torch.where(probing, change * change, torch.zeros_like(change)))
        self.prev_shared_log_tau.copy_(shared)
        n = WARMUP_PROBE_STEPS - 1
        mean = self.tau_change_sum / n
        std = (self.tau_change_sq / n - mean * mean).clamp_min(0).sqrt()
        cv = std / mean.clamp_min(1e-12)
        derived = (WARMUP_CAP_RANGE[0] + 100 * cv).round().clamp(*WARMUP_CAP_RANGE).long()
        decide = (self.warmup_cap < 0) & (self.step >= WARMUP_PROBE_STEPS)
        self.warmup_cap.copy_(torch.where(decide, derived, self.warmup_cap))

    # --- what the original system's trainer exposes ---------------------------------------------------------------

    def loss_ema_snapshot(self) -> list[float]:
        return self.bce_ema.tolist()

    def lambda_snapshot(self) -> list[float]:
        return self.lambdas.tolist()

    def last_smoothness_loss_per_horizon(self) -> list[float]:
        return self.last_smooth.tolist()

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Parameters per optimiser group: the Mamba2 encoder, the CfC trunk and heads, the aux path."""
        return {
            "mamba2": [*self.input_proj.parameters(), *self.encoder.parameters()],
            "cfc": [*self.trunk.parameters(), self.log_tau, *self.heads.parameters()],
            "aux": [*self.aux_trunk.parameters(), *self.aux_heads.parameters()],
        }
