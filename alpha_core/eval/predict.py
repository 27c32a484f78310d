"""Out-of-sample predictions of one checkpoint on one file: a position for every bar and the time it was decided.

One decision clock. A position for bar t is entered at bar t's close, the minute's last trade, and held over
bar t+1 (see `entry_ts`); every model must decide on data stamped no later than that trade:
- supervised bar models: the up-probability at the last position of the window ending at bar t
  (`bar_decision_rows`), turned into a position by the checkpoint's policy (`policy.py`: the fitted one, or the
  fixed rule +1 above 0.5 + band, -1 below 0.5 - band, else flat); a policy that holds a bet h bars makes bar t's
  position depend on bars t - h + 1 .. t, and its decision time is the latest of theirs;
- RL agents: the greedy action on the observation of bar t (window + current position), run in sequence
  (`alpha_core.rl.agents.greedy_decisions`, the same function RL validation uses);
- the book-level perception model: the prediction of the last snapshot at or before bar t's close trade
  (`book_decision_rows`, from the book sidecar's `trade_ts`).

The decision time is derived, never declared: every input window is gathered through an explicit row index,
and a decision's time is the timestamp of the latest row that index read (a bar row: its close trade; a book
row: its snapshot time), carried with the prediction. So a model, or a change to this module, that reads one
bar, one record or one second past its entry trade shows it in `decision_ts`, and `check_decision_clock`
(which `evaluate` runs on every model and ensemble) refuses it. Bars before the first full window (or without
a decision) stay flat, decided on no data (`NO_DECISION`).

Bounded memory whatever the file: a book file is never read whole. Its times are scanned in blocks (the close
trades of each minute, the snapshot at or before each), and only the windows asked for are gathered, chunk by
chunk (`CHUNK_ROWS` rows at most), by plain reads of their rows (`loader.take_rows`). The book model
predicts the snapshots its bars decide on and, for its AUC, a fixed seeded sample of the test file's snapshots
(`auc_rows`), never every snapshot.
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
from alpha_core.data.loader import take_rows
from alpha_core.data.norm import NormStats
from alpha_core.data.sidecar import Sidecar
from alpha_core.eval import policy as policies
from alpha_core.eval.policy import Policy
from alpha_core.models import registry
from alpha_core.models.hooks import LastPosition, PositionWise, Sampling, cpu_batch
from alpha_core.trainers import Trainer
from alpha_core.weights import load_weights

BATCH = 4096  # windows per forward pass on an accelerator
CPU_BATCH = 128  # on CPU: small batches stay in cache (4096 windows took 3x the CPU time of 128-256 per window)
# (a model's `cpu_batch` (`models.hooks.CpuBatch`), where set, is its own: measured fastest for it, bench/README.md)
MAX_CPU_WORKERS = 8  # CPU threads that each run one batch at a time
SAMPLING_SEED = 0x5EED  # the noise of sampling models in evaluation: the same report for the same checkpoint
BLOCK_ROWS = 1 << 20  # rows of one column read per block where a book file's times are scanned (8 MiB)
CHUNK_ROWS = 1 << 19  # rows gathered for one chunk of windows (60 MiB of float16 book features, 120 MiB as float32)
AUC_SAMPLE = 1 << 16  # snapshots of a book test file its AUC is scored on (every one when the file has fewer)
AUC_SAMPLE_SEED = 0xA0C  # which ones: the same rows for the same file length, whatever the checkpoint


NO_DECISION = -1  # decision_ts of a bar whose (flat) position uses no data


class DecisionClockError(RuntimeError):
    """A model traded a bar on data timestamped after the price its position is entered at (look-ahead)."""


@dataclass
class Prediction:
    position: np.ndarray  # [N bars] float64, held over the next bar
    decision_ts: np.ndarray  # [N bars] int64 ns: the latest data the position depends on (NO_DECISION: none)
    probs: np.ndarray | None  # [len(rows), H] up-probabilities (NaN where none); None for RL agents
    scored_on: Sidecar | None  # whose rows and labels `probs` belong to: the bars, or the book file (perception)
    rows: np.ndarray | None = None  # the rows of `scored_on` scored: every bar, or the book's AUC sample
    bar_probs: np.ndarray | None = None  # [N bars, H] the up-probabilities each bar decides on (NaN: none); None: RL
    bar_aux: np.ndarray | None = None  # [N bars, 2H] the book model's expected outcomes there, where asked for
    policy: Policy | None = None  # how `bar_probs` became `position` (None: an RL agent's own actions)


@dataclass
class Checkpoint:
    model: str
    symbol: str
    fold: int
    path: Path
    trainer: Trainer  # how it was trained: what it reads, trades and keeps
    summary: dict

    @property
    def weights(self) -> Path:
        """The checkpoint the gate judged: a book model keeps several, its summary names the one it reports."""
        return self.path / self.trainer.weights_file(self.summary)


def _blocks(sc: Sidecar, name: str):
    """Column `name` of a sidecar in blocks of BLOCK_ROWS rows (plain reads: nothing stays mapped)."""
    for a in range(0, sc.rows, BLOCK_ROWS):
        yield sc.read(name, a, min(a + BLOCK_ROWS, sc.rows))


def _last_per_minute(trade: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(minute, its latest trade) of non-decreasing trade times."""
    minute = trade // NS_PER_MINUTE * NS_PER_MINUTE
    last = np.r_[np.flatnonzero(minute[1:] != minute[:-1]), len(minute) - 1] if len(minute) else np.empty(0, int)
    return minute[last], trade[last]


def book_close_trade_ts(bars: Sidecar, book: Sidecar) -> np.ndarray:
    """int64 [N bars]: ts_event of each bar minute's last trade, from the book sidecar's `trade_ts` (the max
    trade_ts falling in [m, m + 60 s)); -1 where the book saw no trade in that minute. `trade_ts` is read in
    blocks, keeping each block's latest trade per minute (O(minutes) memory)."""
    minutes, trades = [], []
    for block in _blocks(book, "trade_ts"):
        t = block[block >= 0]
        m, t = _last_per_minute(t if (t[1:] >= t[:-1]).all() else np.sort(t))  # in file order they mostly rise
        minutes.append(m)
        trades.append(t)
    minute, trade = (np.concatenate(a) if a else np.empty(0, np.int64) for a in (minutes, trades))
    order = np.lexsort((trade, minute))  # a minute's trades may span blocks: its max is the last after sorting
    minute, trade = _last_per_minute(trade[order])
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


def book_snapshots_at(book: Sidecar, clock: np.ndarray) -> np.ndarray:
    """`snapshots_at(book.ts, clock)` with the book's times read in blocks: each clock time counts the snapshots at
    or before it, block by block (a block wholly at or before it adds its length)."""
    clock = np.asarray(clock, dtype=np.int64)
    order = np.argsort(clock, kind="stable")
    c = clock[order]
    count = np.zeros(len(c), dtype=np.int64)
    whole = np.zeros(len(c) + 1, dtype=np.int64)  # blocks wholly at or before c[i:], as a difference array
    for ts in _blocks(book, "ts"):
        lo, hi = np.searchsorted(c, ts[0], side="left"), np.searchsorted(c, ts[-1], side="left")
        count[lo:hi] += np.searchsorted(ts, c[lo:hi], side="right")
        whole[hi] += len(ts)
    rows = np.empty(len(c), dtype=np.int64)
    rows[order] = count + np.cumsum(whole)[:-1] - 1
    return np.where(clock >= 0, rows, -1)


def bar_decision_rows(bars: Sidecar) -> np.ndarray:
    """The bar row whose window decides each bar's position: the bar itself."""
    return np.arange(bars.rows, dtype=np.int64)


def book_decision_rows(bars: Sidecar, book: Sidecar) -> np.ndarray:
    """The book row whose window decides each bar's position: the last snapshot at or before its close trade."""
    return book_snapshots_at(book, book_close_trade_ts(bars, book))


def auc_rows(n_rows: int, window: int) -> np.ndarray:
    """The book rows a test file's AUC is scored on, sorted: AUC_SAMPLE of the rows with a full window, drawn
    without replacement with seed AUC_SAMPLE_SEED; every such row when there are no more than that."""
    first = window - 1
    population = max(n_rows - first, 0)
    if population <= AUC_SAMPLE:
        return np.arange(first, n_rows, dtype=np.int64)
    pick = np.random.default_rng(AUC_SAMPLE_SEED).choice(population, size=AUC_SAMPLE, replace=False)
    return first + np.sort(pick).astype(np.int64)


def decision_times(read_rows: np.ndarray, row_ts: np.ndarray) -> np.ndarray:
    """int64 [N]: the timestamp of the latest row each decision read (`NO_DECISION` where it read none)."""
    read_rows = np.asarray(read_rows, dtype=np.int64)
    return np.where(read_rows >= 0, np.asarray(row_ts, dtype=np.int64)[np.maximum(read_rows, 0)], NO_DECISION)


def book_decision_times(read_rows: np.ndarray, book: Sidecar) -> np.ndarray:
    """`decision_times(read_rows, book.ts)`, gathering only the rows read."""
    read_rows = np.asarray(read_rows, dtype=np.int64)
    out = np.full(len(read_rows), NO_DECISION, dtype=np.int64)
    read = np.flatnonzero(read_rows >= 0)
    order = np.argsort(read_rows[read], kind="stable")
    out[read[order]] = take_rows(book, "ts", read_rows[read][order])
    return out


def check_decision_clock(
    model: str, file: str, bars_ts: np.ndarray, position: np.ndarray, decision_ts: np.ndarray, entry: np.ndarray
) -> None:
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
            f"price traded at {iso(entry[i])} ({len(late)} such bar(s))"
        )


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


def _batches(run: Callable[[int], None], starts: range, parallel: bool) -> None:
    """`run(lo)` for each batch start; with `parallel` (CPU) over one worker thread per core, each with one
    intra-op thread. A batch's result depends on its windows only, so the threads change no number."""
    workers = min(cpu_workers(), len(starts)) if parallel else 1
    if workers < 2:
        for lo in starts:
            run(lo)
        return
    # the main thread's setting is restored last: the workers' setting would otherwise stay the process default
    with one_intra_op_thread(), ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(1,)) as pool:
        list(pool.map(run, starts))


def _padded(
    fn: Callable[[torch.Tensor], tuple[torch.Tensor, ...]], index: torch.Tensor, size: int, parallel: bool, pad: bool = True
) -> tuple[torch.Tensor, ...]:
    """`fn` over `index` in chunks of `size`, each of its outputs written into one preallocated tensor (under
    inference mode). With `pad` the last chunk is filled up with its last index: matmul kernels can change with the
    batch size, and so could a result's last bits, so every result is computed in a chunk of the same size, whatever
    else is predicted with it. Writing each chunk out at once keeps memory flat: a list of small per-chunk results,
    allocated between each chunk's large temporaries, kept glibc from returning the heap (2.3 MB a chunk)."""
    outputs: list[torch.Tensor] = []

    def run(lo: int) -> None:
        pick = index[lo : lo + size]
        n = len(pick)
        if pad:
            pick = torch.cat([pick, pick[-1:].expand(size - n)])
        with torch.inference_mode():  # per call: worker threads do not inherit the caller's grad mode
            results = fn(pick)
        if not outputs:  # the first chunk, run alone: the outputs' shapes and types
            outputs.extend(torch.empty((len(index), *r.shape[1:]), dtype=r.dtype, device=r.device) for r in results)
        with torch.no_grad():
            for dest, result in zip(outputs, results, strict=True):
                dest[lo : lo + n] = result[:n]

    starts = range(0, len(index), size)
    if len(starts):
        run(starts[0])
        _batches(run, starts[1:], parallel)
    return tuple(outputs)


def _chunks(rows: np.ndarray, seq_len: int, batch: int):
    """(i, j): runs of the sorted window ends whose rows, gathered, stay near CHUNK_ROWS: a span of consecutive
    rows (dense ends) or up to CHUNK_ROWS // seq_len windows (sparse ends). Every chunk but the last holds whole
    batches, so the batches (and a sampling model's noise, drawn batch by batch) are those of one pass."""
    i = 0
    while i < len(rows):
        sparse = i + max(1, CHUNK_ROWS // seq_len)
        dense = int(np.searchsorted(rows, rows[i] + CHUNK_ROWS - seq_len, side="right"))
        j = min(len(rows), max(sparse, dense))
        if j < len(rows):
            j = i + max(batch, (j - i) // batch * batch)
        yield i, min(j, len(rows))
        i = j


def _window_probs(
    model,
    features: np.ndarray,
    dt: np.ndarray | None,
    seq_len: int,
    norm: NormStats,
    device: torch.device,
    rows: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """`_probs_at` on whole arrays (or memory maps) of one file: the windows ending at `rows` (every full window
    when None)."""
    arrays = {"features": features, "dt": dt}
    rows = np.arange(seq_len - 1, len(features)) if rows is None else np.asarray(rows, dtype=np.int64)
    return _probs_at(model, lambda name, idx: np.asarray(arrays[name][idx]), dt is not None, seq_len, norm, device, rows)


def _probs_at(
    model,
    fetch: Callable[[str, np.ndarray], np.ndarray],
    timed: bool,
    seq_len: int,
    norm: NormStats,
    device: torch.device,
    rows: np.ndarray,
    aux: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(up-probability per horizon at the last position of the window ending at each of `rows` (sorted, each >=
    seq_len - 1): [len(rows), H]; the latest row each of those windows read: [len(rows)]). `aux` (the book model):
    its aux heads' expected long and short outcomes instead, [len(rows), 2H].

    The rows read come from the very index that gathers each window, so they are what the model saw, not what it was
    meant to see. The windows go chunk by chunk (`_chunks`): a chunk's rows are fetched (`fetch(name, sorted
    rows)`), moved to the device, upcast to float32 (a book's are stored as float16) and normalised once, and each
    batch of windows is gathered from them on the device. A model with a `position_wise` part (the TFT's variable
    selection, TGGN's graph steps) runs it once per fetched row, and `forward_windows` (or `last_position`) on the
    windows of its output; a model with `last_position` computes only what each window's last position depends on.
    Batches are padded to the full size (`_padded`), so a window's numbers do not depend on the others predicted
    with it: the validation path, which predicts only some snapshots, gets the numbers of the full file, and so does
    any chunking (tests/test_evaluate.py, to the bit). On CPU the batches are small (CPU_BATCH, or the model's
    `cpu_batch`) and run on every core (`_batches`); a sampling model (Diffusion) runs its batches in order,
    unpadded, on its own seeded noise, so reruns agree.
    """
    if len(rows) == 0:
        return np.empty((0, 0), np.float32), np.empty(0, np.int64)
    mean, std = (torch.from_numpy(a).to(device) for a in norm.arrays())
    sampling = isinstance(model, Sampling)
    position_wise, last_position = isinstance(model, PositionWise), isinstance(model, LastPosition)
    generator = torch.Generator(device=device).manual_seed(SAMPLING_SEED) if sampling else None
    cpu = device.type == "cpu"
    batch = cpu_batch(model, CPU_BATCH) if cpu else BATCH
    parallel = cpu and not sampling
    lags = np.arange(-seq_len + 1, 1)
    probs, reads = [], []
    for i, j in _chunks(rows, seq_len, batch):
        ends = rows[i:j]
        if ends[-1] - ends[0] + seq_len <= len(ends) * seq_len:  # dense: the span; sparse: the windows' rows
            need = np.arange(ends[0] - seq_len + 1, ends[-1] + 1)
        else:
            need = np.unique((ends[:, None] + lags).ravel())
        values = torch.from_numpy(fetch("features", need)).to(device).float().sub_(mean).div_(std)  # [len(need), F]
        if position_wise:  # chunks of as many rows as a batch of windows has positions
            (values,) = _padded(
                lambda r, v=values: (model.position_wise(v[r][None])[0],),
                torch.arange(len(values), device=device),
                batch * seq_len,
                parallel,
            )
        times = torch.from_numpy(fetch("dt", need)).to(device) if timed else None
        where = torch.from_numpy(need).to(device)  # the file row of each fetched row
        steps = torch.arange(-seq_len + 1, 1, device=device)

        def run(end: torch.Tensor, values=values, times=times, where=where, steps=steps):
            index = end[:, None] + steps  # [B, K]: the fetched rows each window reads, oldest first
            x = values[index]
            if times is not None and aux:  # the book model's expected outcomes, for the decision layer
                return model.last_aux(x, times[index]).float(), where[index.amax(dim=1)]
            if times is not None:  # the book model: its trunk's logits, without the aux path
                last = model.last_logits(x, times[index])
            elif sampling:
                last = model.forward_last(x, generator=generator)
            elif last_position:  # only what the window's last position depends on
                last = model.last_position(x)
            else:
                last = (model.forward_windows(x) if position_wise else model(x))[:, -1]
            return torch.sigmoid(last.float()), where[index.amax(dim=1)]

        # a window's K rows are consecutive among the fetched rows, so its last one's place locates it
        local = torch.from_numpy(np.searchsorted(need, ends)).to(device)
        p, r = _padded(run, local, batch, parallel, pad=not sampling)
        probs.append(p.cpu().numpy())
        reads.append(r.cpu().numpy())
    return np.concatenate(probs), np.concatenate(reads)


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
    if ckpt.trainer.trades_actions:
        return Loaded(ckpt, device, norm, _load_json(ckpt.path / "env_config.json")["window"])
    if ckpt.trainer.reads_book:
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


def window_probs(
    model: Loaded, sc: Sidecar, rows: np.ndarray | None = None, aux: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the rows predicted: `rows` (every row when None) with a full window, sorted, each once; [n, H] the
    up-probabilities of the windows ending there (`aux`: the book model's expected outcomes, [n, 2H]); [n] the latest
    row each of those windows read), reading only those windows' rows of the file."""
    first = model.window - 1
    rows = np.arange(first, sc.rows) if rows is None else np.unique(rows[rows >= first])
    if len(rows) == 0:
        width = len(sc.meta.horizons) * (2 if aux else 1)
        return rows, np.empty((0, width), np.float32), np.empty(0, np.int64)
    probs, read = _probs_at(
        model.net,
        lambda name, idx: take_rows(sc, name, idx),
        model.ckpt.trainer.reads_book,
        model.window,
        model.norm,
        model.device,
        rows,
        aux,
    )
    return rows, probs, read


def _index_of(got: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Where each of `rows` is in the sorted `got` (-1 where it is not)."""
    k = np.searchsorted(got, rows)
    ok = k < len(got)
    ok[ok] = got[k[ok]] == rows[ok]
    return np.where(ok, k, -1)


def at_rows(values: np.ndarray, rows: np.ndarray, fill) -> np.ndarray:
    """values[rows] per bar, `fill` where a bar has no row (-1)."""
    out = np.full((len(rows), *values.shape[1:]), fill, dtype=values.dtype)
    ok = rows >= 0
    out[ok] = values[rows[ok]]
    return out


def rl_positions(model: Loaded, bars: Sidecar) -> tuple[np.ndarray, np.ndarray]:
    """(greedy positions of the agent bar by bar, the latest row each one read): `greedy_decisions`, exactly as
    RL validation runs it."""
    from alpha_core.rl import EnvConfig, TradingVecEnv, build_agent, load_policy
    from alpha_core.rl.agents import DQNConfig, PPOConfig, greedy_decisions

    ckpt = model.ckpt
    env_cfg = EnvConfig(**_load_json(ckpt.path / "env_config.json"))
    if model.agent is None:  # the policy's spaces come from an environment: the first file's
        agent_cfg = {"dqn": DQNConfig, "ppo": PPOConfig}[ckpt.model](**_load_json(ckpt.path / "agent_config.json"))
        env = TradingVecEnv([bars], env_cfg.model_copy(update={"n_envs": 1, "episode_len": 1}), model.norm)
        model.agent = load_policy(build_agent(ckpt.model, env, agent_cfg, device=str(model.device)), ckpt.weights)
    return greedy_decisions(model.agent, [bars], env_cfg, model.norm)[0]


def predict(
    model: Loaded,
    bars: Sidecar,
    book: Sidecar | None,
    horizon: int,
    band: float,
    scored: bool = True,
    entry: np.ndarray | None = None,
    policy: Policy | None = None,
    with_aux: bool = False,
) -> Prediction:
    """The checkpoint's positions on one bar file, each with the time of the latest data it read (the book file
    is the same period's). `scored` False: positions only (no `probs`), so the book model predicts only the
    snapshots bars decide on; True adds its AUC sample (`auc_rows`). `entry`: `entry_ts(bars, book)`, when the
    caller has it. `policy`: how probabilities become positions (None: the fixed rule at `horizon` and `band`).
    `with_aux` (the book model; implied by an aux policy): its expected outcomes too (`bar_aux`)."""
    policy = policies.fixed(horizon, band) if policy is None else policy
    if model.ckpt.trainer.trades_actions:
        pos, read = rl_positions(model, bars)
        return Prediction(pos, decision_times(read, entry_ts(bars, book) if entry is None else entry), None, None)
    if model.ckpt.trainer.reads_book:
        if book is None:
            raise ValueError(f"no book file for {bars.meta.source.name}")
        rows = book_decision_rows(bars, book)
        sample = auc_rows(book.rows, model.window) if scored else np.empty(0, np.int64)
        got, snap, read = window_probs(model, book, np.concatenate([rows, sample]))
        at = _index_of(got, rows)
        probs, read_at = at_rows(snap, at, np.nan), at_rows(read, at, -1)
        outcomes = None
        if with_aux or policy.needs_aux:  # the same windows through the aux trunk: the same rows read
            got_aux, values, _ = window_probs(model, book, rows, aux=True)
            outcomes = at_rows(values, _index_of(got_aux, rows), np.nan)
        pos = policies.positions(policy, probs, outcomes)
        decision = book_decision_times(np.where(np.isfinite(probs).all(axis=1), read_at, -1), book)
        decision = policies.decision_times(policy, decision)
        if not scored:
            return Prediction(pos, decision, None, None, bar_probs=probs, bar_aux=outcomes, policy=policy)
        return Prediction(
            pos, decision, snap[_index_of(got, sample)], book, sample, bar_probs=probs, bar_aux=outcomes, policy=policy
        )
    rows = bar_decision_rows(bars)
    got, p, r = window_probs(model, bars, rows)
    at = _index_of(got, rows)
    probs, read = at_rows(p, at, np.nan), at_rows(r, at, -1)
    pos = policies.positions(policy, probs)
    decision = decision_times(
        np.where(np.isfinite(probs[:, policy.horizon]), read, -1), entry_ts(bars, book) if entry is None else entry
    )
    decision = policies.decision_times(policy, decision)
    return Prediction(pos, decision, probs, bars, rows, bar_probs=probs, policy=policy)
