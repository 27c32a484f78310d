"""No feature is computed from data stamped after it: change everything after a cut in a real DBN file (drop it,
or shift its prices and scale its sizes) and every sidecar row stamped before the cut keeps its timestamp, its
features and its price, bit for bit.

Labels look ahead by design (they are the targets), and the models are checked for causality on their own
(test_evaluate.py); this is the layer under them: what predecode makes of the raw records.
"""

from __future__ import annotations

import databento_dbn as dbn
import numpy as np
import pytest
import zstandard

from alpha_core.data.dbn import iter_records, read_info
from alpha_core.data.demo import _write_dbn
from alpha_core.data.predecode import predecode
from alpha_core.data.products import product

UNDEF_PRICE = np.iinfo(np.int64).max


def later_changed(records: np.ndarray, cut: int, tick_fixed: int) -> np.ndarray:
    """From record `cut` on: every defined price three ticks higher, every size tripled plus one."""
    changed = records.copy()
    for name in changed.dtype.names:
        column = changed[name][cut:]
        if name.startswith(("open", "high", "low", "close", "bid_px", "ask_px")):
            defined = column != UNDEF_PRICE
            column[defined] += 3 * tick_fixed
        elif name == "volume" or "_sz_" in name:
            column[:] = column * 3 + 1
    return changed


@pytest.mark.parametrize("schema", ["ohlcv-1m", "mbp-10"])
@pytest.mark.parametrize("fraction", [0.35, 0.8])
def test_rows_before_a_cut_do_not_see_what_comes_after_it(tiny_data, tmp_path, schema, fraction):
    source = sorted((tiny_data / "ES.FUT" / schema).glob("*.dbn.zst"))[1]
    records = np.concatenate(list(iter_records(read_info(source))))
    with open(source, "rb") as fh:
        metadata = dbn.Metadata.decode(zstandard.ZstdDecompressor().stream_reader(fh).read())
    cut = int(len(records) * fraction)
    stamp = "ts_recv" if "ts_recv" in records.dtype.names else "ts_event"
    cut_ns = int(records[stamp][cut])
    tick_fixed = round(product("ES.FUT").tick_size * 1e9)
    sidecars = {}
    for variant, recs in {"whole": records, "cut": records[:cut], "changed": later_changed(records, cut, tick_fixed)}.items():
        folder = tmp_path / variant / "ES.FUT" / schema
        folder.mkdir(parents=True)
        _write_dbn(folder / source.name, metadata, recs)
        (item,) = predecode(folder, tmp_path / f"pd-{variant}", "ES.FUT")
        sidecars[variant] = item.sidecar
    whole = sidecars["whole"]
    before = int(np.searchsorted(whole.ts, cut_ns))  # rows stamped before the cut
    assert before > 50, "the cut leaves rows to compare"
    for variant in ("cut", "changed"):
        other = sidecars[variant]
        assert len(other.ts) >= before, variant
        np.testing.assert_array_equal(other.ts[:before], whole.ts[:before], err_msg=variant)
        np.testing.assert_array_equal(other.features[:before], whole.features[:before], err_msg=variant)
        np.testing.assert_array_equal(other.price[:before], whole.price[:before], err_msg=variant)
    # the change is visible after the cut, so the probe can fail
    assert not np.array_equal(sidecars["changed"].price[before:], whole.price[before:])
