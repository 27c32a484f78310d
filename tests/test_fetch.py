"""`alpha fetch`: the real databento client against a local stand-in of the Historical API (tests/databento_standin.py).

What a user relies on: the cost is shown and bounded before anything is billed; the files land where predecode reads
them, whole or not at all; a kill, a cut connection, a 429 storm, 5xx errors or an expired job end in a one-line
error or a resumed download, never a partial file; a second fetch downloads nothing; the key never leaves the
environment."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from databento_standin import Standin

from alpha_core.cli import main
from alpha_core.data.fetch import quarter_slices

KEY = "db-CANARYk3yNeverPrinted9f2c"  # a canary: no output and no written file may contain it
REPO = Path(__file__).resolve().parents[1]
Q1 = "glbx-mdp3-20240101-20240331"


@pytest.fixture(scope="module")
def served(tmp_path_factory, samples) -> dict:
    """Genuine DBN bytes: two demo quarters of ES.FUT (MBP-10, OHLCV-1m) and a real ES.FUT parent definition file."""
    from alpha_core.data.demo import generate_demo_data

    out = tmp_path_factory.mktemp("served")
    generate_demo_data(out, "tiny", seed=7, symbols=["ES.FUT"], quarters=2)
    data = {}
    for schema in ("mbp-10", "ohlcv-1m"):
        for q, start in ((1, "2024-01-01"), (2, "2024-04-01")):
            data[(schema, start)] = (out / "ES.FUT" / schema / f"ES.FUT_2024-Q{q}.dbn.zst").read_bytes()
    data["definition"] = (samples / "nautilus_trader" / "definition-glbx-es-futspread.dbn.zst").read_bytes()
    return data


@pytest.fixture
def standin(served, tmp_path, monkeypatch):
    s = Standin(KEY, dict(served), tmp_path)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(s.cert))
    monkeypatch.setenv("DATABENTO_API_KEY", KEY)
    yield s
    s.close()


def args(standin: Standin, data: Path, *extra: str, end: str = "2024-04-01") -> list[str]:
    fast = ["--backoff-s", "0", "--max-backoff-s", "0.01", "--poll-s", "0"]
    return [
        "fetch",
        "--symbol",
        "ES",
        "--start",
        "2024-01-01",
        "--end",
        end,
        "--data-dir",
        str(data),
        "--gateway",
        standin.gateway,
        *fast,
        *extra,
    ]


def visible(data: Path) -> list[str]:
    """What a reader of the symbol folder sees (predecode, the new-files sensor)."""
    folder = data / "ES.FUT"
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def no_canary(data: Path, *texts: str) -> None:
    for text in texts:
        assert KEY not in text
    for p in data.rglob("*"):
        if p.is_file():
            assert KEY.encode() not in p.read_bytes(), p


def test_quarters_cut_a_range_at_calendar_boundaries():
    d = dt.date
    assert quarter_slices(d(2024, 2, 15), d(2024, 7, 2)) == [
        (d(2024, 2, 15), d(2024, 4, 1)),
        (d(2024, 4, 1), d(2024, 7, 1)),
        (d(2024, 7, 1), d(2024, 7, 2)),
    ]
    assert quarter_slices(d(2024, 10, 1), d(2025, 1, 1)) == [(d(2024, 10, 1), d(2025, 1, 1))]


def test_fetch_streams_the_layout_predecode_reads_and_a_second_fetch_downloads_nothing(standin, served, tmp_path, capsys):
    data = tmp_path / "data"
    assert main(args(standin, data)) == 0
    out = capsys.readouterr().out
    assert "ES.FUT mbp-10 2024-01-01..2024-03-31: 3.00 USD" in out and "3.60 USD" in out
    assert visible(data) == [
        f"definition/{Q1}.definition.dbn.zst",
        f"mbp-10/{Q1}.mbp-10.dbn.zst",
        f"ohlcv-1m/{Q1}.ohlcv-1m.dbn.zst",
    ]
    assert (data / "ES.FUT" / "mbp-10" / f"{Q1}.mbp-10.dbn.zst").read_bytes() == served[("mbp-10", "2024-01-01")]
    ranges = standin.calls("timeseries.get_range")
    assert [(r[2]["schema"], r[2]["symbols"], r[2]["stype_in"], r[2]["dataset"]) for r in ranges] == [
        (s, "ES.FUT", "parent", "GLBX.MDP3") for s in ("mbp-10", "ohlcv-1m", "definition")
    ]
    assert len(standin.calls("metadata.get_cost")) == 3 and len(standin.calls("metadata.get_billable_size")) == 3

    from alpha_core.data.predecode import predecode

    built = predecode(data / "ES.FUT", tmp_path / "cache", "ES.FUT")  # the definitions are left out
    assert sorted(i.sidecar.meta.source.name for i in built) == [f"{Q1}.mbp-10.dbn.zst", f"{Q1}.ohlcv-1m.dbn.zst"]

    before = len(standin.requests)
    assert main(args(standin, data)) == 0
    out = capsys.readouterr().out
    assert standin.requests[before:] == []  # not even a cost query
    assert out.count("nothing to download") == 3
    no_canary(data, out)


def test_cost_is_refused_above_max_cost_before_anything_is_billed(standin, tmp_path, capsys):
    data = tmp_path / "data"
    assert main(args(standin, data, "--max-cost", "1")) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cost 3.60 USD, above the max cost 1.00 USD" in err and "--max-cost" in err
    assert standin.calls("timeseries.get_range") == [] and standin.calls("batch.submit_job") == []
    assert visible(data) == []
    assert main(args(standin, data, "--max-cost", "1", "--dry-run", "--schemas", "definition")) == 0
    assert visible(data) == [] and standin.calls("timeseries.get_range") == []


def test_batch_route_verifies_the_manifest_and_resumes_a_cut_download(standin, served, tmp_path, capsys):
    data = tmp_path / "data"
    standin.cut_download = True  # the first download ends halfway
    assert main(args(standin, data, "--batch-above-bytes", "0", "--schemas", "mbp-10")) == 0
    assert len(standin.calls("batch.submit_job")) == 1
    sub = standin.calls("batch.submit_job")[0][2]
    assert (sub["stype_in"], sub["schema"], sub["split_duration"], sub["encoding"]) == ("parent", "mbp-10", "none", "dbn")
    downloads = standin.calls("batch/download")
    assert [d[3]["Range"] is not None for d in downloads] == [False, True]
    assert int(downloads[1][3]["Range"].removeprefix("bytes=").split("-")[0]) > 0
    assert visible(data) == [f"mbp-10/{Q1}.mbp-10.dbn.zst"]  # metadata.json of the job is not data
    assert (data / "ES.FUT" / "mbp-10" / f"{Q1}.mbp-10.dbn.zst").read_bytes() == served[("mbp-10", "2024-01-01")]
    assert not list((data / ".fetch" / "ES.FUT" / "jobs").iterdir())  # the job is forgotten once recorded
    no_canary(data, capsys.readouterr().out)


def test_a_file_that_does_not_match_the_manifest_is_discarded(standin, tmp_path, capsys):
    data = tmp_path / "data"
    standin.wrong_hash = True
    assert main(args(standin, data, "--batch-above-bytes", "0", "--schemas", "ohlcv-1m")) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"alpha fetch: error: ES.FUT ohlcv-1m 2024-01-01..2024-03-31: {Q1}.ohlcv-1m.dbn.zst does not match the job "
        "manifest's sha256; discarded, rerun to download it again"
    )
    assert visible(data) == [] and not list((data / ".fetch" / "ES.FUT" / "done").glob("*"))
    standin.wrong_hash = False
    assert main(args(standin, data, "--batch-above-bytes", "0", "--schemas", "ohlcv-1m")) == 0
    assert len(standin.calls("batch.submit_job")) == 1  # the same job, downloaded again
    assert visible(data) == [f"ohlcv-1m/{Q1}.ohlcv-1m.dbn.zst"]


def test_a_rate_limit_storm_and_server_errors_are_retried_within_bounds(standin, tmp_path, capsys):
    data = tmp_path / "data"
    standin.fail("metadata.get_cost", 429, times=4, headers={"Retry-After": "1"})
    standin.fail("timeseries.get_range", 503, times=2)
    assert main(args(standin, data, "--schemas", "ohlcv-1m")) == 0
    out = capsys.readouterr().out
    assert out.count("rate limited (429)") == 4 and out.count("server error (503") == 2
    assert visible(data) == [f"ohlcv-1m/{Q1}.ohlcv-1m.dbn.zst"]

    standin.fail("timeseries.get_range", 429, times=50, headers={"Retry-After": "1"})
    assert main(args(standin, data, "--schemas", "mbp-10", "--max-attempts", "3")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "alpha fetch: error: ES.FUT mbp-10 2024-01-01..2024-03-31: timeseries.get_range: rate limited (429); "
        "gave up after 3 attempts"
    ]
    assert len(standin.calls("timeseries.get_range")) == 2 + 1 + 3
    assert visible(data) == [f"ohlcv-1m/{Q1}.ohlcv-1m.dbn.zst"]  # nothing of mbp-10


def test_an_expired_job_is_one_line_and_keeps_nothing(standin, tmp_path, capsys):
    data = tmp_path / "data"
    standin.expire_jobs = True
    assert main(args(standin, data, "--batch-above-bytes", "0", "--schemas", "mbp-10")) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("alpha fetch: error: ES.FUT mbp-10 2024-01-01..2024-03-31: batch job GLBX-")
    assert "expired before its files were downloaded" in line
    assert visible(data) == [] and not list((data / ".fetch" / "ES.FUT" / "jobs").iterdir())
    standin.expire_jobs = False
    assert main(args(standin, data, "--batch-above-bytes", "0", "--schemas", "mbp-10")) == 0  # a new job
    assert len(standin.calls("batch.submit_job")) == 2 and visible(data) == [f"mbp-10/{Q1}.mbp-10.dbn.zst"]


@pytest.mark.parametrize(
    ("status", "expected"),
    [(401, "authentication failed (401)"), (402, "payment required (402)"), (403, "not entitled to this data (403)")],
)
def test_refusals_fail_at_once_in_one_line(standin, tmp_path, capsys, monkeypatch, status, expected):
    data = tmp_path / "data"
    if status == 401:
        monkeypatch.setenv("DATABENTO_API_KEY", KEY[::-1])  # a wrong key: the canary must not show either
    else:
        standin.fail("metadata.get_cost", status, detail="ES.FUT GLBX.MDP3 mbp-10 is not in your plan")
    assert main(args(standin, data)) == 1
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert line.startswith(f"alpha fetch: error: ES.FUT mbp-10 2024-01-01..2024-03-31: metadata.get_cost: {expected}")
    assert len(standin.calls("metadata.get_cost")) == 1  # never retried
    assert visible(data) == []
    no_canary(data, captured.out, captured.err)
    assert KEY[::-1] not in captured.out + captured.err


def test_a_missing_key_is_named(standin, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DATABENTO_API_KEY")
    assert main(args(standin, tmp_path / "data")) == 2
    assert "DATABENTO_API_KEY is not set" in capsys.readouterr().err
    assert standin.requests == []


@pytest.mark.slow  # a subprocess killed mid-download
def test_a_killed_fetch_resumes_its_job_and_its_partial_file(standin, served, tmp_path):
    data = tmp_path / "data"
    standin.hang_download.set()  # the download sends half the file, then waits
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "alpha_core.cli", *args(standin, data, "--batch-above-bytes", "0", "--schemas", "mbp-10")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert standin.hanging.wait(60), proc.communicate(timeout=5)
        part = data / ".fetch" / "ES.FUT" / "partial" / "mbp-10_20240101_20240401" / f"{Q1}.mbp-10.dbn.zst.part"
        deadline = time.monotonic() + 30
        while not (part.exists() and part.stat().st_size > 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert part.stat().st_size > 0
    finally:
        proc.send_signal(signal.SIGKILL)
        output = proc.communicate(timeout=30)[0].decode()
        standin.release.set()
    assert visible(data) == []  # nothing partial where readers look
    assert main(args(standin, data, "--batch-above-bytes", "0", "--schemas", "mbp-10")) == 0
    assert len(standin.calls("batch.submit_job")) == 1  # the remembered job, not a second bill
    resumed = standin.calls("batch/download")[-1][3]["Range"]
    assert resumed is not None and int(resumed.removeprefix("bytes=").split("-")[0]) > 0
    assert (data / "ES.FUT" / "mbp-10" / f"{Q1}.mbp-10.dbn.zst").read_bytes() == served[("mbp-10", "2024-01-01")]
    no_canary(data, output)


# --- the Dagster door: the raw_dbn asset [quarter x symbol] and the closed-quarter sensor -----------------------


def _materialize_raw_dbn(standin: Standin, data: Path, instance, **config):
    import dagster as dg

    from alpha_assets.defs.fetch import RawDbnConfig, raw_dbn
    from alpha_assets.resources import DataRoot

    fast = {"gateway": standin.gateway, "backoff_s": 0.0, "max_backoff_s": 0.01, "poll_s": 0.0}
    return dg.materialize(
        [raw_dbn],
        partition_key="2024-01-01|ES.FUT",
        resources={"data": DataRoot(root=str(data))},
        run_config=dg.RunConfig({"raw_dbn": RawDbnConfig(**fast, **config)}),
        instance=instance,
        raise_on_error=False,
    )


def _events_text(instance, run_id: str) -> str:
    import dagster as dg

    return "\n".join(dg.serialize_value(e) for e in instance.all_logs(run_id))


@pytest.mark.slow  # Dagster runs
def test_raw_dbn_fetches_a_quarter_as_the_cli_does_and_keeps_the_key_out_of_events(standin, served, tmp_path):
    import dagster as dg

    data = tmp_path / "data"
    instance = dg.DagsterInstance.ephemeral()
    result = _materialize_raw_dbn(standin, data, instance, batch_above_bytes=0)
    assert result.success
    assert visible(data) == [f"{s}/{Q1}.{s}.dbn.zst" for s in ("definition", "mbp-10", "ohlcv-1m")]
    (mat,) = result.asset_materializations_for_node("raw_dbn")
    assert mat.metadata["cost_usd"].value == "3.6" and mat.metadata["quarter"].value == "2024-Q1"
    assert len(standin.calls("batch.submit_job")) == 3
    no_canary(data, _events_text(instance, result.run_id))

    before = len(standin.requests)
    again = _materialize_raw_dbn(standin, data, instance)
    assert again.success and standin.requests[before:] == []  # the same records: nothing downloaded twice

    standin.fail("metadata.get_cost", 403, detail="not in your plan")
    refused = _materialize_raw_dbn(standin, tmp_path / "other", instance, max_cost=100.0)
    assert not refused.success
    (failure,) = [e for e in refused.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    description = failure.step_failure_data.user_failure_data.description
    assert description.startswith("ES.FUT 2024-Q1: ES.FUT mbp-10 2024-01-01..2024-03-31: metadata.get_cost: not entitled")
    assert "\n" not in description
    no_canary(tmp_path / "other", _events_text(instance, refused.run_id))


def test_raw_dbn_is_upstream_of_the_sidecars_and_partitioned_by_quarter_and_symbol():
    import dagster as dg

    from alpha_assets.definitions import defs
    from alpha_assets.partitions import split_symbol_quarter, symbol_quarter_key

    graph = defs.resolve_asset_graph()
    for sidecars in ("book_sidecars", "bar_sidecars"):
        assert dg.AssetKey("raw_dbn") in graph.get(dg.AssetKey(sidecars)).parent_keys
    keys = graph.get(dg.AssetKey("raw_dbn")).partitions_def.get_partition_keys()
    assert keys[0] == "2010-07-01|ES.FUT" and "2024-01-01|NQ.FUT" in keys
    assert split_symbol_quarter(symbol_quarter_key("ES.FUT", dt.date(2024, 4, 1))) == ("ES.FUT", dt.date(2024, 4, 1))
    with pytest.raises(ValueError, match="Jan/Apr/Jul/Oct"):
        symbol_quarter_key("ES.FUT", "2024-02-01")


def test_the_closed_quarter_sensor_starts_stopped_and_fetches_each_quarter_once_it_closes():
    import dagster as dg

    from alpha_assets.defs.automation import fetch_closed_quarter
    from alpha_assets.partitions import SYMBOLS, quarter_partitions

    assert fetch_closed_quarter.default_status == dg.DefaultSensorStatus.STOPPED
    closed = quarter_partitions.get_last_partition_key()
    first = fetch_closed_quarter(dg.build_sensor_context(cursor=None))
    assert first.run_requests == [] and first.cursor == closed  # turned on: past quarters are a backfill
    assert isinstance(fetch_closed_quarter(dg.build_sensor_context(cursor=closed)), dg.SkipReason)
    previous = quarter_partitions.get_partition_keys()[-2]
    tick = fetch_closed_quarter(dg.build_sensor_context(cursor=previous))
    assert [r.partition_key for r in tick.run_requests] == [f"{closed}|{s}" for s in SYMBOLS]
    assert tick.cursor == closed
