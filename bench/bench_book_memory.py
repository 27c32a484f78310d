"""The flagship's book path at the real ES density (issue 23 items 1-2): loader start and one perception
checkpoint's evaluation, host peak RSS and CPU seconds against the number of quarters.

Data. A real ES MBP-10 session holds about 5M records; the demo build keeps 0.70 sidecar rows per record, so a
quarter of 63 sessions is 220.5M book rows (38.8 GB as a sidecar: 176 B a row, `STORED_DTYPES`). Such sidecars are
written here as sparse files: every `.npy` has its full size, and only what the measured code reads for its answer is
written (the label tail, whose NaNs mark where windows may start; for a test file its `ts` and `trade_ts`, 3.5 GB a
quarter: snapshots evenly over 23 h a session, a trade every 4th snapshot); features, dt and outcomes read as zeros,
which costs the code what real values cost. The test period's bar file is real-sized too (1,380 bars a session). The
checkpoint is a real `alpha train` checkpoint (seq_len 64, tiny demo data): inference costs the same whatever it
learned.

Children, each a fresh process (CPU = user + system, peak RSS = its ru_maxrss, both from `os.wait4`):
- `loader Q`: `WindowLoader` over Q training quarters (8,000 windows of 64, the seed's n_train_seqs) and the
  validation quarter's loader (1,000), one epoch of batches of 256, then the training time scale
  (`median_spacing`, which reads every dt); `--resident` builds the loaders as on a GPU (their buffers on the
  loader's device; here the CPU) and reports the bytes those buffers take, i.e. the GPU memory they need;
- `eval Q`: one perception checkpoint evaluated as `alpha evaluate` does it on a test file of Q quarters: the
  decision rows and the AUC sample (`predict`), the clock check, the labels of the sample and the AUC with its
  interval, then the same file's positions again as its validation file would be (`scored=False`);
- `bars N`: CPU seconds per bar of every bar member's evaluation (registry defaults, seq_len 64; the RL agents'
  greedy walk over the whole file), timed on N bars of the real-size test bar file: the terms of the workload's
  formula in bench/README.md.

`--density D` scales the rows (the "before" code runs at a fraction of the real density, since at full density it
needs 46 GB or 54 CPU-hours); `--tree DIR` runs the children on another checkout's `alpha_core` (PYTHONPATH).

    nice .venv/bin/python bench/bench_book_memory.py                       # loader q1,q2,q4 and eval q1,q2 (~15 min)
    nice .venv/bin/python bench/bench_book_memory.py --tree /tmp/alpha-old --density 0.125 --loader 1,2 --eval ''
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SESSIONS = 63  # a quarter
ROWS_PER_SESSION = int(5_000_000 * 0.70)  # 5M records a session, 0.70 sidecar rows a record
BARS_PER_SESSION = 1380
SESSION_NS = 23 * 3600 * 10**9
DAY_NS = 24 * 3600 * 10**9
FIRST_SESSION = 1_704_841_200 * 10**9  # Tue 2024-01-09 23:00 UTC: 17:00 Chicago, a session's open
SEQ_LEN, N_TRAIN, N_VAL = 64, 8000, 1000
CHILD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


# --- data ------------------------------------------------------------------------------------------------------


def _template(out: Path) -> Path:
    """A real perception checkpoint and real sidecars (their metas are the templates), from tiny demo data."""
    models = out / "models" / "perception" / "ES.FUT"
    if not (models / "fold-0" / "alpha_train_summary.json").exists():
        from alpha_core.cli import main
        from alpha_core.data.demo import generate_demo_data

        generate_demo_data(out / "demo", "tiny", seed=7, symbols=["ES.FUT"])
        code = main(
            [
                "train",
                "--data-dir",
                str(out / "demo" / "ES.FUT" / "mbp-10"),
                "--predecoded-dir",
                str(out / "pd"),
                "--out",
                str(models),
                "--epochs",
                "1",
                "--batch-size",
                "32",
                "--n-train-seqs",
                "64",
                "--n-val-seqs",
                "64",
                "--seq-len",
                str(SEQ_LEN),
                "--cv-n-folds",
                "1",
                "--device",
                "cpu",
                "--quiet",
            ]
        )
        assert code == 0, "alpha train failed"
        from alpha_core.data.predecode import predecode

        predecode(out / "demo" / "ES.FUT" / "ohlcv-1m", out / "pd", "ES.FUT", "ohlcv-1m")
    return out


def _write_sidecar(path: Path, template, rows: int, fill) -> None:
    """A sidecar of `rows` rows whose arrays are sparse files, in the dtypes the build stores; `fill(name, memmap)`
    writes what must be real."""
    import numpy as np

    from alpha_core.data.sidecar import STORED_DTYPES, ArraySpec, _meta_json

    if (path / "meta.json").exists():
        return
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    arrays = {}
    for name, spec in template.meta.arrays.items():
        shape = (rows, *spec.shape[1:])
        dtype = STORED_DTYPES[template.meta.kind][name]
        arr = np.lib.format.open_memmap(tmp / f"{name}.npy", mode="w+", dtype=dtype, shape=shape)
        fill(name, arr)
        arr.flush()
        del arr
        arrays[name] = ArraySpec(dtype=dtype.name, shape=list(shape))
    meta = template.meta.model_copy(update={"rows": rows, "arrays": arrays, "key": path.name.rsplit(".", 1)[-1]})
    (tmp / "meta.json").write_bytes(_meta_json(meta))
    tmp.rename(path)


def _book(out: Path, template, rows: int, times: bool, tag: str) -> Path:
    """A book sidecar: labels NaN in the tail (as the build leaves it); with `times`, real ts and trade_ts."""
    import numpy as np

    horizons = template.meta.horizons
    sessions = max(1, round(rows / ROWS_PER_SESSION))

    def fill(name, arr):
        if name == "labels":
            for j, h in enumerate(horizons):
                arr[max(rows - h, 0) :, j] = np.nan
        if times and name in ("ts", "trade_ts"):
            per = rows // sessions
            for s in range(sessions):
                lo, hi = s * per, rows if s == sessions - 1 else (s + 1) * per
                for a in range(lo, hi, 1 << 22):
                    b = min(a + (1 << 22), hi)
                    i = np.arange(a, b, dtype=np.int64) - lo
                    if name == "trade_ts":
                        i -= i % 4
                    ts = FIRST_SESSION + s * DAY_NS + i * (SESSION_NS // (hi - lo))
                    arr[a:b] = ts - 1000 if name == "trade_ts" else ts

    path = out / "sidecars" / f"{tag}.ES.book.{rows:012d}{int(times)}"
    _write_sidecar(path, template, rows, fill)
    return path


def _bars(out: Path, template, sessions: int) -> Path:
    """The test period's bars: 1,380 a session, minute-stamped, a random walk in ticks."""
    import numpy as np

    rows = sessions * BARS_PER_SESSION
    rng = np.random.default_rng(0)

    def fill(name, arr):
        minute = np.arange(rows) % BARS_PER_SESSION
        ts = FIRST_SESSION + (np.arange(rows) // BARS_PER_SESSION) * DAY_NS + minute * 60 * 10**9
        values = {
            "ts": ts,
            "trade_ts": ts + 60 * 10**9 - 1,
            "dt": np.full(rows, 60.0),
            "price": 4800 + 0.25 * np.cumsum(rng.integers(-4, 5, rows)),
            "instrument_id": np.ones(rows),
            "features": rng.normal(size=arr.shape),
            "labels": rng.integers(0, 2, arr.shape),
            "outcome_long": rng.normal(size=arr.shape),
            "outcome_short": rng.normal(size=arr.shape),
        }
        arr[:] = values[name]

    path = out / "sidecars" / f"test{sessions}.ES.bars.{rows:012d}"
    _write_sidecar(path, template, rows, fill)
    return path


def prepare(out: Path, density: float, loader_q: list[int], eval_q: list[int]) -> dict:
    from alpha_core.data.sidecar import load_sidecar

    _template(out)
    book_t = load_sidecar(next((out / "pd").rglob("*.ES.book.*")))
    bars_t = load_sidecar(next((out / "pd").rglob("*.ES.bars.*")))
    quarter = int(SESSIONS * ROWS_PER_SESSION * density)
    files = {
        "train": [str(_book(out, book_t, quarter, False, f"train{k}")) for k in range(max(loader_q, default=0))],
        "val": str(_book(out, book_t, quarter, False, "val")),
        "test": {},
    }
    for q in eval_q:
        files["test"][q] = {
            "book": str(_book(out, book_t, q * quarter, True, f"test{q}")),
            "bars": str(_bars(out, bars_t, max(1, round(q * SESSIONS * density)))),
        }
    files["models"] = str(out / "models")
    files["quarter_rows"] = quarter
    return files


# --- the children ------------------------------------------------------------------------------------------------


def child_loader(files: dict, q: int, resident: bool) -> dict:
    import numpy as np

    from alpha_core.data.loader import WindowLoader
    from alpha_core.data.norm import NormStats
    from alpha_core.data.sidecar import load_sidecar

    train = [load_sidecar(p) for p in files["train"][:q]]
    val = load_sidecar(files["val"])
    names = train[0].meta.feature_names
    norm = NormStats(feature_names=names, mean=[0.0] * len(names), std=[1.0] * len(names), rows=1, sources=[])
    phases, t = {}, time.process_time()
    kw = {"resident": True} if resident else {}
    loader = WindowLoader(train, SEQ_LEN, N_TRAIN, 0x4242, norm, **kw)
    val_loader = WindowLoader([val], SEQ_LEN, N_VAL, 0x4242 + 0xC0FFEE, norm, **kw)
    phases["loaders"] = time.process_time() - t
    t = time.process_time()
    loader.reset(0x4243)
    windows = sum(len(b) for b in loader.batches(256))
    phases["epoch"] = time.process_time() - t
    out = {"phases": phases, "windows": windows, "rows": sum(sc.rows for sc in train)}
    buffers = getattr(loader, "_buf", None)
    if buffers is not None:
        out["buffer_bytes"] = sum(
            int(b.numel() * b.element_size())
            for ld in (loader, val_loader)
            for b in (*ld._buf.values(), ld._first, ld._file, ld._start)
        )
        t = time.process_time()
        from alpha_core.train.perception import median_spacing

        median_spacing(train)
        phases["time_scale"] = time.process_time() - t
    else:  # the old loader: every training row's anchor
        out["anchor_bytes"] = int(np.asarray(loader._anchors).nbytes)
    return out


def child_eval(files: dict, q: int) -> dict:
    import numpy as np
    import torch

    from alpha_core.data.sidecar import load_sidecar
    from alpha_core.eval import evaluate as ev
    from alpha_core.eval.predict import check_decision_clock, entry_ts, load, one_intra_op_thread, predict

    (ckpt,), _ = ev.find_checkpoints(Path(files["models"]), ["ES.FUT"], None)
    book, bars = load_sidecar(files["test"][str(q)]["book"]), load_sidecar(files["test"][str(q)]["bars"])
    phases = {}
    with torch.no_grad(), one_intra_op_thread():
        model = load(ckpt, torch.device("cpu"))
        t = time.process_time()
        entry = entry_ts(bars, book)
        phases["clock"] = time.process_time() - t
        t = time.process_time()
        new = "entry" in predict.__code__.co_varnames  # the streaming evaluation (--tree: the code before it)
        pred = predict(model, bars, book, 0, 0.05, True, entry) if new else predict(model, bars, book, 0, 0.05)
        check_decision_clock("perception", "test", np.asarray(bars.ts), pred.position, pred.decision_ts, entry)
        phases["test"] = time.process_time() - t
        t = time.process_time()
        if new:
            from alpha_core.data.loader import take_rows

            labels = take_rows(book, "labels", pred.rows)
            mask = np.isfinite(pred.probs) & np.isfinite(labels)
            auc = ev._auc([ev.Scored(0, "test", pred, mask, labels)])
        else:
            mask = np.isfinite(pred.probs) & np.isfinite(np.asarray(book.labels))
            auc = ev._auc([ev.Scored(0, "test", pred, mask)])
        phases["auc"] = time.process_time() - t
        t = time.process_time()
        val = predict(model, bars, book, 0, 0.05, False, entry) if new else predict(model, bars, book, 0, 0.05, False)
        if new:
            from alpha_core.eval.validation import file_score

            file_score(bars, val.position)
        else:
            ev.file_sharpe(bars, val.position)
        phases["validation"] = time.process_time() - t
    return {
        "phases": phases,
        "rows": book.rows,
        "bars": bars.rows,
        "auc_rows": auc.n_rows,
        "windows": int(np.isfinite(pred.probs).any(axis=1).sum()) + int((val.decision_ts >= 0).sum()),
    }


def child_bars(files: dict, n: int) -> dict:
    """CPU seconds per bar of every bar member's evaluation at the seed's sizes (registry defaults, seq_len 64;
    RL: window 32, greedy positions over the whole file), on `n` bars of the real-size test bar file."""
    import numpy as np
    import torch

    from alpha_core.data.norm import NormStats
    from alpha_core.data.sidecar import load_sidecar
    from alpha_core.eval.predict import _window_probs, one_intra_op_thread
    from alpha_core.models import registry
    from alpha_core.rl import EnvConfig, TradingVecEnv, build_agent
    from alpha_core.rl.agents import greedy_decisions

    bars = load_sidecar(files["test"]["1"]["bars"])
    names = bars.meta.feature_names
    norm = NormStats(feature_names=names, mean=[0.0] * len(names), std=[1.0] * len(names), rows=1, sources=[])
    features = np.asarray(bars.features)[: n + SEQ_LEN]
    per_bar = {}
    with torch.no_grad(), one_intra_op_thread():
        for name, spec in registry.REGISTRY.items():
            if spec.input != "bars":
                continue
            torch.manual_seed(0)
            t = time.process_time()
            if spec.trainer == "rl":
                env = TradingVecEnv([bars], EnvConfig(n_envs=1, episode_len=1), norm)
                greedy_decisions(build_agent(name, env), [bars], EnvConfig(), norm)
                per_bar[name] = (time.process_time() - t) / bars.rows
            else:
                _window_probs(
                    spec.build(n_features=len(names)).eval(),
                    features,
                    None,
                    SEQ_LEN,
                    norm,
                    torch.device("cpu"),
                    np.arange(SEQ_LEN - 1, SEQ_LEN - 1 + n),
                )
                per_bar[name] = (time.process_time() - t) / n
    return {"per_bar_cpu_s": per_bar, "bars_per_quarter": bars.rows, "rows": bars.rows}


# --- the parent --------------------------------------------------------------------------------------------------


def run_child(args: list[str], tree: Path | None) -> dict:
    env = {**os.environ, **CHILD_ENV}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    out = Path(args[args.index("--result") + 1])
    started = time.perf_counter()
    proc = subprocess.Popen(["nice", sys.executable, __file__, *args], env=env, cwd=tree or ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    if status != 0:
        return {"error": f"exit status {status}", "wall_s": wall}
    result = json.loads(out.read_text())
    return {**result, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mib": usage.ru_maxrss / 1024, "wall_s": wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "book_memory")
    ap.add_argument("--loader", default="1,2,4", help="training quarters for the loader runs ('' for none)")
    ap.add_argument("--eval", default="1,2", help="test quarters for the evaluation runs ('' for none)")
    ap.add_argument("--density", type=float, default=1.0, help="fraction of the real density (rows a quarter)")
    ap.add_argument("--bars", type=int, default=4096, help="bars timed per bar member (0: skip the bar members)")
    ap.add_argument("--resident", action="store_true", help="loaders with device-resident buffers (here the CPU)")
    ap.add_argument("--tree", type=Path, help="run the children on this checkout's alpha_core")
    ap.add_argument("--keep", action="store_true", help="keep the sidecars (sparse, but the test times are real)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--files", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    loader_q = [int(x) for x in args.loader.split(",") if x]
    eval_q = [int(x) for x in args.eval.split(",") if x]
    bars = [args.bars] if args.bars and not args.tree else []
    if args.child and args.child[0] == "prepare":
        files = prepare(args.out, args.density, loader_q, sorted(set(eval_q) | ({1} if bars else set())))
        args.files.write_text(json.dumps(files))
        return 0
    if args.child:
        files = json.loads(args.files.read_text())
        kind, q = args.child[0], int(args.child[1])
        result = {
            "loader": lambda: child_loader(files, q, args.resident),
            "eval": lambda: child_eval(files, q),
            "bars": lambda: child_bars(files, q),
        }[kind]()
        args.result.write_text(json.dumps(result))
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    files_path = args.out / "files.json"
    # the data are written by a child: a child's ru_maxrss starts at its parent's peak (exec keeps the high-water
    # mark of the memory it replaces), so the parent must stay small
    prep = [
        "--out",
        str(args.out),
        "--density",
        str(args.density),
        "--loader",
        args.loader,
        "--eval",
        args.eval,
        "--bars",
        str(args.bars if bars else 0),
    ]
    subprocess.run(
        [sys.executable, __file__, "--child", "prepare", "0", "--files", str(files_path), *prep], check=True, cwd=ROOT
    )
    files = json.loads(files_path.read_text())
    tag = f"{'old' if args.tree else 'new'}-d{args.density:g}{'-resident' if args.resident else ''}"
    results = []
    for kind, qs in (("loader", loader_q), ("eval", eval_q), ("bars", bars)):
        for q in qs:
            extra = ["--resident"] if args.resident else []
            res = run_child(
                [
                    "--child",
                    kind,
                    str(q),
                    "--files",
                    str(files_path),
                    "--result",
                    str(args.out / f"{tag}-{kind}{q}.json"),
                    *extra,
                ],
                args.tree,
            )
            res.update(kind=kind, quarters=q, density=args.density, code=tag)
            results.append(res)
            phases = " ".join(f"{k} {v:.1f}" for k, v in res.get("phases", {}).items())
            if "per_bar_cpu_s" in res:
                print(
                    "bar members, CPU ms per bar: " + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in res["per_bar_cpu_s"].items()),
                    flush=True,
                )
            size = f"{res.get('rows', 0) / 1e6:,.1f}M rows"
            extra_bytes = next((f"{k} {res[k] / 2**20:,.1f} MiB" for k in ("buffer_bytes", "anchor_bytes") if k in res), "")
            print(
                f"{tag} {kind} q{q} ({size}): CPU {res.get('cpu_s', float('nan')):.1f} s, peak RSS "
                f"{res.get('rss_mib', float('nan')):,.0f} MiB, wall {res['wall_s']:.1f} s [{phases}] {extra_bytes} "
                f"{res.get('error', '')}",
                flush=True,
            )
    (args.out / f"bench_book_memory-{tag}.json").write_text(json.dumps({"files": files, "results": results}, indent=1))
    if not args.keep:
        shutil.rmtree(args.out / "sidecars", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
