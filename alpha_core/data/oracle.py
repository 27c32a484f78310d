"""The demo generator's oracle: how well the best possible model could rank a sidecar's labels.

`alpha demo-data` writes `{SYMBOL}/oracle/{stem}.oracle.npz` beside the DBN folders, with the
probability of an up move per horizon given the true latent state, keyed by timestamp. Aligned to a
sidecar's rows, its AUC against the sidecar's labels is the ceiling a model can be compared to.
Real data has no oracle file, and then there is nothing to report.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score

from alpha_core.data.sidecar import BOOK, Sidecar


def oracle_path(source: str | Path) -> Path:
    source = Path(source)
    stem = source.name.removesuffix(".zst").removesuffix(".dbn")
    return source.parent.parent / "oracle" / f"{stem}.oracle.npz"


def oracle_probabilities(sc: Sidecar) -> np.ndarray | None:
    """float32 [N, H] oracle up-probability per sidecar row, or None without an oracle file."""
    path = oracle_path(sc.meta.source.path)
    if not path.is_file():
        return None
    prefix = "book" if sc.meta.kind == BOOK else "bar"
    with np.load(path) as z:
        ts, prob, horizons = z[f"{prefix}_ts"], z[f"{prefix}_prob"], z[f"{prefix}_horizons"]
    if list(horizons) != sc.meta.horizons:
        return None
    rows = np.searchsorted(ts, sc.ts)
    rows = np.clip(rows, 0, len(ts) - 1)
    if not np.array_equal(ts[rows], sc.ts):
        return None  # not the generator's file for this sidecar
    return prob[rows]


def oracle_auc(sidecars: list[Sidecar]) -> list[float] | None:
    """Pooled AUC per horizon of the oracle against the sidecars' labels; None without oracle files."""
    probs, labels = [], []
    for sc in sidecars:
        p = oracle_probabilities(sc)
        if p is None:
            return None
        probs.append(p)
        labels.append(np.asarray(sc.labels))
    p, y = np.concatenate(probs), np.concatenate(labels)
    aucs = []
    for j in range(y.shape[1]):
        ok = np.isfinite(y[:, j])
        aucs.append(float(roc_auc_score(y[ok, j], p[ok, j])) if len(np.unique(y[ok, j])) == 2 else float("nan"))
    return aucs
