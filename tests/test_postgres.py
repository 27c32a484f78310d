"""The production instance config is real: deploy/dagster.yaml's PostgreSQL storage against a live server."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import dagster as dg
import pytest
import yaml

from alpha_assets.defs.data import bar_sidecars, book_sidecars, fold_plans
from alpha_assets.resources import DataRoot, StorageRoot

pytestmark = pytest.mark.slow  # Dagster runs, killed processes or a browser: `make check` leaves them out

REPO = Path(__file__).resolve().parents[1]


def postgres_bin() -> Path:
    """The newest Debian PostgreSQL server's binaries, whatever its major version (scripts/test-deps.sh installs one)."""
    found = sorted(Path("/usr/lib/postgresql").glob("[0-9]*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if not found:
        pytest.fail("PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin: run scripts/test-deps.sh")
    return found[-1].parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def postgres():
    """A throwaway PostgreSQL cluster on loopback, as the `postgres` user when we are root (initdb refuses root)."""
    bin_ = postgres_bin()
    data = Path(tempfile.mkdtemp(prefix="alpha-pg-"))  # pytest's tmp dirs are private to their owner
    as_pg = []
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
        as_pg = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    subprocess.run(
        [*as_pg, str(bin_ / "initdb"), "-D", str(data), "-U", "alpha", "--auth=trust"], check=True, capture_output=True
    )
    subprocess.run(
        [
            *as_pg,
            str(bin_ / "pg_ctl"),
            "-D",
            str(data),
            "-w",
            "-l",
            str(data / "log"),
            "-o",
            f"-p {port} -c listen_addresses=127.0.0.1 -k {data}",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        subprocess.run(
            [*as_pg, str(bin_ / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "alpha", "dagster"],
            check=True,
            capture_output=True,
        )
        yield port
    finally:
        subprocess.run([*as_pg, str(bin_ / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


def test_materialization_against_the_production_storage_settings(postgres, tiny_data, tmp_path, monkeypatch):
    production = yaml.safe_load((REPO / "deploy" / "dagster.yaml").read_text())
    home = tmp_path / "home"
    home.mkdir()
    for key, value in {
        "DAGSTER_PG_USERNAME": "alpha",
        "DAGSTER_PG_PASSWORD": "unused",
        "DAGSTER_PG_HOST": "127.0.0.1",
        "DAGSTER_PG_DB": "dagster",
    }.items():
        monkeypatch.setenv(key, value)
    production["storage"]["postgres"]["postgres_db"]["port"] = postgres  # the throwaway server's port
    # the production storage section (the K8sRunLauncher needs a cluster; runs here are in-process)
    (home / "dagster.yaml").write_text(yaml.safe_dump({"storage": production["storage"]}))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dg.DagsterInstance.get() as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        result = dg.materialize(
            [book_sidecars, bar_sidecars, fold_plans],
            partition_key="ES.FUT",
            instance=instance,
            resources={"data": DataRoot(root=str(tiny_data)), "storage": StorageRoot(root=str(tmp_path / "storage"))},
        )
        assert result.success
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("fold_plans"), asset_partitions=["ES.FUT"]), limit=1
        ).records
        assert records and records[0].run_id == result.run_id
