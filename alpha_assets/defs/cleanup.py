"""The daily `storage_cleanup`: what crashed writers left on the storage volume (`alpha clean`, alpha_core.cleanup).

It cleans only what alpha wrote, under a root holding alpha's marker (every run writes it, `StorageRoot.marked`): a
misconfigured ALPHA_STORAGE_ROOT (a home or a shared volume) fails the run, naming the root, with nothing removed."""

from pathlib import Path

import dagster as dg

from alpha_assets.failures import fail_without_retry
from alpha_assets.resources import StorageRoot


@dg.op(description="Remove stale temporaries, abandoned locks, week-old unfinished attempts and dead hyperopt trials")
def clean_storage(context: dg.OpExecutionContext, storage: StorageRoot) -> dg.Output[int]:
    from alpha_core.cleanup import clean

    with fail_without_retry():  # a root that is not alpha's: one line naming it
        removed = clean([Path(storage.root)])
    for removal in removed:
        context.log.info(f"removed {removal.path}: {removal.reason}")
    return dg.Output(
        len(removed), metadata={"removed": len(removed), "paths": dg.MetadataValue.json([str(r.path) for r in removed[:200]])}
    )


@dg.job(description="What crashed writers left on the storage volume, never what a live writer holds")
def storage_cleanup():
    clean_storage()


cleanup_schedule = dg.ScheduleDefinition(
    job=storage_cleanup,
    cron_schedule="30 3 * * *",
    execution_timezone="America/Chicago",
    default_status=dg.DefaultScheduleStatus.RUNNING,
)


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(jobs=[storage_cleanup], schedules=[cleanup_schedule])
