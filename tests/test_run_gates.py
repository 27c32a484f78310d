"""`alpha run` exits non-zero when a checkpoint misses its gate, unless told to report it instead (`make demo`)."""

from __future__ import annotations

import io

from alpha_assets.run import RunState, follow


class FinishedBackfill:
    """A finished backfill as the daemon leaves it: one run done, one failed by its blocking gate check."""

    backfill_id = "test"

    def __init__(self, failure: str) -> None:
        self._failure = failure

    def status(self) -> str:
        return "COMPLETED_SUCCESS"

    def runs(self) -> list[RunState]:
        return [RunState("a" * 32, "SUCCESS", "ES.FUT", ("ensemble_report",)),
                RunState("b" * 32, "FAILURE", "ES.FUT|1", ("checkpoints/ppo",))]

    def failure(self, run_id: str) -> str:
        return self._failure


GATE = "checkpoints__ppo: dagster._core.errors.DagsterAssetCheckFailedError: 1 blocking asset check failed"


def test_a_missed_gate_fails_the_command_by_default():
    out = io.StringIO()
    assert not follow(FinishedBackfill(GATE), out=out)
    assert "GATE" in out.getvalue() and "1 failed or canceled" in out.getvalue()


def test_a_missed_gate_is_reported_when_allowed_but_a_crash_still_fails():
    assert follow(FinishedBackfill(GATE), out=io.StringIO(), allow_gate_failures=True)
    assert not follow(FinishedBackfill("checkpoints__ppo: DataError: x.dbn: record 3: bid_px_00 is 0"),
                      out=io.StringIO(), allow_gate_failures=True)
