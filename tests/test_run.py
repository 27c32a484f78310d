"""`alpha run` (the CI trigger) locally: one asset backfill per RUN_ID, run by a daemon it starts, in parallel up to
MAX_PARALLEL, followed to the end; proven from the instance's event log."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from alpha_assets.dagster_private import BACKFILL_TICK_S, daemon_command
from alpha_assets.partitions import symbol_fold_keys

pytestmark = pytest.mark.slow  # Dagster runs, killed processes or a browser: `make check` leaves them out

REPO = Path(__file__).resolve().parents[1]
SMALL = {"seq_len": 16, "batch_size": 64, "n_train_seqs": 256, "n_val_seqs": 128, "device": "cpu", "min_val_auc": 0.0}
RUN_ID = "ci-parallel"
ENDS = (dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE)


def step_intervals(instance: dg.DagsterInstance, run_ids: list[str], step_prefix: str) -> list[tuple[float, float, str]]:
    """(slot taken, step ended, run) per step: the executor takes the pool slot before STEP_WORKER_STARTING and
    frees it after the step's end, so these intervals lie inside the slot's."""
    out = []
    for run_id in run_ids:
        starts, ends = {}, {}
        for entry in instance.all_logs(run_id):
            event = entry.dagster_event
            if event is None or not (entry.step_key or "").startswith(step_prefix):
                continue
            if event.event_type == dg.DagsterEventType.STEP_WORKER_STARTING:
                starts[entry.step_key] = entry.timestamp
            elif event.event_type in ENDS:
                ends[entry.step_key] = entry.timestamp
        assert set(starts) == set(ends), (run_id, starts, ends)
        out += [(starts[k], ends[k], run_id) for k in starts]
    return out


def most_at_once(intervals: list[tuple[float, float, str]]) -> int:
    edges = sorted([(start, 1) for start, _, _ in intervals] + [(end, -1) for _, end, _ in intervals])
    now = peak = 0
    for _, change in edges:  # an end sorts before a start at the same instant
        now += change
        peak = max(peak, now)
    return peak


def test_alpha_run_is_one_backfill_in_parallel_up_to_max_parallel(tiny_data, tmp_path, monkeypatch):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    data = tmp_path / "data"  # ES only: ZN has no data folder, so its data run fails and nothing after it runs
    shutil.copytree(tiny_data / "ES.FUT", data / "ES.FUT")
    storage = tmp_path / "storage"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALPHA_")}
    env |= {
        "DAGSTER_HOME": str(home),
        "ALPHA_DATA_DIR": str(data),
        "ALPHA_STORAGE_ROOT": str(storage),
        "SYMBOLS": "ES.FUT,ZN.FUT",
        "MODELS": "kan",
        "PHASE": "train",
        "EPOCHS": "1",
        "MAX_PARALLEL": "2",
        "RUN_ID": RUN_ID,
    }
    out = subprocess.run(
        [sys.executable, "-m", "alpha_core.cli", "run", "--train-config", json.dumps(SMALL)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    log = out.stdout + out.stderr[-3000:]
    assert out.returncode == 1, log  # ZN.FUT failed
    assert "Traceback" not in out.stderr, log
    assert re.search(r"FAILED\s+ZN\.FUT\s+bar_sidecars, book_sidecars, fold_plans .*ZN\.FUT", out.stdout), log
    for key in symbol_fold_keys("ES.FUT"):
        assert re.search(rf"done\s+{re.escape(key)}\s+checkpoints/kan", out.stdout), (key, log)
    assert re.search(r"backfill \w+: COMPLETED_FAILED, 4 runs done, 1 failed", out.stdout), log
    assert "gpu pool limit 2, cpu_training pool limit 2" in out.stdout, log  # MAX_PARALLEL; dagster.yaml's default
    daemon_pid = int(re.search(r"started dagster-daemon \(pid (\d+)\)", out.stdout).group(1))
    assert not Path(f"/proc/{daemon_pid}").exists(), "the daemon alpha run started is stopped again"

    monkeypatch.setenv("DAGSTER_HOME", str(home))
    instance = dg.DagsterInstance.get()
    (backfill,) = instance.get_backfills()
    assert backfill.title == "alpha run ci-parallel (train: ES.FUT, ZN.FUT)"
    assert backfill.tags == {"alpha/run_id": RUN_ID, "alpha/trigger": "alpha-run"}
    assert backfill.run_config["ops"]["checkpoints__kan"]["config"] == {"epochs": 1, **SMALL}
    runs = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": backfill.backfill_id}))
    assert len(runs) == 5 and all(r.tags["alpha/run_id"] == RUN_ID and r.tags["alpha/trigger"] == "alpha-run" for r in runs)
    training = [r for r in runs if r.asset_selection == {dg.AssetKey(["checkpoints", "kan"])}]
    assert sorted(r.tags["dagster/partition"] for r in training) == symbol_fold_keys("ES.FUT")  # none for ZN
    assert instance.event_log_storage.get_concurrency_info("gpu").slot_count == 2

    steps = step_intervals(instance, [r.run_id for r in training], "checkpoints__kan")
    assert len(steps) == 3
    assert most_at_once(steps) == 2, f"overlapping, never more than MAX_PARALLEL: {sorted(steps)}"
    (es_data,) = [r.run_id for r in runs if r.tags["dagster/partition"] == "ES.FUT"]
    ((_, plans_done, _),) = step_intervals(instance, [es_data], "fold_plans")
    assert all(start > plans_done for start, _, _ in steps), "dependency order: the folds start after the fold plans"
    folds = storage / RUN_ID / "models" / "kan" / "ES.FUT"
    assert sorted(p.name for p in folds.iterdir() if p.name.startswith("fold-")) == ["fold-0", "fold-1", "fold-2"]


def test_the_local_daemon_is_dagsters_cli_with_a_short_backfill_tick():
    """`alpha run`'s daemon is `dagster-daemon run` with the constant its backfill loop sleeps on set to a few
    seconds (Dagster 1.13 has no setting for it). The loop reads the constant each time it starts, which is what
    makes the assignment take: an upgrade that reads it elsewhere would bring back 30 s waits at each level."""
    import inspect

    from dagster._daemon import backfill

    source = inspect.getsource(backfill.execute_backfill_iteration_loop)
    assert "from dagster._daemon.controller import DEFAULT_DAEMON_INTERVAL_SECONDS" in source
    command = daemon_command(Path("workspace.yaml"))
    assert f"DEFAULT_DAEMON_INTERVAL_SECONDS = {BACKFILL_TICK_S}" in command[2] and BACKFILL_TICK_S < 30
    shown = subprocess.run([*command[:3], "run", "--help"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "--workspace" in shown.stdout, shown.stderr


def test_dry_run_prints_the_backfill_and_refuses_an_unknown_symbol(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALPHA_")}
    base = [sys.executable, "-m", "alpha_core.cli", "run", "--dry-run"]
    ok = subprocess.run(
        base
        + [
            "--symbols",
            "ES.FUT",
            "--models",
            "kan,tft",
            "--phase",
            "full",
            "--run-id",
            "r1",
            "--epochs",
            "3",
            "--hyperopt-trials",
            "4",
            "--max-parallel",
            "5",
        ],
        cwd=tmp_path,
        env=env | {"PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr[-3000:]
    plan = json.loads(ok.stdout[ok.stdout.index("{") :])
    assert plan["tags"] == {"alpha/run_id": "r1", "alpha/trigger": "alpha-run"} and plan["max_parallel"] == 5
    targets = {t["asset"]: t["partitions"] for t in plan["targets"]}
    assert targets == {
        "book_sidecars": ["ES.FUT"],
        "bar_sidecars": ["ES.FUT"],
        "fold_plans": ["ES.FUT"],
        "hyperopt/tft": ["ES.FUT"],
        "checkpoints/kan": symbol_fold_keys("ES.FUT"),
        "checkpoints/tft": symbol_fold_keys("ES.FUT"),
        "ensemble_report": ["ES.FUT"],
    }
    assert plan["run_config"]["ops"] == {
        "hyperopt__tft": {"config": {"trials": 4}},
        "checkpoints__kan": {"config": {"epochs": 3}},
        "checkpoints__tft": {"config": {"epochs": 3}},
        "ensemble_report": {"config": {"models": ["kan", "tft"]}},
    }
    assert list(tmp_path.iterdir()) == [], "a dry run writes nothing"
    # it tells before it spends: the plan's size and where it runs (this CI host has no GPU)
    assert "plan: 11 asset partitions, 7 GPU step(s) and 4 CPU step(s), epochs 3" in ok.stdout
    assert "warning: 7 GPU step(s) planned and this host has no GPU" in ok.stdout

    bad = subprocess.run(
        base + ["--symbols", "ES.FUT,XX.FUT"],
        cwd=tmp_path,
        env=env | {"PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "XX.FUT" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr[-2000:]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"symbols": ["ES.FUT", "XX.FUT"]}, "SYMBOLS: unknown symbol XX.FUT"),
        ({"symbols": []}, "SYMBOLS is empty"),
        ({"models": "nope"}, "nope"),
        ({"phase": "deploy"}, "PHASE must be one of"),
        ({"run_id": "../x"}, "RUN_ID"),
        ({"run_id": "predecoded"}, "RUN_ID='predecoded': 'predecoded' is reserved: the storage root's predecoded/"),
        ({"run_id": "Predecoded"}, "RUN_ID='Predecoded': 'Predecoded' is reserved"),
        ({"max_parallel": 0}, "MAX_PARALLEL must be >= 1"),
        ({"epochs": 0}, "EPOCHS must be >= 1"),
        (
            {"train_config": {"epochz": 1}},
            "--train-config: unknown key 'epochz' \\(did you mean epochs\\?\\); the keys: epochs \\(ge 1\\)",
        ),
        ({"train_config": {"purge_sessions": 1}}, "--train-config: purge_sessions is a fold plan setting, not a step's"),
        ({"fold_config": {"purge_session": 1}}, "--fold-config: unknown key 'purge_session' \\(did you mean purge_sessions"),
        ({"fold_config": {"embargo_sessions": 67}}, "--fold-config: embargo_sessions must be <= 66 \\(got 67\\)"),
        ({"fold_config": {"cv_train_window": "two"}}, "--fold-config: .*cv_train_window"),
        ({"hyperopt_config": {"trials": "many"}}, "--hyperopt-config: .*trials"),
        ({"train_config": {"epochs": 0}}, "--train-config: epochs: .*greater than or equal to 1"),  # as --epochs 0
        ({"hyperopt_config": {"workers": 1000}}, "--hyperopt-config: workers: .*less than or equal to 256"),
        ({"reuse_from": ["../demo"]}, "--reuse-from: '../demo': "),
    ],
)
def test_every_trigger_variable_is_validated_before_anything_is_launched(change, message):
    from alpha_assets import run
    from alpha_core.errors import PlanError

    request = {
        "symbols": ["ES.FUT"],
        "models": "kan,tft",
        "phase": "full",
        "epochs": 1,
        "trials": 1,
        "run_id": "r1",
        "max_parallel": 2,
    } | change
    with pytest.raises(PlanError, match=message):
        run.plan(**request)


def test_the_fold_config_reaches_the_runs_fold_plans_only():
    from alpha_assets import run

    p = run.plan(["ES.FUT"], "kan", "train", 1, None, "r1", fold_config={"purge_sessions": 1, "embargo_sessions": 1})
    assert p.run_config["ops"]["fold_plans"] == {"config": {"purge_sessions": 1, "embargo_sessions": 1}}
    assert "fold_plans" not in run.plan(["ES.FUT"], "kan", "train", 1, None, "r1").run_config.get("ops", {})


def test_the_step_settings_alpha_run_checks_are_the_launchpads():
    from alpha_assets.asset_configs import HyperoptAssetConfig, TrainAssetConfig
    from alpha_core.step_settings import STEP_KEYS

    assert tuple(TrainAssetConfig.model_fields) == STEP_KEYS["checkpoints"]
    assert tuple(HyperoptAssetConfig.model_fields) == STEP_KEYS["hyperopt"]


def test_json_options_must_be_json_objects():
    from alpha_assets.run import parse_json_option
    from alpha_core.errors import PlanError

    assert parse_json_option("--train-config", '{"epochs": 2}') == {"epochs": 2}
    for text in ("{", "[1]"):
        with pytest.raises(PlanError, match="--train-config"):
            parse_json_option("--train-config", text)
