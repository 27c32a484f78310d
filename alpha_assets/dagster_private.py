"""Every private Dagster API alpha uses (a `dagster._...` name), each behind one small function, so an upgrade has
one module to check.

Dagster is pinned: pyproject.toml names dagster 1.13.27 and its libraries 0.29.27, constraints.txt pins them and
everything else. None of the names below is public API: a release may move, rename or change them without notice.
Each is imported inside its function, so importing this module loads no private Dagster module (the definitions and
`alpha run` import only what they call; `alpha --help` imports no Dagster at all).

Why each is needed (no public API does it in Dagster 1.13):

- `latest_completed_cron_tick` (`dagster._utils.schedules.get_latest_completed_cron_tick`): the retrain sensors'
  latest RETRAIN_CRON tick, computed as Dagster computes the ticks of its own cron conditions (timezone, DST).
- `make_asset_graph_subset` (`dagster._core.definitions.assets.graph.asset_graph_subset.AssetGraphSubset`): the
  partitions of several assets at once, what an asset backfill and `dg.RunRequest.for_asset_graph_subset` take.
- `add_asset_backfill` (`dagster._core.execution.backfill.PartitionBackfill`, `dagster._core.utils.
  make_new_backfill_id`): `alpha run` writes its backfill to the local instance, as the webserver's
  `launchPartitionBackfill` mutation does.
- `mark_backfill_canceling` (`dagster._core.execution.backfill.BulkActionStatus`): a local `alpha run` that is
  interrupted cancels its backfill, as the webserver's `cancelPartitionBackfill` does (the daemon then cancels
  its runs).
- `daemon_health` (`dagster._daemon.controller.get_daemon_statuses`): whether a live daemon (e.g. `dg dev`'s)
  already runs backfills, so `alpha run` starts no second one.
- `daemon_command` (`dagster._daemon.cli.main`, as `dagster-daemon run`): the daemon `alpha run` starts, run by
  this interpreter, with the backfill daemon's tick (`dagster._daemon.controller.DEFAULT_DAEMON_INTERVAL_SECONDS`,
  30 s and not a setting) shortened to `BACKFILL_TICK_S`: the backfill starts each partition only on a tick, so a
  local run waited up to 30 s at every level of the lineage (data, search, checkpoints, report) with nothing to do.
- `dev_command` (`dagster._cli.dev.dev_command_impl`, what `dg dev` runs, and its `open_ipc_subprocess`): `alpha ui`
  runs `dg dev`'s webserver, code server and daemon, with that daemon started as `daemon_command`'s, so a backfill
  launched from the UI advances on the same 3 s tick as `alpha run`'s.
- `failed_check_evaluations` (`dagster._core.event_api.PartitionKeyFilter`,
  `dagster._core.storage.asset_check_execution_record.AssetCheckExecutionRecordStatus`): the evaluations of one
  partition's failed checks: why a checkpoint of a given run missed its gate, which the report lists.
- `FAILURE_ERROR_PREFIX` (`dagster._core.definitions.events.Failure`): how a step's error names a `dg.Failure`
  in GraphQL (its qualified class name), which `alpha run --remote` strips to print the failure's own line.

On an upgrade (move dagster and its libraries together in pyproject.toml and constraints.txt): check that every
import above still resolves with the same signature and meaning (the release notes, the source of the new
version), and that `dg.Failure`'s module is still `FAILURE_ERROR_PREFIX`'s; then run the tests that reach them:
tests/test_automation.py (cron tick, the retrain sensors' backfill), tests/test_run.py (backfill, daemon),
tests/test_run_gates.py and tests/test_lineage.py (failed gates), tests/test_webserver.py (`--remote`, `alpha ui`'s daemon).
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import dagster as dg

FAILURE_ERROR_PREFIX = "dagster._core.definitions.events.Failure: "  # before a dg.Failure's description in its error


def latest_completed_cron_tick(cron: str, now: dt.datetime, timezone: str) -> dt.datetime:
    """The latest tick of `cron` (in `timezone`) at or before `now`."""
    from dagster._utils.schedules import get_latest_completed_cron_tick

    return get_latest_completed_cron_tick(cron, now, timezone)


def make_asset_graph_subset(subsets_by_key: Mapping[dg.AssetKey, object]):
    """An AssetGraphSubset from each asset's PartitionsSubset."""
    from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset

    return AssetGraphSubset(partitions_subsets_by_asset_key=subsets_by_key)


def add_asset_backfill(
    instance: dg.DagsterInstance, asset_graph_subset, tags: Mapping[str, str], title: str, description: str, run_config: dict
) -> str:
    """Write an asset backfill of `asset_graph_subset` to the instance (its daemon runs it); returns its id."""
    from dagster._core.execution.backfill import PartitionBackfill
    from dagster._core.utils import make_new_backfill_id

    backfill = PartitionBackfill.from_asset_graph_subset(
        backfill_id=make_new_backfill_id(),
        backfill_timestamp=time.time(),
        tags=tags,
        dynamic_partitions_store=instance,
        asset_graph_subset=asset_graph_subset,
        title=title,
        description=description,
        run_config=run_config,
    )
    instance.add_backfill(backfill)
    return backfill.backfill_id


def mark_backfill_canceling(instance: dg.DagsterInstance, backfill) -> None:
    """Set a backfill (`instance.get_backfill`) to CANCELING: the daemon cancels its runs and then the backfill."""
    from dagster._core.execution.backfill import BulkActionStatus

    instance.update_backfill(backfill.with_status(BulkActionStatus.CANCELING))


def daemon_health(instance: dg.DagsterInstance, daemon_types: Iterable[str], tolerance_s: float) -> dict[str, bool]:
    """Daemon type -> whether it posted a heartbeat within its interval + `tolerance_s`."""
    from dagster._daemon.controller import get_daemon_statuses

    statuses = get_daemon_statuses(instance, daemon_types, ignore_errors=True, heartbeat_tolerance_seconds=tolerance_s)
    return {daemon_type: status.healthy for daemon_type, status in statuses.items()}


BACKFILL_TICK_S = 3
# the daemon's main, with the backfill tick shortened: `python -c DAEMON_MAIN run ...` is `dagster-daemon run ...`
DAEMON_MAIN = (
    "import sys, dagster._daemon.controller as controller; "
    f"controller.DEFAULT_DAEMON_INTERVAL_SECONDS = {BACKFILL_TICK_S}; "
    "from dagster._daemon.cli import main; sys.argv[0] = 'dagster-daemon'; main()"
)


def daemon_command(workspace: Path) -> list[str]:
    """`dagster-daemon run -w WORKSPACE`, with this interpreter, its backfill daemon ticking every BACKFILL_TICK_S."""
    return [sys.executable, "-c", DAEMON_MAIN, "run", "-w", str(workspace)]


def dev_command(workspace: Path, port: int, host: str) -> list[str]:
    """`dg dev` on WORKSPACE (webserver, code server, daemon) with this interpreter, its daemon ticking as
    `daemon_command`'s."""
    start = "from alpha_assets.dagster_private import _dev_main; _dev_main()"
    return [sys.executable, "-c", start, str(workspace), str(port), host]


def _dev_main() -> None:
    """`dev_command`'s process: Dagster's `dev` with `dg dev`'s defaults, launching `python -c DAEMON_MAIN` where it
    would launch `python -m dagster._daemon`."""
    import dagster._cli.dev as dev
    from dagster_shared.cli import WorkspaceOpts

    workspace, port, host = sys.argv[1:4]
    launch = dev.open_ipc_subprocess

    def launch_with_short_tick(command: list[str], **kwargs):
        if command[1:3] == ["-m", "dagster._daemon"]:
            command = [command[0], "-c", DAEMON_MAIN, *command[3:]]
        return launch(command, **kwargs)

    dev.open_ipc_subprocess = launch_with_short_tick
    dev.dev_command_impl(
        code_server_log_level="warning",
        log_level="info",
        log_format="colored",
        port=port,
        host=host,
        use_legacy_code_server_behavior=False,
        shutdown_pipe=None,
        verbose=False,
        workspace_opts=WorkspaceOpts(workspace=[workspace]),
    )


def failed_check_evaluations(instance: dg.DagsterInstance, check_key: dg.AssetCheckKey, partition: str, limit: int = 50):
    """The evaluations (AssetCheckEvaluation) of a partition's newest failed executions of a check, newest first."""
    from dagster._core.event_api import PartitionKeyFilter
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

    records = instance.event_log_storage.get_asset_check_execution_history(
        check_key, limit=limit, partition_filter=PartitionKeyFilter(key=partition)
    )
    return [
        r.event.dagster_event.asset_check_evaluation_data
        for r in records
        if r.status == AssetCheckExecutionRecordStatus.FAILED and r.event is not None
    ]
