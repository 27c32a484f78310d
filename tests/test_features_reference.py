"""Features and labels of generated DBN files against a slow, independent per-record reference.

The reference walks `DBNStore` records one by one in plain Python (its own front-month choice,
trade-flow accumulation, roll stitching, rolling windows and label search) and must agree with
the vectorised sidecar build.
"""

from __future__ import annotations

import datetime as dt
import math
from statistics import mean, stdev
from zoneinfo import ZoneInfo

import databento as db
import numpy as np
import pytest

from alpha_core.data.products import parse_contract
from alpha_core.data.sidecar import ensure_sidecar

CT = ZoneInfo("America/Chicago")
UNDEF = 2**63 - 1


def session_of(ts_ns: int) -> dt.date:
    return (dt.datetime.fromtimestamp(ts_ns / 1e9, tz=CT) + dt.timedelta(hours=7)).date()


def outright_symbols(store, root: str) -> dict[int, str]:
    out = {}
    for raw, intervals in store.metadata.mappings.items():
        if "-" not in raw and raw.startswith(root):
            for iv in intervals:
                out[int(iv["symbol"])] = raw
    return out


def front_by_session(activity: dict[dt.date, dict[int, float]], symbols: dict[int, str], year: int) -> dict:
    expiry = {i: parse_contract(s).expiry_key(year) for i, s in symbols.items()}
    front, current, prev = {}, None, None
    for session in sorted(activity):
        act = activity[session]
        wanted = min(act, key=expiry.get) if prev is None else max(prev, key=lambda i: (prev[i], -expiry[i]))
        if current is not None and expiry[wanted] < expiry[current]:
            wanted = current
        later = [i for i in act if expiry[i] >= expiry[wanted]]
        front[session] = current = min(later, key=expiry.get) if later else wanted
        prev = act
    return front


def reference_book(path, tick: float, horizons, cost):
    store = db.DBNStore.from_file(path)
    symbols = outright_symbols(store, "ES")
    records = [r for r in store if r.instrument_id in symbols]
    kept = [r for r in records if (int(r.flags) & 128) or r.action.value == "T"]
    activity: dict = {}
    for r in kept:
        s = activity.setdefault(session_of(r.ts_recv), {})
        s[r.instrument_id] = s.get(r.instrument_id, 0) + 1
    front = front_by_session(activity, symbols, 2024)

    rows, buy, sell, trade_ts = [], 0.0, 0.0, -1
    prev_ts, prev_iid, prev_mid2, offset = None, None, None, 0
    for r in kept:
        if front[session_of(r.ts_recv)] != r.instrument_id:
            continue
        if r.action.value == "T":
            trade_ts = r.ts_event
            if r.side.value == "B":
                buy += r.size
            elif r.side.value == "A":
                sell += r.size
        if not int(r.flags) & 128:
            continue
        lv = r.levels
        if lv[0].bid_px == UNDEF or lv[0].ask_px == UNDEF or lv[0].ask_px <= lv[0].bid_px:
            continue
        mid2 = lv[0].bid_px + lv[0].ask_px
        if prev_iid is not None and r.instrument_id != prev_iid:
            offset = prev_mid2 - mid2
        adj = mid2 + offset
        bsz = [lv[i].bid_sz if lv[i].bid_px != UNDEF else 0 for i in range(10)]
        asz = [lv[i].ask_sz if lv[i].ask_px != UNDEF else 0 for i in range(10)]
        bct = [lv[i].bid_ct if lv[i].bid_px != UNDEF else 0 for i in range(10)]
        act = [lv[i].ask_ct if lv[i].ask_px != UNDEF else 0 for i in range(10)]
        bid, ask = lv[0].bid_px / 1e9, lv[0].ask_px / 1e9
        micro = (bid * asz[0] + ask * bsz[0]) / (bsz[0] + asz[0]) if bsz[0] + asz[0] else (bid + ask) / 2
        imb = []
        for k in range(1, 11):
            b, a = sum(bsz[:k]), sum(asz[:k])
            imb.append((b - a) / (b + a) if b + a else 0.0)
        depth, count = sum(bsz) + sum(asz), sum(bct) + sum(act)
        dt_s = 0.0 if prev_ts is None else (r.ts_recv - prev_ts) / 1e9
        feats = [
            (ask - bid) / tick,
            (micro - (bid + ask) / 2) / tick,
            0.0 if prev_mid2 is None else (adj - prev_mid2) / 2e9 / tick,
            *imb,
            *[x / depth for x in bsz],
            *[x / depth for x in asz],
            *[x / count for x in bct],
            *[x / count for x in act],
            math.log1p(depth),
            (buy - sell) / (buy + sell) if buy + sell else 0.0,
            math.log1p(buy + sell),
            math.log1p(dt_s * 1e3),
        ]
        rows.append((r.ts_recv, adj, feats, trade_ts))
        buy = sell = 0.0
        prev_ts, prev_iid, prev_mid2 = r.ts_recv, r.instrument_id, adj
    n = len(rows)
    labels = np.full((n, len(horizons)), np.nan)
    long_ = np.full((n, len(horizons)), np.nan)
    for t in range(n):
        for j, h in enumerate(horizons):
            if t + h < n:
                move = rows[t + h][1] - rows[t][1]
                labels[t, j] = 1.0 if move > 0 else 0.0
                long_[t, j] = move / 2e9 - cost
    return rows, labels, long_


def test_book_features_and_labels_match_reference(tiny_data, tmp_path):
    path = sorted((tiny_data / "ES.FUT" / "mbp-10").glob("*.dbn.zst"))[0]
    sc, _ = ensure_sidecar(path, tmp_path)
    rows, labels, long_ = reference_book(path, 0.25, sc.meta.horizons, sc.meta.outcome_label_cost)
    assert sc.rows == len(rows)
    assert sc.meta.roll_dates, "the tiny file should contain a roll"
    np.testing.assert_array_equal(sc.ts, [r[0] for r in rows])
    np.testing.assert_array_equal(sc.trade_ts, [r[3] for r in rows])
    np.testing.assert_allclose(sc.price, [r[1] / 2e9 for r in rows], rtol=0, atol=1e-9)
    # stored as float16: within its rounding (2^-11 relative) of the reference
    np.testing.assert_allclose(sc.features, np.array([r[2] for r in rows]), rtol=5e-4, atol=1e-5)
    np.testing.assert_array_equal(np.isnan(sc.labels), np.isnan(labels))
    np.testing.assert_array_equal(np.nan_to_num(sc.labels, nan=-1), np.nan_to_num(labels, nan=-1))
    np.testing.assert_allclose(sc.outcome_long, long_, atol=1e-5)
    np.testing.assert_allclose(sc.outcome_short, -long_ - 2 * sc.meta.outcome_label_cost, atol=1e-5)


def reference_bars(path, horizons, cost):
    store = db.DBNStore.from_file(path)
    symbols = outright_symbols(store, "ES")
    bars = [b for b in store if b.instrument_id in symbols]
    activity: dict = {}
    for b in bars:
        s = activity.setdefault(session_of(b.ts_event), {})
        s[b.instrument_id] = s.get(b.instrument_id, 0) + b.volume
    front = front_by_session(activity, symbols, 2024)
    bars = [b for b in bars if front[session_of(b.ts_event)] == b.instrument_id]

    rets, logv, closes, offset = [], [], [], 0
    feats = []
    for i, b in enumerate(bars):
        same = i > 0 and bars[i - 1].instrument_id == b.instrument_id
        if i > 0 and not same:
            offset = closes[-1] - b.close
        closes.append(b.close + offset)
        r = math.log(b.close / bars[i - 1].close) if same else 0.0
        rets.append(r)
        logv.append(math.log1p(b.volume))
        window_v = logv[max(0, i - 59) : i + 1]
        vstd = stdev(window_v) if len(window_v) >= 2 else 0.0
        local = dt.datetime.fromtimestamp(b.ts_event / 1e9, tz=CT)
        minute = local.hour * 60 + local.minute
        gap = 0 if i == 0 else (b.ts_event - bars[i - 1].ts_event) // 60_000_000_000 - 1
        first_bar = i == 0 or session_of(b.ts_event) != session_of(bars[i - 1].ts_event)
        feats.append(
            [
                r,
                math.log(b.high / b.low),
                math.log(b.close / b.open),
                sum(rets[max(0, i - 4) : i + 1]),
                sum(rets[max(0, i - 14) : i + 1]),
                math.sqrt(sum(x * x for x in rets[max(0, i - 29) : i + 1])),
                (logv[-1] - mean(window_v)) / (vstd + 1e-3),
                math.log1p(gap),
                math.sin(2 * math.pi * minute / 1440),
                math.cos(2 * math.pi * minute / 1440),
                1.0 if 8 * 60 + 30 <= minute < 15 * 60 else 0.0,
                ((minute - 17 * 60) % 1440) / 1380,
                1.0 if first_bar else 0.0,
            ]
        )
    n, last_ts = len(bars), bars[-1].ts_event
    labels = np.full((n, len(horizons)), np.nan)
    for t in range(n):
        for j, h in enumerate(horizons):
            target = bars[t].ts_event + h * 60_000_000_000
            if target > last_ts:
                continue
            k = max(i for i in range(t, n) if bars[i].ts_event <= target)
            if k > t and closes[k] != closes[t]:  # no bar after t up to t + h, or no move: no direction
                labels[t, j] = 1.0 if closes[k] > closes[t] else 0.0
    return bars, closes, np.array(feats), labels


@pytest.mark.parametrize("quarter", [0, 3])
def test_bar_features_and_labels_match_reference(tiny_data, tmp_path, quarter):
    path = sorted((tiny_data / "ES.FUT" / "ohlcv-1m").glob("*.dbn.zst"))[quarter]
    sc, _ = ensure_sidecar(path, tmp_path)
    bars, closes, feats, labels = reference_bars(path, sc.meta.horizons, sc.meta.outcome_label_cost)
    assert sc.rows == len(bars)
    np.testing.assert_array_equal(sc.ts, [b.ts_event for b in bars])
    np.testing.assert_array_equal(sc.trade_ts, [b.ts_event + 60_000_000_000 - 1 for b in bars])
    np.testing.assert_allclose(sc.price, np.array(closes) / 1e9, atol=1e-9)
    np.testing.assert_allclose(sc.features, feats, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(np.nan_to_num(sc.labels, nan=-1), np.nan_to_num(labels, nan=-1))
