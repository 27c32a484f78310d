"""Synthetic but genuine Databento DBN demo data with a planted, learnable signal.

The files are real GLBX.MDP3-style DBN (zstd) files, MBP-10 and OHLCV-1m, keyed by parent symbol, so the
whole pipeline (decode, front-month selection, features, labels, training, evaluation) can run end to end
without a Databento account, and so a model has something true to find.

Market model, one independent run per symbol and quarter, all on the *event clock* (one event = one venue
event = one MBP-10 record with F_LAST):

* Latent order flow ``z``: AR(1), ``z[t+1] = PHI * z[t] + SIGMA * eps`` with ``PHI = 1 - 1/300`` (it persists
  for a few hundred events) and stationary std 1.
* Latent mid ``m`` in integer ticks: at each event it moves +1 with probability ``Q * sigmoid(BETA * z)``,
  -1 with ``Q * (1 - sigmoid(BETA * z))``, else stays (``Q = 0.3``). The walk is reflected into 0.8-1.25x the
  product's price, which keeps long files' prices plausible and consecutive files within the decoder's factor
  (past a bound the walk is mirrored; the oracle knows).
* What can be observed of ``z``:
  (a) book imbalance: bid level sizes scale with ``exp(+KAPPA * z + noise)``, ask sizes with
  ``exp(-KAPPA * z + noise)``; the noise has a persistent per-side part, so imbalance is an imperfect signal.
  A level keeps its size until an event touches it (or a rare background redraw), as in a real book;
  (b) trades: an event is a trade with probability ``P_TRADE``; the aggressor buys with probability
  ``sigmoid(GAMMA * z)`` and trade size grows with ``|z|``;
  (c) hence OHLCV-1m bars show return autocorrelation and volume effects.
* Contracts: a quarter's file covers ``sessions_per_quarter`` CME sessions (business days, 17:00 CT the
  evening before to 16:00 CT) centred on the roll date of the expiring quarterly contract (8 calendar days
  before the third Friday of the expiry month). Each event belongs to the expiring contract or the next one,
  drawn by a share that ramps up smoothly (logistic, ~10% -> ~90% over two sessions) around the roll; the
  back contract quotes at ``m + carry``. A calendar spread (``ESH4-ESM4``) gets a few quotes and trades at
  front minus back (``-carry``), so consumers must drop spreads.
* Records: a non-trade event is one A/C/M record with F_LAST; a trade event is a ``T`` record (side =
  aggressor, price = ask0 for buys / bid0 for sells, flags 0) then, 1-2 ns later, the book update (F_LAST).
  bid0 = m (+ carry), ask0 = bid0 + 1 tick (2 ticks 5% of the time), levels 1 tick apart; ~1% of snapshots
  have a few empty deep levels (UNDEF_PRICE, size 0, count 0). ``ts_recv`` strictly increases over the file.
* OHLCV-1m bars are aggregated from the ``T`` records per (instrument, minute of ts_recv); no trade, no bar.
* Oracle (``*.oracle.npz``): the probability, given the true latent state, that the mid is strictly higher
  h snapshots (events) or h minutes later. It uses a Gaussian approximation of the sum of the next h steps
  (drift from the decaying AR mean, variance from step and latent noise), tabulated on a z grid. Its AUC is
  the ceiling a model can hope for.

Scale ``real`` (the original workload's shape: 730 days of OHLCV-1m for 4 symbols, and books of real density):

* A quarter file covers every CME session of its calendar quarter (weekdays but New Year's Day, Good Friday,
  July 4, Thanksgiving and Christmas: 62-65 sessions), so the 8 quarter files of a symbol tile two years without
  overlap, each with its roll in the expiry month, a weekend gap every week and the 16:00-17:00 CT break daily.
* Bars and book cannot share one run. A real ES session holds millions of MBP-10 records; simulating all of them
  for 63 sessions x 8 quarters x 4 symbols would take hours of CPU and hundreds of GB, and at book density the
  latent flow (a few hundred events) would last seconds, leaving minute bars without a signal. So each quarter is
  two runs of the same model, on two clocks:
  (a) bars: 60k events a session (a trade in nearly every minute: ~1,375 bars a session, ~87k front-month bars
  a quarter), drawn as trades only (``_trades``: no book levels), ~2 s of CPU a quarter;
  (b) book: ``book_sessions`` sessions around the roll (default 3, so the book has its roll too) at 1M events
  (~1.3M MBP-10 records) a session, starting at run (a)'s mid; ~10 s of CPU a quarter.
  Their trades are not the same trades (the book's are not in the bars): nothing in the pipeline joins the two
  schemas, each file's sidecar is built from that file alone, and each file's oracle comes from its own run, so
  both oracles are exact. ``generate_demo_data(..., book_sessions=N)`` changes N (0: bars only).

Difficulty (`DIFFICULTIES`, `alpha demo-data --difficulty`): ``planted`` (the default) is the model above, a signal
so strong that at scale ``real`` every model wins with an intraday Sharpe near 95. ``realistic`` weakens the drift's
edge (BETA 0.5 -> 0.055), gives the flow a price impact (the mid is displaced by 9 ticks per unit of ``z`` at once, and
the drift carries it on: the flow shows in the last minutes' returns, which is how bars see it, without adding to
what it predicts) and draws each quarter's own strength and persistence (log-sd 0.3: regimes), while the book's and
the trades' footprints keep their strength; the oracle's own strategy, fitted on one quarter and traded on the next,
then makes an annualised Sharpe of about 2 at 1 tick, and a linear model of the bar features about half of it
(bench/README.md, `bench_realistic.py`). The regime comes from its own stream, so a difficulty changes no other draw.

Everything is vectorised numpy (no Python loop over events) and deterministic: the generator of a file is
seeded from (seed, symbol, quarter), zstd uses a fixed level and the npz has fixed zip timestamps.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import functools
import hashlib
import os
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from zoneinfo import ZoneInfo

import databento_dbn as dbn
import numpy as np
import zstandard
from scipy.signal import lfilter
from scipy.special import expit, ndtr

from alpha_core.data.front_month import cme_holidays
from alpha_core.data.products import MONTH_CODES, PRODUCTS, Product, product
from alpha_core.databento_private import message_dtype
from alpha_core.errors import PlanError

BOOK_HORIZONS = (10, 100, 1000)  # snapshots
BAR_HORIZONS_MIN = (5, 15, 60)  # minutes


@dataclass(frozen=True)
class DemoScale:
    """Size of the demo set: quarters per symbol, sessions per quarter file, mean events per session.

    With `book_sessions` set, a quarter is the CME sessions of its calendar quarter (at most `sessions_per_quarter`
    of them, around the roll: `real` takes all) and the two schemas come from two runs of the model on two clocks:
    the OHLCV-1m file from `events_per_session` events in every session, the MBP-10 file from
    `book_events_per_session` events in only `book_sessions` sessions around the roll (module docstring, "Scale
    real"). bench/bench_scale.py caps the sessions to measure how each cost grows with a file's length."""

    name: str
    quarters: int
    sessions_per_quarter: int
    events_per_session: int
    book_sessions: int | None = None  # None: one run, the MBP-10 file covers every session of the quarter
    book_events_per_session: int = 0


SCALES: dict[str, DemoScale] = {
    s.name: s
    for s in (
        DemoScale("tiny", 5, 3, 1_500),
        DemoScale("small", 6, 5, 6_000),
        # 10 sessions x 165k (+-5%) events = 1.57-1.73M events ~ 2.05-2.25M MBP-10 records per file (>= 2M)
        DemoScale("full", 4, 10, 165_000),
        # the original workload: 8 calendar quarters (730 days) of every session (62-65; 66 is the most weekdays a
        # quarter can have); ~1,375 one-minute bars a session from 60k events; MBP-10 for the 3 sessions around
        # each roll at 1M events (~1.3M records) a session
        DemoScale("real", 8, 66, 60_000, book_sessions=3, book_events_per_session=1_000_000),
    )
}


# --- model constants ---------------------------------------------------------------------------------------
PHI = 1.0 - 1.0 / 300.0  # latent persistence: a few hundred events
SIGMA = float(np.sqrt(1.0 - PHI**2))  # stationary std 1
Q_MOVE = 0.3  # probability that an event moves the mid
BETA = 0.5  # latent -> mid drift; oracle AUC ~0.68 at 10 events, a small model gets ~0.6-0.65
KAPPA = 0.35  # latent -> log level size (bid +, ask -)
SIDE_NOISE_STD, SIDE_NOISE_PERSIST = 0.3, 100.0  # persistent per-side size noise: imbalance stays imperfect
LEVEL_NOISE_STD = 0.4  # independent per-level size noise
GAMMA = 0.8  # latent -> aggressor side
ETA = 0.5  # |latent| -> trade size
P_TRADE = 0.3
P_SPREAD = 0.004  # share of events on the calendar spread
P_WIDE = 0.05  # ask0 = bid0 + 2 ticks
P_HOLES = 0.01  # snapshots with a few empty deep levels
P_REFRESH = 0.03  # per event and level: background redraw of a level size (others stay as they were)
RTH_SHARE = 0.7  # share of a session's events in 08:30-15:00 CT
ROLL_WIDTH = 1.0 / np.log(9.0)  # logistic scale in sessions: 10% -> 90% over two sessions
LEVELS = 10
ZSTD_LEVEL = 3
_TICK_GAP = 3  # minimum ns between events; the book record after a trade comes 1-2 ns after the T record


@dataclass(frozen=True)
class Difficulty:
    """How hard the planted signal is to trade: its strength, the noise around it and how it shifts between quarters.

    `beta` scales the latent flow's drift on the mid (``P(up) = Q * sigmoid(beta * z)``); `q_noise` adds, per
    event, a +-1 mid move (each side q_noise / 2) that nothing observable predicts; `regime` is the log-sd of each
    quarter's own multipliers of `beta` and `impact` and of the flow's persistence (a quarter of strong, slow flow,
    then one of weak, fast flow), drawn from the quarter's seed; `impact` displaces the mid by ``impact * z`` ticks,
    with the drift that carries it on added to `beta` (`_market`), so the flow shows in past prices (the only
    footprint bars have) without adding to what it predicts. The book's footprints (imbalance, aggressor side, trade
    size) keep their strength, so a model can still read the flow: what changes is how much the flow is worth net of
    cost. The oracle knows each quarter's parameters, so it stays exact."""

    name: str
    beta: float
    q_noise: float = 0.0
    regime: float = 0.0
    impact: float = 0.0


DIFFICULTIES: dict[str, Difficulty] = {
    d.name: d
    for d in (
        # the original planted signal: every member wins at the real scale (an intraday Sharpe near 95)
        Difficulty("planted", 0.5),
        # calibrated so the oracle's own strategy makes an annualised Sharpe of 1.5-3 at 1 tick at scale `real`,
        # and bar models can read the flow from past prices (bench/README.md, `bench_realistic.py`)
        Difficulty("realistic", 0.055, regime=0.3, impact=9.0),
    )
}


@dataclass(frozen=True)
class _Market:
    """One quarter's drift parameters (a `Difficulty` with its regime drawn)."""

    beta: float = BETA  # the drift's, impact's share included
    phi: float = PHI
    q_noise: float = 0.0
    impact: float = 0.0  # ticks of mid displacement per unit of latent flow


def _market(diff: Difficulty, seed: int, prod: Product, year: int, qn: int) -> _Market:
    """The quarter's parameters: its own stream (the event draws stay those of the default difficulty).

    The displacement `impact * z` fades as the flow does (by ``impact * z / tau`` an event), and the drift carries
    the price on by as much (``Q * b / 2`` an event for a small ``b * z``), so the impact moves the price at once
    where it goes anyway: it shows the flow in the price without adding to what the flow predicts."""
    scale, phi = 1.0, PHI
    if diff.regime:
        g = np.random.default_rng([seed, zlib.crc32(prod.symbol.encode()), year, qn, 2]).standard_normal(2)
        scale, phi = float(np.exp(diff.regime * g[0])), 1.0 - 1.0 / (300.0 * float(np.exp(diff.regime * g[1])))
    impact = diff.impact * scale
    return _Market(diff.beta * scale + 2.0 * impact * (1.0 - phi) / Q_MOVE, phi, diff.q_noise, impact)


_CT = ZoneInfo("America/Chicago")
_NS_MIN = 60 * 1_000_000_000
_UNDEF = dbn.UNDEF_PRICE
_MBP10_DT = message_dtype(dbn.MBP10Msg)
_OHLCV_DT = message_dtype(dbn.OHLCVMsg)


@dataclass(frozen=True)
class _ProductModel:
    """Per-product realism: start price, back-minus-front carry in ticks, book depth and trade size."""

    price: float
    carry_ticks: int
    level_size: float
    trade_size: float
    order_size: float  # average resting order size (size / count)


_MODELS = {
    "ES.FUT": _ProductModel(5000.0, 36, 25.0, 2.0, 2.5),
    "NQ.FUT": _ProductModel(17500.0, 48, 6.0, 1.0, 1.5),
    "ZN.FUT": _ProductModel(110.5, -24, 300.0, 8.0, 12.0),
    "6E.FUT": _ProductModel(1.085, 30, 12.0, 1.5, 2.0),
}


@dataclass
class _Interval:
    start_date: dt.date
    end_date: dt.date  # exclusive
    symbol: str  # str(instrument_id)


@dataclass
class _Mapping:
    raw_symbol: str
    intervals: list[_Interval]


# --- public entry point ------------------------------------------------------------------------------------
def generate_demo_data(
    out_dir: Path,
    scale: str = "small",
    seed: int = 7,
    symbols: Sequence[str] = tuple(PRODUCTS),
    quarters: int | None = None,
    book_sessions: int | None = None,
    split: str = "quarterly",
    difficulty: str = "planted",
) -> list[Path]:
    """Write the files; return the DBN paths written (mbp-10 and ohlcv-1m), sorted.

    `book_sessions` (scale `real` only) overrides how many sessions around each roll get an MBP-10 book; 0 writes
    no MBP-10 files (bars only). `split` lays the same records out as Databento's batch downloads may deliver them
    (`SPLITS`): one file per quarter (the default), per UTC day or month, or one file for every quarter.
    `difficulty` names a `DIFFICULTIES` entry."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise PlanError(f"seed must be a non-negative integer, got {seed!r}")
    if split not in SPLITS:
        raise PlanError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    if scale not in SCALES:
        raise PlanError(f"unknown demo scale {scale!r}; valid scales: {', '.join(SCALES)}")
    if difficulty not in DIFFICULTIES:
        raise PlanError(f"unknown demo difficulty {difficulty!r}; valid difficulties: {', '.join(DIFFICULTIES)}")
    diff = DIFFICULTIES[difficulty]
    if isinstance(symbols, str):
        symbols = (symbols,)
    prods = [product(s) for s in symbols]  # PlanError naming the bad symbol and the known ones
    sc = SCALES[scale]
    n_q = sc.quarters if quarters is None else quarters
    if isinstance(n_q, bool) or not isinstance(n_q, int) or n_q < 1:
        raise PlanError(f"quarters must be a positive integer, got {quarters!r}")
    if book_sessions is not None:
        if sc.book_sessions is None:
            raise PlanError(f"book_sessions applies to scale 'real' only (scale {scale!r} has a book in every session)")
        if isinstance(book_sessions, bool) or not isinstance(book_sessions, int) or book_sessions < 0:
            raise PlanError(f"book_sessions must be a non-negative integer, got {book_sessions!r}")
        sc = dataclasses.replace(sc, book_sessions=book_sessions)
    out_dir = Path(out_dir)
    written: list[Path] = []
    for prod in dict.fromkeys(prods):
        quarterly = []
        for k in range(n_q):
            write = _write_quarter if sc.book_sessions is None else _write_real_quarter
            year, qn = 2024 + k // 4, k % 4 + 1
            quarterly += write(out_dir, prod, year, qn, sc, seed, _market(diff, seed, prod, year, qn))
        written += quarterly if split == "quarterly" else _resplit(out_dir / prod.symbol, quarterly, split)
    return sorted(written)


SPLITS = ("quarterly", "daily", "weekly", "monthly", "single")  # how `generate_demo_data` lays a symbol's records out in files


def _split_key(ts: np.ndarray, split: str) -> np.ndarray:
    """The file each record goes to: its UTC day, week (from Sunday, when CME's week opens) or month (Databento
    splits by UTC date), or one for all."""
    days = ts // (86_400 * 1_000_000_000)
    if split == "daily":
        return days
    if split == "weekly":  # 1970-01-04 was a Sunday
        return (days - 3) // 7
    if split == "monthly":
        dates = days.astype("datetime64[D]")
        return dates.astype("datetime64[M]").astype(np.int64)
    return np.zeros(len(ts), np.int64)


def _key_bounds(key: int, split: str) -> tuple[int, int, str]:
    """[start, end) in UTC ns of a split key, and its file name's date part."""
    ns_day = 86_400 * 1_000_000_000
    if split == "daily":
        day = dt.date(1970, 1, 1) + dt.timedelta(days=int(key))
        return int(key) * ns_day, (int(key) + 1) * ns_day, day.strftime("%Y%m%d")
    if split == "weekly":
        first = 7 * int(key) + 3
        day = dt.date(1970, 1, 1) + dt.timedelta(days=first)
        return first * ns_day, (first + 7) * ns_day, day.strftime("%Y%m%d")
    month = np.datetime64(int(key), "M")
    lo = int(month.astype("datetime64[D]").astype(np.int64)) * ns_day
    hi = int((month + 1).astype("datetime64[D]").astype(np.int64)) * ns_day
    return lo, hi, str(month).replace("-", "")


def _resplit(base: Path, quarterly: list[Path], split: str) -> list[Path]:
    """Rewrite a symbol's quarterly files (and their oracles) as the files of `split`, named like a batch
    download's (`glbx-mdp3-20240315.mbp-10.dbn.zst`; monthly `glbx-mdp3-202403...`, one file
    `glbx-mdp3-20240101-20250331...`), split at UTC midnight as Databento splits: the same records in other files."""
    from alpha_core.data.dbn import iter_records, read_info

    written = []
    stems = sorted({_oracle_of(p) for p in quarterly if _oracle_of(p).is_file()})
    oracles = [np.load(p) for p in stems]
    oracle = (
        {k: oracles[0][k] if k.endswith("_horizons") else np.concatenate([z[k] for z in oracles]) for k in oracles[0].files}
        if oracles
        else None
    )
    for schema in ("mbp-10", "ohlcv-1m"):
        files = sorted((p for p in quarterly if p.parent.name == schema), key=lambda p: p.name)
        if not files:
            continue
        infos = [read_info(p) for p in files]
        records = np.concatenate([np.concatenate(list(iter_records(i))) for i in infos])
        index = records["ts_recv"] if "ts_recv" in records.dtype.names else records["ts_event"]
        intervals: dict[str, dict[int, list[dt.date]]] = {}  # raw symbol -> id -> [first, end) dates
        for info in infos:
            for raw, ivs in info.mappings.items():
                for iv in ivs:
                    span = intervals.setdefault(raw, {}).setdefault(iv.instrument_id, [iv.start_date, iv.end_date])
                    span[0], span[1] = min(span[0], iv.start_date), max(span[1], iv.end_date)
        mappings = [_Mapping(raw, [_Interval(a, b, str(iid)) for iid, (a, b) in ids.items()]) for raw, ids in intervals.items()]
        start, end = infos[0].start, infos[-1].end
        keys = _split_key(index, split)
        bounds = np.flatnonzero(np.diff(keys)) + 1
        for rows in np.split(np.arange(len(records)), bounds):
            if split == "single":
                lo, hi = start, end
                first = dt.datetime.fromtimestamp(start / 1e9, dt.UTC).strftime("%Y%m%d")
                last = dt.datetime.fromtimestamp((end - 1) / 1e9, dt.UTC).strftime("%Y%m%d")
                label = f"{first}-{last}"
            else:
                lo, hi, label = _key_bounds(int(keys[rows[0]]), split)
                lo, hi = max(lo, start), min(hi, end)
            meta = dbn.Metadata(
                dataset="GLBX.MDP3",
                start=lo,
                end=hi,
                stype_in=dbn.SType.PARENT,
                stype_out=dbn.SType.INSTRUMENT_ID,
                schema=dbn.Schema(schema),
                symbols=[base.name],
                mappings=mappings,
            )
            path = base / schema / f"glbx-mdp3-{label}.{schema}.dbn.zst"
            _write_dbn(path, meta, records[rows])
            written.append(path)
            if oracle is not None:  # the oracle of the records this file holds (by their time)
                t0, t1 = int(index[rows[0]]), int(index[rows[-1]])
                arrays = {}
                for k, v in oracle.items():
                    if k.endswith("_horizons"):
                        arrays[k] = v
                    else:
                        ts = oracle["book_ts" if k.startswith("book_") else "bar_ts"]
                        arrays[k] = v[(ts >= t0) & (ts <= t1)]
                _write_npz(_oracle_of(path), arrays)
    for p in quarterly:
        p.unlink()
        _oracle_of(p).unlink(missing_ok=True)
    for z in oracles:
        z.close()
    return written


def _oracle_of(dbn_path: Path) -> Path:
    stem = dbn_path.name.removesuffix(".zst").removesuffix(".dbn")
    return dbn_path.parent.parent / "oracle" / f"{stem}.oracle.npz"


# --- calendar ----------------------------------------------------------------------------------------------
def _third_friday(year: int, month: int) -> dt.date:
    first = dt.date(year, month, 1)
    return first + dt.timedelta(days=(4 - first.weekday()) % 7 + 14)


def _roll_date(year: int, month: int) -> dt.date:
    """CME equity-index style roll: 8 calendar days before the third Friday (a Thursday)."""
    return _third_friday(year, month) - dt.timedelta(days=8)


def _sessions_around(center: dt.date, n: int) -> tuple[list[dt.date], int]:
    """n business days centred on `center`; returns them and the index of `center`."""
    before: list[dt.date] = []
    d = center
    while len(before) < (n - 1) // 2:
        d -= dt.timedelta(days=1)
        if d.weekday() < 5:
            before.append(d)
    after: list[dt.date] = []
    d = center
    while len(after) < n - 1 - len(before):
        d += dt.timedelta(days=1)
        if d.weekday() < 5:
            after.append(d)
    return sorted(before) + [center] + after, len(before)


_holidays = cme_holidays  # the session calendar `alpha folds` reports gaps against


def _quarter_sessions(year: int, qn: int) -> list[dt.date]:
    """The CME sessions of a calendar quarter, each named by its closing day (17:00 CT the evening before to 16:00
    CT): weekdays but the holidays, ~63 a quarter. Consecutive quarters tile time without overlap, as the
    quarterly files of a real download do."""
    first = dt.date(year, 3 * qn - 2, 1)
    end = dt.date(year + 1, 1, 1) if qn == 4 else dt.date(year, 3 * qn + 1, 1)
    off = _holidays(year)
    days = (first + dt.timedelta(days=i) for i in range((end - first).days))
    return [d for d in days if d.weekday() < 5 and d not in off]


def _ct_ns(day: dt.date, hour: int, minute: int) -> int:
    local = dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=_CT)
    return int(local.timestamp()) * 1_000_000_000


def _contract(root: str, year: int, month: int) -> str:
    return f"{root}{MONTH_CODES[month - 1]}{year % 10}"


def _instrument_id(raw_symbol: str) -> int:
    """Stable id in 1..2^31 from the raw symbol (CME ids are opaque integers too)."""
    h = hashlib.blake2b(raw_symbol.encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") % (2**31) + 1


# --- the simulation ----------------------------------------------------------------------------------------
def _rng(seed: int, prod: Product, year: int, qn: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(prod.symbol.encode()), year, qn])


def _session_times(rng: np.random.Generator, days: list[dt.date], per_session: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Strictly increasing event times (ns), their continuous session position (for the roll share), and the
    [start, end) of the whole file. RTH (08:30-15:00 CT) is denser than the overnight session."""
    counts = rng.integers(int(per_session * 0.95), int(per_session * 1.05) + 1, size=len(days))
    times, pos = [], []
    for s, (day, n) in enumerate(zip(days, counts, strict=True)):
        start, end = _ct_ns(day - dt.timedelta(days=1), 17, 0), _ct_ns(day, 16, 0)
        rth0, rth1 = _ct_ns(day, 8, 30) - start, _ct_ns(day, 15, 0) - start
        length = end - start
        in_rth = rng.random(n) < RTH_SHARE
        u_rth = rth0 + rng.random(n) * (rth1 - rth0)
        u_on = rng.random(n) * (length - (rth1 - rth0))
        u_on = np.where(u_on < rth0, u_on, u_on + (rth1 - rth0))
        off = np.sort(np.where(in_rth, u_rth, u_on))
        # squeeze into [0, length - gap*n) and add gap*i: strictly increasing, >= _TICK_GAP ns apart
        off = np.floor(off * ((length - _TICK_GAP * n) / length)).astype(np.int64) + _TICK_GAP * np.arange(n)
        times.append(start + off)
        pos.append(s + off / length)
    first, last = _ct_ns(days[0] - dt.timedelta(days=1), 17, 0), _ct_ns(days[-1], 16, 0)
    return np.concatenate(times), np.concatenate(pos), first, last


def _zeros(n: int, dtype: np.dtype) -> np.ndarray:
    """np.zeros of a record dtype: numpy fills a structured dtype item by item (2.7 s of CPU for 3.9M MBP-10
    records); zeroed bytes viewed as records are the same array in 0.1 s."""
    return np.zeros(n * dtype.itemsize, np.uint8).view(dtype)


def _ar1(rng: np.random.Generator, n: int, phi: float, std: float) -> np.ndarray:
    """Stationary AR(1) path with the given persistence and std."""
    x0 = rng.standard_normal() * std
    eps = rng.standard_normal(n) * (std * np.sqrt(1.0 - phi**2))
    return lfilter([1.0], [1.0, -phi], eps, zi=[phi * x0])[0]


@dataclass
class _Quarter:
    """Everything simulated for one symbol and quarter, before it is laid out as records."""

    prod: Product
    front: str
    back: str
    spread: str
    ids: np.ndarray  # instrument ids of [front, back, spread]
    t: np.ndarray  # event time (ts_recv of the first record of the event)
    z: np.ndarray  # latent order flow
    mid: np.ndarray  # latent mid in ticks after each event (bid0 of the front contract)
    orient: np.ndarray  # +1, or -1 where the mid walk is mirrored at a bound of its band
    inst: np.ndarray  # 0 front, 1 back, 2 spread
    spread_ev: np.ndarray  # sorted indices of the spread's events
    start_ns: int
    end_ns: int
    market: _Market


def _contracts(prod: Product, year: int, qn: int) -> tuple[tuple[str, str, str], np.ndarray]:
    """The quarter's expiring contract, the next one and their calendar spread, with their instrument ids."""
    exp_month = 3 * qn
    nyear, nmonth = (year + 1, 3) if qn == 4 else (year, exp_month + 3)
    front, back = _contract(prod.root, year, exp_month), _contract(prod.root, nyear, nmonth)
    spread = f"{front}-{back}"
    ids = np.array([_instrument_id(s) for s in (front, back, spread)], dtype=np.uint32)
    if len(set(ids.tolist())) != 3:  # pragma: no cover - a 1-in-a-billion hash collision
        raise PlanError(f"instrument id collision among {front}, {back}, {spread}")
    return (front, back, spread), ids


def _simulate(
    prod: Product, year: int, qn: int, sc: DemoScale, seed: int, market: _Market
) -> tuple[_Quarter, np.random.Generator]:
    """The latent processes, event times and contract of each event; the generator goes on to the records."""
    rng = _rng(seed, prod, year, qn)
    names, ids = _contracts(prod, year, qn)
    days, roll_idx = _sessions_around(_roll_date(year, 3 * qn), sc.sessions_per_quarter)
    return _run(prod, names, ids, days, roll_idx, sc.events_per_session, rng, market=market), rng


def _run(
    prod: Product,
    names: tuple[str, str, str],
    ids: np.ndarray,
    days: list[dt.date],
    roll_idx: int,
    per_session: int,
    rng: np.random.Generator,
    start_ticks: int | None = None,
    market: _Market = _Market(),
) -> _Quarter:
    """One run of the market model over `days` (the roll at session `roll_idx`); `start_ticks` None draws the start
    price around the product's. With `market.q_noise`, the same uniform draw that decides an informed move decides
    an uninformed one past Q_MOVE, so the default difficulty's draws are unchanged."""
    model = _MODELS[prod.symbol]
    front, back, spread = names
    t, pos, start_ns, end_ns = _session_times(rng, days, per_session)
    n = len(t)

    z = _ar1(rng, n, market.phi, 1.0)
    p_up = Q_MOVE * expit(market.beta * z)
    u = rng.random(n)
    step = (u < p_up).astype(np.int64) - ((u >= p_up) & (u < Q_MOVE)).astype(np.int64)
    if market.q_noise:
        noise = (u >= Q_MOVE) & (u < Q_MOVE + market.q_noise)
        step += np.where(noise, np.where(u < Q_MOVE + market.q_noise / 2, 1, -1), 0)
    if start_ticks is None:
        start_ticks = int(round(model.price / prod.tick_size * np.exp(0.03 * rng.standard_normal())))
    walk = start_ticks + np.cumsum(step)
    if market.impact:
        walk += np.rint(market.impact * z).astype(np.int64)
    mid, orient = _fold(walk, *_price_band(prod))

    share_back = expit((pos - (roll_idx + 0.5)) / ROLL_WIDTH)
    inst = (rng.random(n) < share_back).astype(np.int8)
    n_spread = max(3, int(round(n * P_SPREAD)))
    spread_ev = np.sort(rng.choice(n, size=n_spread, replace=False))
    inst[spread_ev] = 2

    return _Quarter(prod, front, back, spread, ids, t, z, mid, orient, inst, spread_ev, start_ns, end_ns, market)


def _price_band(prod: Product) -> tuple[int, int]:
    """[low, high] ticks the mid walk is reflected into: 0.8x to 1.25x the product's price. A walk of a quarter's
    events moves a ZN price by ~30 points (the tick walk's volatility is the same for every product), and the
    decoder refuses a price outside the product's plausible range or a factor above its `max_file_move` between
    consecutive files (1.6 for ZN and 6E): any two prices in the band are within 1.5625x of each other."""
    price = _MODELS[prod.symbol].price / prod.tick_size
    return int(round(0.8 * price)), int(round(1.25 * price))


def _fold(walk: np.ndarray, low: int, high: int) -> tuple[np.ndarray, np.ndarray]:
    """(mid, orient): the walk reflected into [low, high] (a walk that crosses a bound comes back mirrored), and +1
    where the mid moves with the walk, -1 where it moves against it (the oracle flips the drift there)."""
    period = 2 * (high - low)
    u = np.mod(walk - low, period)
    inside = u <= high - low
    return np.where(inside, low + u, low + period - u), np.where(inside, 1, -1).astype(np.int8)


def _build_records(q: _Quarter, rng: np.random.Generator) -> np.ndarray:
    """Lay the events out as MBP-10 records (one per event, two per trade) with the observable footprints
    of the latent flow: trade side and size, and level sizes."""
    model = _MODELS[q.prod.symbol]
    n = len(q.t)
    is_spread = q.inst == 2
    zc = np.where(is_spread, 0.0, q.z)  # the spread's book and flow carry no signal
    tick_fp = int(round(q.prod.tick_size * dbn.FIXED_PRICE_SCALE))

    is_trade = rng.random(n) < P_TRADE
    is_trade[q.spread_ev[0]] = True  # every file has at least one spread trade
    buy = rng.random(n) < expit(GAMMA * zc)
    base_trade = np.where(is_spread, 1.0, model.trade_size)
    trade_size = 1 + rng.poisson(base_trade * np.exp(ETA * np.abs(zc)))

    offset = np.array([0, model.carry_ticks, 0], dtype=np.int64)[q.inst]
    bid0 = np.where(is_spread, -model.carry_ticks, q.mid + offset)
    ask0 = bid0 + 1 + (rng.random(n) < P_WIDE)

    # empty deep levels on ~1% of snapshots: the deepest k levels of the bid, the ask or both sides
    holes = rng.random(n) < P_HOLES
    k_holes = rng.integers(1, 4, size=n)
    hole_side = rng.integers(0, 3, size=n)  # 0 bid, 1 ask, 2 both
    first_hole = np.where(holes, LEVELS - k_holes, LEVELS)
    first_hole_b = np.where(hole_side != 1, first_hole, LEVELS)
    first_hole_a = np.where(hole_side != 0, first_hole, LEVELS)

    # what each book record reports: A/C/M at some depth of one side (depth 0 if that level is empty);
    # after a trade the passive side of the fill shrinks (C at the trade price, depth 0)
    action = rng.choice(np.frombuffer(b"ACM", np.uint8), size=n, p=[0.45, 0.40, 0.15])
    is_bid = np.where(is_trade, ~buy, rng.random(n) < 0.5)
    depth = np.minimum(rng.geometric(0.5, size=n) - 1, LEVELS - 1)
    depth = np.where(is_trade | (depth >= np.where(is_bid, first_hole_b, first_hole_a)), 0, depth)
    action = np.where(is_trade, ord("C"), action)
    side = np.where(is_bid, ord("B"), ord("A")).astype(np.uint8)
    level_px = np.where(is_bid, bid0 - depth, ask0 + depth)
    price = np.where(is_trade, np.where(buy, ask0, bid0), level_px) * tick_fp
    size = np.where(is_trade, trade_size, 1 + rng.poisson(1.0, size=n))

    # record layout: event e starts at first[e]; a trade event is [T record, book record]
    rec_count = 1 + is_trade.astype(np.int64)
    first = np.cumsum(rec_count) - rec_count
    book_idx = first + is_trade
    trade_idx = first[is_trade]
    ev = np.repeat(np.arange(n), rec_count)
    nrec = len(ev)

    a = _zeros(nrec, _MBP10_DT)
    a["length"] = _MBP10_DT.itemsize // 4
    a["rtype"] = dbn.RType.MBP_10.value
    a["publisher_id"] = 1
    a["instrument_id"] = q.ids[q.inst][ev]
    ts_recv = q.t[ev]
    ts_recv[book_idx[is_trade]] += 1 + (rng.random(int(is_trade.sum())) < 0.5)
    a["ts_recv"] = ts_recv
    latency = rng.integers(2_000, 40_000, size=n)
    a["ts_event"] = (q.t - latency)[ev]
    a["ts_in_delta"] = rng.integers(1_000, 20_000, size=nrec, dtype=np.int32)
    a["sequence"] = int(rng.integers(1_000_000, 50_000_000)) + np.cumsum(rng.integers(1, 3, size=nrec))
    a["flags"][book_idx] = dbn.F_LAST
    rec_action, rec_side = action[ev], side[ev]
    rec_action[trade_idx] = ord("T")
    rec_side[trade_idx] = np.where(buy[is_trade], ord("B"), ord("A"))
    a["action"].view(np.uint8)[:] = rec_action
    a["side"].view(np.uint8)[:] = rec_side
    a["price"] = price[ev]
    a["size"] = size[ev]
    a["depth"] = depth[ev]

    # level sizes: a level keeps its size until the event touches it or a background refresh redraws it,
    # per instrument; a redraw reflects the latent flow at that moment (bid +KAPPA*z, ask -KAPPA*z)
    side_noise = {
        "bid": _ar1(rng, n, 1.0 - 1.0 / SIDE_NOISE_PERSIST, SIDE_NOISE_STD),
        "ask": _ar1(rng, n, 1.0 - 1.0 / SIDE_NOISE_PERSIST, SIDE_NOISE_STD),
    }
    base_size = np.where(is_spread, 4.0, model.level_size)
    order_size = model.order_size * np.exp(0.3 * rng.standard_normal(n))
    inst_events = [np.flatnonzero(q.inst == c) for c in range(3)]
    for i in range(LEVELS):
        for name, sign, hole in (("bid", 1.0, first_hole_b), ("ask", -1.0, first_hole_a)):
            ln = sign * KAPPA * zc + side_noise[name] + LEVEL_NOISE_STD * rng.standard_normal(n)
            fresh_sz = np.maximum(1, np.rint(base_size * (1.0 + 0.25 * i) * np.exp(ln))).astype(np.uint32)
            fresh_ct = np.clip(np.rint(fresh_sz / order_size), 1, fresh_sz).astype(np.uint32)
            touched = ((depth == i) & (is_bid == (name == "bid"))) | (rng.random(n) < P_REFRESH)
            src = np.empty(n, np.int64)
            for idx in inst_events:
                if len(idx):
                    touched_c = touched[idx]
                    touched_c[0] = True
                    src[idx] = idx[np.maximum.accumulate(np.where(touched_c, np.arange(len(idx)), 0))]
            sz, ct = fresh_sz[src], fresh_ct[src]
            empty = i >= hole
            sz[empty] = 0
            ct[empty] = 0
            px = np.where(empty, _UNDEF, (bid0 - i if name == "bid" else ask0 + i) * tick_fp)
            a[f"{name}_px_{i:02d}"] = px[ev]
            a[f"{name}_sz_{i:02d}"] = sz[ev]
            a[f"{name}_ct_{i:02d}"] = ct[ev]
    return a


def _build_bars(mbp: np.ndarray) -> np.ndarray:
    """OHLCV-1m from the T records, per (minute of ts_recv, instrument); minutes without trades get no bar."""
    tr = mbp[mbp["action"] == b"T"]
    minute = (tr["ts_recv"] // _NS_MIN) * _NS_MIN
    iid = tr["instrument_id"]
    order = np.lexsort((np.arange(len(tr)), iid, minute))
    minute, iid, px, sz = minute[order], iid[order], tr["price"][order], tr["size"][order].astype(np.uint64)
    new = np.ones(len(tr), bool)
    new[1:] = (minute[1:] != minute[:-1]) | (iid[1:] != iid[:-1])
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], len(tr)) - 1
    bars = np.zeros(len(starts), _OHLCV_DT)
    bars["length"] = _OHLCV_DT.itemsize // 4
    bars["rtype"] = dbn.RType.OHLCV_1M.value
    bars["publisher_id"] = 1
    bars["instrument_id"] = iid[starts]
    bars["ts_event"] = minute[starts]
    bars["open"] = px[starts]
    bars["close"] = px[ends]
    bars["high"] = np.maximum.reduceat(px, starts)
    bars["low"] = np.minimum.reduceat(px, starts)
    bars["volume"] = np.add.reduceat(sz, starts)
    return bars


_TRADE_DT = np.dtype(
    [("ts_recv", "<u8"), ("instrument_id", "<u4"), ("price", "<i8"), ("size", "<u4"), ("action", "S1"), ("flags", "u1")]
)


def _trades(q: _Quarter, rng: np.random.Generator) -> np.ndarray:
    """Only the T records of a run, drawn as `_build_records` draws them (trade share, aggressor side from the
    latent flow, size from |z|, price at the touch), for `_build_bars` and the bar oracle: 24 B a trade instead of
    368 B a record and 20 level draws an event, which is what makes 63 sessions of bars a quarter cheap."""
    model = _MODELS[q.prod.symbol]
    is_trade = rng.random(len(q.t)) < P_TRADE
    is_trade[q.spread_ev[0]] = True  # every file has at least one spread trade
    ev = np.flatnonzero(is_trade)
    inst = q.inst[ev]
    is_spread = inst == 2
    zc = np.where(is_spread, 0.0, q.z[ev])
    buy = rng.random(len(ev)) < expit(GAMMA * zc)
    size = 1 + rng.poisson(np.where(is_spread, 1.0, model.trade_size) * np.exp(ETA * np.abs(zc)))
    bid0 = np.where(is_spread, -model.carry_ticks, q.mid[ev] + np.array([0, model.carry_ticks, 0])[inst])
    ask0 = bid0 + 1 + (rng.random(len(ev)) < P_WIDE)
    out = _zeros(len(ev), _TRADE_DT)
    out["ts_recv"] = q.t[ev]
    out["instrument_id"] = q.ids[inst]
    out["price"] = np.where(buy, ask0, bid0) * int(round(q.prod.tick_size * dbn.FIXED_PRICE_SCALE))
    out["size"] = size
    out["action"] = b"T"
    return out


# --- oracle ------------------------------------------------------------------------------------------------
_Z_GRID = np.linspace(-6.0, 6.0, 481)


@functools.lru_cache(maxsize=64)
def _prob_up_table(h: int, given_a_move: bool = False, market: _Market = _Market()) -> np.ndarray:
    """P(sum of the next h mid steps > 0 | z now) on _Z_GRID, Gaussian approximation; `given_a_move`: the same,
    given that the sum is not 0 (the bar labels' definition: a zero move has no direction).

    Future latent z[t+k] | z[t] ~ N(PHI^k z, 1 - PHI^2k); the expected step Q*(2*sigmoid(BETA*z)-1) is
    averaged over that Gaussian with the probit approximation. The variance adds the step noise
    (Q + q_noise - E[step]^2) and the latent uncertainty of the drift (local slope^2 x Var(sum of future z)); with
    an impact, the displacement's expected fade and its shocks (shared with the drift's); beta, the persistence,
    q_noise and the impact are the quarter's (`market`)."""
    beta, phi = market.beta, market.phi
    sigma = float(np.sqrt(1.0 - phi**2))
    k = np.arange(1, h + 1, dtype=np.float64)
    decay = phi**k
    atten = 1.0 / np.sqrt(1.0 + np.pi * beta**2 * (1.0 - decay**2) / 8.0)
    x = beta * _Z_GRID[:, None] * decay[None, :] * atten[None, :]
    s = expit(x)
    drift = Q_MOVE * (2.0 * s - 1.0)
    mean = drift.sum(axis=1)
    var_step = (Q_MOVE + market.q_noise - drift**2).sum(axis=1)
    slope = (2.0 * Q_MOVE * beta * atten[None, :] * s * (1.0 - s)).mean(axis=1)
    w = (1.0 - phi ** (h - k + 1)) / (1.0 - phi)  # weight of the i-th future shock in the sum of future z
    var_latent = slope**2 * (sigma**2 * float((w**2).sum()))
    if market.impact:  # the displacement's change a * (z[t+h] - z[t]) shares the future shocks with the drift
        a = market.impact
        mean = mean + a * _Z_GRID * (phi**h - 1.0)
        coef = slope[:, None] * w[None, :] + a * phi ** (h - k)[None, :]
        var_latent = sigma**2 * (coef**2).sum(axis=1) + 1.0 / 6.0  # + two roundings to whole ticks
    sd = np.sqrt(var_step + var_latent)
    up = ndtr((mean - 0.5) / sd)  # continuity correction: "strictly higher" means sum >= 1
    if not given_a_move:
        return up
    down = ndtr((-mean - 0.5) / sd)  # sum <= -1
    return up / (up + down)


def _oracle_prob(
    z: np.ndarray, orient: np.ndarray, horizons: Sequence[int], given_a_move: bool = False, market: _Market = _Market()
) -> np.ndarray:
    """[len(z), len(horizons)] float32 probabilities of an up-move, read off the tabulated z grid."""
    out = np.empty((len(z), len(horizons)), np.float32)
    zz = np.where(orient > 0, z, -z)  # a mirrored walk moves against the drift: P(S < 0 | z) = P(S > 0 | -z)
    for j, h in enumerate(horizons):
        out[:, j] = np.interp(zz, _Z_GRID, _prob_up_table(int(h), given_a_move, market))
    return out


def _oracle(q: _Quarter, mbp: np.ndarray) -> dict[str, np.ndarray]:
    """The oracle npz arrays: per F_LAST record, and per bar (minute x instrument) from the latent state at its
    close trade, the same information set as the bar's close; bar probabilities are given a move (the bar labels'
    definition)."""
    book_ts = mbp["ts_recv"][(mbp["flags"] & dbn.F_LAST) != 0].astype(np.int64)
    book_prob = _oracle_prob(q.z, q.orient, BOOK_HORIZONS, market=q.market)  # one F_LAST record per event, in event order
    trades = mbp[mbp["action"] == b"T"]  # a T record carries its event's time: q.t[event]
    minute = trades["ts_recv"].astype(np.int64) // _NS_MIN * _NS_MIN
    iid = trades["instrument_id"]
    order = np.lexsort((trades["ts_recv"], iid, minute))
    minute, iid, close_ts = minute[order], iid[order], trades["ts_recv"][order].astype(np.int64)
    last = np.r_[(minute[1:] != minute[:-1]) | (iid[1:] != iid[:-1]), True]  # each bar's close trade
    close_ev = np.searchsorted(q.t, close_ts[last])
    rate_per_min = len(q.t) / ((q.end_ns - q.start_ns) / _NS_MIN)  # file average (incl. overnight)
    bar_events = [max(1, int(round(m * rate_per_min))) for m in BAR_HORIZONS_MIN]
    bar_prob = _oracle_prob(q.z[close_ev], q.orient[close_ev], bar_events, given_a_move=True, market=q.market)
    return {
        "book_ts": book_ts,
        "book_prob": book_prob,
        "bar_ts": minute[last],
        "bar_instrument_id": iid[last].astype(np.int64),
        "bar_prob": bar_prob,
        "book_horizons": np.asarray(BOOK_HORIZONS, np.int64),
        "bar_horizons": np.asarray(BAR_HORIZONS_MIN, np.int64),
    }


# --- writing -----------------------------------------------------------------------------------------------
def _metadata(q: _Quarter, schema: dbn.Schema) -> dbn.Metadata:
    start_date = dt.datetime.fromtimestamp(q.start_ns / 1e9, dt.UTC).date()
    end_date = dt.datetime.fromtimestamp((q.end_ns - 1) / 1e9, dt.UTC).date() + dt.timedelta(days=1)
    mappings = [
        _Mapping(raw, [_Interval(start_date, end_date, str(int(iid)))])
        for raw, iid in zip((q.front, q.back, q.spread), q.ids, strict=True)
    ]
    return dbn.Metadata(
        dataset="GLBX.MDP3",
        start=q.start_ns,
        end=q.end_ns,
        stype_in=dbn.SType.PARENT,
        stype_out=dbn.SType.INSTRUMENT_ID,
        schema=schema,
        symbols=[q.prod.symbol],
        mappings=mappings,
    )


def _tmp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _write_dbn(path: Path, meta: dbn.Metadata, records: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_path(path)
    try:
        cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        with open(tmp, "wb") as fh, cctx.stream_writer(fh, closefd=False) as zw:
            zw.write(bytes(meta))
            raw = records.view(np.uint8)
            chunk = 1 << 26
            for i in range(0, len(raw), chunk):
                zw.write(raw[i : i + chunk])
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """np.savez_compressed stamps the current time into the zip; a fixed date keeps the bytes reproducible."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_path(path)
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for name, arr in arrays.items():
                info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                with zf.open(info, "w", force_zip64=True) as fh:
                    np.lib.format.write_array(fh, np.ascontiguousarray(arr), allow_pickle=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _write_quarter(
    out: Path, prod: Product, year: int, qn: int, sc: DemoScale, seed: int, market: _Market = _Market()
) -> list[Path]:
    q, rng = _simulate(prod, year, qn, sc, seed, market)
    mbp = _build_records(q, rng)
    stem = f"{prod.symbol}_{year}-Q{qn}"
    base = out / prod.symbol
    mbp_path = base / "mbp-10" / f"{stem}.dbn.zst"
    bar_path = base / "ohlcv-1m" / f"{stem}.dbn.zst"
    _write_dbn(mbp_path, _metadata(q, dbn.Schema.MBP_10), mbp)
    _write_dbn(bar_path, _metadata(q, dbn.Schema.OHLCV_1M), _build_bars(mbp))
    _write_npz(base / "oracle" / f"{stem}.oracle.npz", _oracle(q, mbp))
    return [mbp_path, bar_path]


def _around(center: int, n: int, total: int) -> int:
    """First index of the n consecutive items of `total` centred on index `center`."""
    return min(max(0, center - (n - 1) // 2), total - n)


def _write_real_quarter(
    out: Path, prod: Product, year: int, qn: int, sc: DemoScale, seed: int, market: _Market = _Market()
) -> list[Path]:
    """Scale `real`: bars from a run over every session of the calendar quarter (trades only), the book from a
    second run at book density over `sc.book_sessions` sessions around the roll, starting at the first run's mid.
    Each file's oracle comes from its own run (module docstring, "Scale real")."""
    names, ids = _contracts(prod, year, qn)
    days = _quarter_sessions(year, qn)
    roll_idx = bisect.bisect_left(days, _roll_date(year, 3 * qn))
    if sc.sessions_per_quarter < len(days):  # a shorter file of the same density, around the roll
        lo = _around(roll_idx, sc.sessions_per_quarter, len(days))
        days, roll_idx = days[lo : lo + sc.sessions_per_quarter], roll_idx - lo
    q = _run(prod, names, ids, days, roll_idx, sc.events_per_session, rng := _rng(seed, prod, year, qn), market=market)
    trades = _trades(q, rng)
    stem = f"{prod.symbol}_{year}-Q{qn}"
    base = out / prod.symbol
    bar_path = base / "ohlcv-1m" / f"{stem}.dbn.zst"
    _write_dbn(bar_path, _metadata(q, dbn.Schema.OHLCV_1M), _build_bars(trades))
    arrays = _oracle(q, trades)  # its bar_* entries; the book_* ones come from the book's own run below
    del trades
    arrays["book_ts"] = np.zeros(0, np.int64)
    arrays["book_prob"] = np.zeros((0, len(BOOK_HORIZONS)), np.float32)
    written = [bar_path]
    n_book = min(sc.book_sessions or 0, len(days))
    if n_book:
        lo = _around(roll_idx, n_book, len(days))
        first = int(np.searchsorted(q.t, _ct_ns(days[lo] - dt.timedelta(days=1), 17, 0)))
        start_ticks = int(q.mid[min(first, len(q.t) - 1)])
        book_rng = np.random.default_rng([seed, zlib.crc32(prod.symbol.encode()), year, qn, 1])
        qb = _run(
            prod, names, ids, days[lo : lo + n_book], roll_idx - lo, sc.book_events_per_session, book_rng, start_ticks, market
        )
        del q
        mbp = _build_records(qb, book_rng)
        mbp_path = base / "mbp-10" / f"{stem}.dbn.zst"
        _write_dbn(mbp_path, _metadata(qb, dbn.Schema.MBP_10), mbp)
        arrays.update((k, v) for k, v in _oracle(qb, mbp).items() if k.startswith("book_"))
        written.append(mbp_path)
    _write_npz(base / "oracle" / f"{stem}.oracle.npz", arrays)
    return written
