#!/usr/bin/env python
"""Sidecar benchmark: DBN decode vs. sidecar build (throughput, peak memory) and window sampling.

    .venv/bin/python bench/bench_sidecar.py [--out bench/out] [--keep] [--repeats 3] [--epochs 3] [--no-stages]
                                            [--process-only]

1. Generates (or reuses) one `--scale full` ES.FUT MBP-10 demo file (quarter 1, >= 2M records) under
   `{out}/data/ES.FUT/mbp-10/`.
2. Runs every measurement in its own fresh interpreter, so each phase's peak RSS is its own: the peak comes
   from the kernel (`os.wait4` rusage of that one child, what RUSAGE_CHILDREN reports for it), minus the
   median peak of a baseline child that makes the same imports (numpy, databento, polars, the alpha_core
   build stack) and does no work. Times are taken inside the child (imports excluded).
     a. bare decode          `DBNStore.from_file(p).to_ndarray()`   (the whole file at once)
     b. chunked bare decode  iterate `to_ndarray(count=262144)`     (and count=8192, the build's chunk size)
     c. sidecar build        `ensure_sidecar(p, <empty temp dir under --out>)`: sha256 + decode + front
                             month + features + labels + write
   Whole process (exec to exit, interpreter start, imports and exit included), the same rounds:
     d. bare decode          `python -c 'import databento; databento.DBNStore.from_file(p).to_ndarray()'`
     e. alpha predecode      `alpha predecode --data-dir <a folder holding only p> --output-dir <empty dir>`,
                             the console script beside this interpreter (the real CLI entry point)
   a to e run interleaved for `--repeats` rounds, with `os.sync()` after each child so one phase's
   write-back does not land in the next one's timing; medians are reported. One extra build (not in the
   medians) times the build's stages by wrapping its functions.
   Targets: build throughput >= 0.5 x bare-decode throughput (DBN records of the file per second), in the
   child (c vs a) and as whole processes (e vs d); build peak RSS above baseline < 3 x the decoded size of
   the file (records x 368 bytes). `--process-only` runs d and e alone (and no sampling).
3. Window sampling on one core (`torch.set_num_threads(1)`, child pinned to one CPU): `WindowLoader` over
   the built sidecar (`load_sidecar`), seq_len 64, n_max_sequences 200,000, norm from `fit_norm_stats`;
   one warm-up epoch, then `--epochs` timed epochs of `batches(B)` (median) for B = 256 and 4096, with and
   without normalisation. Target: >= 50,000 windows (of 64 snapshots) per second.
4. Prints machine info (cores, CPU, memory, versions) with the numbers, and writes everything to
   `{out}/bench_sidecar.json`. Exit status 0 when every target passes, else 1.

Built sidecars are removed at the end unless `--keep`; the generated DBN data is always kept for reuse.
The parent process imports nothing heavy (its RSS could otherwise show in a child's peak).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SYMBOL = "ES.FUT"
SEED = 7
RECORD_BYTES = 368  # one MBP-10 record
CHUNK = 262_144
BUILD_CHUNK = 8_192  # alpha_core.data.series.BOOK_CHUNK_RECORDS
SEQ_LEN, N_MAX_SEQUENCES = 64, 200_000
BUILD_RATIO_TARGET = 0.5
PROCESS_RATIO_TARGET = 0.5
BARE_DECODE = "import sys, databento; print(len(databento.DBNStore.from_file(sys.argv[1]).to_ndarray()))"
BUILD_MEMORY_TARGET = 3.0
WINDOWS_TARGET = 50_000


# --- workers: each runs in a fresh interpreter ------------------------------------------------------------
def _common_imports() -> None:
    """What every decode/build child (and the baseline) imports before measuring anything."""
    import databento  # noqa: F401
    import numpy  # noqa: F401
    import polars  # noqa: F401

    import alpha_core.data.features  # noqa: F401  (the whole build stack)
    import alpha_core.data.series  # noqa: F401
    import alpha_core.data.sidecar  # noqa: F401


def worker_generate(a: argparse.Namespace) -> dict:
    from alpha_core.data.demo import generate_demo_data

    t0 = time.perf_counter()
    paths = generate_demo_data(Path(a.dir), scale="full", seed=SEED, symbols=[SYMBOL], quarters=1)
    return {"seconds": time.perf_counter() - t0, "paths": [str(p) for p in paths]}


def worker_baseline(a: argparse.Namespace) -> dict:
    _common_imports()
    import databento
    import numpy
    import polars

    import alpha_core

    return {
        "alpha_core": str(Path(alpha_core.__file__).parent),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "databento": databento.__version__,
        "polars": polars.__version__,
    }


def worker_decode(a: argparse.Namespace) -> dict:
    _common_imports()
    import databento as db

    t0 = time.perf_counter()
    arr = db.DBNStore.from_file(a.file).to_ndarray()
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "records": len(arr), "itemsize": arr.dtype.itemsize}


def worker_decode_chunked(a: argparse.Namespace) -> dict:
    _common_imports()
    import databento as db

    t0 = time.perf_counter()
    n = 0
    for chunk in db.DBNStore.from_file(a.file).to_ndarray(count=a.count):
        n += len(chunk)
    return {"seconds": time.perf_counter() - t0, "records": n}


STAGES = (  # (key, label); "  " marks a part of the stage above
    ("sha256", "sha256 of the file (sidecar key)"),
    ("pass1", "pass 1 (read_book): decode, time order, activity per session"),
    ("pass2", "pass 2 (BookSource.chunks): waiting for decode + snapshots"),
    ("decode", "  zstd + DBN decode, both passes (background threads)"),
    ("features", "book features (BookFeatures, float levels included)"),
    ("labels", "labels (LabelStream)"),
    ("write", "appending to the .npy files"),
    ("other", "other (meta, fsync, rename, load)"),
)


def _stage_timers() -> dict[str, float]:
    """Time the build's stages by wrapping module functions and methods (only in the `--stages` run)."""
    import functools

    import alpha_core.data.build as build
    import alpha_core.data.features as features
    import alpha_core.data.labels as labels
    import alpha_core.data.series as series
    import alpha_core.data.sidecar as sidecar

    spent: dict[str, float] = {}

    def add(key: str, seconds: float) -> None:
        spent[key] = spent.get(key, 0.0) + seconds

    def wrap(owner, name: str, key: str) -> None:
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                add(key, time.perf_counter() - t0)

        setattr(owner, name, timed)

    def wrap_iter(owner, name: str, key: str) -> None:
        """Time every step of the iterator `owner.name(...)` returns."""
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            items = fn(*args, **kwargs)
            while True:
                t0 = time.perf_counter()
                try:
                    item = next(items)
                except StopIteration:
                    return
                finally:
                    add(key, time.perf_counter() - t0)
                yield item

        setattr(owner, name, timed)

    wrap(sidecar, "file_sha256", "sha256")
    wrap(build, "read_book", "pass1")
    wrap_iter(series.BookSource, "chunks", "pass2")
    wrap_iter(series, "iter_records", "decode")
    wrap(features.BookFeatures, "__call__", "features")
    wrap(labels.LabelStream, "push", "labels")
    wrap(labels.LabelStream, "finish", "labels")
    wrap(build.NpyAppender, "write", "write")
    return spent


def worker_build(a: argparse.Namespace) -> dict:
    _common_imports()
    from alpha_core.data.sidecar import ensure_sidecar

    spent = _stage_timers() if a.stages else None
    if any(Path(a.dir).iterdir()):
        raise SystemExit(f"build dir {a.dir} is not empty")
    t0 = time.perf_counter()
    sc, status = ensure_sidecar(a.file, a.dir, SYMBOL)
    seconds = time.perf_counter() - t0
    out = {
        "seconds": seconds,
        "status": status,
        "rows": sc.rows,
        "path": str(sc.path),
        "sidecar_bytes": sum(p.stat().st_size for p in sc.path.iterdir()),
        "features_shape": list(sc.features.shape),
    }
    if spent is not None:
        spent["other"] = seconds - sum(
            v for k, v in spent.items() if k in ("sha256", "pass1", "pass2", "features", "labels", "write")
        )
        out["stages"] = {k: round(spent.get(k, 0.0), 4) for k, _ in STAGES}
    return out


def worker_sample(a: argparse.Namespace) -> dict:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import numpy as np
    import torch

    torch.set_num_threads(1)
    from alpha_core.data.loader import WindowLoader
    from alpha_core.data.norm import fit_norm_stats
    from alpha_core.data.sidecar import load_sidecar

    sc = load_sidecar(a.dir)
    t0 = time.perf_counter()
    norm = fit_norm_stats([sc])
    fit_seconds = time.perf_counter() - t0
    results = []
    for normed in (True, False):
        for batch in (256, 4096):
            loader = WindowLoader([sc], seq_len=SEQ_LEN, n_max_sequences=N_MAX_SEQUENCES, seed=0, norm=norm if normed else None)
            warm = sum(len(b) for b in loader.batches(batch))  # warm-up epoch: page cache, allocator
            epochs = []
            for e in range(a.epochs):
                loader.reset(1 + e)
                t0 = time.perf_counter()
                n = 0
                for b in loader.batches(batch):
                    n += len(b)
                epochs.append({"windows": n, "seconds": time.perf_counter() - t0})
            rate = statistics.median(ep["windows"] / ep["seconds"] for ep in epochs)
            results.append(
                {
                    "batch": batch,
                    "norm": normed,
                    "warmup_windows": warm,
                    "epochs": epochs,
                    "windows_per_s": rate,
                    "snapshot_rows_per_s": rate * SEQ_LEN,
                }
            )
    last = b
    return {
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "sidecar_rows": sc.rows,
        "n_windows": loader.n_windows,
        "fit_norm_seconds": fit_seconds,
        "batch_shapes": {
            "x": list(last.x.shape),
            "labels": list(last.labels.shape),
            "x_dtype": str(last.x.dtype),
            "finite": bool(np.isfinite(last.x.numpy()).all()),
        },
        "configs": results,
    }


WORKERS = {
    "generate": worker_generate,
    "baseline": worker_baseline,
    "decode": worker_decode,
    "decode_chunked": worker_decode_chunked,
    "build": worker_build,
    "sample": worker_sample,
}


# --- parent -----------------------------------------------------------------------------------------------
def run_process(phase: str, cmd: list[str]) -> tuple[str, dict]:
    """Run `cmd` as a fresh process; its stdout and its kernel-measured wall (exec to exit), CPU and peak RSS."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=REPO, env=env)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (ru_maxrss in KiB on Linux)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"{phase} child failed ({proc.returncode}):\n{stderr}{stdout}")
    if hasattr(os, "sync"):
        os.sync()  # write back what the phase wrote now, not during the next phase's measurement
    return stdout, {
        "peak_rss_bytes": usage.ru_maxrss * 1024,
        "process_wall_seconds": wall,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
    }


def run_child(phase: str, script: str | None = None, **kw) -> dict:
    """Run one phase of `script` (this file) in a fresh interpreter; return its JSON result plus its
    kernel-measured peak RSS."""
    cmd = [sys.executable, str(Path(script or __file__).resolve()), "--worker", phase]
    for k, v in kw.items():
        if v is True:
            cmd.append(f"--{k}")
        elif v not in (None, False):
            cmd += [f"--{k}", str(v)]
    stdout, usage = run_process(phase, cmd)
    return {**json.loads(stdout.strip().splitlines()[-1]), **usage}


def alpha_cli() -> Path:
    """The `alpha` console script installed beside this interpreter: what a user or a pod runs."""
    path = Path(sys.executable).parent / "alpha"
    if not path.exists():
        raise SystemExit(f"no `alpha` entry point beside {sys.executable}: run the bench with the project's .venv/bin/python")
    return path


def single_file_dir(dbn_path: Path, out: Path) -> Path:
    """A data folder holding only `dbn_path` (hard-linked, else copied): what `alpha predecode` is given, so it
    builds that one file although `bench_sidecar_memory.py` puts more quarters beside it."""
    root = out / "predecode-input"
    shutil.rmtree(root, ignore_errors=True)
    target = root / SYMBOL / "mbp-10" / dbn_path.name
    target.parent.mkdir(parents=True)
    try:
        os.link(dbn_path, target)
    except OSError:
        shutil.copyfile(dbn_path, target)
    return root / SYMBOL


def run_whole_process(dbn_path: Path, data_dir: Path, build_dir: Path) -> dict[str, dict]:
    """d and e of one round: the bare decode and `alpha predecode`, each timed from exec to exit."""
    stdout, decode = run_process("decode_process", [sys.executable, "-c", BARE_DECODE, str(dbn_path)])
    decode["records"] = int(stdout)
    stdout, predecode = run_process(
        "predecode_process", [str(alpha_cli()), "predecode", "--data-dir", str(data_dir), "--output-dir", str(build_dir)]
    )
    if not stdout.startswith("built "):
        raise SystemExit(f"alpha predecode did not build a sidecar into the empty {build_dir}:\n{stdout}")
    return {"decode_process": decode, "predecode_process": predecode}


def machine_info(versions: dict, sample: dict | None) -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    info = {
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": cpu,
        "memory_bytes": mem,
        "platform": platform.platform(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        **versions,
    }
    if sample is not None:
        info["torch"] = sample["torch"]
    return info


def fmt_rate(x: float) -> str:
    return f"{x / 1e6:6.2f} M/s" if x >= 1e6 else f"{x / 1e3:6.1f} k/s"


def mib(x: float) -> str:
    return f"{x / 2**20:7.0f} MiB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "bench" / "out"), help="output folder (data, sidecars, json)")
    ap.add_argument("--keep", action="store_true", help="keep the built sidecar directories (default: removed)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of decode / chunked decode / build")
    ap.add_argument("--epochs", type=int, default=3, help="timed sampling epochs per configuration (median)")
    ap.add_argument("--no-stages", action="store_true", help="skip the extra build run with stage timings")
    ap.add_argument(
        "--process-only",
        action="store_true",
        help="only the whole-process bare decode vs `alpha predecode` (d and e), no sampling",
    )
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--file", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=CHUNK, help=argparse.SUPPRESS)
    ap.add_argument("--stages", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.worker:
        print(json.dumps(WORKERS[a.worker](a)))
        return 0

    started = time.time()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data_dir = out / "data"
    dbn_path = data_dir / SYMBOL / "mbp-10" / f"{SYMBOL}_2024-Q1.dbn.zst"
    print(f"# sidecar benchmark  ({time.strftime('%Y-%m-%d %H:%M:%S')})", flush=True)
    if dbn_path.exists():
        generated = None
        print(f"data: reusing {dbn_path}", flush=True)
    else:
        print(f"data: generating --scale full {SYMBOL} quarters=1 under {data_dir} ...", flush=True)
        generated = run_child("generate", dir=data_dir)
        print(f"      done in {generated['seconds']:.1f} s", flush=True)
    file_bytes = dbn_path.stat().st_size

    print("baseline (same imports, no work) ...", flush=True)
    baselines = [run_child("baseline") for _ in range(3)]
    baseline_rss = statistics.median(b["peak_rss_bytes"] for b in baselines)

    build_root = Path(tempfile.mkdtemp(prefix="sidecar-builds-", dir=out))
    process_dir = single_file_dir(dbn_path, out)
    in_child = () if a.process_only else ("decode", "decode_chunked", "decode_chunked_build", "build")
    runs: dict[str, list[dict]] = {k: [] for k in (*in_child, "decode_process", "predecode_process")}
    round_loads = []
    stages = sample = None
    try:
        for r in range(a.repeats):
            round_loads.append(list(os.getloadavg()) if hasattr(os, "getloadavg") else None)
            print(
                f"round {r + 1}/{a.repeats}: {'' if a.process_only else 'decode, chunked decode, build, '}"
                f"whole-process decode and predecode ...",
                flush=True,
            )
            if not a.process_only:
                runs["decode"].append(run_child("decode", file=dbn_path))
                runs["decode_chunked"].append(run_child("decode_chunked", file=dbn_path, count=CHUNK))
                runs["decode_chunked_build"].append(run_child("decode_chunked", file=dbn_path, count=BUILD_CHUNK))
                target = build_root / f"run{r}"
                target.mkdir()
                runs["build"].append(run_child("build", file=dbn_path, dir=target))
                if r and not a.keep:  # the last build stays for the sampling phase
                    shutil.rmtree(build_root / f"run{r - 1}")
            target = build_root / f"process{r}"
            target.mkdir()
            for key, result in run_whole_process(dbn_path, process_dir, target).items():
                runs[key].append(result)
            if not a.keep:
                shutil.rmtree(target)
        if not a.no_stages and not a.process_only:
            print("extra build with stage timings (not in the medians) ...", flush=True)
            target = build_root / "stages"
            target.mkdir()
            stages = run_child("build", file=dbn_path, dir=target, stages=True)
            shutil.rmtree(target)

        if not a.process_only:
            sidecar_path = runs["build"][-1]["path"]
            print("window sampling (1 core) ...", flush=True)
            sample = run_child("sample", dir=sidecar_path, epochs=a.epochs)
    finally:
        if not a.keep:
            shutil.rmtree(build_root, ignore_errors=True)
        shutil.rmtree(process_dir.parent, ignore_errors=True)

    # --- numbers ------------------------------------------------------------------------------------------
    n = runs["decode_process"][0]["records"]
    assert all(x["records"] == n for k in (*in_child[:3], "decode_process") for x in runs[k])
    decoded_bytes = n * RECORD_BYTES

    def summary(key: str, seconds: str = "seconds") -> dict:
        rs = runs[key]
        secs = [x[seconds] for x in rs]
        above = [x["peak_rss_bytes"] - baseline_rss for x in rs]
        return {
            "seconds": secs,
            "median_seconds": statistics.median(secs),
            "records_per_s": n / statistics.median(secs),
            "peak_rss_bytes": [x["peak_rss_bytes"] for x in rs],
            "peak_rss_above_baseline_bytes": above,
            "median_peak_rss_above_baseline_bytes": statistics.median(above),
            "cpu_seconds": [x["cpu_seconds"] for x in rs],
        }

    phases = {k: summary(k, "process_wall_seconds" if k.endswith("_process") else "seconds") for k in runs}
    process_ratio = phases["predecode_process"]["records_per_s"] / phases["decode_process"]["records_per_s"]
    whole_process = {
        "decode_command": [Path(sys.executable).name, "-c", BARE_DECODE, str(dbn_path)],
        "predecode_command": [str(alpha_cli()), "predecode", "--data-dir", str(process_dir), "--output-dir", "<empty dir>"],
        "throughput_ratio": process_ratio,
        "ratio_per_round": [
            d["process_wall_seconds"] / e["process_wall_seconds"]
            for d, e in zip(runs["decode_process"], runs["predecode_process"], strict=True)
        ],
        "load_average_per_round": round_loads,
    }
    targets = {
        "predecode_whole_process_throughput_vs_bare_decode": {
            "value": process_ratio,
            "target": f">= {PROCESS_RATIO_TARGET}",
            "pass": process_ratio >= PROCESS_RATIO_TARGET,
        },
    }
    if not a.process_only:
        assert runs["decode"][0]["itemsize"] == RECORD_BYTES
        phases["decode"]["decoded_bytes"] = decoded_bytes
        phases["build"]["rows"] = runs["build"][0]["rows"]
        phases["build"]["sidecar_bytes"] = runs["build"][0]["sidecar_bytes"]
        phases["build"]["statuses"] = [x["status"] for x in runs["build"]]
        ratio = phases["build"]["records_per_s"] / phases["decode"]["records_per_s"]
        mem_ratio = phases["build"]["median_peak_rss_above_baseline_bytes"] / decoded_bytes
        targets["build_throughput_vs_bare_decode"] = {
            "value": ratio,
            "target": f">= {BUILD_RATIO_TARGET}",
            "pass": ratio >= BUILD_RATIO_TARGET,
        }
        targets["build_peak_rss_above_baseline_vs_decoded_size"] = {
            "value": mem_ratio,
            "target": f"< {BUILD_MEMORY_TARGET}",
            "pass": mem_ratio < BUILD_MEMORY_TARGET,
        }
    sample_by = {(c["batch"], c["norm"]): c for c in sample["configs"]} if sample else {}
    for (batch, normed), c in sorted(sample_by.items(), key=lambda kv: (not kv[0][1], kv[0][0])):
        targets[f"windows_per_s_batch{batch}_{'norm' if normed else 'raw'}"] = {
            "value": c["windows_per_s"],
            "target": f">= {WINDOWS_TARGET}",
            "pass": c["windows_per_s"] >= WINDOWS_TARGET,
        }

    versions = {k: baselines[0][k] for k in ("python", "numpy", "databento", "polars")}
    machine = machine_info(versions, sample)
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "machine": machine,
        "file": {
            "path": str(dbn_path),
            "bytes": file_bytes,
            "records": n,
            "record_bytes": RECORD_BYTES,
            "decoded_bytes": decoded_bytes,
            "generated": generated,
        },
        "baseline_peak_rss_bytes": [b["peak_rss_bytes"] for b in baselines],
        "baseline_peak_rss_median_bytes": baseline_rss,
        "phases": phases,
        "whole_process": whole_process,
        "build_stages": stages["stages"] if stages else None,
        "build_stages_seconds": stages["seconds"] if stages else None,
        "sampling": sample,
        "targets": targets,
        "all_targets_pass": all(t["pass"] for t in targets.values()),
    }
    (out / "bench_sidecar.json").write_text(json.dumps(report, indent=2) + "\n")

    # --- report -------------------------------------------------------------------------------------------
    p = print
    p()
    p("== machine ==")
    p(
        f"cpu: {machine['cpu_model']}; cores: {machine['cores']} (usable {machine['usable_cores']}); "
        f"memory: {machine['memory_bytes'] / 2**30:.1f} GiB; load avg at start: "
        f"{', '.join(f'{x:.2f}' for x in machine['load_average_at_start'] or [])}"
    )
    p(f"alpha_core: {baselines[0]['alpha_core']}")
    p(
        f"python {machine['python']}, numpy {machine['numpy']}, databento {machine['databento']}, "
        f"polars {machine['polars']}, torch {machine.get('torch', '-')}; {machine['platform']}"
    )
    p()
    p("== file ==")
    p(f"{dbn_path}  ({file_bytes / 2**20:.1f} MiB zstd)")
    p(f"{n:,} MBP-10 records x {RECORD_BYTES} B = {decoded_bytes / 2**20:.0f} MiB decoded")
    p(
        f"baseline RSS (interpreter + imports, no work): {mib(baseline_rss)} "
        f"(runs: {', '.join(mib(b['peak_rss_bytes']).strip() for b in baselines)})"
    )
    p()
    p(f"== whole process: exec to exit, fresh process each ({a.repeats} interleaved rounds; median) ==")
    p(f"{'process':44s} {'wall s':>7s} {'records/s':>11s} {'CPU s':>6s} {'peak RSS':>9s}   runs (s)")
    for key, label in (
        ("decode_process", "d. bare decode  python -c (databento)"),
        ("predecode_process", "e. alpha predecode  (the alpha script)"),
    ):
        ph = phases[key]
        p(
            f"{label:44s} {ph['median_seconds']:7.2f} {fmt_rate(ph['records_per_s']):>11s} "
            f"{statistics.median(ph['cpu_seconds']):6.2f} {mib(statistics.median(ph['peak_rss_bytes'])).strip():>9s}   "
            f"{', '.join(f'{s:.2f}' for s in ph['seconds'])}"
        )
    p(
        f"predecode / bare decode throughput, whole process: {process_ratio:5.2f}   (per round: "
        f"{', '.join(f'{x:.2f}' for x in whole_process['ratio_per_round'])})"
    )
    p(
        f"load average (1, 5, 15 min) at each round's start: "
        f"{'; '.join(', '.join(f'{x:.2f}' for x in la) for la in round_loads if la)}"
    )
    if not a.process_only:
        p()
        p(f"== decode vs build ({a.repeats} interleaved rounds, fresh process each; median) ==")
        p(f"{'phase':44s} {'wall s':>7s} {'records/s':>11s} {'peak RSS - baseline':>20s}   runs (s)")
        labels = {
            "decode": "a. bare decode  to_ndarray()",
            "decode_chunked": f"b. chunked decode  to_ndarray(count={CHUNK})",
            "decode_chunked_build": f"   chunked decode  to_ndarray(count={BUILD_CHUNK})",
            "build": "c. sidecar build  ensure_sidecar (all steps)",
        }
        for key, label in labels.items():
            ph = phases[key]
            p(
                f"{label:44s} {ph['median_seconds']:7.2f} {fmt_rate(ph['records_per_s']):>11s} "
                f"{mib(ph['median_peak_rss_above_baseline_bytes']):>20s}   "
                f"{', '.join(f'{s:.2f}' for s in ph['seconds'])}"
            )
        p(
            f"build output: {phases['build']['rows']:,} front-month snapshot rows, "
            f"{phases['build']['sidecar_bytes'] / 2**20:.0f} MiB sidecar; statuses {phases['build']['statuses']}"
        )
        p(
            f"build / bare decode throughput:    {ratio:5.2f}   (vs chunked decode: "
            f"{phases['build']['records_per_s'] / phases['decode_chunked']['records_per_s']:.2f})"
        )
        p(
            f"build peak RSS / decoded size:     {mem_ratio:5.2f}   "
            f"(bare decode: {phases['decode']['median_peak_rss_above_baseline_bytes'] / decoded_bytes:.2f})"
        )
        if stages:
            p()
            p(f"== build stages (one extra build, {stages['seconds']:.2f} s wall) ==")
            for key, label in STAGES:
                p(f"  {label:50s} {stages['stages'][key]:6.3f} s")
        p()
        p(
            f"== window sampling: seq_len {SEQ_LEN}, {sample['n_windows']:,} windows/epoch, 1 core "
            f"(torch threads {sample['torch_threads']}, cpu affinity {sample['affinity']}) =="
        )
        p(
            f"sidecar rows {sample['sidecar_rows']:,}; fit_norm_stats {sample['fit_norm_seconds']:.2f} s; "
            f"last batch x {sample['batch_shapes']['x']} {sample['batch_shapes']['x_dtype']}"
        )
        for c in sample["configs"]:
            eps = ", ".join(f"{e['windows'] / e['seconds']:,.0f}" for e in c["epochs"])
            p(
                f"  batch {c['batch']:5d}  {'norm' if c['norm'] else 'raw ':4s}  {c['windows_per_s']:10,.0f} windows/s "
                f"({c['snapshot_rows_per_s'] / 1e6:5.2f} M rows/s)   epochs: {eps}"
            )
    p()
    p("== targets ==")
    for name, t in targets.items():
        v = t["value"]
        shown = f"{v:,.0f}" if v > 100 else f"{v:.2f}"
        p(f"  [{'PASS' if t['pass'] else 'FAIL'}] {name:50s} {shown:>10s}  (target {t['target']})")
    p()
    p(f"json: {out / 'bench_sidecar.json'}   (total {time.time() - started:.0f} s)")
    return 0 if report["all_targets_pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
