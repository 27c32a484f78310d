"""Real Databento sample files (DBN v1-3) through our reader, against `databento` itself."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys

import databento as db
import numpy as np
import pytest
from conftest import SAMPLES
from databento.common.constants import SCHEMA_STRUCT_MAP, SCHEMA_STRUCT_MAP_V1, SCHEMA_STRUCT_MAP_V2

from alpha_core.cli import main
from alpha_core.data.dbn import RECORD_CLASSES, count_records, iter_records, read_info, record_dtype
from alpha_core.data.sidecar import ensure_sidecar
from alpha_core.data.validate import RecordChecks
from alpha_core.errors import DataError

MBP10_FILES = [
    "databento-python/GLBX.MDP3/test_data.mbp-10.dbn.zst",
    "dbn/test_data.mbp-10.dbn",
    "dbn/test_data.mbp-10.v1.dbn.zst",
    "dbn/test_data.mbp-10.v2.dbn.zst",
    "dbn/test_data.mbp-10.v3.dbn.zst",
]
OHLCV_FILES = ["databento-python/GLBX.MDP3/test_data.ohlcv-1m.dbn.zst"]
# the dbn repository's ESH1 bars carry 100x prices (open 372025.0 in a 3,702 market): legal DBN, wrong data
HUNDREDFOLD_OHLCV = [
    "dbn/test_data.ohlcv-1m.dbn",
    "dbn/test_data.ohlcv-1m.v1.dbn.zst",
    "dbn/test_data.ohlcv-1m.v2.dbn.zst",
    "dbn/test_data.ohlcv-1m.v3.dbn.zst",
]
TWO_PRODUCTS = "nautilus_trader/futures_ohlcv-1m_2024-07-01T23-40_2024-07-02T00-10.dbn.zst"


def test_every_sample_covers_dbn_versions_1_to_3(samples):
    versions = {read_info(samples / f).version for f in MBP10_FILES + HUNDREDFOLD_OHLCV}
    assert versions == {1, 2, 3}


@pytest.mark.parametrize("name", MBP10_FILES + OHLCV_FILES + HUNDREDFOLD_OHLCV + [TWO_PRODUCTS])
def test_records_equal_databento(samples, name):
    path = samples / name
    info = read_info(path)
    reference = db.DBNStore.from_file(path).to_ndarray()
    checks = RecordChecks(info, record_dtype(info), observe_prices=name in HUNDREDFOLD_OHLCV)  # see below
    ours = np.concatenate(list(iter_records(info, chunk_records=1, checks=checks)))
    assert ours.dtype == reference.dtype
    assert np.array_equal(ours, reference)
    if name not in HUNDREDFOLD_OHLCV:
        assert count_records(read_info(path)) == len(reference) > 0


@pytest.mark.parametrize("name", HUNDREDFOLD_OHLCV)
def test_prices_a_hundred_times_too_high_are_refused_by_predecode(samples, tmp_path, name):
    """Real DBN files whose ESH1 bars open at 372,025 (the market was at 3,702): legal records, not ES prices.
    Building features from them is refused, naming the file and the field."""
    path = samples / name
    message = rf"{path.name}: record 0: open is 372025 for a bar of ESH1, outside the plausible ES.FUT range"
    with pytest.raises(DataError, match=message):
        count_records(read_info(path))
    with pytest.raises(DataError, match=message):
        ensure_sidecar(path, tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", HUNDREDFOLD_OHLCV)
def test_inspect_describes_the_hundredfold_bars_with_a_warning(samples, name, capsys):
    """`alpha inspect` shows any valid DBN file: the databento client's own OHLCV-1m test files (v1, v2, v3 and
    uncompressed) are described, and their implausible prices are one warning line naming the file and the field."""
    path = samples / name
    assert main(["inspect", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    (row,) = json.loads(captured.out)
    assert row["schema"] == "ohlcv-1m" and row["dbn_version"] == read_info(path).version and row["symbols"] == ["ESH1"]
    assert row["records"] == 2 and row["first_ts"] == "2020-12-28T13:00:00+00:00"
    assert (row["price_min"], row["price_max"]) == (372025.0, 372150.0)
    (warning,) = captured.err.splitlines()
    assert warning.startswith(f"alpha inspect: warning: {path}: ")
    assert "record 0: open is 372025 for a bar of ESH1" in warning and "outside the plausible ES.FUT range" in warning
    assert row["warnings"] == [warning.removeprefix("alpha inspect: warning: ")]


ALL_SAMPLES = sorted(
    str(p.relative_to(SAMPLES))
    for p in SAMPLES.rglob("*.dbn*")
    if ".frag" not in p.name  # frag: no metadata header
)


@pytest.mark.parametrize("name", ALL_SAMPLES)
def test_inspect_describes_every_real_sample(samples, name, capsys):
    """Every real sample (every schema and DBN version) is described: records equal to databento's, a price range."""
    path = samples / name
    assert main(["inspect", str(path), "--json"]) == 0, capsys.readouterr().err
    (row,) = json.loads(capsys.readouterr().out)
    store = db.DBNStore.from_file(path)
    assert row["schema"] == str(store.schema) and row["records"] == len(store.to_ndarray()) > 0
    assert row["symbols"] == list(store.symbols)
    if row["schema"] in ("mbp-10", "ohlcv-1m", "trades"):
        assert 0 < row["price_min"] <= row["price_max"]


@pytest.mark.parametrize("version, structs", [(1, SCHEMA_STRUCT_MAP_V1), (2, SCHEMA_STRUCT_MAP_V2), (3, SCHEMA_STRUCT_MAP)])
def test_record_layouts_are_databentos_for_every_schema_and_version(samples, version, structs):
    """We name record layouts without importing `databento` (see `dbn.py`): they must stay the ones it uses."""
    info = read_info(samples / MBP10_FILES[0])
    known = {str(schema): np.dtype(cls._dtypes) for schema, cls in structs.items()}
    for schema in RECORD_CLASSES.keys() | known.keys():
        file = dataclasses.replace(info, schema=schema, version=version)
        if schema in known:
            assert record_dtype(file) == known[schema], (version, schema)
        else:
            with pytest.raises(DataError, match=f"metadata.schema '{schema}' has no known record layout"):
                record_dtype(file)


def test_predecode_does_not_import_databento_pandas_polars_or_torch(samples, tmp_path):
    """A whole `alpha predecode` process pays for the imports it makes; none of these is needed for a book."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(samples / MBP10_FILES[0], data)
    heavy = ["databento", "pandas", "polars", "torch", "aiohttp", "dagster", "matplotlib"]
    script = (
        f"import json, sys; from alpha_core.cli import main; rc = main(['predecode', '--data-dir', {str(data)!r}, "
        f"'--output-dir', {str(tmp_path / 'pd')!r}]); "
        f"print(json.dumps([m for m in {heavy!r} if m in sys.modules])); sys.exit(rc)"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    built, loaded = out.stdout.strip().splitlines()
    assert built.startswith("built ") and "test_data.mbp-10.dbn.zst: 4 rows" in built
    assert json.loads(loaded) == []


@pytest.mark.parametrize("name", MBP10_FILES)
def test_book_sidecar_mid_matches_databento(samples, tmp_path, name):
    path = samples / name
    df = db.DBNStore.from_file(path).to_df()
    snapshots = df[(df["flags"] & 128) != 0]
    sc, status = ensure_sidecar(path, tmp_path)
    assert status == "built"
    assert sc.meta.source.schema_ == "mbp-10"
    assert sc.rows == len(snapshots)
    expected_mid = ((snapshots["bid_px_00"] + snapshots["ask_px_00"]) / 2).to_numpy()
    np.testing.assert_allclose(sc.price, expected_mid)
    spread_ticks = ((snapshots["ask_px_00"] - snapshots["bid_px_00"]) / 0.25).to_numpy()
    col = sc.meta.feature_names.index("spread_ticks")
    np.testing.assert_allclose(sc.features[:, col], spread_ticks)
    assert sc.meta.contracts == {"ESH1": len(snapshots)}


@pytest.mark.parametrize("name", OHLCV_FILES)
def test_bar_sidecar_close_matches_databento(samples, tmp_path, name):
    path = samples / name
    df = db.DBNStore.from_file(path).to_df()
    sc, _ = ensure_sidecar(path, tmp_path)
    assert sc.rows == len(df)
    np.testing.assert_allclose(sc.price, df["close"].to_numpy())
    np.testing.assert_array_equal(sc.ts, df.index.astype("int64").to_numpy())


def test_parent_symbology_keeps_only_outrights(samples):
    info = read_info(samples / "nautilus_trader/definition-glbx-es-futspread.dbn.zst")
    assert info.stype_in == "parent" and info.symbols == ("ES.FUT",)
    assert len(info.mappings) == 41
    spreads = [s for s in info.mappings if "-" in s]
    assert spreads, "the real parent file maps calendar spreads too"
    outrights = info.outright_ids("ES")
    assert outrights, "outright contracts expected"
    assert all("-" not in s and s.startswith("ES") and len(s) == 4 for s in outrights.values())
    assert set(outrights.values()) == {s for s in info.mappings if "-" not in s}
    assert info.products() == {"ES"}


def test_two_instrument_file_is_split_by_product(samples, tmp_path):
    path = samples / TWO_PRODUCTS
    es, _ = ensure_sidecar(path, tmp_path, symbol="ES.FUT")
    nq, _ = ensure_sidecar(path, tmp_path, symbol="NQ.FUT")
    assert es.meta.contracts == {"ESU4": 30} and nq.meta.contracts == {"NQU4": 30}
    assert es.price.min() > 5000 and es.price.max() < 6000
    assert nq.price.min() > 19000 and nq.price.max() < 21000
    assert es.path != nq.path
    with pytest.raises(DataError, match=r"futures_ohlcv.*several or no products \(ES, NQ\)"):
        ensure_sidecar(path, tmp_path)
    with pytest.raises(DataError, match=r"futures_ohlcv.*no ZN.FUT contracts"):
        ensure_sidecar(path, tmp_path, symbol="ZN.FUT")


@pytest.mark.parametrize(
    "name, schema",
    [
        ("databento-python/GLBX.MDP3/test_data.trades.dbn.zst", "trades"),
        ("databento-python/GLBX.MDP3/test_data.definition.dbn.zst", "definition"),
        ("nautilus_trader/futures_trades_2024-07-01T23-58_2024-07-02T00-02.dbn.zst", "trades"),
    ],
)
def test_other_schemas_are_rejected(samples, tmp_path, name, schema):
    with pytest.raises(DataError) as err:
        ensure_sidecar(samples / name, tmp_path)
    message = str(err.value)
    assert (samples / name).name in message
    assert f"metadata.schema is '{schema}'" in message and "mbp-10 or ohlcv-1m" in message
    assert list(tmp_path.iterdir()) == []
