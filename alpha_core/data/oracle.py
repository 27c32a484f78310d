"""The demo generator's oracle: how well the best possible model could rank a sidecar's labels.

`alpha demo-data` writes `{SYMBOL}/oracle/{stem}.oracle.npz` beside the DBN folders, with the
probability of an up move per horizon given the true latent state, keyed by timestamp. Aligned to a
sidecar's rows, its AUC against the sidecar's labels is the ceiling a model can be compared to.
Real data has no oracle file, and then there is nothing to report.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

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


def oracle_auc(sidecars: list[Sidecar], scored: list[np.ndarray] | None = None) -> list[float] | None:
    """Pooled AUC per horizon of the oracle against the sidecars' labels; None without oracle files.

    `scored` (one bool [N, H] mask per sidecar) restricts each horizon to the rows a model was scored on, so
    the model and the oracle are compared on exactly the same rows and labels. The AUC is the evaluator's."""
    from alpha_core.eval.metrics import auc

    probs, labels = [], []
    for i, sc in enumerate(sidecars):
        p = oracle_probabilities(sc)
        if p is None:
            return None
        y = np.asarray(sc.labels, dtype=np.float64)
        probs.append(p)
        labels.append(y if scored is None else np.where(scored[i], y, np.nan))
    return np.atleast_1d(auc(np.concatenate(probs), np.concatenate(labels))).tolist()
