"""Download a symbol's Databento data per calendar quarter: the `alpha fetch` step and the `raw_dbn` asset.

What is fetched: MBP-10 and OHLCV-1m of a parent symbol (`ES.FUT`, `stype_in=parent`, dataset GLBX.MDP3) and
its `definition` records (the contracts behind the rolls), one unit per schema and calendar quarter, into
`{data_root}/{SYMBOL}/{schema}/` under Databento's own file names (`glbx-mdp3-20240101-20240331.mbp-10.dbn.zst`),
the layout `alpha predecode` reads (it skips the definitions).

- Cost first: `metadata.get_cost` and `metadata.get_billable_size` of every missing unit are printed, and the
  whole request is refused above `max_cost` (USD) before anything is billed.
- Route: a unit above `batch_above_bytes` (default 5 GB, Databento's own advice: docs "Size limits") goes
  through a batch job (`batch.submit_job`, polled with `batch.list_jobs`, files from `batch.list_files`),
  a smaller one through `timeseries.get_range`.
- Whole or absent: files are written under `{data_root}/.fetch/{SYMBOL}/partial/` (never a symbol folder, so no
  reader sees them), checked (batch files against the job manifest's size and sha256; every file is a complete
  DBN stream of the unit's schema), then recorded (`.fetch/{SYMBOL}/done/*.json`, the commit point) and renamed
  into place. A batch file cut off by a kill resumes with an HTTP Range request; a cut-off stream cannot resume and
  is discarded. A submitted job is remembered (`.fetch/{SYMBOL}/jobs/`), so a rerun waits for it instead of paying
  again; a unit whose record and files are in place is never downloaded again.
- The key comes from `DATABENTO_API_KEY` only; it is never printed, recorded or put in an error (`_scrub`).
- Errors are one line naming symbol, schema and range: 401/402/403 at once, 429 after `Retry-After` and 5xx or a
  dropped connection after exponential backoff, both at most `max_attempts` times; an expired job forgets itself.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from alpha_core.atomic import atomic_write_json
from alpha_core.data.dbn import DBN_SUFFIXES, DbnSource, check_zstd_complete, read_info
from alpha_core.data.products import product
from alpha_core.errors import DataError, FetchError, PlanError

KEY_ENV = "DATABENTO_API_KEY"
DATASET = "GLBX.MDP3"
GATEWAY = "https://hist.databento.com"
DEFINITION = "definition"
FETCH_SCHEMAS = ("mbp-10", "ohlcv-1m", DEFINITION)
BATCH_ABOVE_BYTES = 5 * 10**9  # Databento: "we recommend using batch download for requests over 5 GB"
STATE_DIR = ".fetch"  # under the data root, beside the symbol folders: records, remembered jobs, partial files
PART_SUFFIX = ".part"  # never a DBN suffix: no reader takes a partial file for data
CHUNK_BYTES = 1 << 16

Schema = Literal["mbp-10", "ohlcv-1m", "definition"]


class FetchConfig(BaseModel):
    """One `alpha fetch` (or one `raw_dbn` partition): a parent symbol's schemas over [start, end)."""

    model_config = ConfigDict(extra="forbid")

    symbol: str
    start: dt.date
    end: dt.date  # exclusive
    data_dir: Path
    schemas: list[Schema] = Field(default_factory=lambda: list(FETCH_SCHEMAS), min_length=1)
    max_cost: float = Field(25.0, ge=0)
    dataset: str = DATASET
    gateway: str = GATEWAY
    batch_above_bytes: int = Field(BATCH_ABOVE_BYTES, ge=0)
    poll_s: float = Field(30.0, ge=0)
    job_timeout_s: float = Field(6 * 3600.0, ge=0)
    max_attempts: int = Field(6, ge=1)
    backoff_s: float = Field(1.0, ge=0)
    max_backoff_s: float = Field(120.0, ge=0)
    dry_run: bool = False

    @model_validator(mode="after")
    def _range(self) -> FetchConfig:
        if self.end <= self.start:
            raise ValueError(f"end {self.end} must be after start {self.start} (end is exclusive)")
        self.symbol = product(self.symbol.strip().upper()).symbol
        return self


# --- calendar quarters ---------------------------------------------------------------------------------------


def quarter_start(day: dt.date) -> dt.date:
    return dt.date(day.year, 3 * ((day.month - 1) // 3) + 1, 1)


def next_quarter(day: dt.date) -> dt.date:
    first = quarter_start(day)
    month = first.month + 3
    return dt.date(first.year + (month > 12), (month - 1) % 12 + 1, 1)


def quarter_name(day: dt.date) -> str:
    return f"{day.year}-Q{(day.month - 1) // 3 + 1}"


def quarter_slices(start: dt.date, end: dt.date) -> list[tuple[dt.date, dt.date]]:
    """[start, end) cut at calendar quarter boundaries (UTC dates), so each unit is a quarter or part of one."""
    out, s = [], start
    while s < end:
        e = min(next_quarter(s), end)
        out.append((s, e))
        s = e
    return out


@dataclass(frozen=True)
class Unit:
    """One schema of one symbol over one quarter (or part of one): what is fetched, recorded and billed at once."""

    symbol: str
    schema: str
    start: dt.date
    end: dt.date  # exclusive

    @property
    def key(self) -> str:
        return f"{self.schema}_{self.start:%Y%m%d}_{self.end:%Y%m%d}"

    @property
    def label(self) -> str:
        return f"{self.symbol} {self.schema} {self.start}..{self.end - dt.timedelta(days=1)}"

    def file_name(self, dataset: str) -> str:
        """Databento's batch file name for the range (`glbx-mdp3-20240101-20240331.mbp-10.dbn.zst`)."""
        last = self.end - dt.timedelta(days=1)
        return f"{dataset.lower().replace('.', '-')}-{self.start:%Y%m%d}-{last:%Y%m%d}.{self.schema}.dbn.zst"


def plan_units(cfg: FetchConfig) -> list[Unit]:
    return [Unit(cfg.symbol, schema, s, e) for s, e in quarter_slices(cfg.start, cfg.end) for schema in cfg.schemas]


@dataclass(frozen=True)
class Layout:
    """Where a symbol's files, records, remembered jobs and partial downloads live under the data root."""

    root: Path
    symbol: str

    @property
    def symbol_dir(self) -> Path:
        return self.root / self.symbol

    @property
    def state(self) -> Path:
        return self.root / STATE_DIR / self.symbol

    def done(self, unit: Unit) -> Path:
        return self.state / "done" / f"{unit.key}.json"

    def job(self, unit: Unit) -> Path:
        return self.state / "jobs" / f"{unit.key}.json"

    def partial(self, unit: Unit) -> Path:
        return self.state / "partial" / unit.key

    def lock(self, unit: Unit) -> Path:
        return self.state / "locks" / f"{unit.key}.lock"


# --- results -------------------------------------------------------------------------------------------------


class FetchedFile(BaseModel):
    path: str  # relative to the symbol folder
    size: int
    sha256: str


class UnitResult(BaseModel):
    schema_: str = Field(alias="schema")
    start: dt.date
    end: dt.date  # exclusive
    status: Literal["complete", "fetched", "quoted"]  # already there | downloaded now | dry run
    route: str | None = None  # batch | stream
    job_id: str | None = None
    cost_usd: float | None = None
    billable_bytes: int | None = None
    files: list[FetchedFile] = []

    model_config = ConfigDict(populate_by_name=True)


class FetchSummary(BaseModel):
    symbol: str
    data_dir: str
    units: list[UnitResult]
    cost_usd: float  # of what this call downloaded (or would: a dry run)
    billable_bytes: int

    def files(self) -> list[str]:
        return [f"{self.symbol}/{f.path}" for u in self.units for f in u.files]


def _mb(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e6:,.1f} MB"


# --- the key, and keeping it out of every message ------------------------------------------------------------


def api_key() -> str:
    key = os.environ.get(KEY_ENV, "")
    if not key.strip():
        raise PlanError(f"{KEY_ENV} is not set: alpha reads the Databento API key from the environment only")
    return key


def _scrub(text: str, key: str) -> str:
    return " ".join(str(text).replace(key, "<key>").split()) if key else " ".join(str(text).split())


class _Api:
    """The databento client's calls with bounded retries, failing as one FetchError line per unit."""

    def __init__(self, cfg: FetchConfig, key: str, log: Callable[[str], None]) -> None:
        import databento

        self.cfg, self.key, self.log = cfg, key, log
        self.client = databento.Historical(key=key, gateway=cfg.gateway)

    def fail(self, unit: Unit, text: str) -> FetchError:
        return FetchError(_scrub(f"{unit.label}: {text}", self.key))

    def call(self, unit: Unit, what: str, fn: Callable):
        import requests
        from databento.common.error import BentoError, BentoHttpError

        cfg = self.cfg
        for attempt in range(1, cfg.max_attempts + 1):
            backoff = min(cfg.backoff_s * 2 ** (attempt - 1), cfg.max_backoff_s)
            try:
                return fn()
            except BentoHttpError as exc:
                status, message = exc.http_status, _scrub(exc.message or "", self.key)
                if status == 429:
                    kind, delay = "rate limited (429)", _retry_after(exc.headers, backoff, cfg.max_backoff_s)
                elif status >= 500:
                    kind, delay = f"server error ({status}{': ' + message if message else ''})", backoff
                else:
                    raise self.fail(unit, f"{what}: {_client_error(status, message)}") from exc
            except (requests.RequestException, BentoError, _Incomplete) as exc:
                kind, delay = f"connection error ({_scrub(type(exc).__name__, self.key)})", backoff
            if attempt == cfg.max_attempts:
                raise self.fail(unit, f"{what}: {kind}; gave up after {attempt} attempts")
            self.log(f"{unit.label}: {what}: {kind}; retry {attempt}/{cfg.max_attempts - 1} in {delay:.1f} s")
            time.sleep(delay)
        raise AssertionError("unreachable")


class _Incomplete(Exception):
    """A download that ended before the manifest's size (a dropped connection): resumed on the next attempt."""


def _retry_after(headers, default: float, cap: float) -> float:
    try:
        return min(float(headers.get("Retry-After", default)), cap)
    except (TypeError, ValueError):  # an HTTP date: the backoff instead
        return default


def _client_error(status: int, message: str) -> str:
    known = {
        401: f"authentication failed (401): the key in {KEY_ENV} was rejected",
        402: "payment required (402)",
        403: "not entitled to this data (403)",
    }
    text = known.get(status, f"refused ({status})")
    return f"{text}: {message}" if message and status != 401 else text


# --- records -------------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def completed(layout: Layout, unit: Unit) -> dict | None:
    """The unit's record when every file it names is in place with its size; a file a kill left between the
    record (the commit point) and its rename is renamed now."""
    record = _read_json(layout.done(unit))
    if not isinstance(record, dict) or not isinstance(record.get("files"), list):
        return None  # none, or not one this code wrote: fetched again
    for f in record["files"]:
        final = layout.symbol_dir / f["path"]
        if final.is_file() and final.stat().st_size == f["size"]:
            continue
        part = layout.partial(unit) / (Path(f["path"]).name + PART_SUFFIX)
        if part.is_file() and part.stat().st_size == f["size"] and _sha256(part) == f["sha256"]:
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(part, final)
            continue
        return None
    shutil.rmtree(layout.partial(unit), ignore_errors=True)
    return record


def _commit(layout: Layout, unit: Unit, parts: list[tuple[Path, FetchedFile]], result: UnitResult) -> None:
    """Record the unit (the commit point), then rename its files into place, then forget its job."""
    for part, _ in parts:
        with open(part, "rb") as fh:
            os.fsync(fh.fileno())
    result.files = [f for _, f in parts]
    atomic_write_json(layout.done(unit), json.loads(result.model_dump_json(by_alias=True)))
    for part, f in parts:
        final = layout.symbol_dir / f.path
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, final)
        with contextlib.suppress(OSError):
            fd = os.open(final.parent, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    layout.job(unit).unlink(missing_ok=True)
    shutil.rmtree(layout.partial(unit), ignore_errors=True)


@contextlib.contextmanager
def _unit_lock(layout: Layout, unit: Unit) -> Iterator[None]:
    """One fetch of a unit at a time (a CLI run beside a Dagster step); the kernel drops it with its process."""
    path = layout.lock(unit)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FetchError(f"{unit.label}: another fetch is downloading it now (lock {path})") from None
        yield


def _check_dbn(path: Path, unit: Unit, name: str) -> None:
    """A complete DBN stream of the unit's schema, or the partial file is discarded."""
    try:
        info = read_info(path)
        if info.schema != unit.schema:
            raise DataError(path, f"metadata.schema is {info.schema!r}; expected {unit.schema!r}")
        with DbnSource(path) as source:
            check_zstd_complete(source)
    except DataError as exc:
        path.unlink(missing_ok=True)
        raise FetchError(
            f"{unit.label}: {name} is not a complete DBN file ({exc}); discarded, rerun to fetch it again"
        ) from exc


# --- the two routes ------------------------------------------------------------------------------------------


def _stream(api: _Api, layout: Layout, unit: Unit, result: UnitResult) -> None:
    cfg, name = api.cfg, unit.file_name(api.cfg.dataset)
    part_dir = layout.partial(unit)
    part_dir.mkdir(parents=True, exist_ok=True)
    part = part_dir / (name + PART_SUFFIX)

    def attempt() -> None:
        part.unlink(missing_ok=True)  # a stream cannot resume: what a killed or dropped one left is discarded
        api.client.timeseries.get_range(
            dataset=cfg.dataset,
            symbols=unit.symbol,
            schema=unit.schema,
            start=unit.start.isoformat(),
            end=unit.end.isoformat(),
            stype_in="parent",
            stype_out="instrument_id",
            path=part,
        )

    api.call(unit, "timeseries.get_range", attempt)
    _check_dbn(part, unit, name)
    f = FetchedFile(path=f"{unit.schema}/{name}", size=part.stat().st_size, sha256=_sha256(part))
    _commit(layout, unit, [(part, f)], result)


def _batch(api: _Api, layout: Layout, unit: Unit, result: UnitResult) -> None:
    cfg, client = api.cfg, api.client
    job = _read_json(layout.job(unit))
    if job is None:
        submitted = api.call(
            unit,
            "batch.submit_job",
            lambda: client.batch.submit_job(
                dataset=cfg.dataset,
                symbols=unit.symbol,
                schema=unit.schema,
                start=unit.start.isoformat(),
                end=unit.end.isoformat(),
                stype_in="parent",
                stype_out="instrument_id",
                encoding="dbn",
                compression="zstd",
                split_duration="none",  # one file per unit: a quarter, the unit folds are planned in
                delivery="download",
            ),
        )
        job = {"id": str(submitted["id"]), "submitted": dt.datetime.now(dt.UTC).date().isoformat()}
        atomic_write_json(layout.job(unit), job)
        api.log(f"{unit.label}: batch job {job['id']} submitted")
    else:
        api.log(f"{unit.label}: resuming batch job {job['id']} (submitted {job['submitted']})")
    result.job_id = job["id"]
    _wait(api, layout, unit, job)
    listed = api.call(unit, "batch.list_files", lambda: client.batch.list_files(job["id"]))
    entries = [e for e in listed if str(e.get("filename", "")).endswith(DBN_SUFFIXES)]
    if not entries:
        raise api.fail(unit, f"batch job {job['id']} lists no DBN file")
    part_dir = layout.partial(unit)
    part_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    for entry in entries:
        name, size = Path(str(entry["filename"])).name, int(entry["size"])
        algo, _, digest = str(entry.get("hash", "")).partition(":")
        if algo != "sha256":
            raise api.fail(unit, f"batch job {job['id']}: {name} has no sha256 in the manifest ({entry.get('hash')!r})")
        part = part_dir / (name + PART_SUFFIX)
        _download(api, unit, entry["urls"]["https"], part, size)
        if _sha256(part) != digest:
            part.unlink()
            raise api.fail(unit, f"{name} does not match the job manifest's sha256; discarded, rerun to download it again")
        _check_dbn(part, unit, name)
        parts.append((part, FetchedFile(path=f"{unit.schema}/{name}", size=size, sha256=digest)))
    _commit(layout, unit, parts, result)


def _wait(api: _Api, layout: Layout, unit: Unit, job: dict) -> None:
    cfg = api.cfg
    deadline = time.monotonic() + cfg.job_timeout_s
    since = (dt.date.fromisoformat(job["submitted"]) - dt.timedelta(days=1)).isoformat()
    while True:
        jobs = api.call(
            unit,
            "batch.list_jobs",
            lambda: api.client.batch.list_jobs(states="queued,processing,done,expired", since=since),
        )
        state = next((str(j.get("state")) for j in jobs if str(j.get("id")) == job["id"]), None)
        if state in (None, "expired"):
            layout.job(unit).unlink(missing_ok=True)
            shutil.rmtree(layout.partial(unit), ignore_errors=True)
            raise api.fail(
                unit,
                f"batch job {job['id']} {'expired' if state else 'is no longer listed'} before its files were "
                "downloaded; nothing was kept, rerun to submit a new job",
            )
        if state == "done":
            return
        if time.monotonic() >= deadline:
            raise api.fail(unit, f"batch job {job['id']} still {state} after {cfg.job_timeout_s:.0f} s; rerun to wait for it")
        time.sleep(cfg.poll_s)


def _download(api: _Api, unit: Unit, url: str, part: Path, size: int) -> None:
    """The file at `url` into `part`, resuming what is there with a Range request."""
    import requests
    from databento.common.http import check_http_error
    from databento.common.system import USER_AGENT
    from requests.auth import HTTPBasicAuth

    def attempt() -> None:
        have = part.stat().st_size if part.exists() else 0
        if have > size:  # not a prefix of this file
            part.unlink()
            have = 0
        if have == size:
            return
        headers = {"user-agent": USER_AGENT}
        if have:
            headers["Range"] = f"bytes={have}-{size - 1}"
        with requests.get(url, headers=headers, auth=HTTPBasicAuth(api.key, ""), stream=True, timeout=(100, 100)) as r:
            check_http_error(r)
            with open(part, "ab" if have and r.status_code == 206 else "wb") as fh:
                for chunk in r.iter_content(CHUNK_BYTES):
                    fh.write(chunk)
        if part.stat().st_size != size:
            raise _Incomplete(f"{part.stat().st_size} of {size} bytes")

    api.call(unit, f"download of {part.name.removesuffix(PART_SUFFIX)}", attempt)


# --- the step ------------------------------------------------------------------------------------------------


def fetch(cfg: FetchConfig, log: Callable[[str], None] = print) -> FetchSummary:
    """Fetch every unit of `cfg` that is not complete yet, after printing (and bounding) what it costs."""
    layout = Layout(Path(cfg.data_dir), cfg.symbol)
    units = plan_units(cfg)
    results: dict[Unit, UnitResult] = {}
    todo: list[Unit] = []
    for unit in units:
        record = completed(layout, unit)
        if record is not None:
            results[unit] = UnitResult.model_validate({**record, "status": "complete"})
            log(f"{unit.label}: complete ({', '.join(f['path'] for f in record['files'])}), nothing to download")
        else:
            todo.append(unit)
    if not todo:
        return _summary(cfg, units, results)
    key = api_key()
    api = _Api(cfg, key, log)
    for unit in todo:
        result = results[unit] = UnitResult(schema=unit.schema, start=unit.start, end=unit.end, status="quoted")
        job = _read_json(layout.job(unit))
        if job is not None:
            result.cost_usd, result.route, result.job_id = 0.0, "batch", job["id"]
            log(f"{unit.label}: batch job {job['id']} already submitted (billed then)")
            continue
        query = {
            "dataset": cfg.dataset,
            "symbols": unit.symbol,
            "schema": unit.schema,
            "start": unit.start.isoformat(),
            "end": unit.end.isoformat(),
            "stype_in": "parent",
        }
        result.cost_usd = float(api.call(unit, "metadata.get_cost", lambda q=query: api.client.metadata.get_cost(**q)))
        result.billable_bytes = int(
            api.call(unit, "metadata.get_billable_size", lambda q=query: api.client.metadata.get_billable_size(**q))
        )
        result.route = "batch" if result.billable_bytes > cfg.batch_above_bytes else "stream"
        log(f"{unit.label}: {result.cost_usd:.2f} USD, {_mb(result.billable_bytes)} billable, {result.route}")
    cost = sum(results[u].cost_usd or 0.0 for u in todo)
    size = sum(results[u].billable_bytes or 0 for u in todo)
    log(f"{cfg.symbol}: {len(todo)} download(s), {cost:.2f} USD, {_mb(size)} (max cost {cfg.max_cost:.2f} USD)")
    if cost > cfg.max_cost:
        raise PlanError(
            f"{cfg.symbol} {cfg.start}..{cfg.end - dt.timedelta(days=1)}: {len(todo)} download(s) cost {cost:.2f} USD, "
            f"above the max cost {cfg.max_cost:.2f} USD; nothing was fetched (raise --max-cost to allow it)"
        )
    if cfg.dry_run:
        return _summary(cfg, units, results)
    for unit in todo:
        result = results[unit]
        with _unit_lock(layout, unit):
            record = completed(layout, unit)
            if record is None:
                (_batch if result.route == "batch" else _stream)(api, layout, unit, result)
            else:  # another fetch finished it meanwhile
                result.files = [FetchedFile.model_validate(f) for f in record["files"]]
        result.status = "fetched"
        log(f"{unit.label}: fetched {', '.join(f.path for f in result.files)} ({result.route})")
    return _summary(cfg, units, results)


def _summary(cfg: FetchConfig, units: list[Unit], results: dict[Unit, UnitResult]) -> FetchSummary:
    todo = [results[u] for u in units if results[u].status != "complete"]
    return FetchSummary(
        symbol=cfg.symbol,
        data_dir=str(cfg.data_dir),
        units=[results[u] for u in units],
        cost_usd=sum(r.cost_usd or 0.0 for r in todo),
        billable_bytes=sum(r.billable_bytes or 0 for r in todo),
    )
