"""Out-of-sample predictions of one checkpoint on one file, turned into a position for every bar.

A position decided at the close of bar t is held over bar t+1, and it only uses data up to t:
- supervised bar models: the up-probability at the last position of the window ending at bar t; the
  position is +1 above 0.5 + band, -1 below 0.5 - band, else flat;
- RL agents: the greedy action on the observation of bar t (window + current position), run in sequence;
- the book-level perception model: the prediction of the last snapshot received before bar t's minute ends.
Bars before the first full window stay flat.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model

from alpha_core.data.labels import NS_PER_MINUTE
from alpha_core.data.norm import NormStats
from alpha_core.data.sidecar import Sidecar
from alpha_core.models import registry

BATCH = 4096


@dataclass
class Checkpoint:
    model: str
    symbol: str
    fold: int
    path: Path
    trainer: str  # supervised | rl | perception
    summary: dict

    @property
    def weights(self) -> Path:
        return self.path / ("trunk_best_h1000.safetensors" if self.trainer == "perception" else "model.safetensors")


def positions_from_probs(probs: np.ndarray, band: float) -> np.ndarray:
    return np.where(probs > 0.5 + band, 1.0, np.where(probs < 0.5 - band, -1.0, 0.0))


@torch.no_grad()
def _window_probs(model, features: np.ndarray, dt: np.ndarray | None, seq_len: int, norm: NormStats,
                  device: torch.device) -> np.ndarray:
    """Up-probability per horizon at the last position of every window ending at rows seq_len-1 .. N-1.

    The file goes to the device once and is normalised once; each batch of windows is then a strided view
    of it made contiguous on the device, so the host copies nothing per batch.
    """
    mean, std = (torch.from_numpy(a).to(device) for a in norm.arrays())
    feats = torch.from_numpy(np.array(features)).to(device).sub_(mean).div_(std).unfold(0, seq_len, 1)  # [W, F, K]
    times = None if dt is None else torch.from_numpy(np.array(dt)).to(device).unfold(0, seq_len, 1)  # [W, K]
    out = []
    for lo in range(0, feats.shape[0], BATCH):
        x = feats[lo : lo + BATCH].transpose(1, 2).contiguous()
        if times is None:
            last = model.forward_last(x) if hasattr(model, "forward_last") else model(x)[:, -1]
        else:
            last = model(x, times[lo : lo + BATCH].contiguous())["logits"][:, -1]
        out.append(torch.sigmoid(last.float()))
    return torch.cat(out).cpu().numpy() if out else np.empty((0, 0), np.float32)


def _load_json(path: Path) -> dict:
    return json.loads(path.read_text())


def supervised_probs(ckpt: Checkpoint, bars: Sidecar, device: torch.device) -> np.ndarray:
    """[N, H] up-probabilities per bar (NaN before the first full window)."""
    spec = registry.get(ckpt.model)
    model = spec.builder()(spec.config_class()(**_load_json(ckpt.path / "model_config.json"))).to(device).eval()
    load_model(model, str(ckpt.weights), device=str(device))
    seq_len = _load_json(ckpt.path / "train_config.json")["seq_len"]
    norm = NormStats.load(ckpt.path / "norm_stats.json")
    probs = np.full((bars.rows, len(bars.meta.horizons)), np.nan, dtype=np.float32)
    if bars.rows >= seq_len:
        probs[seq_len - 1 :] = _window_probs(model, bars.features, None, seq_len, norm, device)
    return probs


def perception_bar_probs(ckpt: Checkpoint, book: Sidecar, bars: Sidecar, device: torch.device) -> np.ndarray:
    """The book model's probabilities on the bar clock: the last snapshot before each bar's minute ends."""
    from alpha_core.models.perception import PerceptionConfig, PerceptionModel

    model = PerceptionModel(PerceptionConfig(**_load_json(ckpt.path / "model_config.json"))).to(device).eval()
    load_model(model, str(ckpt.weights), device=str(device))
    seq_len = ckpt.summary["seq_len"]
    norm = NormStats.load(ckpt.path / "norm_stats.json")
    snap = np.full((book.rows, len(book.meta.horizons)), np.nan, dtype=np.float32)
    if book.rows >= seq_len:
        snap[seq_len - 1 :] = _window_probs(model, book.features, book.dt, seq_len, norm, device)
    last = np.searchsorted(np.asarray(book.ts), np.asarray(bars.ts) + NS_PER_MINUTE, side="left") - 1
    out = np.full((bars.rows, snap.shape[1]), np.nan, dtype=np.float32)
    ok = last >= 0
    out[ok] = snap[last[ok]]
    return out


def rl_positions(ckpt: Checkpoint, bars: Sidecar, device: torch.device) -> np.ndarray:
    """Greedy actions of the agent bar by bar (the position is part of the next observation)."""
    from alpha_core.rl import EnvConfig, MarketSeries, TradingVecEnv, build_agent, load_policy
    from alpha_core.rl.agents import DQNConfig, PPOConfig

    env_cfg = EnvConfig(**{**_load_json(ckpt.path / "env_config.json"), "n_envs": 1})
    norm = NormStats.load(ckpt.path / "norm_stats.json")
    agent_cfg = {"dqn": DQNConfig, "ppo": PPOConfig}[ckpt.model](**_load_json(ckpt.path / "agent_config.json"))
    series = MarketSeries(np.asarray(bars.features), np.asarray(bars.price), bars.meta.tick_size)
    env = TradingVecEnv([series], EnvConfig(**{**env_cfg.model_dump(), "episode_len": 1}), norm)
    agent = build_agent(ckpt.model, env, agent_cfg, device=str(device))
    load_policy(agent, ckpt.weights)
    mean, std = norm.arrays()
    feats = (np.asarray(bars.features) - mean) / std
    window = env_cfg.window
    positions = np.zeros(bars.rows, dtype=np.float64)
    current = 0.0
    for t in range(window - 1, bars.rows):
        obs = np.concatenate([feats[t - window + 1 : t + 1].reshape(-1), [current]]).astype(np.float32)
        action, _ = agent.predict(obs[None], deterministic=True)
        current = float(int(action[0]) - 1)
        positions[t] = current
    return positions
