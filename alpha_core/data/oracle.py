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


def oracle_probabilities(sc: Sidecar, rows: np.ndarray | None = None) -> np.ndarray | None:
    """float32 [N, H] oracle up-probability per sidecar row (of `rows` only, when given), or None without an
    oracle file (or not this file's).

    Book rows are keyed by time; bars by (minute, instrument), since on a roll day both contracts trade a bar in
    the same minute, each with its own close trade."""
    path = oracle_path(sc.meta.source.path)
    if not path.is_file():
        return None
    book = sc.meta.kind == BOOK
    if rows is None:
        want_ts = np.asarray(sc.ts, dtype=np.int64)
        want_iid = np.zeros(len(want_ts), np.int64) if book else np.asarray(sc.instrument_id, dtype=np.int64)
    else:  # only those rows are read (evaluation's sample of a book file far larger than memory)
        from alpha_core.data.loader import take_rows

        want_ts = take_rows(sc, "ts", rows).astype(np.int64)
        want_iid = np.zeros(len(want_ts), np.int64) if book else take_rows(sc, "instrument_id", rows).astype(np.int64)
    wanted = np.stack([want_ts, want_iid], axis=1)
    # the file's own oracle; else every oracle of the symbol: a calendar quarter read from several files (a daily
    # split, `predecode.quarter_sidecars`) is named for its first file only
    for paths in ([path], sorted(path.parent.glob("*.oracle.npz"))):
        loaded = [_load(p, book, sc.meta.horizons) for p in paths]
        if any(x is None for x in loaded):
            return None
        ts, iid, prob = (np.concatenate([x[i] for x in loaded]) for i in range(3))
        order = np.lexsort((iid, ts))
        found = _find(np.stack([ts[order], iid[order]], axis=1), wanted)
        if found is not None:
            return prob[order][found]
    return None  # not the generator's files for this sidecar


def _load(path: Path, book: bool, horizons: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(ts, instrument id, probabilities) of the book's or the bars' rows of one oracle file; None when it is an
    older generator's or of other horizons."""
    prefix = "book" if book else "bar"
    with np.load(path) as z:
        if not book and "bar_instrument_id" not in z:
            return None  # an older generator's oracle (read at the minute's last event, not its close trade)
        ts, prob, stored = z[f"{prefix}_ts"], z[f"{prefix}_prob"], z[f"{prefix}_horizons"]
        iid = np.zeros(len(ts), np.int64) if book else z["bar_instrument_id"]
    if list(stored) != horizons:
        return None
    return ts, iid, prob


def _find(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray | None:
    """Row of each wanted (ts, id) pair in lexicographically sorted `keys`, or None if any is missing."""
    view = np.dtype([("ts", np.int64), ("id", np.int64)])
    have = np.ascontiguousarray(keys).view(view).ravel()
    want = np.ascontiguousarray(wanted).view(view).ravel()
    rows = np.clip(np.searchsorted(have, want), 0, max(len(have) - 1, 0))
    return rows if len(have) and np.array_equal(have[rows], want) else None


def oracle_auc(
    sidecars: list[Sidecar], scored: list[np.ndarray] | None = None, rows: list[np.ndarray | None] | None = None
) -> list[float] | None:
    """Pooled AUC per horizon of the oracle against the sidecars' labels; None without oracle files.

    `rows` (sorted row indices per sidecar, None: every row) are the rows a model was scored on, and `scored` (one
    bool [rows, H] mask per sidecar) restricts each horizon to those with a prediction and a label, so the model
    and the oracle are compared on exactly the same rows and labels. The AUC is the evaluator's."""
    from alpha_core.metrics import auc

    probs, labels = [], []
    for i, sc in enumerate(sidecars):
        pick = None if rows is None else rows[i]
        p = oracle_probabilities(sc, pick)
        if p is None:
            return None
        if pick is None:
            y = np.asarray(sc.labels, dtype=np.float64)
        else:
            from alpha_core.data.loader import take_rows

            y = take_rows(sc, "labels", pick).astype(np.float64)
        probs.append(p)
        labels.append(y if scored is None else np.where(scored[i], y, np.nan))
    return np.atleast_1d(auc(np.concatenate(probs), np.concatenate(labels))).tolist()
