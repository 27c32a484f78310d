"""Out-of-sample predictions of one checkpoint on one file: a position for every bar and the time it was decided.

One decision clock. A position for bar t is entered at bar t's close, the minute's last trade, and held over
bar t+1 (see `entry_ts`); every model decides no later than that trade:
- supervised bar models: the up-probability at the last position of the window ending at bar t; the
  position is +1 above 0.5 + band, -1 below 0.5 - band, else flat. Bar t's close is its last input, so the
  decision is at the close;
- RL agents: the greedy action on the observation of bar t (window + current position), run in sequence
  (`alpha_core.rl.agents.greedy_positions`, the same function RL validation uses), decided at the close;
- the book-level perception model: the prediction of the last snapshot at or before bar t's close trade
  (`book_close_trade_ts`, from the book sidecar's `trade_ts`), never one received after it.
Bars before the first full window (or without a decision) stay flat, decided on no data (`NO_DECISION`).
`check_decision_clock` proves decision_ts <= entry_ts for every traded bar; `evaluate` runs it on every model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from alpha_core.data.labels import NS_PER_MINUTE
from alpha_core.data.norm import NormStats
from alpha_core.data.sidecar import Sidecar
from alpha_core.models import registry
from alpha_core.weights import load_weights

BATCH = 4096
SAMPLING_SEED = 0x5EED  # the noise of sampling models in evaluation: the same report for the same checkpoint


NO_DECISION = -1  # decision_ts of a bar whose (flat) position uses no data


class DecisionClockError(RuntimeError):
    """A model traded a bar on data timestamped after the price its position is entered at (look-ahead)."""


@dataclass
class Prediction:
    position: np.ndarray  # [N bars] float64, held over the next bar
    decision_ts: np.ndarray  # [N bars] int64 ns: the latest data the position depends on (NO_DECISION: none)
    probs: np.ndarray | None  # [rows of scored_on, H] up-probabilities (NaN where none); None for RL agents
    scored_on: Sidecar | None  # whose rows and labels `probs` belong to: the bars, or the book file (perception)


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


def book_close_trade_ts(bars: Sidecar, book: Sidecar) -> np.ndarray:
    """int64 [N bars]: ts_event of each bar minute's last trade, from the book sidecar's `trade_ts` (the max
    trade_ts falling in [m, m + 60 s)); -1 where the book saw no trade in that minute."""
    trade = np.asarray(book.trade_ts, dtype=np.int64)
    trade = np.unique(trade[trade >= 0])  # sorted: the last of a minute is the max
    minute = trade // NS_PER_MINUTE * NS_PER_MINUTE
    bar_ts = np.asarray(bars.ts, dtype=np.int64)
    last = np.searchsorted(minute, bar_ts, side="right") - 1  # the minute's last trade, if the minute has one
    ok = last >= 0
    ok[ok] = minute[last[ok]] == bar_ts[ok]
    return np.where(ok, trade[np.maximum(last, 0)], -1)


def entry_ts(bars: Sidecar, book: Sidecar | None = None) -> np.ndarray:
    """int64 [N bars]: when each bar's close price (the entry price) traded. The bar sidecar only bounds it
    (`trade_ts` = the minute's last nanosecond); the book's trades pin it where the book is given."""
    upper = np.asarray(bars.trade_ts, dtype=np.int64)
    if book is None:
        return upper
    exact = book_close_trade_ts(bars, book)
    return np.where(exact >= 0, exact, upper)


def snapshots_at(book_ts: np.ndarray, clock: np.ndarray) -> np.ndarray:
    """Row of the last snapshot with ts <= each clock time (-1 where none, or where the clock is < 0)."""
    rows = np.searchsorted(np.asarray(book_ts), clock, side="right") - 1
    return np.where(clock >= 0, rows, -1)


def check_decision_clock(model: str, file: str, bars_ts: np.ndarray, position: np.ndarray, decision_ts: np.ndarray,
                         entry: np.ndarray) -> None:
    """Raise `DecisionClockError` naming the model, file and first bar traded (a position held or changed) on a
    decision timestamped after its entry price."""
    position = np.asarray(position, dtype=np.float64)
    traded = (position != 0) | (position != np.r_[0.0, position[:-1]])
    late = np.flatnonzero(traded & (np.asarray(decision_ts) > np.asarray(entry)))
    if len(late):
        i = int(late[0])

        def iso(ns: int) -> str:
            return str(np.datetime64(int(ns), "ns"))

        raise DecisionClockError(
            f"{model} on {file}: bar {i} ({iso(bars_ts[i])}) trades on data from {iso(decision_ts[i])}, after its entry "
            f"price traded at {iso(entry[i])} ({len(late)} such bar(s))")


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
    sampling = hasattr(model, "forward_last")  # a sampling model (Diffusion): its own seeded noise, so reruns agree
    generator = torch.Generator(device=device).manual_seed(SAMPLING_SEED) if sampling else None
    for lo in range(0, feats.shape[0], BATCH):
        x = feats[lo : lo + BATCH].transpose(1, 2).contiguous()
        if times is None:
            last = model.forward_last(x, generator=generator) if sampling else model(x)[:, -1]
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
    load_weights(model, ckpt.weights, device)
    seq_len = _load_json(ckpt.path / "train_config.json")["seq_len"]
    norm = NormStats.load(ckpt.path / "norm_stats.json")
    probs = np.full((bars.rows, len(bars.meta.horizons)), np.nan, dtype=np.float32)
    if bars.rows >= seq_len:
        probs[seq_len - 1 :] = _window_probs(model, bars.features, None, seq_len, norm, device)
    return probs


def perception_snapshot_probs(ckpt: Checkpoint, book: Sidecar, device: torch.device) -> np.ndarray:
    """[N snapshots, H] the book model's up-probabilities per snapshot (NaN before the first full window)."""
    from alpha_core.models.perception import PerceptionConfig, PerceptionModel

    model = PerceptionModel(PerceptionConfig(**_load_json(ckpt.path / "model_config.json"))).to(device).eval()
    load_weights(model, ckpt.weights, device)
    seq_len = ckpt.summary["seq_len"]
    norm = NormStats.load(ckpt.path / "norm_stats.json")
    snap = np.full((book.rows, len(book.meta.horizons)), np.nan, dtype=np.float32)
    if book.rows >= seq_len:
        snap[seq_len - 1 :] = _window_probs(model, book.features, book.dt, seq_len, norm, device)
    return snap


def book_decisions(snap: np.ndarray, book_ts: np.ndarray, close_trade: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bar probabilities [N bars, H], decision_ts [N bars]): each bar reads the last snapshot at or before its close
    trade (`close_trade` -1: no decision, NaN)."""
    rows = snapshots_at(book_ts, close_trade)
    ok = rows >= 0
    probs = np.full((len(close_trade), snap.shape[1]), np.nan, dtype=np.float32)
    probs[ok] = snap[rows[ok]]
    decided = ok & np.isfinite(probs).all(axis=1)
    return probs, np.where(decided, np.asarray(book_ts)[np.maximum(rows, 0)], NO_DECISION)


def rl_positions(ckpt: Checkpoint, bars: Sidecar, device: torch.device) -> np.ndarray:
    """Greedy positions of the agent bar by bar: `greedy_positions`, exactly as RL validation runs it."""
    from alpha_core.rl import EnvConfig, TradingVecEnv, build_agent, load_policy
    from alpha_core.rl.agents import DQNConfig, PPOConfig, greedy_positions

    env_cfg = EnvConfig(**_load_json(ckpt.path / "env_config.json"))
    norm = NormStats.load(ckpt.path / "norm_stats.json")
    agent_cfg = {"dqn": DQNConfig, "ppo": PPOConfig}[ckpt.model](**_load_json(ckpt.path / "agent_config.json"))
    env = TradingVecEnv([bars], env_cfg.model_copy(update={"n_envs": 1, "episode_len": 1}), norm)
    agent = load_policy(build_agent(ckpt.model, env, agent_cfg, device=str(device)), ckpt.weights)
    return greedy_positions(agent, [bars], env_cfg, norm)[0]


def predict(ckpt: Checkpoint, bars: Sidecar, book: Sidecar | None, horizon: int, band: float,
            device: torch.device) -> Prediction:
    """The checkpoint's positions on one bar file, on the decision clock (the book file is the same period's)."""
    clock = entry_ts(bars, book)
    if ckpt.trainer == "rl":
        pos = rl_positions(ckpt, bars, device)
        decided = np.arange(bars.rows) >= _load_json(ckpt.path / "env_config.json")["window"] - 1
        return Prediction(pos, np.where(decided, clock, NO_DECISION), None, None)
    if ckpt.trainer == "perception":
        if book is None:
            raise ValueError(f"no book file for {bars.meta.source.name}")
        snap = perception_snapshot_probs(ckpt, book, device)
        probs, decision = book_decisions(snap, book.ts, book_close_trade_ts(bars, book))
        pos = positions_from_probs(np.nan_to_num(probs[:, horizon], nan=0.5), band)
        return Prediction(pos, decision, snap, book)
    probs = supervised_probs(ckpt, bars, device)
    decided = np.isfinite(probs[:, horizon])
    pos = positions_from_probs(np.nan_to_num(probs[:, horizon], nan=0.5), band)
    return Prediction(pos, np.where(decided, clock, NO_DECISION), probs, bars)
