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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from alpha_core import cpus
from alpha_core.data.labels import NS_PER_MINUTE
from alpha_core.data.norm import NormStats
from alpha_core.data.sidecar import Sidecar
from alpha_core.models import registry
from alpha_core.weights import load_weights

BATCH = 4096  # windows per forward pass on an accelerator
CPU_BATCH = 128  # on CPU: small batches stay in cache (4096 windows took 3x the CPU time of 128-256 per window)
MAX_CPU_WORKERS = 8  # CPU threads that each run one batch at a time
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


def cpu_workers() -> int:
    """The cores this process may use (at most MAX_CPU_WORKERS): CPU inference runs one batch per core."""
    return max(1, min(cpus.step_cpus(), MAX_CPU_WORKERS))


@contextmanager
def one_intra_op_thread():
    """torch's own intra-op threads set to 1 for the duration. On CPU, evaluation runs a worker thread per core
    instead (`_batches`): less wall and CPU time than intra-op threads on the 2-core VM, and far less while another
    process holds a core, since intra-op threads meet at a barrier in every op (bench/README.md)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _batches(run: Callable[[int], torch.Tensor], starts: range, parallel: bool) -> list[torch.Tensor]:
    """`run(lo)` for each batch start, in order; with `parallel` (CPU) over one worker thread per core, each with
    one intra-op thread. A batch's result depends on its windows only, so the threads change no number."""
    workers = min(cpu_workers(), len(starts)) if parallel else 1
    if workers < 2:
        return [run(lo) for lo in starts]
    # the main thread's setting is restored last: the workers' setting would otherwise stay the process default
    with one_intra_op_thread(), ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(1,)) as pool:
        return list(pool.map(run, starts))


def _padded(fn: Callable[[torch.Tensor], torch.Tensor], index: torch.Tensor, size: int, parallel: bool,
            pad: bool = True) -> torch.Tensor:
    """`fn` over `index` in chunks of `size`, concatenated (under inference mode). With `pad` the last chunk is
    filled up with its last index: matmul kernels can change with the batch size, and so could a result's last
    bits, so every result is computed in a chunk of the same size, whatever else is predicted with it."""

    def run(lo: int) -> torch.Tensor:
        pick = index[lo : lo + size]
        n = len(pick)
        if pad:
            pick = torch.cat([pick, pick[-1:].expand(size - n)])
        with torch.inference_mode():  # per call: worker threads do not inherit the caller's grad mode
            return fn(pick)[:n]

    return torch.cat(_batches(run, range(0, len(index), size), parallel))


def _window_probs(model, features: np.ndarray, dt: np.ndarray | None, seq_len: int, norm: NormStats,
                  device: torch.device, rows: np.ndarray | None = None) -> np.ndarray:
    """Up-probability per horizon at the last position of every window ending at rows seq_len-1 .. N-1, or only of
    the windows ending at `rows` (each >= seq_len - 1): [windows, H].

    The file goes to the device once and is normalised once; each batch of windows is then gathered from it on
    the device, so the host copies nothing per batch. A model with a `position_wise` part (the TFT's variable
    selection) runs it once per row, and `forward_windows` on the windows of its output. Batches are padded to
    the full size (`_padded`): the validation path, which predicts only some snapshots, gets the numbers of the
    full file (on the demo checkpoints to the bit: bench_evaluate.py --demo --reference). On CPU the batches are
    small and run on every core (`_batches`); a sampling model (Diffusion) runs its batches in order, unpadded, on
    its own seeded noise, so reruns agree.
    """
    if len(features) < seq_len or (rows is not None and len(rows) == 0):
        return np.empty((0, 0), np.float32)
    mean, std = (torch.from_numpy(a).to(device) for a in norm.arrays())
    values = torch.from_numpy(np.array(features)).to(device).sub_(mean).div_(std)  # [N, F]
    sampling = hasattr(model, "forward_last")
    generator = torch.Generator(device=device).manual_seed(SAMPLING_SEED) if sampling else None
    cpu = device.type == "cpu"
    batch = CPU_BATCH if cpu else BATCH
    parallel = cpu and not sampling
    if hasattr(model, "position_wise"):  # chunks of as many rows as a batch of windows has positions
        values = _padded(lambda r: model.position_wise(values[r][None])[0], torch.arange(len(values), device=device),
                         batch * seq_len, parallel)
    feats = values.unfold(0, seq_len, 1)  # [W, F (or the position-wise width), K]
    times = None if dt is None else torch.from_numpy(np.array(dt)).to(device).unfold(0, seq_len, 1)  # [W, K]
    ends = np.arange(seq_len - 1, len(features)) if rows is None else np.asarray(rows, dtype=np.int64)

    def run(pick: torch.Tensor) -> torch.Tensor:
        x = feats[pick].transpose(1, 2).contiguous()
        if times is not None:  # the book model: its trunk's logits, without the aux path
            last = model.last_logits(x, times[pick].contiguous())
        elif sampling:
            last = model.forward_last(x, generator=generator)
        else:
            last = (model.forward_windows(x) if hasattr(model, "position_wise") else model(x))[:, -1]
        return torch.sigmoid(last.float())

    index = torch.from_numpy(ends - (seq_len - 1)).to(device)  # the windows to predict
    return _padded(run, index, batch, parallel, pad=not sampling).cpu().numpy()


def _load_json(path: Path) -> dict:
    return json.loads(path.read_text())


@dataclass
class Loaded:
    """A checkpoint read once, to predict every file of its fold (its test and validation files)."""

    ckpt: Checkpoint
    device: torch.device
    norm: NormStats
    window: int  # rows each decision reads: seq_len, or the RL environment's window
    net: torch.nn.Module | None = None  # None for an RL agent: built on its first file (`rl_positions`)
    agent: object | None = None


def load(ckpt: Checkpoint, device: torch.device) -> Loaded:
    """The checkpoint's network on `device`, in eval mode, with its normalisation and window."""
    norm = NormStats.load(ckpt.path / "norm_stats.json")
    if ckpt.trainer == "rl":
        return Loaded(ckpt, device, norm, _load_json(ckpt.path / "env_config.json")["window"])
    if ckpt.trainer == "perception":
        from alpha_core.models.perception import PerceptionConfig, PerceptionModel

        net = PerceptionModel(PerceptionConfig(**_load_json(ckpt.path / "model_config.json")))
        seq_len = ckpt.summary["seq_len"]
    else:
        spec = registry.get(ckpt.model)
        net = spec.builder()(spec.config_class()(**_load_json(ckpt.path / "model_config.json")))
        seq_len = _load_json(ckpt.path / "train_config.json")["seq_len"]
    net = net.to(device).eval()
    load_weights(net, ckpt.weights, device)
    return Loaded(ckpt, device, norm, seq_len, net)


def supervised_probs(model: Loaded, bars: Sidecar) -> np.ndarray:
    """[N, H] up-probabilities per bar (NaN before the first full window)."""
    probs = np.full((bars.rows, len(bars.meta.horizons)), np.nan, dtype=np.float32)
    if bars.rows >= model.window:
        probs[model.window - 1 :] = _window_probs(model.net, bars.features, None, model.window, model.norm,
                                                  model.device)
    return probs


def perception_snapshot_probs(model: Loaded, book: Sidecar, rows: np.ndarray | None = None) -> np.ndarray:
    """[N snapshots, H] the book model's up-probabilities per snapshot (NaN before the first full window), or only at
    the snapshots `rows` (NaN elsewhere)."""
    snap = np.full((book.rows, len(book.meta.horizons)), np.nan, dtype=np.float32)
    first = model.window - 1
    if rows is None:
        if book.rows > first:
            snap[first:] = _window_probs(model.net, book.features, book.dt, model.window, model.norm, model.device)
        return snap
    rows = np.unique(rows[rows >= first])
    if len(rows):
        snap[rows] = _window_probs(model.net, book.features, book.dt, model.window, model.norm, model.device, rows)
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


def rl_positions(model: Loaded, bars: Sidecar) -> np.ndarray:
    """Greedy positions of the agent bar by bar: `greedy_positions`, exactly as RL validation runs it."""
    from alpha_core.rl import EnvConfig, TradingVecEnv, build_agent, load_policy
    from alpha_core.rl.agents import DQNConfig, PPOConfig, greedy_positions

    ckpt = model.ckpt
    env_cfg = EnvConfig(**_load_json(ckpt.path / "env_config.json"))
    if model.agent is None:  # the policy's spaces come from an environment: the first file's
        agent_cfg = {"dqn": DQNConfig, "ppo": PPOConfig}[ckpt.model](**_load_json(ckpt.path / "agent_config.json"))
        env = TradingVecEnv([bars], env_cfg.model_copy(update={"n_envs": 1, "episode_len": 1}), model.norm)
        model.agent = load_policy(build_agent(ckpt.model, env, agent_cfg, device=str(model.device)), ckpt.weights)
    return greedy_positions(model.agent, [bars], env_cfg, model.norm)[0]


def predict(model: Loaded, bars: Sidecar, book: Sidecar | None, horizon: int, band: float,
            scored: bool = True) -> Prediction:
    """The checkpoint's positions on one bar file, on the decision clock (the book file is the same period's).
    `scored` False: positions only (no `probs`), so the book model predicts only the snapshots bars decide on."""
    clock = entry_ts(bars, book)
    if model.ckpt.trainer == "rl":
        pos = rl_positions(model, bars)
        decided = np.arange(bars.rows) >= model.window - 1
        return Prediction(pos, np.where(decided, clock, NO_DECISION), None, None)
    if model.ckpt.trainer == "perception":
        if book is None:
            raise ValueError(f"no book file for {bars.meta.source.name}")
        close = book_close_trade_ts(bars, book)
        snap = perception_snapshot_probs(model, book, None if scored else snapshots_at(book.ts, close))
        probs, decision = book_decisions(snap, book.ts, close)
        pos = positions_from_probs(np.nan_to_num(probs[:, horizon], nan=0.5), band)
        return Prediction(pos, decision, snap, book) if scored else Prediction(pos, decision, None, None)
    probs = supervised_probs(model, bars)
    decided = np.isfinite(probs[:, horizon])
    pos = positions_from_probs(np.nan_to_num(probs[:, horizon], nan=0.5), band)
    return Prediction(pos, np.where(decided, clock, NO_DECISION), probs, bars)
