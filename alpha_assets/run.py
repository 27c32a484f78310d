"""`alpha run`: the original system's CI trigger (SYMBOLS, MODELS, PHASE, MAX_PARALLEL, EPOCHS, HYPEROPT_TRIALS, RUN_ID) as ONE
Dagster asset backfill per RUN_ID.

The backfill targets, for the chosen symbols and models, the data assets [symbol], hyperopt [symbol], every fold's
checkpoints [symbol x fold] and the report [symbol]. The backfill daemon runs each partition in its own run, in
dependency order, and as many at once as the run queue and the pools allow: GPU steps hold a slot of the `gpu`
pool, whose limit `alpha run` sets to MAX_PARALLEL (GPU steps across all runs of the instance); training and
hyperopt steps placed on CPU pods (the RL agents, `alpha_assets.execution.placement`) hold slots of the
`cpu_training` pool, whose limit is the instance's (`dagster instance concurrency set cpu_training N`, else
dagster.yaml's default limit; `alpha run` prints it); the other steps hold slots of the `cpu` pool.

Settings reach the runs through the backfill's run config: Dagster gives every run of a backfill the same run
config, and a run ignores the entries of ops it does not contain, so one config carries the epochs and the train
and hyperopt settings of every op. Every run is tagged `alpha/run_id` (all artifacts land under
`{storage}/<RUN_ID>/`) and `alpha/trigger`.

Locally the backfill is written to the instance of $DAGSTER_HOME and run by its daemon: the one of a running
`alpha ui` (or `dg dev`) when it has a live heartbeat, else a `dagster-daemon run` started for as long as `alpha run`
follows the backfill. With `--remote URL` it is launched through the webserver's GraphQL API. Either way `alpha run` prints one
line per run that starts, finishes or fails (with the plan's progress and an ETA), the backfill's UI link at the
end, and fails itself when anything failed.

Here: the plan (`plan`, `describe`), following a backfill (`LocalBackfill`, `follow`, `report_followup`) and
launching it (`launch_local`, `launch_remote`, `print_summaries`). What a backfill targets and reads back is
`alpha_assets.backfill`, a phase's asset partitions `alpha_assets.lineage`, the local daemon `alpha_assets.daemon`,
the GraphQL client `alpha_assets.remote`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from dataclasses import dataclass, replace

import dagster as dg

from alpha_assets.backfill import GATE_REASON, Plan, RunState, describe_failure, run_state
from alpha_assets.daemon import Daemon
from alpha_assets.dagster_private import add_asset_backfill, mark_backfill_canceling
from alpha_assets.execution import CPU_POOL, CPU_TRAINING_POOL, GPU_POOL
from alpha_assets.lineage import PHASES, asset_graph_subset, lineage
from alpha_assets.partitions import SYMBOLS
from alpha_assets.remote import RemoteBackfill
from alpha_assets.resources import StorageRoot, default_resources
from alpha_core import cpus, progress, step_settings
from alpha_core.errors import PlanError, describe_validation_error
from alpha_core.models import registry
from alpha_core.storage import run_id_problem

MAX_PARALLEL = 10  # the original system's default GPU concurrency cap
LOCAL_UI = "http://127.0.0.1:3000"  # where `alpha ui` serves the instance of $DAGSTER_HOME
BACKFILL_TAG = "dagster/backfill"
FINISHED = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}
RUN_WORDS = {
    "STARTING": "running",
    "STARTED": "running",
    "SUCCESS": "done",
    "FAILURE": "FAILED",
    "CANCELING": "canceled",
    "CANCELED": "canceled",
}  # QUEUED / NOT_STARTED print nothing


def plan(
    symbols: list[str],
    models: str,
    phase: str,
    epochs: int | None,
    trials: int | None,
    run_id: str,
    max_parallel: int = MAX_PARALLEL,
    train_config: dict | None = None,
    hyperopt_config: dict | None = None,
    reuse_from: list[str] | None = None,
    fold_config: dict | None = None,
) -> Plan:
    """Validate the request (every error names the variable) and build its backfill."""
    if phase not in PHASES:
        raise PlanError(f"PHASE must be one of {', '.join(PHASES)} (got {phase!r})")
    symbols = list(dict.fromkeys(symbols))
    if not symbols:
        raise PlanError("SYMBOLS is empty")
    unknown = [s for s in symbols if s not in SYMBOLS]
    if unknown:
        raise PlanError(f"SYMBOLS: unknown symbol {', '.join(unknown)} (known: {', '.join(SYMBOLS)})")
    names = list(dict.fromkeys(registry.select(models)))
    if not names:
        raise PlanError("MODELS selects no model")
    if (problem := run_id_problem(run_id)) is not None:
        raise PlanError(f"RUN_ID={run_id!r}: {problem}")
    reuse_from = list(dict.fromkeys(r for r in reuse_from or [] if r != run_id))
    for reused in reuse_from:
        if (problem := run_id_problem(reused)) is not None:
            raise PlanError(f"--reuse-from: {reused!r}: {problem}")
    for name, value in (("MAX_PARALLEL", max_parallel), ("EPOCHS", epochs), ("HYPEROPT_TRIALS", trials)):
        if value is not None and value < 1:
            raise PlanError(f"{name} must be >= 1 (got {value})")
    targets = lineage(symbols, names, phase)
    ops = {}
    for key in targets:
        kind, _, model = key.partition("/")
        if kind == "hyperopt":  # unset values stay the trainers' defaults, as for every other door
            ops[f"hyperopt__{model}"] = {"config": {**({"trials": trials} if trials else {}), **(hyperopt_config or {})}}
        elif kind == "checkpoints":
            ops[f"checkpoints__{model}"] = {"config": {**({"epochs": epochs} if epochs else {}), **(train_config or {})}}
        elif kind == "ensemble_report":  # the models the report must account for
            ops[kind] = {"config": {"models": names}}
        elif kind == "fold_plans" and fold_config:  # the plan every step of the run trains on
            ops[kind] = {"config": fold_config}
    result = Plan(run_id, phase, symbols, names, max_parallel, targets, {"ops": ops} if ops else {}, reuse_from)
    _validate_run_config(result.run_config)
    return result


def _validate_run_config(run_config: dict) -> None:
    """Refuse a bad key, type or value now rather than in every run of the backfill: Dagster's schema check
    (keys, types), then the config classes themselves (their bounds)."""
    import pydantic

    from alpha_assets.asset_configs import HyperoptAssetConfig, TrainAssetConfig
    from alpha_assets.definitions import defs

    def flag(where: str) -> str:
        return next((f for kind, f in step_settings.FLAGS.items() if kind in where), "--train-config")

    for op, entry in run_config.get("ops", {}).items():
        kind = op.partition("__")[0]
        if kind in step_settings.FLAGS:
            step_settings.check_keys(kind, entry["config"])
    try:
        dg.validate_run_config(defs.resolve_implicit_global_asset_job_def(), run_config)
    except dg.DagsterInvalidConfigError as exc:  # the same error repeats for every model: name the first
        error = exc.errors[0]
        raise PlanError(f"{flag(str(error.stack) + error.message)}: {error.message}") from None
    for op, entry in run_config.get("ops", {}).items():
        kind, _, model = op.partition("__")
        if kind == "fold_plans":
            from alpha_assets.defs.data import FoldConfig

            try:
                FoldConfig(**entry["config"])
            except pydantic.ValidationError as exc:
                raise PlanError(f"--fold-config: {describe_validation_error(exc)}") from None
        if kind in ("hyperopt", "checkpoints"):
            try:
                (HyperoptAssetConfig if kind == "hyperopt" else TrainAssetConfig)(**entry["config"])
                step_settings.check(kind, registry.get(model).trainer, entry["config"])
            except pydantic.ValidationError as exc:
                raise PlanError(f"{flag(op)}: {describe_validation_error(exc)}") from None


def spend(p: Plan, remote: bool) -> list[str]:
    """What the plan will spend and where, before it spends it: partitions, GPU and CPU steps, epochs, and a
    warning when GPU steps are planned on a host without a GPU."""
    from alpha_assets.execution import placement

    steps = {"gpu": 0, "cpu": 0}
    for key, partitions in p.targets.items():
        kind, _, model = key.partition("/")
        if kind in ("hyperopt", "checkpoints"):
            steps["gpu" if placement(model).on_gpu else "cpu"] += len(partitions)
        else:
            steps["cpu"] += len(partitions)
    ops = p.run_config.get("ops", {})
    epochs = {(entry.get("config") or {}).get("epochs") for op, entry in ops.items() if op.startswith("checkpoints")}
    epochs_text = ", ".join(str(e or "the trainer's default") for e in epochs) if epochs - {None} else "each trainer's default"
    lines = [
        f"plan: {p.size} asset partitions, {steps['gpu']} GPU step(s) and {steps['cpu']} CPU step(s), epochs "
        f"{epochs_text}, at most {p.max_parallel} GPU steps at once, {'on the remote instance' if remote else 'on this host'}"
    ]
    if steps["gpu"] and not remote:
        import torch

        if not torch.cuda.is_available():
            lines.append(
                f"warning: {steps['gpu']} GPU step(s) planned and this host has no GPU: they run on its CPU, slowly "
                "(fewer --models or --epochs, or --remote to a cluster with GPUs)"
            )
    return lines


def parse_json_option(flag: str, text: str | None) -> dict | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError(f"{flag}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise PlanError(f"{flag}: expected a JSON object, got {type(value).__name__}")
    return value


def default_run_id() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")


def describe(p: Plan) -> str:
    return json.dumps(
        {
            "run_id": p.run_id,
            "title": p.title,
            "description": p.description,
            "tags": p.tags,
            "max_parallel": p.max_parallel,
            "targets": [{"asset": a, "partitions": keys} for a, keys in p.targets.items()],
            "run_config": p.run_config,
        },
        indent=2,
    )


# --- following a backfill ---------------------------------------------------------------------------


class LocalBackfill:
    """A backfill in the local instance; the daemon that runs it is the caller's business."""

    def __init__(self, instance: dg.DagsterInstance, backfill_id: str) -> None:
        self.instance, self.backfill_id = instance, backfill_id

    def status(self) -> str:
        return self.instance.get_backfill(self.backfill_id).status.value

    def runs(self) -> list[RunState]:
        records = self.instance.get_run_records(filters=dg.RunsFilter(tags={BACKFILL_TAG: self.backfill_id}))
        return [
            run_state(
                r.dagster_run.run_id,
                r.dagster_run.status.value,
                r.dagster_run.tags,
                [k.to_user_string() for k in r.dagster_run.asset_selection or ()],
            )
            for r in records
        ]

    def failure(self, run_id: str) -> str:
        checks = [
            entry.dagster_event.asset_check_evaluation_data
            for entry in self.instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
        ]
        missed = [(c.asset_key.to_user_string(), c.check_name, c.description) for c in checks if not c.passed and c.blocking]
        failures = []
        for record in self.instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE):
            data = record.dagster_event.step_failure_data
            if data.user_failure_data is not None and data.user_failure_data.description:
                failures.append((record.step_key, data.user_failure_data.description))  # our dg.Failure's one line
                continue
            error = data.error
            while error is not None and error.cause is not None:  # the user code's error, not Dagster's wrapper
                error = error.cause
            failures.append((record.step_key, error.message if error else None))
        return describe_failure(missed, failures)

    def cancel(self) -> None:
        backfill = self.instance.get_backfill(self.backfill_id)
        if backfill.status.value not in FINISHED:
            mark_backfill_canceling(self.instance, backfill)


@dataclass(frozen=True)
class Outcome:
    """How a followed backfill ended; true when nothing failed (a missed gate counts only without
    `allow_gate_failures`)."""

    ok: bool
    status: str
    gate_misses: int  # runs that failed only because a checkpoint missed its validation gate
    failures: int  # runs that failed otherwise, or were canceled
    runs: tuple[RunState, ...] = ()

    def __bool__(self) -> bool:
        return self.ok


def follow(
    backfill, poll_s: float = 2.0, check=None, out=None, allow_gate_failures: bool = False, total: int | None = None
) -> Outcome:
    """Print one line per run that starts, finishes or fails until the backfill is finished; true if all succeeded.

    A run that failed only because a checkpoint missed its (blocking) gate prints `GATE`; with
    `allow_gate_failures` it does not count as a failure (the report lists the checkpoint as excluded), though
    Dagster shows that partition, and so the backfill, as failed. `check()` returns a reason to give up (the daemon
    died), or None. With `total` (the plan's asset partitions), each finished run's line says how many are
    finished and an ETA, and a bar on a terminal's stderr shows the same."""
    out = out or sys.stdout  # the stdout of the moment (a test's capture replaces it after import)
    started, seen, gates, failures = time.monotonic(), {}, 0, 0
    plan_progress = PlanProgress(total, started)
    while True:
        status = backfill.status()  # before the runs: a finished backfill has launched all of its runs
        runs = sorted(backfill.runs(), key=lambda r: r.run_id)
        for run in runs:
            word = RUN_WORDS.get(run.status)
            if word is None or seen.get(run.run_id) == word:
                continue
            seen[run.run_id] = word
            reason = backfill.failure(run.run_id) if word == "FAILED" else ""
            if word == "FAILED" and reason.startswith(GATE_REASON):
                word, reason = "GATE", reason.removeprefix(GATE_REASON)
            gates += word == "GATE"
            failures += word in ("FAILED", "canceled")
            where = plan_progress.finished(len(run.assets)) if word != "running" else ""
            plan_progress.say(
                f"{time.monotonic() - started:6.0f} s  {word:<8} {run.partition:<10} {', '.join(run.assets)}  "
                f"(run {run.run_id[:8]}){'  ' + where if where else ''}{'  ' + reason if reason else ''}",
                out,
            )
        if status in FINISHED:
            plan_progress.close()
            failed = failures + (0 if allow_gate_failures else gates)
            done = sum(w == "done" for w in seen.values())
            print(
                f"backfill {backfill.backfill_id}: {status}, {done} runs done, {failed} failed or canceled"
                f"{f', {gates} below their gate' if gates else ''} ({time.monotonic() - started:.0f} s)",
                file=out,
                flush=True,
            )
            # Dagster marks a backfill with a gate-failed partition COMPLETED_FAILED: that is no failure of ours
            # when the gate misses are allowed and nothing else failed
            finished = status in ("COMPLETED_SUCCESS", "COMPLETED") or (status == "COMPLETED_FAILED" and gates > 0)
            return Outcome(finished and not failed, status, gates, failures, tuple(runs))
        problem = check() if check else None
        if problem:
            plan_progress.close()
            raise PlanError(problem)
        time.sleep(poll_s)


class PlanProgress:
    """How far a followed backfill is through its plan's asset partitions, with an ETA from the pace so far
    (partitions finished per second since the start: runs overlap, so a mean over the whole run, not per run)."""

    def __init__(self, total: int | None, started: float) -> None:
        self.total, self.started, self.done = total, started, 0
        self.bar = progress.bar(total=total, desc="plan", unit="partition") if total else None

    def finished(self, n_assets: int) -> str:
        """Count a finished run's asset partitions; the line's `k/N partitions, ETA ...` ('' without a total)."""
        if not self.total:
            return ""
        n = max(n_assets, 1)
        self.done = min(self.done + n, self.total)
        self.bar.update(n)
        left = self.total - self.done
        if not left:
            return f"{self.done}/{self.total} partitions"
        elapsed = time.monotonic() - self.started
        return f"{self.done}/{self.total} partitions, ETA {duration(elapsed * left / self.done)}"

    def say(self, line: str, out) -> None:
        if self.bar is not None:
            self.bar.write(line, file=out)  # tqdm clears and redraws its bar around the line
        else:
            print(line, file=out)
        out.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def duration(seconds: float) -> str:
    """`45 s`, `3 min 20 s`, `2 h 05 min`: an ETA as a person reads it."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def report_followup(p: Plan, outcome: Outcome) -> Plan | None:
    """The report partitions a backfill never ran because a checkpoint upstream missed its gate, as a backfill of
    their own; None when there are none.

    Dagster counts every partition downstream of a failed one as failed and does not run it, but the report is
    where a missed gate is listed (under Excluded, with its reason), over the folds that passed. Only after gate
    misses: any other failure stops the lineage as Dagster decided."""
    if not outcome.gate_misses or outcome.failures:
        return None
    ran = {r.partition for r in outcome.runs if "ensemble_report" in r.assets}
    missing = [symbol for symbol in p.targets.get("ensemble_report", []) if symbol not in ran]
    if not missing:
        return None
    ops = {op: entry for op, entry in p.run_config.get("ops", {}).items() if op == "ensemble_report"}
    return replace(
        p, phase="eval", symbols=missing, targets={"ensemble_report": missing}, run_config={"ops": ops} if ops else {}
    )


def _followup_note(p: Plan) -> str:
    return f"the report of {', '.join(p.symbols)}, which Dagster does not run below a missed gate, as its own backfill"


# --- launching: locally (the instance of $DAGSTER_HOME and its daemon) or through a webserver ---------------


def pool_limits(gpu: int, cpu_training: int | None) -> str:
    return f"gpu pool limit {gpu}, {CPU_TRAINING_POOL} pool limit {'none' if cpu_training is None else cpu_training}"


def launch_local(
    p: Plan, instance: dg.DagsterInstance | None = None, poll_s: float = 2.0, allow_gate_failures: bool = False
) -> Outcome:
    """Write the backfill to the local instance, make sure a daemon runs it, follow it to the end (and the report
    it skipped below missed gates, `report_followup`)."""
    if instance is None:
        if not os.environ.get("DAGSTER_HOME"):
            raise PlanError("DAGSTER_HOME is not set: point it at the instance folder (e.g. dagster_home/)")
        instance = dg.DagsterInstance.get()
    instance.event_log_storage.set_concurrency_slots(GPU_POOL, p.max_parallel)
    # every step is a process on this host: the CPU pools scale with its cores, each step gets its share of them
    host = cpus.local_plan(cpus.decide(cpus.cgroup_cpu_limit(), cpus.affinity_cpus(), None), p.max_parallel)
    for pool in (CPU_TRAINING_POOL, CPU_POOL):
        instance.event_log_storage.set_concurrency_slots(pool, host.cpu_pool_limit)
    cpu_limit = instance.event_log_storage.get_concurrency_info(CPU_TRAINING_POOL).limit
    source = LocalBackfill(instance, _add_backfill(instance, p))
    print(
        f"backfill {source.backfill_id} ({p.size} asset partitions) in {instance.root_directory}; "
        f"{pool_limits(p.max_parallel, cpu_limit)}, {CPU_POOL} pool limit {host.cpu_pool_limit}, "
        f"{host.cpus_per_step} CPU thread(s) per step ({cpus.ENV})",
        flush=True,
    )
    daemon = Daemon(instance, {**os.environ, "MAX_PARALLEL": str(p.max_parallel), cpus.ENV: str(host.cpus_per_step)})
    try:
        outcome = follow(source, poll_s, check=daemon.ensure, allow_gate_failures=allow_gate_failures, total=p.size)
        followup, first = report_followup(p, outcome), source.backfill_id
        if followup is not None:
            source = LocalBackfill(instance, _add_backfill(instance, followup))
            print(f"backfill {source.backfill_id}: {_followup_note(followup)}", flush=True)
            report = follow(source, poll_s, check=daemon.ensure, total=followup.size)
            outcome = replace(outcome, ok=outcome.ok and report.ok, failures=outcome.failures + report.failures)
        print(f"In the UI: {LOCAL_UI}/runs/b/{first} (`alpha ui` serves this instance)", flush=True)
        return outcome
    except KeyboardInterrupt:
        source.cancel()
        raise
    finally:
        daemon.stop()


def print_summaries(p: Plan, storage: StorageRoot | None = None) -> None:
    """Each symbol's report of this run in plain text (`alpha_core.eval.report.summary`), as `alpha evaluate` ends."""
    from alpha_core.eval.report import load_report, summary

    storage = storage or default_resources()["storage"]
    for symbol in p.symbols if "ensemble_report" in p.targets else []:
        path = storage.run_dir(p.run_id) / "eval" / symbol / "ensemble_report.json"
        if path.is_file():
            print("\n" + summary(load_report(path), path), flush=True)


def _add_backfill(instance: dg.DagsterInstance, p: Plan) -> str:
    from alpha_assets.definitions import defs

    return add_asset_backfill(
        instance,
        asset_graph_subset(p.targets, defs.resolve_asset_graph()),
        tags=p.tags,
        title=p.title,
        description=p.description,
        run_config=p.run_config,
    )


def launch_remote(p: Plan, url: str, poll_s: float = 5.0, allow_gate_failures: bool = False) -> Outcome:
    remote = RemoteBackfill(url)
    backfill_id = remote.launch(p)
    print(
        f"backfill {backfill_id} ({p.size} asset partitions): {remote.url}/runs/b/{backfill_id}; "
        f"{pool_limits(p.max_parallel, remote.cpu_training_limit())}",
        flush=True,
    )
    try:
        outcome = follow(remote, poll_s, allow_gate_failures=allow_gate_failures, total=p.size)
        followup = report_followup(p, outcome)
        if followup is not None:
            remote = RemoteBackfill(url)
            print(f"backfill {remote.launch(followup)}: {_followup_note(followup)}", flush=True)
            report = follow(remote, poll_s, total=followup.size)
            outcome = replace(outcome, ok=outcome.ok and report.ok, failures=outcome.failures + report.failures)
        print(f"In the UI: {remote.url}/runs/b/{backfill_id}", flush=True)
        return outcome
    except KeyboardInterrupt:
        remote.cancel()
        raise
