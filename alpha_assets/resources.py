"""Where data comes from and where artifacts go; both from the environment, overridable per run."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from alpha_core.storage import PREDECODED, run_id_problem


class DataRoot(dg.ConfigurableResource):
    """Raw DBN files, one folder per symbol (`{root}/ES.FUT/...`); read-only `/data` in the cluster."""

    root: str

    def symbol_dir(self, symbol: str) -> Path:
        from alpha_core.data.predecode import symbol_dir

        return symbol_dir(self.root, symbol)


class StorageRoot(dg.ConfigurableResource):
    """Everything alpha writes: the sidecar cache and one folder per run (`{root}/{run_id}/...`)."""

    root: str

    def marked(self) -> Path:
        """The root, with the marker that lets `storage_cleanup` and `alpha clean` clean it (written once)."""
        from alpha_core.cleanup import mark_storage_root

        mark_storage_root(self.root)
        return Path(self.root)

    def predecoded_dir(self, symbol: str) -> Path:
        """Content-addressed sidecar cache, shared by every run (a sidecar is built once)."""
        return self.marked() / PREDECODED / symbol

    def run_dir(self, run_id: str) -> Path:
        """`{root}/{run_id}`: the id must be a plain folder name (a tag reaches here from whoever can reach the
        webserver's API; `..` or `/` would write outside the storage root)."""
        if (problem := run_id_problem(run_id)) is not None:
            raise dg.Failure(f"{RUN_ID_TAG}={run_id!r}: {problem}", allow_retries=False)
        return self.marked() / run_id


def default_resources() -> dict[str, dg.ConfigurableResource]:
    return {
        "data": DataRoot(root=os.environ.get("ALPHA_DATA_DIR", str(Path("data/demo").resolve()))),
        "storage": StorageRoot(root=os.environ.get("ALPHA_STORAGE_ROOT", str(Path("storage").resolve()))),
    }


RUN_ID_TAG = "alpha/run_id"  # the pipeline RUN_ID: every run of one `alpha run` or retrain shares it
REUSE_TAG = "alpha/reuse_from"  # other runs whose checkpoints and searches this run may use, by name, comma-separated
DEFAULT_RUN_ID = "default"  # the run of a Dagster run without the tag (a click in the UI, an automation condition)
TRIGGER_TAG = "alpha/trigger"  # what launched the run: alpha-run, schedule, new-dbn-files, automation


def run_id(context) -> str:
    """The pipeline's RUN_ID: `alpha run` and the retrain sensors tag every step with theirs; a Dagster run without
    the tag (the UI's Materialize, an automation condition) belongs to the run `default`, so that its report finds
    the checkpoints materialized by earlier clicks. The launchpad's tags name another run."""
    return context.run.tags.get(RUN_ID_TAG, DEFAULT_RUN_ID)


def runs_in_scope(context) -> list[str]:
    """This run, then the runs it reuses by name (`alpha run --reuse-from`, the `alpha/reuse_from` tag), in order:
    a report or a checkpoint reads what these runs materialized, and nothing of any other run."""
    reused = [r.strip() for r in context.run.tags.get(REUSE_TAG, "").split(",") if r.strip()]
    return [run_id(context), *[r for r in reused if r != run_id(context)]]
