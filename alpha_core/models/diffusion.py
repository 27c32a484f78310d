"""Diffusion ensemble member: a conditional DDPM (Ho et al. 2020) over the forward moves at every horizon.

Hooks (alpha_core/models/hooks.py): BarModel (`DiffusionModel`) with OwnLoss, Sampling.

Target. At position k the vector y0[b, k, :] holds the forward price move in ticks at each horizon,
``move = (outcome_long - outcome_short) / 2 / tick_size`` (outcome_long = move - cost and outcome_short =
-move - cost, so the cost cancels), divided by a per-horizon scale ``s_h = sqrt(E[move_h^2])``. The scale is
a running mean of squares kept in a buffer and updated by ``loss`` in training mode, so the DDPM sees moves
of about unit variance. It starts at ``sqrt(horizon)`` ticks. Entries whose label is NaN are set to 0 and
left out of the loss.

Forward process (T steps; betas linear 1e-4..0.02 scaled by 1000 / T, or cosine, Nichol & Dhariwal 2021)::

    alpha_t = 1 - beta_t,   abar_t = prod_{s <= t} alpha_s
    q(y_t | y_0)        = N(sqrt(abar_t) y_0, (1 - abar_t) I)
    q(y_{t-1} | y_t, y_0) = N(c0_t y_0 + ct_t y_t, var_t),  c0_t = sqrt(abar_{t-1}) beta_t / (1 - abar_t),
                            ct_t = sqrt(alpha_t) (1 - abar_{t-1}) / (1 - abar_t),
                            var_t = beta_t (1 - abar_{t-1}) / (1 - abar_t)      (abar_{-1} = 1: var_0 = 0)

Model. A causal GRU over the window gives a context c[b, k] per position. The denoiser is an MLP applied at each
position and jointly over the H horizons: eps_theta(y_t, t, c) = W3 silu(W2 silu(Wy y_t + Wc c + e(t))), where
e(t) is an MLP of a sinusoidal embedding of t. Training minimises the epsilon-prediction MSE
``|eps - eps_theta(sqrt(abar_t) y0 + sqrt(1 - abar_t) eps, t, c)|^2`` with t drawn uniformly per position,
averaged over the finite labels.

Sampling (``forward``) is ancestral: y_{T-1} ~ N(0, I), then for t = T-1..0
``y0_hat = (y_t - sqrt(1 - abar_t) eps_theta) / sqrt(abar_t)`` (clipped to +-clip_x0), and
``y_{t-1} ~ q(y_{t-1} | y_t, y0_hat)``. It is vectorised over samples, batch and positions, with one Python loop
over the T steps. Each step's variance adds c0_t^2 E[Var(y0 | y_t)] to var_t (Analytic-DPM, Bao et al.
2022). E[Var(y0 | y_t)] = (1 - abar_t) / abar_t (1 - E[eps_theta^2]), with E[eps_theta^2] a running mean per
step and horizon kept by ``loss``. Without that term, few-step samples are too narrow (about 10% at T = 50).
The ``n_samples`` noise paths are common to every position (common random numbers). Each
position's estimate stays unbiased, and the Monte-Carlo error is shared, so the model ranks positions far
less noisily than with independent noise. A position's output also depends on neither the batch nor the
window length, given the torch seed. The output is

    P(up_h) = (#{samples with move_h > up_threshold_ticks} + 0.5) / (n_samples + 1),   logits = logit(P(up_h))

Moves are whole ticks and the direction label is "strictly up", so the default threshold is half a tick.
0.0 gives the plain "sample > 0". The logits are always finite, at most log(2 n_samples + 1) in size.
The GRU is causal and the noise does not depend on x, so for a given seed the logit at position k depends on
bars 0..k only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn

from alpha_core.bounds import Count, Dim, NonNegFloat, PositiveFloat
from alpha_core.data.loader import WindowBatch


class DiffusionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    n_features: Count
    horizons: tuple[int, ...] = (5, 15, 60)
    n_steps: int = Field(50, ge=1, le=100_000)  # diffusion steps T
    schedule: Literal["linear", "cosine"] = "linear"
    beta_start: float = Field(1e-4, gt=0, lt=1)  # linear schedule, scaled by 1000 / T (Ho et al. use T = 1000)
    beta_end: float = Field(0.02, gt=0, lt=1)
    n_samples: Dim = 32  # samples per position to estimate P(up) in forward()
    d_context: Dim = 32  # GRU context size
    d_hidden: Dim = 64  # denoiser MLP width
    d_time: Dim = 32  # sinusoidal time embedding size
    clip_x0: PositiveFloat | None = 6.0  # clip the predicted y0 (in scaled units) while sampling; None: no clip
    up_threshold_ticks: NonNegFloat = 0.5  # a sampled move counts as "up" above this many ticks
    scale_momentum: float = Field(0.01, gt=0, le=1)  # floor of the running-scale update weight (a cumulative mean before that)
    train_draws: Dim = 1  # (t, eps) draws per position and training step (the encoder runs once)
    reverse_variance: Literal["analytic", "posterior"] = "analytic"  # sampler's step variance, see GaussianDiffusion
    eps_momentum: float = Field(0.05, gt=0, le=1)  # update weight of the running E[eps_theta^2] (analytic variance)


def make_betas(
    n_steps: int, schedule: str, beta_start: float = 1e-4, beta_end: float = 0.02, dtype: torch.dtype = torch.float64
) -> Tensor:
    """Linear betas ``beta_start..beta_end`` scaled by 1000/T, or the cosine schedule ``abar(t) = cos^2(...)``."""
    if schedule == "linear":
        scale = 1000.0 / n_steps
        return torch.linspace(beta_start * scale, min(beta_end * scale, 0.999), n_steps, dtype=torch.float64).to(dtype)
    if schedule == "cosine":
        s = 0.008
        u = torch.arange(n_steps + 1, dtype=torch.float64) / n_steps
        f = torch.cos((u + s) / (1 + s) * math.pi / 2) ** 2
        return (1 - f[1:] / f[:-1]).clamp(max=0.999).to(dtype)
    raise ValueError(f"unknown beta schedule {schedule!r}")


class GaussianDiffusion(nn.Module):
    """The DDPM schedule, q(y_t | y_0), the posterior q(y_{t-1} | y_t, y_0) and the ancestral sampler.

    Every coefficient is computed in float64 and stored as a non-persistent buffer of ``dtype``. The
    coefficients follow from the config, so they are never saved.
    """

    def __init__(self, betas: Tensor, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        betas = betas.to(torch.float64)
        alphas = 1 - betas
        abar = torch.cumprod(alphas, 0)
        abar_prev = torch.cat([torch.ones(1, dtype=torch.float64), abar[:-1]])
        coefs = {
            "betas": betas,
            "alphas_cumprod": abar,
            "sqrt_abar": abar.sqrt(),
            "sqrt_one_minus_abar": (1 - abar).sqrt(),
            "post_c0": abar_prev.sqrt() * betas / (1 - abar),
            "post_ct": alphas.sqrt() * (1 - abar_prev) / (1 - abar),
            "post_var": betas * (1 - abar_prev) / (1 - abar),
        }
        for name, value in coefs.items():
            self.register_buffer(name, value.to(dtype), persistent=False)

    @property
    def n_steps(self) -> int:
        return self.betas.shape[0]

    @staticmethod
    def _at(coef: Tensor, t: Tensor | int, like: Tensor) -> Tensor:
        """coef[t] broadcast against ``like`` (t is an int or a tensor of like's leading dims)."""
        if isinstance(t, int):
            return coef[t]
        out = coef[t]
        return out.reshape(*out.shape, *([1] * (like.dim() - out.dim())))

    def q_sample(self, y0: Tensor, t: Tensor | int, noise: Tensor) -> Tensor:
        """A draw of q(y_t | y_0) = N(sqrt(abar_t) y0, (1 - abar_t) I) from the given standard noise."""
        return self._at(self.sqrt_abar, t, y0) * y0 + self._at(self.sqrt_one_minus_abar, t, y0) * noise

    def q_posterior(self, y0: Tensor, yt: Tensor, t: Tensor | int) -> tuple[Tensor, Tensor]:
        """Mean and variance of q(y_{t-1} | y_t, y_0)."""
        mean = self._at(self.post_c0, t, yt) * y0 + self._at(self.post_ct, t, yt) * yt
        return mean, self._at(self.post_var, t, yt).expand_as(mean)

    def predict_y0(self, yt: Tensor, t: Tensor | int, eps: Tensor) -> Tensor:
        return (yt - self._at(self.sqrt_one_minus_abar, t, yt) * eps) / self._at(self.sqrt_abar, t, yt)

    def y0_variance(self, eps_sq: Tensor, max_var: float | None = None) -> Tensor:
        """Analytic-DPM: E[Var(y0 | y_t)] = (1 - abar_t) / abar_t * (1 - E[eps_theta^2]) from eps_sq [T, ...]."""
        ratio = (1 - self.alphas_cumprod) / self.alphas_cumprod
        var = ratio.reshape(-1, *([1] * (eps_sq.dim() - 1))) * (1 - eps_sq)
        return var.clamp(0, max_var)

    def sample(
        self,
        eps_fn: Callable[[Tensor, int], Tensor],
        y_init: Tensor,
        noise_fn: Callable[[], Tensor],
        clip_x0: float | None = None,
        y0_var: Tensor | None = None,
    ) -> Tensor:
        """Ancestral sampling from y_{T-1} = y_init. ``eps_fn(y_t, t)`` predicts the noise, and ``noise_fn()``
        gives the fresh standard noise of one step. That noise broadcasts against y_t.

        Without ``y0_var``, each step draws from q(y_{t-1} | y_t, y0_hat), as in DDPM with sigma^2 = beta-tilde.
        The last step (t = 0) is then deterministic. That under-disperses the samples when T is small. With
        ``y0_var[t]`` (an estimate of E[Var(y0 | y_t)], broadcast against y_t), each step adds the
        uncertainty of y0_hat: sigma_t^2 = var_t + c0_t^2 y0_var[t] (Bao et al. 2022, Analytic-DPM). The
        last step adds it too. For Gaussian data with the exact eps this gives exact draws.
        """
        y = y_init
        for t in range(self.n_steps - 1, -1, -1):
            y0 = self.predict_y0(y, t, eps_fn(y, t))
            if clip_x0 is not None:
                y0 = y0.clamp(-clip_x0, clip_x0)
            mean, var = self.q_posterior(y0, y, t)
            if y0_var is not None:
                var = var + self.post_c0[t].square() * y0_var[t]
                y = mean + var.sqrt() * noise_fn()
            else:
                y = mean + var.sqrt() * noise_fn() if t > 0 else mean
        return y


def timestep_embedding(t: Tensor, dim: int) -> Tensor:
    """Sinusoidal embedding [..., dim] of integer steps (Vaswani et al. / DDPM)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    angles = t.to(torch.float32).unsqueeze(-1) * freqs
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class Denoiser(nn.Module):
    """eps_theta(y_t, t, c) = W3 silu(W2 silu(Wy y_t + Wc c + e(t))), per position and jointly over horizons.

    ``context_term`` (Wc c) is computed once per position and reused by every sample and step.
    """

    def __init__(self, n_horizons: int, d_context: int, d_hidden: int, d_time: int) -> None:
        super().__init__()
        self.d_time = d_time
        self.in_y = nn.Linear(n_horizons, d_hidden)
        self.in_context = nn.Linear(d_context, d_hidden, bias=False)
        self.time_mlp = nn.Sequential(nn.Linear(d_time, d_hidden), nn.SiLU(), nn.Linear(d_hidden, d_hidden))
        self.hidden = nn.Linear(d_hidden, d_hidden)
        self.out = nn.Linear(d_hidden, n_horizons)

    def context_term(self, context: Tensor) -> Tensor:
        return self.in_context(context)

    def time_term(self, t: Tensor) -> Tensor:
        return self.time_mlp(timestep_embedding(t, self.d_time))

    def forward(self, yt: Tensor, time_term: Tensor, context_term: Tensor) -> Tensor:
        # yt [S, B, K, H], time_term [d_hidden] | [S, B, K, d_hidden], context_term [B, K, d_hidden] -> eps [S, B, K, H]
        h = F.silu(self.in_y(yt) + context_term + time_term)
        return self.out(F.silu(self.hidden(h)))


class DiffusionModel(nn.Module):
    def __init__(self, cfg: DiffusionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        n_h = len(cfg.horizons)
        self.encoder = nn.GRU(cfg.n_features, cfg.d_context, batch_first=True)
        self.denoiser = Denoiser(n_h, cfg.d_context, cfg.d_hidden, cfg.d_time)
        betas = make_betas(cfg.n_steps, cfg.schedule, cfg.beta_start, cfg.beta_end)
        self.diffusion = GaussianDiffusion(betas)
        # running mean of the squared move in ticks per horizon, and how many updates it has seen
        self.register_buffer("move_sq", torch.tensor(cfg.horizons, dtype=torch.float32))
        self.register_buffer("scale_updates", torch.zeros((), dtype=torch.float32))
        # running E[eps_theta(y_t, t, c)^2] per step and horizon over the training data (Analytic-DPM); 1 = no y0 doubt
        self.register_buffer("eps_sq", torch.ones(cfg.n_steps, n_h))

    def move_scale(self) -> Tensor:
        """Ticks per unit of the DDPM's target, per horizon [H]."""
        return self.move_sq.sqrt().clamp_min(1e-3)

    def encode(self, x: Tensor) -> Tensor:
        """Causal context per position: x [B, K, F] -> [B, K, d_context]."""
        return self.encoder(x)[0]

    def sample_moves(self, context: Tensor, n_samples: int | None = None, generator: torch.Generator | None = None) -> Tensor:
        """Samples of the scaled moves [S, B, K, H] given a context [B, K, d_context]."""
        n = self.cfg.n_samples if n_samples is None else n_samples
        n_h = len(self.cfg.horizons)
        ctx_term = self.denoiser.context_term(context)  # [B, K, d_hidden]
        steps = torch.arange(self.cfg.n_steps, device=context.device)
        time_terms = self.denoiser.time_term(steps).to(ctx_term.dtype)  # [T, d_hidden]

        def noise() -> Tensor:  # common to every position: [S, 1, 1, H]
            return torch.randn(n, 1, 1, n_h, generator=generator, device=context.device, dtype=ctx_term.dtype)

        def eps_fn(yt: Tensor, t: int) -> Tensor:
            return self.denoiser(yt, time_terms[t], ctx_term)

        y0_var = None
        if self.cfg.reverse_variance == "analytic":  # the target has about unit variance: Var(y0 | y_t) <= 1
            y0_var = self.diffusion.y0_variance(self.eps_sq.to(ctx_term.dtype), max_var=1.0)
        return self.diffusion.sample(eps_fn, noise(), noise, self.cfg.clip_x0, y0_var)

    def logits_from_context(self, context: Tensor, generator: torch.Generator | None = None) -> Tensor:
        samples = self.sample_moves(context, generator=generator)  # [S, B, K, H]
        threshold = self.cfg.up_threshold_ticks / self.move_scale().to(samples.dtype)
        ups = (samples > threshold).to(samples.dtype).sum(0)
        n = samples.shape[0]
        p = (ups + 0.5) / (n + 1)
        return torch.log(p) - torch.log1p(-p)

    def forward(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """x [B, K, F] -> logits [B, K, H] of P(move_h > 0) from ``n_samples`` ancestral samples per position."""
        return self.logits_from_context(self.encode(x), generator)

    def forward_last(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:  # x [B, K, F] -> logits [B, H]
        """Logits [B, H] at the last position only: ``forward(x)[:, -1]`` (same seed, common noise) at 1/K the cost."""
        return self.logits_from_context(self.encode(x)[:, -1:], generator)[:, 0]

    def target(self, batch: WindowBatch, tick_size: float) -> tuple[Tensor, Tensor]:
        """Forward moves in ticks [B, K, H] (0 where masked) and the mask of finite labels."""
        move = (batch.outcome_long - batch.outcome_short) * (0.5 / tick_size)
        mask = torch.isfinite(batch.labels) & torch.isfinite(move)
        return torch.where(mask, move, torch.zeros_like(move)), mask

    @torch.no_grad()
    def _update_scale(self, move: Tensor, mask: Tensor) -> None:
        m = mask.to(move.dtype).flatten(0, -2)
        count = m.sum(0)
        batch_sq = (move.flatten(0, -2).square() * m).sum(0) / count.clamp_min(1)
        w = torch.clamp(1.0 / (self.scale_updates + 1), min=self.cfg.scale_momentum)
        updated = (1 - w) * self.move_sq + w * batch_sq
        self.move_sq.copy_(torch.where(count > 0, updated, self.move_sq))
        self.scale_updates.add_(1)

    @torch.no_grad()
    def _update_eps_sq(self, eps: Tensor, t: Tensor, weight: Tensor) -> None:
        n_h = eps.shape[-1]
        w = weight.expand_as(eps).reshape(-1, n_h)
        sums = torch.zeros_like(self.eps_sq).index_add_(0, t.flatten(), eps.square().reshape(-1, n_h) * w)
        counts = torch.zeros_like(self.eps_sq).index_add_(0, t.flatten(), w)
        m = self.cfg.eps_momentum
        updated = (1 - m) * self.eps_sq + m * sums / counts.clamp_min(1)
        self.eps_sq.copy_(torch.where(counts > 0, updated, self.eps_sq))

    def loss(self, batch: WindowBatch, tick_size: float) -> Tensor:
        """DDPM epsilon-prediction MSE at every position and horizon whose label is finite."""
        move, mask = self.target(batch, tick_size)
        if self.training:
            self._update_scale(move, mask)
        y0 = move / self.move_scale()
        ctx_term = self.denoiser.context_term(self.encode(batch.x))  # [B, K, d_hidden]
        r = self.cfg.train_draws
        b, k, _ = y0.shape
        t = torch.randint(0, self.cfg.n_steps, (r, b, k), device=y0.device)
        noise = torch.randn((r, *y0.shape), device=y0.device, dtype=y0.dtype)
        yt = self.diffusion.q_sample(y0.expand_as(noise), t, noise)
        eps = self.denoiser(yt, self.denoiser.time_term(t), ctx_term)
        weight = mask.to(eps.dtype)
        if self.training:
            self._update_eps_sq(eps.detach(), t, weight)
        return ((eps - noise).square() * weight).sum() / (weight.sum() * r).clamp_min(1)
