"""The `realistic` difficulty's calibration: the oracle's own strategy at scale `real`, and what bars can reach.

For each (symbol, seed), `generate_demo_data(scale="real", book_sessions=0, difficulty=...)` writes 8 quarters of
bars (a cap `--sessions` keeps the sessions around each roll), each file's sidecar is built, and the generator's
exact bar probabilities (`oracle_probabilities`) are traded through the evaluator's functions: the fixed rule
(h0, band 0.05, one bar) and the decision layer as `alpha evaluate` fits it (`policy.fit` on quarter k, the
validation file, applied unchanged to quarter k + 1, the test file), pooled over the 7 test quarters. Sharpe is
annualised from CME-session PnL (`metrics`), net of 0 and 1 tick per unit of turnover.

Beside it, the ceiling of a bar model without a network: a logistic regression per horizon on the sidecar's bar
features, their last `LAGS` bars' returns, range and body, and three moving averages of the return, trained on the
4 quarters before a fold's validation quarter, its policy fitted on that quarter, over the walk-forward plan's 3 test
quarters (5, 6, 7), with the oracle through the same fits on the same quarters: their ratio is the linear model's
capture.

    PYTHONPATH=. .venv/bin/python bench/bench_realistic.py --difficulty realistic
    PYTHONPATH=. .venv/bin/python bench/bench_realistic.py --difficulty planted --runs ES.FUT:7 --sessions 10
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import numpy as np

RUNS = ("ES.FUT:7", "NQ.FUT:7", "ES.FUT:8", "ZN.FUT:9", "6E.FUT:10")
LAGS = 10
TRAIN_QUARTERS = 4


def linear_inputs(features: np.ndarray) -> np.ndarray:
    """The features, the last LAGS bars' log return, range and body, and the return's moving averages (30, 100 and
    300 bars): what a linear model needs to read a flow that persists a few bars from past prices."""
    from scipy.signal import lfilter

    out = [features]
    for k in range(1, LAGS + 1):
        lag = np.zeros_like(features[:, :3])
        lag[k:] = features[:-k, :3]
        out.append(lag)
    r = features[:, 0].astype(np.float64)
    for span in (30, 100, 300):
        out.append(lfilter([1.0 / span], [1.0, -(1.0 - 1.0 / span)], r)[:, None].astype(np.float32))
    return np.concatenate(out, axis=1)


def linear_probs(train: list[dict], files: list[dict]) -> list[np.ndarray]:
    """Per file in `files`, [N, H] up-probabilities of a logistic regression per horizon fitted on `train`."""
    from sklearn.linear_model import LogisticRegression

    x = np.concatenate([f["x"] for f in train])
    mean, sd = x.mean(0), x.std(0) + 1e-9
    out = [np.zeros((len(f["ts"]), train[0]["y"].shape[1])) for f in files]
    for h in range(train[0]["y"].shape[1]):
        y = np.concatenate([f["y"][:, h] for f in train])
        ok = np.isfinite(y)
        model = LogisticRegression(C=0.1, max_iter=300).fit(((x - mean) / sd)[ok], y[ok])
        for o, f in zip(out, files, strict=True):
            o[:, h] = model.predict_proba((f["x"] - mean) / sd)[:, 1]
    return out


def one(symbol: str, seed: int, difficulty: str, sessions: int | None, out: Path) -> dict:
    from alpha_core import metrics
    from alpha_core.data import demo
    from alpha_core.data.oracle import oracle_probabilities
    from alpha_core.data.sidecar import ensure_sidecar
    from alpha_core.eval import policy
    from alpha_core.eval.validation import next_move_ticks

    if sessions:
        demo.SCALES["capped"] = dataclasses.replace(demo.SCALES["real"], name="capped", sessions_per_quarter=sessions)
    demo.generate_demo_data(out, "capped" if sessions else "real", seed, [symbol], None, 0, difficulty=difficulty)
    files = []
    for path in sorted((out / symbol / "ohlcv-1m").glob("*.dbn.zst")):
        sc, _ = ensure_sidecar(path, out / "sidecars")
        files.append(
            {
                "ts": np.asarray(sc.ts),
                "oracle": oracle_probabilities(sc).astype(np.float64),
                "moves": next_move_ticks(sc),
                "x": linear_inputs(np.asarray(sc.features, dtype=np.float32)),
                "y": np.asarray(sc.labels),
            }
        )
    holds = policy.hold_bars(demo.BAR_HORIZONS_MIN, "minutes")

    def traded(val: dict, val_probs: np.ndarray, test_probs: np.ndarray) -> np.ndarray:
        """The test positions of the policy fitted on the validation file's probabilities."""
        return policy.positions(policy.fit(val_probs, val["ts"], val["moves"], 1.0, holds)[0], test_probs)

    def sharpes(tests: list[dict], pos: list[np.ndarray]) -> tuple[float, float, float]:
        ts, moves, p = (np.concatenate(x) for x in ([f["ts"] for f in tests], [f["moves"] for f in tests], pos))
        s0, s1 = (metrics.sharpe(metrics.daily_pnl(ts, metrics.bar_pnl(p, moves, c))[1]) for c in (0.0, 1.0))
        return s0, s1, metrics.turnover(p)

    fixed = [policy.positions(policy.fixed(0, 0.05), f["oracle"]) for f in files[1:]]
    fitted = [traded(v, v["oracle"], t["oracle"]) for v, t in zip(files[:-1], files[1:], strict=True)]
    folds = range(TRAIN_QUARTERS + 1, len(files))
    linear, oracle = [], []
    for k in folds:
        val, test = files[k - 1], files[k]
        vp, tp = linear_probs(files[k - 1 - TRAIN_QUARTERS : k - 1], [val, test])
        linear.append(traded(val, vp, tp))
        oracle.append(traded(val, val["oracle"], test["oracle"]))
    tests = [files[k] for k in folds]
    return {
        "sessions": sum(len(metrics.daily_pnl(f["ts"], f["moves"])[0]) for f in files[1:]),
        "fixed": sharpes(files[1:], fixed),
        "fitted": sharpes(files[1:], fitted),
        "folds_oracle": sharpes(tests, oracle),
        "folds_linear": sharpes(tests, linear),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--difficulty", default="realistic")
    ap.add_argument("--runs", default=",".join(RUNS), help="SYMBOL:SEED,...")
    ap.add_argument("--sessions", type=int, help="cap each quarter to the sessions around its roll (default: all)")
    a = ap.parse_args()
    rows = []
    for run in a.runs.split(","):
        symbol, seed = run.split(":")
        started = time.process_time()
        with tempfile.TemporaryDirectory() as tmp:
            r = one(symbol, int(seed), a.difficulty, a.sessions, Path(tmp))
        rows.append(r)
        f, g, o, lin = r["fixed"], r["fitted"], r["folds_oracle"], r["folds_linear"]
        print(
            f"{symbol} seed {seed}: {r['sessions']} test sessions | fixed S0 {f[0]:.2f} S1 {f[1]:.2f} turnover "
            f"{f[2]:.3f} | fitted S0 {g[0]:.2f} S1 {g[1]:.2f} turnover {g[2]:.4f} | test folds: oracle S1 {o[1]:.2f}, "
            f"linear S1 {lin[1]:.2f} (S0 {lin[0]:.2f}, turnover {lin[2]:.4f}) | {time.process_time() - started:.0f} s CPU"
        )
    for kind in ("fixed", "fitted", "folds_oracle", "folds_linear"):
        s1 = np.array([r[kind][1] for r in rows])
        print(f"mean over {len(rows)} runs, {kind}: S1 {s1.mean():.2f} (runs {s1.min():.2f} .. {s1.max():.2f})")


if __name__ == "__main__":
    main()
