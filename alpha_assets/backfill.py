"""One backfill of `alpha run`, wherever it runs: what it targets (`Plan`) and what is read back of it (`RunState`,
`describe_failure`).

`alpha_assets.run` builds the Plan and follows its runs, in the local instance (`run.LocalBackfill`) or through a
webserver's GraphQL API (`alpha_assets.remote.RemoteBackfill`); both report a run's state as a `RunState` and why a
run failed with `describe_failure`, so `alpha run` prints the same lines either way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from alpha_assets.resources import REUSE_TAG, RUN_ID_TAG, TRIGGER_TAG
from alpha_core.gates import GATE_CHECK

# the qualified class name Dagster puts before an error's message: alpha's own errors then read as the CLI prints
# them, others keep their class name
QUALIFIED_CLASS = re.compile(r"^alpha_core\.errors\.\w+: |^(\w+\.)+(?=\w+: )")
GATE_REASON = "gate: "  # how a backfill's `failure` starts when only checkpoints' validation gates failed


@dataclass(frozen=True)
class Plan:
    """One backfill: which partitions of which assets, the run config every run gets, and the tags."""

    run_id: str
    phase: str
    symbols: list[str]
    models: list[str]
    max_parallel: int
    targets: dict[str, list[str]]  # asset key (user string) -> partition keys
    run_config: dict = field(default_factory=dict)
    reuse_from: list[str] = field(default_factory=list)  # other runs whose checkpoints and searches it may use

    @property
    def tags(self) -> dict[str, str]:
        reuse = {REUSE_TAG: ",".join(self.reuse_from)} if self.reuse_from else {}
        return {RUN_ID_TAG: self.run_id, TRIGGER_TAG: "alpha-run", **reuse}

    @property
    def title(self) -> str:
        return f"alpha run {self.run_id} ({self.phase}: {', '.join(self.symbols)})"[:100]

    @property
    def description(self) -> str:
        return (
            f"alpha run {self.run_id}: phase {self.phase}, symbols {','.join(self.symbols)}, "
            f"models {','.join(self.models)}, at most {self.max_parallel} GPU steps at once"
        )

    @property
    def size(self) -> int:
        return sum(len(p) for p in self.targets.values())


@dataclass(frozen=True)
class RunState:
    run_id: str
    status: str  # DagsterRunStatus value
    partition: str
    assets: tuple[str, ...]


def run_state(run_id: str, status: str, tags: dict, assets) -> RunState:
    return RunState(run_id, status, tags.get("dagster/partition", "-"), tuple(sorted(assets)))


def describe_failure(missed_checks: list[tuple[str, str, str | None]], failures: list[tuple[str, str | None]]) -> str:
    """Why a run failed, as `alpha run` prints it: its failed blocking checks, (asset, check, description), each
    naming its metric and threshold, prefixed GATE_REASON when only validation gates failed (a failed blocking check
    also fails its asset's step, which it explains); any other failed step, (step, error), comes first with the
    first line of its own error, without the qualified class name Dagster puts in front."""
    explained = {asset.replace("/", "__") for asset, _, _ in missed_checks}  # the op of asset a/b is a__b
    others = [
        f"{step}: {QUALIFIED_CLASS.sub('', (error or 'failed').strip().splitlines()[0])}"
        for step, error in failures
        if step not in explained
    ]
    checks = [f"{asset} {check}: {description}" for asset, check, description in missed_checks]
    gates_only = bool(checks) and not others and all(check == GATE_CHECK for _, check, _ in missed_checks)
    return (GATE_REASON if gates_only else "") + "; ".join(others + checks)
