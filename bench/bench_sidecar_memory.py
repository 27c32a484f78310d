#!/usr/bin/env python
"""Sidecar build memory against file size: peak RSS of a ~2M- and a ~20M-record MBP-10 build.

    .venv/bin/python bench/bench_sidecar_memory.py [--out bench/out] [--quarters 10] [--scale full] [--keep]

1. Generates (or reuses) `--quarters` consecutive `--scale full` ES.FUT demo quarters (seed 7) under
   `{out}/data/ES.FUT/mbp-10/` (quarter 1, 2024-Q1, is the file `bench_sidecar.py` uses: ~2.2M records), and
   joins all of them into one file `{out}/data-joined/ES.FUT/mbp-10/ES.FUT_joined-{quarters}q.dbn.zst`
   (~2.2M records per quarter: the records of each quarter appended in time order under one metadata header
   that maps every contract, so the joined file has a roll per quarter like a long real file).
2. Builds the sidecar of the first quarter and of the joined file, each with `ensure_sidecar` in a fresh
   interpreter, into an empty directory. Peak RSS is the child's own `ru_maxrss` from `os.wait4` (what
   `RUSAGE_CHILDREN` gives for that one child); a baseline child makes the same imports and does no work.
3. Prints and writes `{out}/bench_sidecar_memory.json`: records, sidecar rows, wall time, peak RSS (and above
   the baseline) per file. Targets (issue 11): the joined file's peak RSS is within 1.3x of the one-quarter
   file's, and under 1.5 GiB. Exit status 0 when both pass.

The built sidecars are removed unless `--keep` (the joined one is about 250 B per snapshot row on disk).

    .venv/bin/python bench/bench_sidecar_memory.py --predecode 1,4 [--out bench/out] [--scale full]

`--predecode N,M,...` measures whole `alpha` processes instead (issue 20, item 6: total RSS, not only anonymous
memory): it generates (or reuses) `max(N, M, ...)` `--scale full` ES.FUT quarters of both schemas with
`alpha demo-data` under `{out}/predecode-data/all/`, hard-links the first N quarters into `q{N}/`, and for each N
runs, each in a fresh process timed from exec to exit: `alpha predecode` into an empty cache (build), the same
again (every sidecar reused) and `alpha folds --cv-n-folds 1` (N >= 2), reading the files' timestamps and then
with `--predecoded-dir` (from the sidecars' meta). Peak RSS is the process's `ru_maxrss`
(anonymous and file-backed pages alike: a memory map that stays touched counts). Targets: every predecode's
peak RSS under 500 MB, and the largest N's within 1.3x of the smallest's. It writes
`{out}/bench_sidecar_memory_predecode.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_sidecar import alpha_cli, machine_info, mib, run_child, run_process, worker_baseline, worker_build

REPO = Path(__file__).resolve().parents[1]
SYMBOL, SEED = "ES.FUT", 7
RATIO_TARGET = 1.3
PEAK_TARGET = 1.5 * 2**30
PREDECODE_PEAK_TARGET = 500e6  # issue 20: total RSS below 500 MB from 1 to 4 full quarters


def worker_generate(a: argparse.Namespace) -> dict:
    from alpha_core.data.demo import generate_demo_data

    t0 = time.perf_counter()
    paths = generate_demo_data(Path(a.dir), scale=a.scale, seed=SEED, symbols=[SYMBOL], quarters=a.quarters)
    return {"seconds": time.perf_counter() - t0, "paths": [str(p) for p in paths]}


def worker_join(a: argparse.Namespace) -> dict:
    """Append the records of the quarter files (in time order) under one metadata header mapping every contract."""
    from dataclasses import dataclass

    import databento_dbn as dbn
    import zstandard

    from alpha_core.data.dbn import read_info

    @dataclass
    class Interval:  # what databento_dbn.Metadata reads from a mapping interval
        start_date: object
        end_date: object
        symbol: str

    @dataclass
    class Mapping:
        raw_symbol: str
        intervals: list[Interval]

    t0 = time.perf_counter()
    infos = sorted((read_info(p) for p in a.files.split(",")), key=lambda i: i.start)
    spans: dict[str, list] = {}
    for info in infos:
        for raw, intervals in info.mappings.items():
            for iv in intervals:
                span = spans.setdefault(raw, [iv.start_date, iv.end_date, str(iv.instrument_id)])
                span[0], span[1] = min(span[0], iv.start_date), max(span[1], iv.end_date)
    meta = dbn.Metadata(
        dataset=infos[0].dataset,
        start=infos[0].start,
        end=infos[-1].end,
        stype_in=dbn.SType.PARENT,
        stype_out=dbn.SType.INSTRUMENT_ID,
        schema=dbn.Schema.MBP_10,
        symbols=[SYMBOL],
        mappings=[Mapping(raw, [Interval(*span)]) for raw, span in sorted(spans.items())],
    )
    out = Path(a.dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    with open(tmp, "wb") as fh, zstandard.ZstdCompressor(level=3).stream_writer(fh, closefd=False) as zw:
        zw.write(bytes(meta))
        for info in infos:
            with info.path.open("rb") as src, zstandard.ZstdDecompressor().stream_reader(src) as reader:
                head = reader.read(8)
                reader.read(int.from_bytes(head[4:8], "little"))  # skip this file's metadata
                while block := reader.read(1 << 24):
                    zw.write(block)
    tmp.replace(out)
    return {"seconds": time.perf_counter() - t0, "path": str(out)}


def worker_count(a: argparse.Namespace) -> dict:
    from alpha_core.data.dbn import count_records, read_info

    return {"records": count_records(read_info(a.file))}


def quarter_links(source: Path, n: int, target: Path) -> Path:
    """`target/ES.FUT/{schema}/` holding the first `n` quarters of `source` (hard links, else copies)."""
    for schema_dir in sorted((source / SYMBOL).iterdir()):
        if schema_dir.name not in ("mbp-10", "ohlcv-1m"):
            continue
        dst = target / SYMBOL / schema_dir.name
        dst.mkdir(parents=True, exist_ok=True)
        for path in sorted(schema_dir.glob("*.dbn.zst"))[:n]:
            if not (dst / path.name).exists():
                try:
                    os.link(path, dst / path.name)
                except OSError:
                    shutil.copyfile(path, dst / path.name)
    return target


def predecode_memory(a: argparse.Namespace) -> int:
    """Whole `alpha predecode` (build, then reuse) and `alpha folds` processes over 1..N full quarters."""
    started = time.time()
    out = Path(a.out).resolve()
    counts = sorted({int(n) for n in a.predecode.split(",")})
    root = out / "predecode-data"
    source = root / "all"
    have = len(list((source / SYMBOL / "mbp-10").glob("*.dbn.zst"))) if source.exists() else 0
    print(f"# alpha predecode / folds memory vs quarters  ({time.strftime('%Y-%m-%d %H:%M:%S')})", flush=True)
    if have < max(counts):
        print(f"data: alpha demo-data --scale {a.scale} --symbols {SYMBOL} --quarters {max(counts)} ...", flush=True)
        shutil.rmtree(source, ignore_errors=True)
        run_process(
            "demo-data",
            [
                str(alpha_cli()),
                "demo-data",
                "--scale",
                a.scale,
                "--symbols",
                SYMBOL,
                "--quarters",
                str(max(counts)),
                "--output-dir",
                str(source),
            ],
        )
    baseline = run_process("baseline", [sys.executable, "-c", "import alpha_core.cli"])[1]
    results: dict[str, dict] = {}
    for n in counts:
        data = quarter_links(source, n, root / f"q{n}")
        cache = Path(tempfile.mkdtemp(prefix="predecode-memory-", dir=out))
        try:
            row: dict[str, dict] = {}
            cmd = [str(alpha_cli()), "predecode", "--quiet", "--data-dir", str(data), "--output-dir", str(cache)]
            for phase in ("build", "reuse"):
                stdout, usage = run_process(f"predecode {phase} q{n}", cmd)
                statuses = sorted({line.split()[0] for line in stdout.splitlines() if line.strip()})
                row[phase] = {**usage, "statuses": statuses, "files": len(stdout.splitlines())}
            if n >= 2:
                folds = [str(alpha_cli()), "folds", "--data-dir", str(data / SYMBOL), "--cv-n-folds", "1", "--json"]
                row["folds"] = run_process(f"folds q{n}", folds)[1]
                try:  # planned from the sidecars' meta (an option older trees do not have)
                    row["folds_from_sidecars"] = run_process(
                        f"folds q{n} (sidecars)", [*folds, "--predecoded-dir", str(cache)]
                    )[1]
                except SystemExit:
                    row["folds_from_sidecars"] = None
            rows = sum(json.loads(m.read_text())["rows"] for m in cache.rglob("meta.json"))
            row["sidecar_rows"] = rows
            row["sidecar_bytes"] = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
            results[f"q{n}"] = row
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        r = results[f"q{n}"]
        print(
            f"q{n}: {r['sidecar_rows']:,} rows; predecode build {mib(r['build']['peak_rss_bytes'])} "
            f"({r['build']['cpu_seconds']:.1f} CPU s), reuse {mib(r['reuse']['peak_rss_bytes'])} "
            f"({r['reuse']['cpu_seconds']:.2f} CPU s)"
            + (f", folds {r['folds']['cpu_seconds']:.2f} CPU s" if "folds" in r else "")
            + (f" ({r['folds_from_sidecars']['cpu_seconds']:.2f} from the sidecars)" if r.get("folds_from_sidecars") else ""),
            flush=True,
        )
    first, last = results[f"q{counts[0]}"], results[f"q{counts[-1]}"]
    ratio = last["build"]["peak_rss_bytes"] / first["build"]["peak_rss_bytes"]
    worst = max(max(r["build"]["peak_rss_bytes"], r["reuse"]["peak_rss_bytes"]) for r in results.values())
    targets = {
        "predecode_peak_rss_bytes": {
            "value": worst,
            "target": f"< {PREDECODE_PEAK_TARGET / 1e6:.0f} MB",
            "pass": worst < PREDECODE_PEAK_TARGET,
        },
        f"predecode_peak_rss_q{counts[-1]}_vs_q{counts[0]}": {
            "value": ratio,
            "target": f"<= {RATIO_TARGET}",
            "pass": ratio <= RATIO_TARGET,
        },
    }
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "alpha_core": str(REPO),
        "machine": machine_info({}, None),
        "baseline_import_peak_rss_bytes": baseline["peak_rss_bytes"],
        "results": results,
        "targets": targets,
        "all_targets_pass": all(t["pass"] for t in targets.values()),
    }
    (out / "bench_sidecar_memory_predecode.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"baseline (python -c 'import alpha_core.cli'): {mib(baseline['peak_rss_bytes']).strip()}")
    for name, t in targets.items():
        v = t["value"]
        shown = f"{v / 1e6:.0f} MB" if v > 100 else f"{v:.3f}"
        print(f"  [{'PASS' if t['pass'] else 'FAIL'}] {name:34s} {shown:>10s}  (target {t['target']})")
    print(f"json: {out / 'bench_sidecar_memory_predecode.json'}   (total {time.time() - started:.0f} s)")
    return 0 if report["all_targets_pass"] else 1


WORKERS = {
    "generate": worker_generate,
    "join": worker_join,
    "count": worker_count,
    "baseline": worker_baseline,
    "build": worker_build,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "bench" / "out"), help="output folder (data, sidecars, json)")
    ap.add_argument("--quarters", type=int, default=10, help="demo quarters joined into the large file")
    ap.add_argument("--scale", default="full", help="demo scale of each quarter (full: ~2.2M records)")
    ap.add_argument("--keep", action="store_true", help="keep the built sidecars")
    ap.add_argument("--predecode", metavar="N,M", help="whole `alpha predecode`/`folds` processes over N, M quarters")
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--file", help=argparse.SUPPRESS)
    ap.add_argument("--files", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--stages", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(WORKERS[a.worker](a)))
        return 0
    if a.predecode:
        return predecode_memory(a)

    started = time.time()
    out = Path(a.out).resolve()
    data_dir = out / "data"
    quarter_files = [data_dir / SYMBOL / "mbp-10" / f"{SYMBOL}_{2024 + k // 4}-Q{k % 4 + 1}.dbn.zst" for k in range(a.quarters)]
    joined = out / "data-joined" / SYMBOL / "mbp-10" / f"{SYMBOL}_joined-{a.quarters}q.dbn.zst"
    print(f"# sidecar build memory vs file size  ({time.strftime('%Y-%m-%d %H:%M:%S')})", flush=True)
    if all(p.exists() for p in quarter_files):
        print(f"data: reusing {len(quarter_files)} quarters under {data_dir}", flush=True)
    else:
        print(f"data: generating --scale {a.scale} {SYMBOL} quarters={a.quarters} under {data_dir} ...", flush=True)
        g = run_child("generate", script=__file__, dir=data_dir, scale=a.scale, quarters=a.quarters)
        print(f"      done in {g['seconds']:.0f} s", flush=True)
    if not joined.exists():
        print(f"data: joining them into {joined} ...", flush=True)
        j = run_child("join", script=__file__, files=",".join(map(str, quarter_files)), dir=joined)
        print(f"      done in {j['seconds']:.0f} s", flush=True)
    files = {"one_quarter": quarter_files[0], "joined": joined}

    print("baseline (same imports, no work) ...", flush=True)
    baselines = [run_child("baseline", script=__file__) for _ in range(3)]
    baseline_rss = statistics.median(b["peak_rss_bytes"] for b in baselines)
    results = {}
    build_root = Path(tempfile.mkdtemp(prefix="sidecar-memory-", dir=out))
    try:
        for name, path in files.items():
            records = run_child("count", script=__file__, file=path)["records"]
            print(f"build {name}: {path.name} ({records:,} records) ...", flush=True)
            target = build_root / name
            target.mkdir()
            r = run_child("build", script=__file__, file=path, dir=target)
            results[name] = {
                "file": str(path),
                "file_bytes": path.stat().st_size,
                "records": records,
                "rows": r["rows"],
                "seconds": r["seconds"],
                "process_wall_seconds": r["process_wall_seconds"],
                "cpu_seconds": r["cpu_seconds"],
                "peak_rss_bytes": r["peak_rss_bytes"],
                "peak_rss_above_baseline_bytes": r["peak_rss_bytes"] - baseline_rss,
                "sidecar_bytes": r["sidecar_bytes"],
            }
            if not a.keep:
                shutil.rmtree(target)
    finally:
        if not a.keep:
            shutil.rmtree(build_root, ignore_errors=True)

    small, big = results["one_quarter"], results["joined"]
    ratio = big["peak_rss_bytes"] / small["peak_rss_bytes"]
    targets = {
        "peak_rss_joined_vs_one_quarter": {"value": ratio, "target": f"<= {RATIO_TARGET}", "pass": ratio <= RATIO_TARGET},
        "peak_rss_joined_bytes": {
            "value": big["peak_rss_bytes"],
            "target": f"< {PEAK_TARGET / 2**20:.0f} MiB",
            "pass": big["peak_rss_bytes"] < PEAK_TARGET,
        },
    }
    versions = {k: baselines[0][k] for k in ("python", "numpy", "databento", "polars")}
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "machine": machine_info(versions, None),
        "baseline_peak_rss_bytes": [b["peak_rss_bytes"] for b in baselines],
        "baseline_peak_rss_median_bytes": baseline_rss,
        "builds": results,
        "targets": targets,
        "all_targets_pass": all(t["pass"] for t in targets.values()),
    }
    (out / "bench_sidecar_memory.json").write_text(json.dumps(report, indent=2) + "\n")

    print()
    print(f"baseline RSS (interpreter + imports, no work): {mib(baseline_rss).strip()}")
    print(f"{'file':14s} {'records':>12s} {'rows':>12s} {'build s':>8s} {'peak RSS':>10s} {'- baseline':>11s}")
    for name, r in results.items():
        print(
            f"{name:14s} {r['records']:12,d} {r['rows']:12,d} {r['seconds']:8.1f} {mib(r['peak_rss_bytes']):>10s} "
            f"{mib(r['peak_rss_above_baseline_bytes']):>11s}"
        )
    for name, t in targets.items():
        v = t["value"]
        shown = f"{v / 2**20:.0f} MiB" if v > 100 else f"{v:.3f}"
        print(f"  [{'PASS' if t['pass'] else 'FAIL'}] {name:34s} {shown:>10s}  (target {t['target']})")
    print(f"json: {out / 'bench_sidecar_memory.json'}   (total {time.time() - started:.0f} s)")
    return 0 if report["all_targets_pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
