"""The `realistic` difficulty's calibration: the oracle's own strategy at scale `real` (issue 31 item 0).

For each (symbol, seed), `generate_demo_data(scale="real", book_sessions=0, difficulty=...)` writes 8 quarters of
bars (a cap `--sessions` keeps the sessions around each roll), each file's sidecar is built, and the generator's
exact bar probabilities (`oracle_probabilities`) are traded through the evaluator's functions: the fixed rule
(h0, band 0.05, one bar) and the decision layer as `alpha evaluate` fits it (`policy.fit` on quarter k, the
validation file, applied unchanged to quarter k + 1, the test file), pooled over the 7 test quarters. Sharpe is
annualised from CME-session PnL (`metrics`), net of 0 and 1 tick per unit of turnover.

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
        files.append((np.asarray(sc.ts), oracle_probabilities(sc).astype(np.float64), next_move_ticks(sc)))
    holds = policy.hold_bars(demo.BAR_HORIZONS_MIN, "minutes")
    fixed = [policy.positions(policy.fixed(0, 0.05), p) for _, p, _ in files[1:]]
    fitted = []
    for (vts, vp, vmv), (_, tp, _) in zip(files[:-1], files[1:], strict=True):
        fitted.append(policy.positions(policy.fit(vp, vts, vmv, 1.0, holds)[0], tp))
    ts = np.concatenate([f[0] for f in files[1:]])
    moves = np.concatenate([f[2] for f in files[1:]])

    def sharpe(pos: list[np.ndarray], cost: float) -> float:
        return metrics.sharpe(metrics.daily_pnl(ts, metrics.bar_pnl(np.concatenate(pos), moves, cost))[1])

    return {
        "sessions": len(metrics.daily_pnl(ts, moves)[0]),
        "fixed": (sharpe(fixed, 0.0), sharpe(fixed, 1.0), metrics.turnover(np.concatenate(fixed))),
        "fitted": (sharpe(fitted, 0.0), sharpe(fitted, 1.0), metrics.turnover(np.concatenate(fitted))),
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
        f, g = r["fixed"], r["fitted"]
        print(
            f"{symbol} seed {seed}: {r['sessions']} test sessions | fixed S0 {f[0]:.2f} S1 {f[1]:.2f} turnover "
            f"{f[2]:.3f} | fitted S0 {g[0]:.2f} S1 {g[1]:.2f} turnover {g[2]:.4f} | {time.process_time() - started:.0f} s CPU"
        )
    for kind in ("fixed", "fitted"):
        s1 = np.array([r[kind][1] for r in rows])
        print(f"mean over {len(rows)} runs, {kind}: S1 {s1.mean():.2f} (runs {s1.min():.2f} .. {s1.max():.2f})")


if __name__ == "__main__":
    main()
