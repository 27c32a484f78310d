"""The GPU regression check's report (bench/gpu_check.py): every target gets its figure and PASS or FAIL, and a stage
that failed, timed out or did not run is a FAIL with its reason, never a silent gap."""

from __future__ import annotations

import datetime
import importlib.util
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
sys.modules["gpu_check"] = gpu_check  # its dataclasses look their module up
spec.loader.exec_module(gpu_check)


def _outputs(tmp_path: Path, raw: dict[str, dict], log: str) -> Path:
    with tarfile.open(tmp_path / "raw.tgz", "w:gz") as tar:
        for name, content in raw.items():
            data = json.dumps(content).encode()
            info = tarfile.TarInfo(f"raw/{name}.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (tmp_path / "gpu_check.log").write_text(log)
    return tmp_path


def _job(model: str, wall: float, rc: int = 0, error: str | None = None) -> dict:
    stages = {"data": 0.2, "epochs": wall / 2, "val_score": 0.5}
    return {"id": f"train/{model}/0", "run": True, "result": {"wall_s": wall, "rc": rc, "error": error, "stage_s": stages}}


def test_every_target_is_judged_and_a_missing_figure_fails(tmp_path, capsys):
    ensemble = [_job(m, 8.0) for m in gpu_check.SUPERVISED if m != "liquid"] + [_job("liquid", 0.0, 1, "OOM")]
    out = _outputs(
        tmp_path,
        {
            "b1_fp32": {"modes": [{"sequences_per_s": 3100.0}]},
            "b4096_bf16": {"modes": [{"error": "RuntimeError: index out of bounds"}]},
            "fold_cold": {"marks": [["fit done", 24.0]], "stage_s": {"imports": 3.0, "compile": 12.0, "total": 24.0}},
            "fold_warm": {"marks": [["fit done", 14.0]], "stage_s": {"imports": 3.0, "compile": 2.0, "total": 14.0}},
            "ensemble_fold": {"jobs": ensemble},
            "dqn_fold": {"jobs": [_job("dqn", 44.0)]},
        },
        "\n===== cuda_tests: pytest\nFAILED tests/test_a.py::test_b - x\n1 failed, 30 passed in 99s\n===== b1_fp32: x\n",
    )
    stages = {name: {"rc": 0} for name in gpu_check.DEFAULT_STAGES.split(",")}
    stages["cuda_tests"]["rc"] = 1
    stages["b4096_fp32"] = {"rc": "timeout"}
    fig = gpu_check.figures(out, stages)
    rows = {r["id"]: r for r in gpu_check.verdicts(fig, stages)}
    # each fold's stages, as its trainer recorded them, for the report (issue 33 item 1)
    assert fig["stage_s"]["flagship warm"]["compile"] == 2.0 and fig["stage_s"]["tft"]["val_score"] == 0.5
    assert set(rows) == {"cuda_tests", *(t.id for t in gpu_check.TARGETS)}
    assert rows["cuda_tests"]["blocks"] and "tests/test_a.py::test_b" in rows["cuda_tests"]["note"]
    assert rows["b1_fp32"]["pass"] and rows["fold_cold"]["pass"] and rows["fold_warm"]["pass"]
    assert rows["b4096_bf16"]["result"] == "NO FIGURE" and rows["b4096_bf16"]["blocks"]  # the mode failed: no figure
    assert rows["b4096_fp32"]["blocks"] and "timeout" in rows["b4096_fp32"]["note"]
    liquid = rows["fold_liquid"]
    assert liquid["blocks"] and liquid["note"] == "OOM"  # a failed job's wall time is no figure
    assert rows["ensemble_sum"]["blocks"] and "liquid" in rows["ensemble_sum"]["note"]
    assert rows["dqn_fold"]["pass"]
    gpu_check.report({"stages": stages, "figures": fig, "targets": list(rows.values())})
    printed = capsys.readouterr().out
    assert "stages of flagship cold, s: imports 3.00  compile 12.00  total 24.00" in printed
    assert "BLOCKED by: CUDA test set" in printed


def _figures(
    b1: float | None, fold_cold: float | None, members: float | None, dqn: float | None, warm: float | None = None
) -> dict:
    """A check's `figures` as gpu_check.figures writes them (the records before the two-pod stage have no warm fold)."""
    job = {"rc": 0, "error": None}
    return {
        "cuda_tests": {"passed": 40, "failed": 0, "skipped": 0, "failures": []},
        "b1_fp32": {"sequences_per_s": b1},
        "b4096_bf16": {"sequences_per_s": 420_000.0},
        "b4096_fp32": {"sequences_per_s": 390_000.0},
        "fold_cold": {"fold_s": fold_cold},
        "fold_warm": {"fold_s": warm},
        "ensemble": {
            **{m: {**job, "wall_s": members} for m in gpu_check.SUPERVISED},
            "dqn": {**job, "wall_s": dqn},
        },
    }


def _recorded(results: Path, folder: str, name: str, device: str, commit: str, fig: dict) -> None:
    (results / folder).mkdir(parents=True, exist_ok=True)
    (results / folder / name).write_text(json.dumps({"commit": commit, "device": device, "stages": {}, "figures": fig}))


def test_each_figure_is_compared_with_the_last_one_recorded_on_the_same_card(tmp_path):
    results = tmp_path / "results"
    h200 = "NVIDIA H200 2.11.0+cu130"
    _recorded(results, "h200-2026-12-01", "gpu_check.json", h200, "old", _figures(2000.0, 30.0, 5.0, 40.0))
    # the newest H200 record without a B=1 figure: B=1 is compared with the one before it
    _recorded(results, "h200-2026-12-02b", "gpu_check_call1.json", h200, "c1", _figures(None, 36.0, 6.0, 44.0))
    _recorded(results, "h200-2026-12-02b", "gpu_check_call2.json", h200, "c2", _figures(2300.0, None, None, None))
    _recorded(results, "h200-2026-12-02", "gpu_check.json", h200, "older", _figures(9999.0, 1.0, 1.0, 1.0))
    # another card, newer, much faster: never the H200's baseline
    _recorded(results, "h100-2026-12-05", "gpu_check.json", "NVIDIA H100 80GB HBM3 2.12.0", "h1", _figures(9e9, 1.0, 1.0, 1.0))
    (results / "h200-2026-12-04").mkdir()
    (results / "h200-2026-12-04" / "gpu_check.json").write_text("{not json")  # unreadable: skipped, not fatal

    last = gpu_check.last_recorded(results, "NVIDIA H200")
    assert (last["b1_fp32"]["value"], last["b1_fp32"]["commit"]) == (2300.0, "c2")
    assert (last["fold_cold"]["value"], last["fold_cold"]["commit"]) == (36.0, "c1")
    assert last["ensemble_sum"]["value"] == 6.0 * len(gpu_check.SUPERVISED)
    assert gpu_check.last_recorded(results, "NVIDIA H100 80GB HBM3")["b1_fp32"]["value"] == 9e9

    def judged(fig: dict) -> dict:
        result = {"device": "NVIDIA H200 2.12.0", "gpu": "NVIDIA H200", "stages": {"cuda_tests": {"rc": 0}}, "figures": fig}
        return gpu_check.judge(result, results)

    # within every band (B=1 3% below 2,300; the cold fold 10% above 36 s; each member 15% + 1 s above 6 s):
    # not blocked (the sum 10% above 8 x 6 s), though the goals (B=1 >= 3,000, cold fold < 25 s, DQN < 45 s) are not met
    ok = judged(_figures(2240.0, 39.0, 6.5, 46.0, warm=12.0))
    rows = {r["id"]: r for r in ok["targets"]}
    assert not ok["blocked"]
    assert rows["b1_fp32"]["result"] == rows["fold_cold"]["result"] == rows["dqn_fold"]["result"] == "BELOW GOAL"
    assert rows["fold_tft"]["result"] == "PASS" and rows["ensemble_sum"]["result"] == "PASS"
    assert rows["fold_warm"]["result"] == "PASS" and rows["fold_warm"]["note"] == "first figure on this card"
    # beyond the bands: blocked, and the row says against what
    bad = judged(_figures(2200.0, 40.0, 8.0, 49.0, warm=12.0))
    rows = {r["id"]: r for r in bad["targets"]}
    assert bad["blocked"]
    assert {k for k, r in rows.items() if r["result"] == "REGRESSED"} == {
        "b1_fp32",
        "fold_cold",
        "ensemble_sum",
        "dqn_fold",
        *(f"fold_{m}" for m in gpu_check.SUPERVISED),
    }
    assert "c2" in rows["b1_fp32"]["note"] and rows["b1_fp32"]["last_value"] == 2300.0
    # a card with no record yet: the figures are its first, nothing regressed
    first = gpu_check.judge({"gpu": "NVIDIA B200", "stages": {}, "figures": _figures(2200.0, 20.0, 8.0, 40.0)}, results)
    assert not any(r["result"] == "REGRESSED" for r in first["targets"])


def test_a_check_s_record_is_what_the_next_check_compares_with(tmp_path):
    """The JSON a check writes, committed where it says, is read back by the next check on that card."""
    results = tmp_path / "results"
    result = {"gpu": "NVIDIA H100 80GB HBM3", "device": "NVIDIA H100 80GB HBM3 2.11.0", "stages": {}}
    result |= {"figures": _figures(2500.0, 30.0, 7.0, 44.0), "date": "2026-12-06T04:00:00+00:00"}
    gpu_check.judge(result, results)
    assert gpu_check._slug(result["gpu"]) == "h100" and gpu_check._slug("NVIDIA H200") == "h200"
    where = tmp_path / f"bench/results/{gpu_check._slug(result['gpu'])}-2026-12-06/gpu_check.json"
    where.parent.mkdir(parents=True)
    gpu_check.atomic_text(where, json.dumps(result, default=str))
    last = gpu_check.last_recorded(tmp_path / "bench/results", "NVIDIA H100 80GB HBM3")
    assert last["b1_fp32"]["value"] == 2500.0 and last["dqn_fold"]["value"] == 44.0
    assert not list(where.parent.glob(".*tmp"))


def test_a_check_recorded_later_in_a_folder_of_earlier_calls_is_the_newer(tmp_path):
    """The folder of a day's calls (gpu_check_call3.json, ...) can receive that day's later check as gpu_check.json
    (its `record_as`): the records' own dates order them, so the later check is what the next one compares with."""
    results = tmp_path / "results"
    h100 = "NVIDIA H100 80GB HBM3 2.11.0"
    for name, when, b1 in (("gpu_check_call3.json", "08:46", 3100.0), ("gpu_check.json", "19:39", 3500.0)):
        fig = _figures(b1, 30.0, 6.0, 16.0)
        (results / "h100-2026-12-07").mkdir(parents=True, exist_ok=True)
        record = {"commit": when, "device": h100, "date": f"2026-12-07T{when}:00+00:00", "stages": {}, "figures": fig}
        (results / "h100-2026-12-07" / name).write_text(json.dumps(record))
    assert gpu_check.last_recorded(results, "NVIDIA H100 80GB HBM3")["b1_fp32"]["value"] == 3500.0


def test_a_blocked_check_is_kept_where_no_later_check_compares_with_it(tmp_path, capsys):
    """A check that regressed is committed beside the records, not as the last record: the next check still compares
    with the last passing figures, so a regression cannot widen its own band."""
    results = tmp_path / "bench/results"
    _recorded(
        results, "h100-2026-12-06", "gpu_check.json", "NVIDIA H100 80GB HBM3 2.11.0", "base", _figures(2500.0, 30.0, 7.0, 16.0)
    )
    slow = {"gpu": "NVIDIA H100 80GB HBM3", "commit": "abc1234", "stages": {"cuda_tests": {"rc": 0}}}
    slow = gpu_check.judge(slow | {"figures": _figures(2500.0, 30.0, 7.0, 30.0, 14.0)}, results)
    assert slow["blocked"]
    now = datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)
    slow["record_as"] = gpu_check.record_as(slow, now)
    assert slow["record_as"] == "bench/results/h100-2026-12-07/blocked_check_abc1234.json"
    gpu_check.report(slow | {"figures": slow["figures"] | {"ensemble": {}}})
    assert f"keep this check: commit {slow['record_as']}" in capsys.readouterr().out
    where = tmp_path / slow["record_as"]
    where.parent.mkdir(parents=True)
    gpu_check.atomic_text(where, json.dumps(slow, default=str))
    assert gpu_check.last_recorded(results, "NVIDIA H100 80GB HBM3")["dqn_fold"]["value"] == 16.0
    passing = gpu_check.judge(slow | {"figures": _figures(2500.0, 30.0, 7.0, 16.5, 14.0)}, results)
    assert not passing["blocked"], [r for r in passing["targets"] if r["blocks"]]
    assert gpu_check.record_as(passing, now) == "bench/results/h100-2026-12-07/gpu_check.json"


def test_a_regression_that_a_second_run_does_not_repeat_does_not_block(tmp_path, capsys):
    """A regressed figure is measured again before it blocks: the better run is judged, the row says it was the
    second, and the record the next check reads holds it. A regression that repeats still blocks."""
    results = tmp_path / "bench/results"
    h100 = "NVIDIA H100 80GB HBM3"
    _recorded(results, "h100-2026-12-06", "gpu_check.json", f"{h100} 2.11.0", "base", _figures(3100.0, 20.0, 6.0, 16.0, 12.0))
    first = _figures(3100.0, 20.0, 7.5, 18.5, 12.0)  # the members and DQN beyond their bands (6 x 1.15 + 1; 16 x 1.1)
    result = gpu_check.judge({"gpu": h100, "commit": "abc", "stages": {"cuda_tests": {"rc": 0}}, "figures": first}, results)
    assert result["blocked"]
    again = sorted({r["stage"] for r in result["targets"] if r["result"] == "REGRESSED"} & set(gpu_check.CONFIRMABLE))
    assert again == ["dqn_fold", "ensemble_fold"]

    # the second run: the members within their band, DQN as slow as before
    again_stages = {"ensemble_fold": {"rc": 0}, "dqn_fold": {"rc": 0}}
    result["confirmation"] = {"stages": again_stages, "figures": _figures(None, None, 6.5, 18.4)}
    result = gpu_check.judge(result, results)
    rows = {r["id"]: r for r in result["targets"]}
    assert rows["ensemble_sum"]["result"] == "PASS" and rows["ensemble_sum"]["value"] == 6.5 * len(gpu_check.SUPERVISED)
    assert rows["ensemble_sum"]["note"] == "a second run's (the first: 60.0 s)"
    assert rows["dqn_fold"]["result"] == "REGRESSED" and rows["dqn_fold"]["value"] == 18.4
    assert rows["b1_fp32"]["result"] == "PASS" and rows["b1_fp32"]["note"] == ""  # not measured again: the first run's
    assert result["blocked"] and [r["id"] for r in result["targets"] if r["blocks"]] == ["dqn_fold"]

    # recorded, the check's judged figures are what the next one compares with
    where = results / "h100-2026-12-07" / "gpu_check.json"
    where.parent.mkdir(parents=True)
    gpu_check.atomic_text(where, json.dumps(result, default=str))
    last = gpu_check.last_recorded(results, h100)
    assert last["fold_tft"]["value"] == 6.5 and last["dqn_fold"]["value"] == 18.4 and last["b1_fp32"]["value"] == 3100.0


def test_a_host_of_another_speed_scales_the_cpu_bound_seconds_it_is_judged_against(tmp_path, capsys):
    """The same card on a slower host: each time is judged against its record with the record's CPU-bound seconds
    scaled by the two hosts' probes (all of a member's or DQN's fold; the flagship's fold less its captured epochs),
    the throughputs as recorded. A faster host is held to less time; a record without a probe, to its figure."""
    results = tmp_path / "results"
    recorded = _figures(2300.0, 33.0, 6.0, 16.0, warm=18.0) | {"host_probe_s": 1.0}
    recorded["stage_s"] = {"flagship cold": {"epochs": 12.0}, "flagship warm": {"epochs": 12.0}}
    _recorded(results, "h100-2026-12-06", "gpu_check.json", "NVIDIA H100 80GB HBM3 2.11.0", "base", recorded)
    assert gpu_check.last_recorded(results, "NVIDIA H100 80GB HBM3")["fold_warm"]["captured_epochs_s"] == 12.0

    def judged(probe: float | None, b1=2290.0, cold=44.0, members=9.5, dqn=25.0, warm=21.0) -> dict:
        fig = _figures(b1, cold, members, dqn, warm) | {"host_probe_s": probe}
        result = {"gpu": "NVIDIA H100 80GB HBM3", "stages": {"cuda_tests": {"rc": 0}}, "figures": fig}
        return gpu_check.judge(result, results)

    def regressed(result: dict) -> set[str]:
        return {r["id"] for r in result["targets"] if r["result"] == "REGRESSED"}

    # a host 1.6x slower: a member 6 s -> 9.6, DQN 16 -> 25.6, the cold fold 12 + 21 x 1.6 = 45.6, the warm 21.6
    slow = judged(1.6)
    assert not slow["blocked"], [r for r in slow["targets"] if r["blocks"]]
    rows = {r["id"]: r for r in slow["targets"]}
    assert rows["fold_cold"]["last_on_this_host"] == 45.6 and rows["fold_warm"]["last_on_this_host"] == 21.6
    assert rows["fold_cold"]["note"].startswith("last base: 45.6 s on this host"), rows["fold_cold"]["note"]
    assert "on this host" not in rows["b1_fp32"]["note"]  # a throughput is the card's: never scaled
    assert slow["host"].startswith("host: this machine's CPU probe took 1.60 s against 1.00 s") and "1.60x" in slow["host"]
    # what no host explains still blocks: the captured epochs (GPU-bound) 8 s slower, B=1 throughput 13% lower
    worse = judged(1.6, b1=2000.0, warm=26.0)
    assert regressed(worse) == {"b1_fp32", "fold_warm"}
    note = {r["id"]: r for r in worse["targets"]}["fold_warm"]["note"]
    assert note == "worse than 24.8 s (last base, 21.6 s on this host +- 10% + 1 s)", note
    gpu_check.report(worse | {"figures": worse["figures"] | {"ensemble": {}}})
    assert "1.60x slower" in capsys.readouterr().out
    # a host twice as fast: the record's figures on the slower host are regressions here
    assert regressed(judged(0.5, cold=33.0, members=6.0, dqn=16.0, warm=18.0)) >= {"ensemble_sum", "dqn_fold", "fold_cold"}
    assert "2.00x faster" in judged(0.5)["host"]
    # no probe this time: every figure against the record as it is
    assert regressed(judged(None)) == {
        "fold_cold",
        "ensemble_sum",
        "dqn_fold",
        "fold_warm",
        *(f"fold_{m}" for m in gpu_check.SUPERVISED),
    }
    assert judged(1.1, members=6.0, dqn=16.0)["host"] == "", "within HOST_SLOWER: nothing to say"


def test_a_second_run_from_a_later_call_is_judged_on_its_own_host(tmp_path, capsys):
    """A check whose call had no time left for its second runs gets them from a later call of the same commit
    (`--judge CHECK --second-run LATER`): only the stages it may run again count, their times scaled from the later
    host to the check's by the probes; the judgement is rewritten in the file. Another commit's run is refused."""
    results = tmp_path / "bench/results"
    h100 = "NVIDIA H100 80GB HBM3"
    base = _figures(3100.0, 20.0, 6.0, 16.0, 12.0) | {"host_probe_s": 2.0}
    _recorded(results, "h100-2026-12-06", "gpu_check.json", f"{h100} 2.11.0", "base", base)
    header = {"gpu": h100, "commit": "abc", "date": "2026-12-07T19:00:00+00:00", "stages": {"cuda_tests": {"rc": 0}}}
    # on a host 1.5x slower: the members 9 s -> 10.9 allowed; tggn's 12 s beyond it
    first = _figures(3100.0, 20.0, 9.0, 24.0, 12.0) | {"host_probe_s": 3.0}
    first["ensemble"]["tggn"]["wall_s"] = 12.0
    check = tmp_path / "out" / "gpu_check.json"
    check.parent.mkdir()
    check.write_text(json.dumps(gpu_check.judge(header | {"figures": first}, results)))
    assert [r["id"] for r in json.loads(check.read_text())["targets"] if r["blocks"]] == ["fold_tggn"]

    # the later call, on a host as fast as the record's: tggn 7 s there is 10.5 s on the check's host
    later_fig = _figures(None, 15.0, 7.0, None, None) | {"host_probe_s": 2.0}
    stages = {"members_warmup": {"rc": 0}, "ensemble_fold": {"rc": 0}, "fold_cold": {"rc": 0}}
    later = tmp_path / "later.json"
    later.write_text(json.dumps(header | {"stages": stages, "figures": later_fig}))
    argv = ["gpu_check.py", "--judge", str(check), "--second-run", str(later), "--results-dir", str(results)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", argv)
        assert gpu_check.main() == 0, capsys.readouterr().out
    judged = json.loads(check.read_text())
    rows = {r["id"]: r for r in judged["targets"]}
    assert rows["fold_tggn"]["result"] == "PASS" and rows["fold_tggn"]["value"] == 10.5
    assert rows["fold_tggn"]["note"] == "a second run's (the first: 12.0 s); last base: 9.0 s on this host"
    assert rows["fold_kan"]["value"] == 9.0, "the first run's where it was the better"
    assert rows["fold_cold"]["value"] == 20.0, "a stage that cannot run twice keeps its first figure"
    assert judged["record_as"] == "bench/results/h100-2026-12-07/gpu_check.json" and not judged["blocked"]
    assert "stage ensemble_fold (second run): rc 0" in capsys.readouterr().out

    later.write_text(json.dumps(header | {"commit": "def", "stages": stages, "figures": later_fig}))
    with pytest.MonkeyPatch.context() as mp, pytest.raises(SystemExit, match="a check of def on"):
        mp.setattr(sys, "argv", argv)
        gpu_check.main()


def test_the_members_folds_are_timed_after_a_warm_up_into_their_compile_cache(tmp_path):
    """A fresh machine's first member folds compile their Triton kernels: the check warms them first, by default,
    into the very compile cache root the timed folds then read, as a run's later pods do."""
    stages = {name: (argv, env) for name, _, argv, env in gpu_check.stage_commands(tmp_path)}
    order = gpu_check.DEFAULT_STAGES.split(",")
    assert order.index("members_warmup") < order.index("ensemble_fold")
    warmup, timed = stages["members_warmup"], stages["ensemble_fold"]
    assert warmup[1]["ALPHA_COMPILE_CACHE"] == timed[1]["ALPHA_COMPILE_CACHE"]
    assert warmup[0][warmup[0].index("--jobs") + 1] == timed[0][timed[0].index("--jobs") + 1]
    assert warmup[0][warmup[0].index("--epochs") + 1] == "1" and "--epochs" not in timed[0]


def test_a_check_killed_in_its_last_stage_is_judged_from_what_it_left(tmp_path, capsys):
    """The session's device time can run out mid-check: the call is killed before gpu_check.py writes its JSON or
    archives its raw files. `--judge-outputs` judges the folder it left: the finished stages with their figures, the
    one it was killed in and those it never started without, so the check is blocked and recorded as such."""
    results = tmp_path / "bench/results"
    h100 = "NVIDIA H100 80GB HBM3"
    _recorded(results, "h100-2026-12-06", "gpu_check.json", f"{h100} 2.11.0", "base", _figures(3100.0, 30.0, 6.0, 16.0, 18.0))
    out = tmp_path / "out"
    (out / "raw").mkdir(parents=True)
    (out / "raw" / "b1_fp32.json").write_text(json.dumps({"modes": [{"sequences_per_s": 3500.0}]}))
    (out / "raw" / "fold_cold.json").write_text(json.dumps({"marks": [["fit done", 29.0]], "stage_s": {"total": 29.0}}))
    done = '----- done {}: {{"rc": 0, "wall_s": 20.0, "limit_s": 110}}\n'
    (out / "gpu_check.log").write_text(
        "commit: abc1234\ngpu: NVIDIA H100 80GB HBM3\ntorch: 2.11.0+cu130\ndate: 2026-12-07T17:55:00+00:00\n"
        "stages: cuda_tests,b1_fp32,fold_cold,fold_warm\n"
        "\n===== cuda_tests: pytest (limit 240 s)\n54 passed in 148.83s\n"
        + done.format("cuda_tests")
        + "\n===== b1_fp32: python3 bench/bench_train_gpu.py (limit 110 s)\n"
        + done.format("b1_fp32")
        + "\n===== fold_cold: python3 bench/fold_timeline.py (limit 83 s)\n"
        + done.format("fold_cold")
        + "\n===== fold_warm: python3 bench/fold_timeline.py (limit 44 s)\n"
    )
    argv = ["gpu_check.py", "--judge-outputs", str(out), "--results-dir", str(results)]
    sys.argv, saved = argv, sys.argv
    try:
        assert gpu_check.main() == 1
    finally:
        sys.argv = saved
    result = json.loads((out / "gpu_check.json").read_text())
    rows = {r["id"]: r for r in result["targets"]}
    assert result["commit"] == "abc1234" and result["cut_short"] and result["blocked"]
    assert rows["cuda_tests"]["result"] == "PASS" and rows["b1_fp32"]["result"] == "PASS"
    assert rows["fold_cold"]["result"] == "BELOW GOAL" and not rows["fold_cold"]["blocks"]  # 29 s: no regression
    assert rows["fold_warm"]["result"] == "NO FIGURE" and "killed during fold_warm" in rows["fold_warm"]["note"]
    assert "not among --stages" in rows["dqn_fold"]["note"]
    assert result["record_as"] == "bench/results/h100-2026-12-07/blocked_check_abc1234.json"
    blocked = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("BLOCKED by: "))
    assert "flagship fold at the defaults, pod 2: pod 1's caches" in blocked
