"""`dg dev` serves the assets and materializes a partition launched through GraphQL (as the UI does)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import dagster as dg
import pytest
from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

from alpha_assets import run as alpha_run

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render(url: str, profile: Path) -> str:
    """The page's DOM after its scripts ran, from Debian's headless Chromium (scripts/test-deps.sh installs it)."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("Debian's chromium is needed for the UI test: run scripts/test-deps.sh")
    out = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--virtual-time-budget=20000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120,
    )
    return out.stdout


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def test_dg_dev_launches_a_partition_run(tiny_data, tmp_path, monkeypatch):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "ALPHA_DATA_DIR": str(tiny_data),
           "ALPHA_STORAGE_ROOT": str(tmp_path / "storage")}
    dg_exe = Path(sys.executable).with_name("dg")
    log = (tmp_path / "dg-dev.log").open("w")
    server = subprocess.Popen([str(dg_exe), "dev", "-p", str(port), "-h", "127.0.0.1"], cwd=REPO, env=env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def up():
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2).status == 200
            except OSError:
                assert server.poll() is None, (tmp_path / "dg-dev.log").read_text()[-3000:]
                return False

        wait_for(up, 180, "the webserver")
        client = DagsterGraphQLClient("127.0.0.1", port_number=port)

        def submit():
            try:
                return client.submit_job_execution(
                    "__ASSET_JOB",
                    repository_location_name="alpha",
                    asset_selection=[["book_sidecars"], ["bar_sidecars"], ["fold_plans"]],
                    tags={"dagster/partition": "NQ.FUT", "alpha/trigger": "test"},
                )
            except DagsterGraphQLClientError:
                return None  # the code location is still loading

        run_id = wait_for(submit, 120, "the code location")
        status = wait_for(
            lambda: (s := client.get_run_status(run_id)) in (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE)
            and s,
            300,
            "the run",
        )
        assert status == dg.DagsterRunStatus.SUCCESS, (tmp_path / "dg-dev.log").read_text()[-3000:]

        # what CI does: `alpha run --remote` launches one backfill through GraphQL and follows it to the end
        small = {"seq_len": 16, "batch_size": 64, "n_train_seqs": 256, "n_val_seqs": 128, "device": "cpu",
                 "min_val_auc": 0.0}
        plan = alpha_run.plan(["NQ.FUT"], "kan", "train", epochs=1, trials=1, run_id="ci-remote", train_config=small)
        assert alpha_run.launch_remote(plan, f"http://127.0.0.1:{port}", poll_s=1.0)

        # the UI itself, in headless Chromium: the asset catalog lists the lineage, an asset shows its partitions
        catalog = render(f"http://127.0.0.1:{port}/assets", tmp_path / "chrome-1")
        assert "book_sidecars" in catalog and "checkpoints" in catalog
        partitions = render(f"http://127.0.0.1:{port}/assets/book_sidecars?view=partitions", tmp_path / "chrome-2")
        assert all(symbol in partitions for symbol in ("ES.FUT", "NQ.FUT", "ZN.FUT", "6E.FUT"))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    assert list((tmp_path / "storage").glob(f"{run_id}/folds/NQ.FUT/fold_plans.json"))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    checks = dg.DagsterInstance.get().get_latest_asset_check_evaluation_record(
        dg.AssetCheckKey(dg.AssetKey("fold_plans"), "fold_leakage")
    )
    # the backfill of `alpha run` rebuilt NQ.FUT's data after the UI's run, so the latest check is either run's
    assert checks is not None and (checks.run_id == run_id
                                   or dg.DagsterInstance.get().get_run_by_id(checks.run_id).tags["alpha/run_id"] == "ci-remote")
    folds = sorted(p.name for p in (tmp_path / "storage" / "ci-remote" / "models" / "kan" / "NQ.FUT").iterdir()
                   if p.name.startswith("fold-"))  # beside them: each fold's .fold-k.attempts
    assert folds == ["fold-0", "fold-1", "fold-2"]
