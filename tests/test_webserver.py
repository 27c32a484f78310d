"""`dg dev` serves the assets and materializes a partition launched through GraphQL (as the UI does), and its
pages show what researchers read: the report's table and plots, and a missed gate as a failed check."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

from alpha_assets import run as alpha_run
from alpha_assets.definitions import defs
from alpha_assets.partitions import symbol_fold_key
from alpha_assets.resources import DataRoot, StorageRoot

REPO = Path(__file__).resolve().parents[1]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        pytest.fail("Debian's chromium is needed for the UI test: run scripts/test-deps.sh")
    return found


def render(url: str, profile: Path) -> str:
    """The page's DOM after its scripts ran, from Debian's headless Chromium (scripts/test-deps.sh installs it)."""
    out = subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=20000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120,
    )
    return out.stdout


# Given to every `interact` script: polls `found()` every 100 ms for up to 30 s, its first truthy value or null.
UNTIL = """async (found) => {
  for (let i = 0; i < 300; i++) { const v = found(); if (v) return v; await new Promise(r => setTimeout(r, 100)); }
  return null;
}"""


def interact(url: str, script: str, profile: Path, timeout: float = 90):
    """Open `url` in headless Chromium and return what `script` returns: an async JS function of `until`, run in the
    loaded page, whose result comes back as JSON.

    For what `--dump-dom` cannot show: content behind a click (a "[Show Markdown]" dialog, a tab). Chromium is
    driven through the DevTools protocol on a pipe (fds 3 and 4: NUL-separated JSON), so no driver is needed.
    """
    to_chrome, from_chrome = os.pipe(), os.pipe()

    def child_fds():  # the protocol's fixed fds; dup first, as the pipes' own fds may be 3 or 4
        read_end, write_end = os.dup(to_chrome[0]), os.dup(from_chrome[1])
        os.dup2(read_end, 3)
        os.dup2(write_end, 4)

    browser = subprocess.Popen([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe",
                                "about:blank"], pass_fds=(3, 4), preexec_fn=child_fds, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(to_chrome[0])
    os.close(from_chrome[1])
    pending, sent, deadline, events = b"", 0, time.monotonic() + timeout, []

    def receive() -> dict:
        nonlocal pending
        while b"\0" not in pending:
            ready, _, _ = select.select([from_chrome[0]], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"chromium did not finish {url} in {timeout} s"
            chunk = os.read(from_chrome[0], 1 << 20)
            assert chunk, "chromium exited"
            pending += chunk
        message, pending = pending.split(b"\0", 1)
        return json.loads(message)

    def call(method: str, session: str | None = None, **params) -> dict:
        nonlocal sent
        sent += 1
        os.write(to_chrome[1], json.dumps({"id": sent, "method": method, "params": params,
                                           **({"sessionId": session} if session else {})}).encode() + b"\0")
        while (reply := receive()).get("id") != sent:
            events.append(reply)
        assert "error" not in reply, f"{method}: {reply['error']}"
        return reply["result"]

    try:
        target = call("Target.createTarget", url="about:blank")["targetId"]
        session = call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        call("Page.enable", session)
        call("Page.navigate", session, url=url)
        while not any(event.get("method") == "Page.loadEventFired" for event in events):
            events.append(receive())
        result = call("Runtime.evaluate", session, expression=f"({script})({UNTIL})", awaitPromise=True,
                      returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")
    finally:
        browser.kill()
        browser.wait()
        os.close(to_chrome[1])
        os.close(from_chrome[0])


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class Webserver:
    port: int
    home: Path
    log: Path
    process: subprocess.Popen

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self) -> str:
        return self.log.read_text()[-3000:]

    def wait_up(self) -> None:
        """Until the webserver answers and has loaded the code location."""
        def up():
            try:
                return urllib.request.urlopen(f"{self.url}/server_info", timeout=2).status == 200
            except OSError:
                assert self.process.poll() is None, self.log_tail()
                return False

        wait_for(up, 180, "the webserver")
        wait_for(lambda: self.graphql('{ assetNodeOrError(assetKey: {path: ["ensemble_report"]}) { __typename } }')
                 ["assetNodeOrError"]["__typename"] == "AssetNode", 120, "the code location")

    def graphql(self, query: str) -> dict:
        request = urllib.request.Request(f"{self.url}/graphql", data=json.dumps({"query": query}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())["data"]


@contextmanager
def dg_dev(tmp_path: Path, data: Path) -> Iterator[Webserver]:
    """`dg dev` on a free port with its own DAGSTER_HOME (the repository's dagster.yaml), stopped on exit.

    It returns at once, so the caller can work while the webserver starts; `wait_up()` before talking to it.
    """
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    env = {**os.environ, "DAGSTER_HOME": str(home), "ALPHA_DATA_DIR": str(data),
           "ALPHA_STORAGE_ROOT": str(tmp_path / "storage")}
    log = tmp_path / "dg-dev.log"
    with log.open("w") as out:
        process = subprocess.Popen([str(Path(sys.executable).with_name("dg")), "dev", "-p", str(port := free_port()),
                                    "-h", "127.0.0.1"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        yield Webserver(port, home, log, process)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def test_dg_dev_launches_a_partition_run(tiny_data, tmp_path, monkeypatch):
    with dg_dev(tmp_path, tiny_data) as server:
        server.wait_up()
        client = DagsterGraphQLClient("127.0.0.1", port_number=server.port)

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
        assert status == dg.DagsterRunStatus.SUCCESS, server.log_tail()

        # what CI does: `alpha run --remote` launches one backfill through GraphQL and follows it to the end
        small = {"seq_len": 16, "batch_size": 64, "n_train_seqs": 256, "n_val_seqs": 128, "device": "cpu",
                 "min_val_auc": 0.0}
        plan = alpha_run.plan(["NQ.FUT"], "kan", "train", epochs=1, trials=1, run_id="ci-remote", train_config=small)
        assert alpha_run.launch_remote(plan, server.url, poll_s=1.0)

        # the UI itself, in headless Chromium: the asset catalog lists the lineage, an asset shows its partitions
        catalog = render(f"{server.url}/assets", tmp_path / "chrome-1")
        assert "book_sidecars" in catalog and "checkpoints" in catalog
        partitions = render(f"{server.url}/assets/book_sidecars?view=partitions", tmp_path / "chrome-2")
        assert all(symbol in partitions for symbol in ("ES.FUT", "NQ.FUT", "ZN.FUT", "6E.FUT"))
    assert list((tmp_path / "storage").glob(f"{run_id}/folds/NQ.FUT/fold_plans.json"))
    monkeypatch.setenv("DAGSTER_HOME", str(server.home))
    checks = dg.DagsterInstance.get().get_latest_asset_check_evaluation_record(
        dg.AssetCheckKey(dg.AssetKey("fold_plans"), "fold_leakage")
    )
    # the backfill of `alpha run` rebuilt NQ.FUT's data after the UI's run, so the latest check is either run's
    assert checks is not None and (checks.run_id == run_id
                                   or dg.DagsterInstance.get().get_run_by_id(checks.run_id).tags["alpha/run_id"] == "ci-remote")
    folds = sorted(p.name for p in (tmp_path / "storage" / "ci-remote" / "models" / "kan" / "NQ.FUT").iterdir()
                   if p.name.startswith("fold-"))  # beside them: each fold's .fold-k.attempts
    assert folds == ["fold-0", "fold-1", "fold-2"]


TINY_TRAIN = {"epochs": 1, "seq_len": 16, "batch_size": 64, "n_train_seqs": 256, "n_val_seqs": 128, "device": "cpu"}

# Run in the page: wait for the overview's metadata (one row per entry, its key in the first cell), read the report's
# tables as shown, then open the equity entry's "[Show Markdown]" and wait for the plot to decode in the dialog.
REPORT_PAGE = """async (until) => {
  const entry = (key) => [...document.querySelectorAll('tr')].find(tr => tr.cells[0]?.textContent.trim() === key);
  const shown = (table) => table && {
    columns: [...table.querySelectorAll('thead th')].map(th => th.textContent.trim()),
    rows: [...table.querySelectorAll('tbody tr')].map(tr => [...tr.cells].map(td => td.textContent.trim())),
  };
  const results = shown(await until(() => entry('results')?.querySelector('table')));
  const excluded = shown(entry('excluded')?.querySelector('table'));
  [...(entry('equity')?.querySelectorAll('a') ?? [])].find(a => a.textContent.trim() === '[Show Markdown]')?.click();
  const plot = await until(() => [...document.querySelectorAll('[role=dialog] img')]
                                     .find(img => img.complete && img.naturalWidth > 0));
  return {results, excluded, dialog: plot?.closest('[role=dialog]')?.innerText ?? null,
          plot: plot && {src: plot.getAttribute('src').slice(0, 22), width: plot.naturalWidth},
          page: document.body.innerText.slice(0, 3000)};
}"""

# The check's "Execution history" tab: one row per evaluation, with its result and partition.
CHECK_HISTORY = """async (until) => {
  (await until(() => [...document.querySelectorAll('[role=tab]')]
                       .find(tab => tab.textContent.trim() === 'Execution history')))?.click();
  const table = await until(() => [...document.querySelectorAll('table')].find(t =>
    [...t.querySelectorAll('thead th')].some(th => th.textContent.trim() === 'Partition')
    && t.querySelectorAll('tbody tr').length >= 2));
  return {columns: table && [...table.querySelectorAll('thead th')].map(th => th.textContent.trim()),
          rows: table && [...table.querySelectorAll('tbody tr')].map(tr => [...tr.cells].map(td => td.textContent.trim())),
          page: document.body.innerText.slice(0, 3000)};
}"""


def test_the_ui_shows_the_report_and_a_missed_gate(tiny_data, tmp_path, monkeypatch):
    """What a researcher reads in `dg dev`: the report's rows and plot on its page, a missed gate as a failed check."""
    with dg_dev(tmp_path, tiny_data) as server:
        # materialize into the webserver's instance while it starts: a missed gate on fold 1, then a fold that
        # passes, then the report over both
        monkeypatch.setenv("DAGSTER_HOME", str(server.home))
        assets = list(defs.assets)
        by_key = {a.key.to_user_string(): a for a in assets}
        resources = {"data": DataRoot(root=str(tiny_data)), "storage": StorageRoot(root=str(tmp_path / "storage"))}
        with dg.DagsterInstance.get() as instance:
            def run(selection, partition, config=None):
                return dg.materialize(assets, selection=[by_key[s] for s in selection], partition_key=partition,
                                      instance=instance, resources=resources, run_config=config, raise_on_error=False,
                                      tags={"alpha/run_id": "ui"})

            def train(fold, min_auc):
                config = {"ops": {"checkpoints__tft": {"config": {**TINY_TRAIN, "min_val_auc": min_auc}}}}
                return run(["checkpoints/tft"], symbol_fold_key("ES.FUT", fold), config)

            assert run(["book_sidecars", "bar_sidecars", "fold_plans"], "ES.FUT").success
            missed = train(1, 0.99)
            assert not missed.success, "the gate cannot be met"
            no_data = run(["bar_sidecars"], "ZN.FUT")  # tiny_data holds ES.FUT and NQ.FUT
            assert not no_data.success
            assert train(0, 0.0).success
            assert run(["ensemble_report"], "ES.FUT", {"ops": {"ensemble_report": {"config": {"models": ["tft"]}}}}).success
        server.wait_up()
        assert server.graphql("{ shouldShowNux }") == {"shouldShowNux": False}, "a sign-up dialog covers the UI"
        # what `alpha run --remote` prints for that run: the gate's metric and threshold, and the run's page
        reason = alpha_run.RemoteBackfill(server.url).failure(missed.run_id)
        assert reason.startswith(alpha_run.GATE_REASON + "checkpoints/tft validation_gate: tft ES.FUT fold 1: "), reason
        assert "mean validation AUC" in reason and "<= 0.99" in reason and reason.endswith(f"/runs/{missed.run_id})")
        reason = alpha_run.RemoteBackfill(server.url).failure(no_data.run_id)
        assert reason.startswith("bar_sidecars: ") and "no data directory for ZN.FUT" in reason, reason
        assert "alpha_core" not in reason and reason.endswith(f"/runs/{no_data.run_id})"), reason

        report = interact(f"{server.url}/assets/ensemble_report", REPORT_PAGE, tmp_path / "chrome-report")
        assert report["results"], f"no results table on the report's page: {report['page']}"
        assert {"row", "sharpe", "dsr"} <= set(report["results"]["columns"])
        models = {row[0] for row in report["results"]["rows"]}
        assert "tft" in models and "ensemble: equal_weight" in models, report["results"]
        excluded = {(row[0], row[2]): row[3] for row in report["excluded"]["rows"]}
        assert excluded[("tft", "1")].startswith("gate failed: mean validation AUC"), report["excluded"]
        plot = report["plot"]
        assert plot and plot["src"] == "data:image/png;base64," and plot["width"] > 0, \
            f"no equity plot behind [Show Markdown]: {(report['dialog'] or report['page'])[:500]}"
        assert "ES.FUT: out-of-sample equity" in report["dialog"]

        checks = interact(f"{server.url}/assets/checkpoints/tft?view=checks&checkDetail=validation_gate",
                          CHECK_HISTORY, tmp_path / "chrome-checks")
        assert checks["rows"], f"no execution history of validation_gate: {checks['page']}"
        partition = checks["columns"].index("Partition")
        executions = {row[partition]: row for row in checks["rows"]}
        assert {key: row[0] for key, row in executions.items()} == {"ES.FUT|1": "Failed", "ES.FUT|0": "Passed"}, \
            checks["rows"]
        assert any("mean validation AUC" in cell and "<= 0.99" in cell for cell in executions["ES.FUT|1"])
