"""The demo oracle: aligned to sidecar rows, clearly above chance, absent for real data."""

from __future__ import annotations

import numpy as np

from alpha_core.data.oracle import oracle_auc, oracle_probabilities
from alpha_core.data.sidecar import ensure_sidecar


def test_oracle_auc_of_demo_sidecars(tiny_sidecars):
    book = oracle_auc(tiny_sidecars["book"])
    bars = oracle_auc(tiny_sidecars["bars"])
    assert book is not None and bars is not None
    assert 0.62 < book[0] < 0.9 and 0.7 < book[1] < 0.95
    assert 0.6 < bars[0] < 0.9
    probs = oracle_probabilities(tiny_sidecars["book"][0])
    assert probs.shape == (tiny_sidecars["book"][0].rows, 3) and ((probs > 0) & (probs < 1)).all()


def test_real_data_has_no_oracle(samples, tmp_path):
    sc, _ = ensure_sidecar(samples / "databento-python/GLBX.MDP3/test_data.mbp-10.dbn.zst", tmp_path)
    assert oracle_probabilities(sc) is None and oracle_auc([sc]) is None


def test_oracle_auc_on_the_rows_a_model_was_scored_on(tiny_sidecars):
    from alpha_core.metrics import auc

    sc = tiny_sidecars["bars"][0]
    labels = np.asarray(sc.labels, dtype=np.float64)
    scored = np.zeros(labels.shape, bool)
    scored[len(scored) // 2 :] = True  # e.g. a model whose first window ends halfway
    scored &= np.isfinite(labels)
    got = oracle_auc([sc], [scored])
    want = auc(oracle_probabilities(sc), np.where(scored, labels, np.nan))
    np.testing.assert_allclose(got, want, rtol=0, atol=0)
    assert got != oracle_auc([sc])  # other rows, another number: the comparison must use the model's rows


def test_the_oracle_on_some_rows_is_the_oracle_on_a_mask_of_them(tiny_sidecars):
    """`rows` (the book model's AUC sample) scores exactly those rows, as a mask over the whole file did."""
    sc = tiny_sidecars["book"][0]
    rows = np.sort(np.random.default_rng(2).choice(sc.rows, 300, replace=False))
    labels = np.asarray(sc.labels)
    full = np.zeros(labels.shape, bool)
    full[rows] = np.isfinite(labels[rows])
    assert oracle_auc([sc], [full[rows]], [rows]) == oracle_auc([sc], [full])
    np.testing.assert_array_equal(oracle_probabilities(sc, rows), oracle_probabilities(sc)[rows])
