"""The demo data generator: real DBN files to decode, with a roll, spreads and a learnable signal."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path

import databento as db
import databento_dbn as dbn
import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from alpha_core.data.demo import BAR_HORIZONS_MIN, BOOK_HORIZONS, SCALES, generate_demo_data
from alpha_core.data.products import PRODUCTS, parse_contract
from alpha_core.errors import PlanError

SYMBOLS = ("ES.FUT", "ZN.FUT", "6E.FUT")
QUARTERS = ("2024-Q1", "2024-Q2", "2024-Q3", "2024-Q4", "2025-Q1")
SCHEMAS = {"mbp-10": dbn.Schema.MBP_10, "ohlcv-1m": dbn.Schema.OHLCV_1M}


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, list[Path]]:
    out = tmp_path_factory.mktemp("demo")
    return out, generate_demo_data(out, scale="tiny", symbols=SYMBOLS)


def _load(path: Path) -> tuple[db.DBNStore, np.ndarray]:
    store = db.DBNStore.from_file(path)
    return store, store.to_ndarray()


def _mbp_files(paths: list[Path]) -> list[Path]:
    return [p for p in paths if p.parent.name == "mbp-10"]


def _tick(path: Path) -> int:
    """The product's tick in DBN fixed-point units."""
    return round(PRODUCTS[path.parent.parent.name].tick_size * dbn.FIXED_PRICE_SCALE)


def _outright_ids(store: db.DBNStore) -> dict[int, str]:
    """instrument_id -> raw symbol of the outrights (spreads dropped), in expiry order."""
    ids = {int(iv["symbol"]): raw for raw, ivs in store.metadata.mappings.items() for iv in ivs if "-" not in raw}
    return dict(sorted(ids.items(), key=lambda kv: parse_contract(kv[1]).expiry_key(2024)))


def test_layout_and_return_value(demo):
    out, paths = demo
    expected = sorted(out / sym / schema / f"{sym}_{q}.dbn.zst" for sym in SYMBOLS for schema in SCHEMAS for q in QUARTERS)
    assert paths == expected
    assert len(QUARTERS) == SCALES["tiny"].quarters
    for sym in SYMBOLS:
        assert sorted(p.name for p in (out / sym / "oracle").iterdir()) == [f"{sym}_{q}.oracle.npz" for q in QUARTERS]
    assert not [p for p in out.rglob("*") if p.name.startswith(".")]  # no temporary files left behind


def test_files_decode_with_parent_metadata(demo):
    _, paths = demo
    for path in paths:
        store, arr = _load(path)
        meta = store.metadata
        assert meta.schema == SCHEMAS[path.parent.name]
        assert arr.dtype.itemsize == (368 if meta.schema == dbn.Schema.MBP_10 else 56)
        assert len(arr) > 100
        sym = path.parent.parent.name
        assert meta.dataset == "GLBX.MDP3"
        assert meta.stype_in == dbn.SType.PARENT and meta.stype_out == dbn.SType.INSTRUMENT_ID
        assert meta.symbols == [sym]
        assert meta.start <= int(arr["ts_recv" if "ts_recv" in arr.dtype.names else "ts_event"].min())
        assert int(arr["ts_event"].max()) < meta.end

        raws = sorted(meta.mappings)
        outrights = [r for r in raws if "-" not in r]
        spreads = [r for r in raws if "-" in r]
        assert len(outrights) == 2 and len(spreads) == 1
        assert all(parse_contract(r).root == PRODUCTS[sym].root for r in outrights)
        front, back = _outright_ids(store).values()
        assert spreads == [f"{front}-{back}"]
        year, qn = path.name.split("_")[1].split(".")[0].split("-Q")
        assert front == f"{PRODUCTS[sym].root}{'HMUZ'[int(qn) - 1]}{year[-1]}"

        first_day = dt.datetime.fromtimestamp(meta.start / 1e9, dt.UTC).date()
        last_day = dt.datetime.fromtimestamp((meta.end - 1) / 1e9, dt.UTC).date()
        mapped = set()
        for ivs in meta.mappings.values():
            assert len(ivs) == 1
            assert ivs[0]["start_date"] <= first_day and ivs[0]["end_date"] > last_day  # end exclusive
            mapped.add(int(ivs[0]["symbol"]))
        assert set(np.unique(arr["instrument_id"]).tolist()) == mapped  # spread records included


def test_prices_on_the_tick_grid(demo):
    _, paths = demo
    for path in paths:
        store, arr = _load(path)
        tick = _tick(path)
        if store.metadata.schema == dbn.Schema.MBP_10:
            fields = ["price"] + [f"{s}_px_{i:02d}" for s in ("bid", "ask") for i in range(10)]
        else:
            fields = ["open", "high", "low", "close"]
        for f in fields:
            px = arr[f][arr[f] != dbn.UNDEF_PRICE]
            assert np.all(px % tick == 0), f"{path.name}: {f} off the tick grid"
        if store.metadata.schema == dbn.Schema.MBP_10:
            last = arr[(arr["flags"] & dbn.F_LAST) != 0]
            assert np.all(last["ask_px_00"] - last["bid_px_00"] >= tick)


def test_records_are_well_formed(demo):
    _, paths = demo
    for path in _mbp_files(paths):
        _, a = _load(path)
        assert np.all(np.diff(a["ts_recv"].astype(np.int64)) > 0)
        assert np.all(np.diff(a["sequence"].astype(np.int64)) > 0)
        assert np.all(a["ts_event"] < a["ts_recv"]) and np.all(a["publisher_id"] == 1)
        assert set(np.unique(a["action"]).tolist()) == {b"A", b"C", b"M", b"T"}
        is_t = np.flatnonzero(a["action"] == b"T")
        t, nxt = a[is_t], a[is_t + 1]  # a trade is followed by its book update
        assert np.all(t["flags"] == 0) and np.all(nxt["flags"] & dbn.F_LAST)
        assert np.all(nxt["instrument_id"] == t["instrument_id"]) and np.all(nxt["action"] != b"T")
        assert np.all(np.where(t["side"] == b"B", t["ask_px_00"], t["bid_px_00"]) == t["price"])
        assert np.all((t["size"] > 0) & np.isin(t["side"], [b"A", b"B"]))
        assert np.all(a["flags"][a["action"] != b"T"] == dbn.F_LAST)


def test_roll_two_outrights_trade_and_the_next_one_takes_over(demo):
    _, paths = demo
    for path in _mbp_files(paths):
        store, a = _load(path)
        front, back = _outright_ids(store)
        trades = a[a["action"] == b"T"]
        assert (trades["instrument_id"] == front).sum() > 20 and (trades["instrument_id"] == back).sum() > 20
        outr = a[np.isin(a["instrument_id"], [front, back])]
        fifth = len(outr) // 5
        early, late = outr["instrument_id"][:fifth], outr["instrument_id"][-fifth:]
        assert (early == front).mean() > 0.7, path.name
        assert (late == back).mean() > 0.7, path.name
        # the spread trades too, near front minus back (the carry, measured from the two books)
        (spread,) = [r for r in store.metadata.mappings if "-" in r]
        spread_trades = trades[trades["instrument_id"] == int(store.metadata.mappings[spread][0]["symbol"])]
        assert len(spread_trades) >= 1
        book = a[(a["flags"] & dbn.F_LAST) != 0]
        is_f, is_b = book["instrument_id"] == front, book["instrument_id"] == back
        prev_b = np.searchsorted(book["ts_recv"][is_b], book["ts_recv"][is_f]) - 1  # latest back quote
        ok = prev_b >= 0
        carry = np.median(book["bid_px_00"][is_b][prev_b[ok]].astype(np.int64) - book["bid_px_00"][is_f][ok])
        assert carry != 0
        assert np.all(np.abs(spread_trades["price"] + carry) <= 2 * _tick(path))


def test_some_deep_levels_are_empty(demo):
    _, paths = demo
    holes = snapshots = 0
    for path in _mbp_files(paths):
        _, a = _load(path)
        last = a[(a["flags"] & dbn.F_LAST) != 0]
        for side in ("bid", "ask"):
            assert np.all(last[f"{side}_px_00"] != dbn.UNDEF_PRICE)
            for i in range(10):
                empty = last[f"{side}_px_{i:02d}"] == dbn.UNDEF_PRICE
                assert np.all(last[f"{side}_sz_{i:02d}"][empty] == 0) and np.all(last[f"{side}_ct_{i:02d}"][empty] == 0)
                assert np.all(last[f"{side}_sz_{i:02d}"][~empty] > 0) and np.all(last[f"{side}_ct_{i:02d}"][~empty] >= 1)
        any_hole = (last["bid_px_09"] == dbn.UNDEF_PRICE) | (last["ask_px_09"] == dbn.UNDEF_PRICE)
        holes += int(any_hole.sum())
        snapshots += len(last)
    assert 0.002 < holes / snapshots < 0.05


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    def files(out: Path, seed: int) -> dict[str, bytes]:
        generate_demo_data(out, scale="tiny", seed=seed, symbols=["NQ.FUT"], quarters=1)
        return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    a, b, c = files(tmp_path / "a", 7), files(tmp_path / "b", 7), files(tmp_path / "c", 8)
    assert len(a) == 3 and a == b
    assert a.keys() == c.keys() and all(a[k] != c[k] for k in a)


def test_oracle_aligns_and_beats_chance(demo):
    out, paths = demo
    probs, labels = [], []
    for path in _mbp_files(paths):
        store, a = _load(path)
        sym = path.parent.parent.name
        orc = np.load(out / sym / "oracle" / path.name.replace(".dbn.zst", ".oracle.npz"))
        assert orc["book_horizons"].tolist() == list(BOOK_HORIZONS)
        assert orc["bar_horizons"].tolist() == list(BAR_HORIZONS_MIN)
        last = (a["flags"] & dbn.F_LAST) != 0
        np.testing.assert_array_equal(orc["book_ts"], a["ts_recv"][last].astype(np.int64))
        assert orc["book_prob"].dtype == np.float32 and orc["book_prob"].shape == (last.sum(), 3)
        assert np.all((orc["book_prob"] > 0) & (orc["book_prob"] < 1))
        trades = a[a["action"] == b"T"]  # one bar per (minute, instrument) with a trade, as the bar files hold
        bars = np.unique(
            np.stack(
                [
                    trades["ts_recv"].astype(np.int64) // 60_000_000_000 * 60_000_000_000,
                    trades["instrument_id"].astype(np.int64),
                ],
                axis=1,
            ),
            axis=0,
        )
        np.testing.assert_array_equal(np.stack([orc["bar_ts"], orc["bar_instrument_id"]], axis=1), bars)
        assert orc["bar_prob"].dtype == np.float32 and orc["bar_prob"].shape == (len(bars), 3)

        # realised up-moves of the mid of the dominant outright, 10 of its own snapshots ahead
        book = a[last]
        outrights = list(_outright_ids(store))
        dom = max(outrights, key=lambda iid: int((book["instrument_id"] == iid).sum()))
        rows = np.flatnonzero(book["instrument_id"] == dom)
        mid = book["bid_px_00"][rows].astype(np.float64) + book["ask_px_00"][rows]
        h = BOOK_HORIZONS[0]
        probs.append(orc["book_prob"][rows[:-h], 0])
        labels.append(mid[h:] > mid[:-h])
    auc = roc_auc_score(np.concatenate(labels), np.concatenate(probs))
    assert auc > 0.62, auc
    per_file = [roc_auc_score(y, p) for y, p in zip(labels, probs, strict=True)]
    assert min(per_file) > 0.55, per_file


def test_bars_match_the_trades(demo):
    _, paths = demo
    for path in [p for p in paths if p.parent.name == "ohlcv-1m"]:
        store, bars = _load(path)
        _, mbp = _load(path.parent.parent / "mbp-10" / path.name)
        assert np.all(bars["rtype"] == dbn.RType.OHLCV_1M.value)
        assert np.all(bars["low"] <= np.minimum(bars["open"], bars["close"]))
        assert np.all(bars["high"] >= np.maximum(bars["open"], bars["close"]))
        order = np.lexsort((bars["instrument_id"], bars["ts_event"]))  # sorted by ts_event, then instrument
        np.testing.assert_array_equal(order, np.arange(len(bars)))
        assert np.all(bars["ts_event"] % 60_000_000_000 == 0)

        t = mbp[mbp["action"] == b"T"]
        minute = t["ts_recv"] // 60_000_000_000 * 60_000_000_000
        groups = {}
        for m, iid, px, sz in zip(
            minute.tolist(), t["instrument_id"].tolist(), t["price"].tolist(), t["size"].tolist(), strict=True
        ):
            g = groups.setdefault((m, iid), [px, px, px, px, 0])
            g[1], g[2], g[3], g[4] = max(g[1], px), min(g[2], px), px, g[4] + sz
        assert len(groups) == len(bars)
        got = {
            (int(b["ts_event"]), int(b["instrument_id"])): [int(b[f]) for f in ("open", "high", "low", "close", "volume")]
            for b in bars
        }
        assert got == groups


def test_unknown_scale_or_symbol_is_a_plan_error(tmp_path):
    with pytest.raises(PlanError, match=r"'huge'.*tiny.*small.*full"):
        generate_demo_data(tmp_path, scale="huge")
    with pytest.raises(PlanError, match=r"'XX.FUT'.*ES\.FUT"):
        generate_demo_data(tmp_path, scale="tiny", symbols=["ES.FUT", "XX.FUT"])
    with pytest.raises(PlanError, match="quarters"):
        generate_demo_data(tmp_path, scale="tiny", symbols=["ES.FUT"], quarters=0)
    assert not list(tmp_path.iterdir())  # nothing written before the validation failed


# --- scale `real`: the original workload's shape ------------------------------------------------------------

_NS_MIN = 60_000_000_000


def _ct(ts_ns: np.ndarray) -> np.ndarray:
    """America/Chicago wall-clock datetimes of UTC nanosecond timestamps."""
    from zoneinfo import ZoneInfo

    ct = ZoneInfo("America/Chicago")
    return np.array([dt.datetime.fromtimestamp(t / 1e9, ct).replace(tzinfo=None) for t in ts_ns.tolist()])


def _session(ct_times: np.ndarray) -> np.ndarray:
    """CME session (trade date) of each Chicago time: the session opens at 17:00 CT the evening before."""
    return np.array([(t + dt.timedelta(hours=7)).date() for t in ct_times.tolist()])


@pytest.fixture(scope="module")
def real_bars(tmp_path_factory) -> Path:
    """Two quarters of ES.FUT bars at scale `real` (no book: the bar run alone)."""
    out = tmp_path_factory.mktemp("real")
    paths = generate_demo_data(out, scale="real", symbols=["ES.FUT"], quarters=2, book_sessions=0)
    assert [p.parent.name for p in paths] == ["ohlcv-1m", "ohlcv-1m"]
    return out


@pytest.mark.slow
def test_real_scale_bars_have_the_original_shape(real_bars):
    """~63 sessions a quarter of ~1,380 front-month bars, the daily break, weekends, the roll, quarters that tile."""
    files = sorted((real_bars / "ES.FUT" / "ohlcv-1m").glob("*.dbn.zst"))
    spans = []
    for path in files:
        store, bars = _load(path)
        front, back = _outright_ids(store)
        ts = bars["ts_event"].astype(np.int64)
        ct = _ct(ts)
        sessions = _session(ct)
        assert 62 <= len(set(sessions.tolist())) <= 65
        assert not any(t.hour == 16 for t in ct)  # the 16:00-17:00 CT break
        assert not any(t.weekday() == 5 or (t.weekday() == 6 and t.hour < 17) for t in ct)  # weekend
        # per session, the dominant outright trades in nearly every minute of the 23 hours
        outright = np.isin(bars["instrument_id"], [front, back])
        per_session = {}
        for s, iid in zip(sessions[outright].tolist(), bars["instrument_id"][outright].tolist(), strict=True):
            per_session.setdefault(s, {}).setdefault(iid, 0)
            per_session[s][iid] += 1
        dominant = np.array([max(c.values()) for c in per_session.values()])
        assert 1_340 <= np.median(dominant) <= 1_380, np.median(dominant)
        # the expiring contract leads until the roll in its expiry month, the next one after
        first_s, last_s = min(per_session), max(per_session)
        assert max(per_session[first_s], key=per_session[first_s].get) == front
        assert max(per_session[last_s], key=per_session[last_s].get) == back
        spans.append((int(ts.min()), int(ts.max())))
    assert spans[0][1] < spans[1][0]  # consecutive quarters do not overlap


def test_real_scale_bar_oracle_aligns_with_the_sidecar(real_bars, tmp_path):
    from alpha_core.data.oracle import oracle_auc, oracle_probabilities
    from alpha_core.data.sidecar import ensure_sidecar

    path = sorted((real_bars / "ES.FUT" / "ohlcv-1m").glob("*.dbn.zst"))[0]
    sc, _ = ensure_sidecar(path, tmp_path)
    assert 80_000 < len(sc.ts) < 95_000  # ~87,000 front-month bars a quarter
    assert oracle_probabilities(sc) is not None
    assert min(oracle_auc([sc])) > 0.6


@pytest.mark.slow
def test_real_scale_book_around_the_roll(tmp_path, monkeypatch):
    """The MBP-10 file holds the sessions around the roll, at the price of the bars, with its own exact oracle;
    same seed, same bytes."""
    import dataclasses

    from alpha_core.data import demo

    light = dataclasses.replace(SCALES["real"], book_events_per_session=20_000)  # the default's 1M: bench/
    monkeypatch.setitem(demo.SCALES, "real", light)
    paths = generate_demo_data(tmp_path / "a", scale="real", symbols=["ZN.FUT"], quarters=1)
    again = generate_demo_data(tmp_path / "b", scale="real", symbols=["ZN.FUT"], quarters=1)
    for p, q in zip(paths, again, strict=True):
        assert p.read_bytes() == q.read_bytes()
    mbp_path, bar_path = sorted(paths)
    store, a = _load(mbp_path)
    _, bars = _load(bar_path)
    last = (a["flags"] & dbn.F_LAST) != 0
    sessions = sorted(set(_session(_ct(a["ts_recv"][last][::500].astype(np.int64))).tolist()))
    assert sessions == [dt.date(2024, 3, 6), dt.date(2024, 3, 7), dt.date(2024, 3, 8)]  # the roll: Thu 7 March
    assert 3 * 20_000 * 1.2 < len(a) < 3 * 20_000 * 1.4  # one record an event, two a trade
    front, back = _outright_ids(store)
    trades = a[a["action"] == b"T"]
    assert (trades["instrument_id"] == front).sum() > 100 and (trades["instrument_id"] == back).sum() > 100
    # the book quotes where the bars trade at the same time
    bar_close = bars["close"][bars["instrument_id"] == front]
    bar_ts = bars["ts_event"][bars["instrument_id"] == front]
    book_front = a[last & (a["instrument_id"] == front)]
    at = np.searchsorted(bar_ts, book_front["ts_recv"][0])
    assert abs(int(book_front["bid_px_00"][0]) - int(bar_close[at])) < 0.01 * int(bar_close[at])
    orc = np.load(tmp_path / "a" / "ZN.FUT" / "oracle" / mbp_path.name.replace(".dbn.zst", ".oracle.npz"))
    np.testing.assert_array_equal(orc["book_ts"], a["ts_recv"][last].astype(np.int64))
    assert orc["book_prob"].shape == (int(last.sum()), 3)
    assert set(orc["bar_ts"].tolist()) == set(bars["ts_event"].astype(np.int64).tolist())  # every bar's minute
    assert orc["bar_prob"].shape == (len(orc["bar_ts"]), 3)


def test_book_sessions_is_checked(tmp_path):
    with pytest.raises(PlanError, match="book_sessions applies to scale 'real' only"):
        generate_demo_data(tmp_path, scale="tiny", symbols=["ES.FUT"], book_sessions=2)
    with pytest.raises(PlanError, match="book_sessions must be a non-negative integer"):
        generate_demo_data(tmp_path, scale="real", symbols=["ES.FUT"], book_sessions=-1)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_daily_weekly_monthly_and_one_file_layouts_of_the_demo_plan_the_same_folds(tmp_path, capsys):
    """`alpha demo-data --split` writes the same records per UTC day, week, month or in one file (as Databento's batch
    downloads split them): each layout plans the quarterly files' folds, without a gap; the monthly and the one-file
    layouts give each quarter the very rows and labels of its quarterly file."""
    from alpha_core.cli import main
    from alpha_core.data.predecode import predecode, quarter_sidecars

    plans, quarters = {}, {}
    for split in ("quarterly", "daily", "weekly", "monthly", "single"):
        assert (
            main(["demo-data", "--scale", "tiny", "--symbols", "ES", "--output-dir", str(tmp_path / split), "--split", split])
            == 0
        )
        capsys.readouterr()
        assert main(["folds", "--data-dir", str(tmp_path / split), "--symbol", "ES", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        plans[split] = {
            schema: (p["units"], p["gaps"], [[[u["name"] for u in f[s]] for s in ("train", "val", "test")] for f in p["folds"]])
            for schema, p in out.items()
        }
        files = {schema: p["n_files"] for schema, p in out.items()}
        assert files["ohlcv-1m"] == files["mbp-10"]
        assert 5 <= files["mbp-10"] <= 20 if split == "weekly" else files["mbp-10"] == {"daily": 20, "single": 1}.get(split, 5)
        sidecars = predecode(tmp_path / split / "ES.FUT", tmp_path / "pd" / split, "ES.FUT", "ohlcv-1m")
        quarters[split] = quarter_sidecars([i.sidecar for i in sidecars])
    assert plans["daily"] == plans["weekly"] == plans["monthly"] == plans["single"] == plans["quarterly"]
    assert plans["quarterly"]["mbp-10"][0] == ["2024-Q1", "2024-Q2", "2024-Q3", "2024-Q4", "2025-Q1"]
    for split in ("monthly", "single"):
        assert list(quarters[split]) == list(quarters["quarterly"])
        for name, want in quarters["quarterly"].items():
            got = quarters[split][name]
            assert got.meta.source.name == want.meta.source.name == name
            for array in ("ts", "labels", "outcome_long", "instrument_id"):
                np.testing.assert_array_equal(np.asarray(getattr(got, array)), np.asarray(getattr(want, array)), err_msg=array)
            # features are causal: in one file a quarter's first rows see the previous quarter (its last hour)
            warm = 0 if split == "monthly" else 60
            np.testing.assert_array_equal(np.asarray(got.features)[warm:], np.asarray(want.features)[warm:])
            # one file stitches every roll before the quarter into its prices: the same moves, from another level
            np.testing.assert_allclose(np.diff(got.price), np.diff(want.price), atol=1e-9)


def test_the_oracle_stays_exact_with_noise_and_another_persistence():
    """The oracle of a quarter with uninformed moves (`q_noise`) and its own persistence (a regime) is calibrated:
    per quintile of its probability, the share of mids strictly higher 10 events later is the probability's mean.
    An oracle that ignored the noise misses by ~0.1 (checked beside it)."""
    from alpha_core.data import demo

    prod = PRODUCTS["ES.FUT"]
    names, ids = demo._contracts(prod, 2024, 1)
    days, roll = demo._sessions_around(demo._roll_date(2024, 3), 5)
    market = demo._Market(beta=0.5, phi=1 - 1 / 100, q_noise=0.6)
    q = demo._run(prod, names, ids, days, roll, 60_000, np.random.default_rng(1), market=market)
    h = 10
    up = (q.mid[h:] > q.mid[:-h]).astype(float)

    def worst_quintile_gap(m) -> float:
        p = demo._oracle_prob(q.z, q.orient, [h], market=m)[:-h, 0].astype(float)
        edges = np.quantile(p, [0.2, 0.4, 0.6, 0.8])
        b = np.searchsorted(edges, p)
        return max(abs(p[b == k].mean() - up[b == k].mean()) for k in range(5))

    assert worst_quintile_gap(market) < 0.025
    assert worst_quintile_gap(demo._Market(beta=0.5, phi=1 - 1 / 100, q_noise=0.0)) > 0.06


def test_an_impact_shows_the_flow_in_past_prices_without_adding_to_what_it_predicts():
    """The realistic level's impact: the mid is displaced by `impact * z` at once and the drift carries it on, so
    the last few hundred events' move tells the flow (what a bar model reads), while the oracle stays calibrated
    and its edge (how far its probabilities spread) does not grow: what is predictable stays the residual drift."""
    from alpha_core.data import demo

    prod = PRODUCTS["ES.FUT"]
    names, ids = demo._contracts(prod, 2024, 1)
    days, roll = demo._sessions_around(demo._roll_date(2024, 3), 5)
    past = 300  # the flow's persistence in events
    seen, spread = {}, {}
    for impact in (0.0, 9.0):
        market = demo._market(demo.Difficulty("x", 0.055, impact=impact), 7, prod, 2024, 1)
        q = demo._run(prod, names, ids, days, roll, 60_000, np.random.default_rng(1), market=market)
        seen[impact] = np.corrcoef(q.mid[past:] - q.mid[:-past], q.z[past:])[0, 1]
        spread[impact] = demo._oracle_prob(q.z, q.orient, [215], market=market).std()  # five minutes
    assert seen[0.0] < 0.25 and seen[9.0] > 0.6, seen
    assert 0.4 < spread[9.0] / spread[0.0] < 1.0, spread  # the displacement's noise, and no edge of its own

    h = 10  # calibrated: per quintile, the share of mids higher h events later is the probability's mean
    up = (q.mid[h:] > q.mid[:-h]).astype(float)

    def worst_quintile_gap(m) -> float:
        p = demo._oracle_prob(q.z, q.orient, [h], market=m)[:-h, 0].astype(float)
        b = np.searchsorted(np.quantile(p, [0.2, 0.4, 0.6, 0.8]), p)
        return max(abs(p[b == k].mean() - up[b == k].mean()) for k in range(5))

    assert worst_quintile_gap(market) < 0.02
    assert worst_quintile_gap(dataclasses.replace(market, impact=0.0)) > 0.04  # an oracle blind to the impact


def test_realistic_difficulty_shifts_between_quarters_and_weakens_the_oracle(tmp_path):
    from alpha_core.data import demo
    from alpha_core.data.oracle import oracle_auc
    from alpha_core.data.sidecar import ensure_sidecar

    prod = PRODUCTS["ES.FUT"]
    planted = {demo._market(demo.DIFFICULTIES["planted"], 7, prod, 2024, qn) for qn in (1, 2, 3, 4)}
    assert planted == {demo._Market()}  # the default's quarters are the original model, draws unchanged
    real = [demo._market(demo.DIFFICULTIES["realistic"], 7, prod, 2024, qn) for qn in (1, 2, 3, 4)]
    assert len({m.beta for m in real}) == 4 and len({m.phi for m in real}) == 4
    assert all(m.impact > 0 and m.beta < 0.5 for m in real)

    aucs = {}
    for difficulty in ("planted", "realistic"):
        out = tmp_path / difficulty
        paths = generate_demo_data(out, scale="tiny", symbols=["ES.FUT"], quarters=1, difficulty=difficulty)
        bars = [ensure_sidecar(p, tmp_path / f"sc-{difficulty}")[0] for p in paths if p.parent.name == "ohlcv-1m"]
        aucs[difficulty] = oracle_auc(bars)
    assert aucs["planted"][0] > 0.65 and 0.5 < aucs["realistic"][0] < 0.58, aucs


def test_unknown_difficulty_is_a_plan_error(tmp_path):
    with pytest.raises(PlanError, match="unknown demo difficulty 'hard'; valid difficulties: planted, realistic"):
        generate_demo_data(tmp_path, scale="tiny", difficulty="hard")


def test_a_walk_that_goes_far_turns_back_inside_the_products_band():
    """A quarter's walk moves a ZN price by ~30 points, and the decoder refuses a price below 50 or a factor above 1.6
    between consecutive files: the walk is reflected into 0.8-1.25x the product's price at both bounds, and the
    oracle's orientation follows the mirror."""
    from alpha_core.data import demo

    prod = PRODUCTS["ZN.FUT"]
    low, high = demo._price_band(prod)
    assert prod.price_range[0] <= low * prod.tick_size and high / low < prod.max_file_move
    names, ids = demo._contracts(prod, 2024, 1)
    days, roll = demo._sessions_around(demo._roll_date(2024, 3), 5)
    for start in (low + 30, high - 30):  # next to a bound: the walk crosses it within the run
        q = demo._run(prod, names, ids, days, roll, 60_000, np.random.default_rng(3), start_ticks=start)
        assert (q.orient < 0).any() and low <= q.mid.min() and q.mid.max() <= high


def test_fold_mirrors_a_walk_at_both_bounds():
    from alpha_core.data import demo

    mid, orient = demo._fold(np.array([5, 10, 11, 13, 20, 21, 24, 4, 1, -2]), 5, 20)
    assert mid.tolist() == [5, 10, 11, 13, 20, 19, 16, 6, 9, 12]
    assert orient.tolist() == [1, 1, 1, 1, 1, -1, -1, -1, -1, -1]
