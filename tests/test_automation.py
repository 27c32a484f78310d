"""Per-symbol schedules and the new-DBN-files sensor, evaluated as the daemon would."""

from __future__ import annotations

import json
import shutil

import dagster as dg

from alpha_assets.automation import new_dbn_files, schedules
from alpha_assets.definitions import defs


def test_one_weekly_schedule_per_symbol_requests_its_partition():
    assert [s.name for s in schedules] == ["retrain_es_fut", "retrain_nq_fut", "retrain_zn_fut", "retrain_6e_fut"]
    es = schedules[0]
    assert es.cron_schedule == "0 2 * * 6" and es.execution_timezone == "America/Chicago"
    request = es(dg.build_schedule_context())
    assert request.partition_key == "ES.FUT" and request.tags["alpha/trigger"] == "schedule"
    defs.resolve_job_def("symbol_data")  # the schedule's job resolves


def test_sensor_requests_data_and_every_fold_of_a_symbol_with_new_files(tiny_data, tmp_path, monkeypatch):
    root = tmp_path / "data"
    shutil.copytree(tiny_data / "ES.FUT", root / "ES.FUT")
    monkeypatch.setenv("ALPHA_DATA_DIR", str(root))
    instance = dg.DagsterInstance.ephemeral()
    first = new_dbn_files(dg.build_sensor_context(instance=instance))
    jobs = sorted((r.job_name, r.partition_key) for r in first.run_requests)
    assert jobs == [("fold_training", "0|ES.FUT"), ("fold_training", "1|ES.FUT"), ("fold_training", "2|ES.FUT"),
                    ("symbol_data", "ES.FUT")]
    cursor = first.cursor
    assert len(json.loads(cursor)["ES.FUT"]) == 10

    again = new_dbn_files(dg.build_sensor_context(instance=instance, cursor=cursor))
    assert isinstance(again, dg.SkipReason)

    shutil.copytree(tiny_data / "NQ.FUT", root / "NQ.FUT")
    shutil.copy(root / "ES.FUT" / "mbp-10" / "ES.FUT_2025-Q1.dbn.zst", root / "ES.FUT" / "mbp-10" / "ES.FUT_2025-Q2.dbn.zst")
    third = new_dbn_files(dg.build_sensor_context(instance=instance, cursor=cursor))
    by_symbol = {r.partition_key for r in third.run_requests if r.job_name == "symbol_data"}
    assert by_symbol == {"ES.FUT", "NQ.FUT"}
    es = next(r for r in third.run_requests if r.partition_key == "ES.FUT")
    assert es.tags["alpha/new-files"] == "mbp-10/ES.FUT_2025-Q2.dbn.zst"
