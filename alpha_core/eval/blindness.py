"""Future-blindness, whatever the code reads: a checkpoint's positions must not change when the future does.

The decision clock (`predict.check_decision_clock`) follows the rows a prediction gathered through its index; code
that reads around the index (a network mixing the windows of its batch, a next-bar price read from the sidecar
directly, a book read a second late) passes it. This check needs no knowledge of what was read: the test file is cut
at seeded points, every row after the cut is replaced by other data (rows of the same file from far after the cut,
their timestamps kept, so the file stays well formed), the checkpoint predicts that file with its policy, and its
probabilities and positions up to the cut must equal, to the bit, those of the whole file. A checkpoint that differs
is excluded with the bar, the cut and the difference.

Cost: each cut predicts a prefix of the file that ends a few rows (`AFTER`) past the cut (a sampling model's rounded up
to a whole batch, so it draws the same noise batch by batch), with the cuts in the first `SPAN` (2%) of the bars the
checkpoint decides: at most ~4% of predicting the test file, for the two cuts. The two cuts are adjacent rows (c and
c + 1): a window whose batch neighbour it reads is never the last of its batch at both.
"""

from __future__ import annotations

import math

import numpy as np

from alpha_core.data.loader import take_rows
from alpha_core.data.sidecar import ARRAYS, Sidecar
from alpha_core.eval.predict import BATCH, CPU_BATCH, NO_DECISION, Loaded, Prediction, book_snapshots_at, predict
from alpha_core.models.hooks import Sampling, cpu_batch

SEED = 0xB1D
SPAN = 0.02  # the cuts fall in the first 2% of the bars a checkpoint decides (after its first window and holding)
AFTER = 8  # rows predicted past a cut, at least: what a model reading ahead would see replaced
KEEP = ("ts", "trade_ts", "instrument_id")  # the time structure stays; everything a model could read is replaced


def cut_points(n_rows: int, first: int, n_decided: int | None = None) -> list[int]:
    """The seeded cuts of a file of `n_rows` bars whose positions are whole from bar `first` on (its first decision,
    window and holding period), among the first SPAN of its `n_decided` decided bars: [c, c + 1] (none when the file
    is too short to hold them)."""
    lo = first
    hi = max(lo, first + int((n_rows if n_decided is None else n_decided) * SPAN))
    if lo + 2 + AFTER > n_rows:
        return []
    c = int(np.random.default_rng([SEED, n_rows]).integers(lo, min(hi, n_rows - 2 - AFTER) + 1))
    return [c, c + 1]


def spliced(sc: Sidecar, stop: int, cut: int, salt: int) -> Sidecar:
    """Rows [0, stop) of `sc` in memory, every row after `cut` replaced by rows drawn from the rest of the file (its
    own first rows, reversed, when there is no rest), timestamps kept."""
    n_new = stop - cut - 1
    if sc.rows - stop >= n_new:  # seeded rows of the rest of the file (a draw, not a permutation of a huge file)
        donors = np.sort(np.random.default_rng([SEED, salt, cut]).integers(stop, sc.rows, n_new))
    else:
        donors = np.arange(n_new)[::-1] % max(cut, 1)
    arrays = {}
    for name in ARRAYS:
        if name not in sc.meta.arrays:
            continue
        a = sc.read(name, 0, stop)
        if name not in KEEP and n_new > 0:
            order = np.argsort(donors, kind="stable")
            got = np.empty((n_new, *a.shape[1:]), a.dtype)
            got[order] = take_rows(sc, name, donors[order])
            a[cut + 1 :] = got
        arrays[name] = a
    return Sidecar(sc.path, sc.meta.model_copy(update={"rows": stop}), **arrays)


def _batch(model: Loaded) -> int:
    return cpu_batch(model.net, CPU_BATCH) if model.device.type == "cpu" else BATCH


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return np.array_equal(a, b, equal_nan=True)


def check(model: Loaded, bars: Sidecar, book: Sidecar | None, whole: Prediction, entry: np.ndarray) -> str | None:
    """None when the checkpoint's probabilities and positions up to each cut are those of the whole file `whole`
    (predicted with its policy, `whole.policy`), else why not (the exclusion's reason)."""
    policy = whole.policy
    hold = policy.hold if policy is not None else 1
    if whole.bar_probs is not None:
        decided = np.flatnonzero(np.isfinite(whole.bar_probs).all(axis=1))  # a book model: where the book is
    else:
        decided = np.flatnonzero(whole.decision_ts != NO_DECISION)
    if not len(decided):
        return None
    start = model.window - 1
    for cut in cut_points(bars.rows, int(decided[0]) + hold + AFTER, len(decided)):
        stop = cut + 1 + AFTER
        if isinstance(model.net, Sampling):  # a sampling model: whole batches, so its noise is drawn as before
            stop = start + math.ceil((stop - start) / _batch(model)) * _batch(model)
        stop = min(bars.rows, stop)
        short_bars = spliced(bars, stop, cut, 0)
        short_book = None
        if book is not None and model.ckpt.trainer.reads_book:
            at = book_snapshots_at(book, np.array([entry[cut], entry[stop - 1]]))
            book_cut = int(at[0])
            book_stop = min(book.rows, int(at[1]) + 1 + AFTER)
            short_book = spliced(book, book_stop, max(book_cut, 0), 1)
        elif book is not None:
            short_book = book
        part = predict(model, short_bars, short_book, 0, 0.0, scored=False, entry=entry[:stop], policy=policy)
        upto = slice(0, cut + 1)
        probs_whole = None if whole.bar_probs is None else whole.bar_probs[upto]
        probs_cut = None if part.bar_probs is None else part.bar_probs[upto]
        if not _same(probs_whole, probs_cut) or not np.array_equal(whole.position[upto], part.position[upto]):
            differ = np.flatnonzero(
                (whole.position[upto] != part.position[upto])
                | (
                    np.zeros(cut + 1, bool)
                    if probs_whole is None
                    else ~np.all((probs_whole == probs_cut) | (np.isnan(probs_whole) & np.isnan(probs_cut)), axis=1)
                )
            )
            i = int(differ[-1]) if len(differ) else cut
            return (
                f"not future-blind: with the rows after bar {cut} of {bars.meta.source.name} replaced by other data, "
                f"bar {i}'s prediction changed ({len(differ)} bar(s) up to the cut differ): it reads the future"
            )
    return None
