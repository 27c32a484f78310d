"""How long the `alpha` CLI takes to answer (issue 21 item 1): every command's --help, `alpha models`, a bad flag
and a mistyped command, each run --repeats times as a fresh process of the installed `alpha` console script.

Wall seconds and CPU seconds (user + system of the child, from os.wait4) per run; the table shows the median and
the worst of each. On a machine shared with other work, wall time depends on the neighbours and CPU time hardly
does, so the targets are judged on CPU seconds: --help and a usage error under 1 s, `alpha models` under 2 s.
`--importtime` adds the modules that cost most to import for one command (`python -X importtime`).

    .venv/bin/python bench/bench_cli.py                          # 3 repeats of each (~1 minute once fast)
    .venv/bin/python bench/bench_cli.py --repeats 5 --importtime --json bench/out/bench_cli.json

Exit status 0 when every target holds on the median CPU seconds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = (
    "inspect",
    "predecode",
    "folds",
    "demo-data",
    "train",
    "train-supervised",
    "train-rl",
    "hyperopt",
    "evaluate",
    "clean",
    "run",
    "models",
)
# (label, argv, CPU-second target, expected exit status)
CASES = (
    [("--help", ["--help"], 1.0, 0)]
    + [(f"{c} --help", [c, "--help"], 1.0, 0) for c in COMMANDS]
    + [
        ("models", ["models"], 2.0, 0),
        ("bad flag", ["train-supervised", "--model", "tft", "--data-dir", "d", "--output-dir", "o", "--bogus", "1"], 1.0, 2),
        ("mistyped command", ["trian", "--epochs", "3"], 1.0, 2),
        ("--version", ["--version"], 1.0, 0),
    ]
)


def alpha_exe() -> str:
    exe = Path(sys.executable).with_name("alpha")
    if not exe.exists():
        sys.exit(f"{exe}: no `alpha` console script beside this interpreter (pip install -e .)")
    return str(exe)


def run_once(argv: list[str]) -> tuple[float, float, int]:
    """(wall s, CPU s of the child, exit status) of one fresh `alpha argv` process."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: keep Popen from waiting again
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode


def importtime(argv: list[str], top: int) -> list[tuple[str, float, float]]:
    """The `top` imports by cumulative seconds, (module, self s, cumulative s), of `python -X importtime -m
    alpha_core.cli argv`. A module's cumulative time includes what it imports (indented under it, as Python shows
    it), so the first row of a chain is the import to make lazy."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "alpha_core.cli", *argv], capture_output=True, text=True)
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "[us]" in line:
            continue
        self_us, cumulative_us, name = line[len("import time:") :].split("|")
        rows.append((name[1:].rstrip(), int(self_us) / 1e6, int(cumulative_us) / 1e6))
    return sorted(rows, key=lambda r: -r[2])[:top]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per case (default: %(default)s)")
    parser.add_argument("--importtime", action="store_true", help="also list the costliest imports of a few cases")
    parser.add_argument("--top", type=int, default=12, help="imports listed per case (default: %(default)s)")
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    args = parser.parse_args(argv)

    exe = alpha_exe()
    load = os.getloadavg()
    print(
        f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
        f"{args.repeats} fresh processes of `alpha ...` per case"
    )
    print(f"{'case':26s} {'wall med':>9s} {'wall max':>9s} {'CPU med':>8s} {'CPU max':>8s} {'target':>7s}  exit")
    results, ok = [], True
    run_once([exe, "--help"])  # warm the page cache and bytecode: the first run of a session is not the case here
    for label, case_argv, target, expected in CASES:
        runs = [run_once([exe, *case_argv]) for _ in range(args.repeats)]
        walls, cpus, codes = zip(*runs, strict=True)
        cpu_median = statistics.median(cpus)
        passed = cpu_median < target and set(codes) == {expected}
        ok &= passed
        print(
            f"{label:26s} {statistics.median(walls):9.2f} {max(walls):9.2f} {cpu_median:8.2f} {max(cpus):8.2f} "
            f"{'< ' + format(target, 'g'):>7s}  {','.join(map(str, sorted(set(codes))))}"
            f"{'' if passed else '  MISSED'}"
        )
        results.append(
            {
                "case": label,
                "argv": case_argv,
                "wall_s": list(walls),
                "cpu_s": list(cpus),
                "exit": list(codes),
                "expected_exit": expected,
                "cpu_target_s": target,
                "passed": passed,
            }
        )

    imports = {}
    if args.importtime:
        for case_argv in (["--help"], ["train-supervised", "--help"], ["models"]):
            label = " ".join(case_argv)
            imports[label] = importtime(case_argv, args.top)
            print(f"\nslowest imports of `alpha {label}` (cumulative s, self s; nesting as -X importtime shows it):")
            for name, self_s, cumulative_s in imports[label]:
                print(f"  {cumulative_s:6.3f} {self_s:6.3f}  {name}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "load_average": load,
                    "cpus": os.cpu_count(),
                    "repeats": args.repeats,
                    "cases": results,
                    "importtime": imports,
                },
                indent=2,
            )
        )
    print(f"\n{'every target met' if ok else 'targets MISSED'} (median CPU seconds)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
