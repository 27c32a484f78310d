"""What `alpha run` says of a failed run, from real runs in an instance: a missed gate is a GATE line with its
metric and threshold and fails the command unless told to report it instead (`make demo`); any other failure,
a failed data check included, is FAILED whatever the flag."""

from __future__ import annotations

import io

import dagster as dg
import pytest

from alpha_assets.backfill import RunState
from alpha_assets.definitions import defs
from alpha_assets.partitions import symbol_fold_key
from alpha_assets.resources import DataRoot, StorageRoot
from alpha_assets.run import LocalBackfill, follow

TINY_TRAIN = {"epochs": 1, "seq_len": 16, "batch_size": 64, "n_train_seqs": 256, "n_val_seqs": 128, "device": "cpu"}


@pytest.fixture(scope="module")
def failures(tiny_data, tmp_path_factory) -> dict[str, str]:
    """`LocalBackfill.failure` of a run whose checkpoint missed its gate and of a run whose data step failed."""
    instance = dg.DagsterInstance.ephemeral()
    assets = list(defs.assets)
    by_key = {a.key.to_user_string(): a for a in assets}
    storage = tmp_path_factory.mktemp("storage")

    def run(selection, partition, config=None):
        return dg.materialize(
            assets,
            selection=[by_key[s] for s in selection],
            partition_key=partition,
            instance=instance,
            run_config=config,
            raise_on_error=False,
            resources={"data": DataRoot(root=str(tiny_data)), "storage": StorageRoot(root=str(storage))},
        )

    assert run(["book_sidecars", "bar_sidecars", "fold_plans"], "ES.FUT").success
    config = {"ops": {"checkpoints__tft": {"config": {**TINY_TRAIN, "min_val_auc": 0.99}}}}
    gate = run(["checkpoints/tft"], symbol_fold_key("ES.FUT", 1), config=config)
    no_data = run(["bar_sidecars"], "ZN.FUT")  # tiny_data has ES.FUT and NQ.FUT only
    # one run, two steps: tft misses its gate, kan fails on a bad setting (a failure no gate explains)
    config["ops"]["checkpoints__kan"] = {"config": {**TINY_TRAIN, "n_train_seqs": 0}}
    mixed = run(["checkpoints/tft", "checkpoints/kan"], symbol_fold_key("ES.FUT", 2), config=config)
    assert not gate.success and not no_data.success and not mixed.success
    backfill = LocalBackfill(instance, "unused")
    return {
        "gate": backfill.failure(gate.run_id),
        "data": backfill.failure(no_data.run_id),
        "mixed": backfill.failure(mixed.run_id),
    }


class FinishedBackfill:
    """A finished backfill: one run done, one failed for `failure`."""

    backfill_id = "test"

    def __init__(self, failure: str) -> None:
        self._failure = failure

    def status(self) -> str:
        return "COMPLETED_SUCCESS"

    def runs(self) -> list[RunState]:
        return [
            RunState("a" * 32, "SUCCESS", "ES.FUT", ("ensemble_report",)),
            RunState("b" * 32, "FAILURE", "ES.FUT|1", ("checkpoints/tft",)),
        ]

    def failure(self, run_id: str) -> str:
        return self._failure


def test_a_missed_gate_names_its_metric_and_fails_the_command_by_default(failures):
    out = io.StringIO()
    assert not follow(FinishedBackfill(failures["gate"]), out=out)
    (line,) = [line for line in out.getvalue().splitlines() if "ES.FUT|1" in line]
    assert line.split()[2] == "GATE", line
    assert "checkpoints/tft validation_gate: tft ES.FUT fold 1: mean validation AUC" in line and "<= 0.99" in line
    assert "Dagster" not in line and "Error" not in line, line
    assert "1 failed or canceled" in out.getvalue()


def test_a_missed_gate_is_reported_when_allowed_but_a_crash_still_fails(failures):
    assert follow(FinishedBackfill(failures["gate"]), out=io.StringIO(), allow_gate_failures=True)
    out = io.StringIO()
    assert not follow(FinishedBackfill(failures["data"]), out=out, allow_gate_failures=True)
    (line,) = [line for line in out.getvalue().splitlines() if "ES.FUT|1" in line]
    assert line.split()[2] == "FAILED", line
    assert failures["data"].startswith("bar_sidecars: ") and "no data directory for ZN.FUT" in failures["data"]
    assert "alpha_core" not in failures["data"], failures["data"]  # the message as the CLI prints it


def test_a_missed_gate_does_not_excuse_another_failure_in_its_run(failures):
    """A missed gate fails its own step too (the partition is Failed); only that step is explained by the gate, so
    a run where another step failed is FAILED, whatever --allow-gate-failures says."""
    assert failures["mixed"].startswith("checkpoints__kan: run config: n_train_seqs must be >= 1"), failures["mixed"]
    assert "checkpoints/tft validation_gate: tft ES.FUT fold 2: mean validation AUC" in failures["mixed"]
    out = io.StringIO()
    assert not follow(FinishedBackfill(failures["mixed"]), out=out, allow_gate_failures=True)
    (line,) = [line for line in out.getvalue().splitlines() if "ES.FUT|1" in line]
    assert line.split()[2] == "FAILED", line


class ProgressingBackfill:
    """A backfill of three runs (four asset partitions) that finish one per poll."""

    backfill_id = "progress"

    def __init__(self) -> None:
        self.polls = 0
        self.plan = [
            RunState("a" * 32, "SUCCESS", "ES.FUT", ("bar_sidecars", "fold_plans")),
            RunState("b" * 32, "SUCCESS", "ES.FUT|0", ("checkpoints/tft",)),
            RunState("c" * 32, "SUCCESS", "ES.FUT", ("ensemble_report",)),
        ]

    def status(self) -> str:
        self.polls += 1
        return "COMPLETED_SUCCESS" if self.polls > len(self.plan) else "REQUESTED"

    def runs(self) -> list[RunState]:
        return self.plan[: self.polls]

    def failure(self, run_id: str) -> str:
        return ""


def test_each_finished_run_says_how_far_the_plan_is_with_an_eta():
    out = io.StringIO()
    assert follow(ProgressingBackfill(), poll_s=0.01, out=out, total=4)
    lines = [line for line in out.getvalue().splitlines() if "(run " in line]
    assert [line.split("(run ")[1].split(")  ")[1].split(",")[0] for line in lines] == [
        "2/4 partitions",
        "3/4 partitions",
        "4/4 partitions",
    ], lines
    assert "ETA " in lines[0] and "ETA " in lines[1] and "ETA" not in lines[2], lines


def test_an_eta_reads_as_a_person_says_it():
    from alpha_assets.run import duration

    assert [duration(s) for s in (4.4, 65, 3600 * 2 + 300)] == ["4 s", "1 min 05 s", "2 h 05 min"]
