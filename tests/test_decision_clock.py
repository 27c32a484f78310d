"""One decision clock: every model family decides no later than the trade its position is entered at, on real
sidecar timestamps of demo data, and a signal that peeks past the close is caught."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import flags

from alpha_core.cli import main
from alpha_core.data.labels import NS_PER_MINUTE
from alpha_core.data.sidecar import load_sidecar
from alpha_core.eval.evaluate import find_checkpoints
from alpha_core.eval.predict import (
    NO_DECISION,
    DecisionClockError,
    book_close_trade_ts,
    check_decision_clock,
    entry_ts,
    load,
    predict,
    snapshots_at,
)

FOLDS = flags(cv_n_folds=2, cv_train_window=2, cv_fold=0, device="cpu")
TEST = "ES.FUT_2024-Q4"  # fold 0's test file


@pytest.fixture(scope="module")
def run(tiny_data, tmp_path_factory):
    """One cheap checkpoint per family (supervised bars, RL, the book model) and the test file's sidecars."""
    root = tmp_path_factory.mktemp("clock")
    models, pd = root / "models", root / "pd"
    bars_dir, book_dir = tiny_data / "ES.FUT" / "ohlcv-1m", tiny_data / "ES.FUT" / "mbp-10"
    assert (
        main(
            [
                "train-supervised",
                *flags(
                    model="kan",
                    data_dir=bars_dir,
                    output_dir=models / "kan" / "ES.FUT",
                    epochs=1,
                    seq_len=16,
                    batch_size=64,
                    n_train_seqs=256,
                    n_val_seqs=128,
                    predecoded_dir=pd,
                ),
                *FOLDS,
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "train-rl",
                *flags(
                    model="ppo",
                    data_dir=bars_dir,
                    output_dir=models / "ppo" / "ES.FUT",
                    epochs=1,
                    timesteps_per_epoch=256,
                    n_envs=4,
                    window=8,
                    predecoded_dir=pd,
                ),
                *FOLDS,
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "train",
                *flags(
                    mbp10_data_dir=book_dir,
                    predecoded_dir=pd,
                    out=models / "perception" / "ES.FUT",
                    epochs=1,
                    batch_size=32,
                    n_train_seqs=64,
                    n_val_seqs=32,
                    seq_len=16,
                ),
                *FOLDS,
            ]
        )
        == 0
    )
    checkpoints = {c.model: load(c, torch.device("cpu")) for c in find_checkpoints(models, ["ES.FUT"])[0]}
    bars = load_sidecar(next(pd.rglob(f"{TEST}.ES.bars.*")))
    book = load_sidecar(next(pd.rglob(f"{TEST}.ES.book.*")))
    return checkpoints, bars, book


def _traded(position: np.ndarray) -> np.ndarray:
    return (position != 0) | (position != np.r_[0.0, position[:-1]])


def test_the_close_trade_clock_on_demo_timestamps(run):
    _, bars, book = run
    close = book_close_trade_ts(bars, book)
    bar_ts = np.asarray(bars.ts)
    known = close >= 0
    assert known.mean() > 0.95  # the book saw the trades the bars were built from
    assert ((close[known] >= bar_ts[known]) & (close[known] < bar_ts[known] + NS_PER_MINUTE)).all()
    trades = np.asarray(book.trade_ts)
    assert np.isin(close[known], trades).all()  # a real trade's ts_event
    # no later trade of the book falls in the same minute
    later = trades[(trades >= 0)]
    for m in np.flatnonzero(known)[:: max(1, bars.rows // 50)]:
        in_minute = later[(later >= bar_ts[m]) & (later < bar_ts[m] + NS_PER_MINUTE)]
        assert close[m] == in_minute.max()
    entry = entry_ts(bars, book)
    assert (entry[known] == close[known]).all()
    assert (entry[~known] == np.asarray(bars.trade_ts)[~known]).all()  # the bar's own bound where the book has none


@pytest.mark.parametrize("family", ["kan", "ppo", "perception"])
def test_every_family_decides_at_or_before_its_entry_price(run, family):
    checkpoints, bars, book = run
    pred = predict(checkpoints[family], bars, book, 0, 0.0)
    entry = entry_ts(bars, book)
    traded = _traded(pred.position)
    assert traded.sum() > 10, "the check needs traded bars"
    assert (pred.decision_ts[traded] <= entry[traded]).all()
    check_decision_clock(family, TEST, np.asarray(bars.ts), pred.position, pred.decision_ts, entry)
    decided = pred.decision_ts != NO_DECISION
    if family == "perception":  # a snapshot's own timestamp, the LAST one at or before the close trade
        book_ts = np.asarray(book.ts)
        assert np.isin(pred.decision_ts[decided], book_ts).all()
        following = np.searchsorted(book_ts, pred.decision_ts[decided], side="right")
        ok = following < len(book_ts)
        assert (book_ts[following[ok]] > entry[decided][ok]).all()
        assert (pred.decision_ts[decided] < entry[decided]).all()  # the close trade's own snapshot arrives after it
    else:  # bar models decide at the close of the bar they read
        assert (pred.decision_ts[decided] == entry[decided]).all()
    assert not pred.position[~decided].any()  # no decision, no position
    # the validation path (positions only: the book model predicts just the snapshots bars decide on) trades the same
    unscored = predict(checkpoints[family], bars, book, 0, 0.0, scored=False)
    np.testing.assert_array_equal(unscored.position, pred.position)
    np.testing.assert_array_equal(unscored.decision_ts, pred.decision_ts)


def _cheat(monkeypatch, family: str, how: str) -> None:
    """Make a family read past its entry trade the way a bug or a cheating model would: its windows end one row
    later (the next bar, the next book record), or the book is read a second after the close trade."""
    import alpha_core.eval.predict as predict_module
    from alpha_core.rl.env import MarketData

    if family == "ppo":  # the agent's observations gather the next bar's window
        honest = MarketData.windows
        monkeypatch.setattr(
            MarketData, "windows", lambda self, rows: honest(self, np.minimum(rows + 1, len(self.features) - 1))
        )
    elif family == "perception" and how == "+1 s":

        def late(bars, book):
            close = book_close_trade_ts(bars, book)
            return snapshots_at(book.ts, np.where(close >= 0, close + 1_000_000_000, -1))

        monkeypatch.setattr(predict_module, "book_decision_rows", late)
    elif family == "perception":
        honest_rows = predict_module.book_decision_rows
        monkeypatch.setattr(
            predict_module, "book_decision_rows", lambda bars, book: np.minimum(honest_rows(bars, book) + 1, book.rows - 1)
        )
    else:
        monkeypatch.setattr(
            predict_module, "bar_decision_rows", lambda bars: np.minimum(np.arange(bars.rows) + 1, bars.rows - 1)
        )


@pytest.mark.parametrize(
    "family, how", [("kan", "next bar"), ("ppo", "next bar"), ("perception", "next record"), ("perception", "+1 s")]
)
def test_a_model_that_reads_past_its_entry_trade_is_caught(run, monkeypatch, family, how):
    """The decision time is derived from the rows a prediction actually gathered, not declared: a model that reads
    one bar, one book record or one second past its entry trade carries that time and fails the check."""
    checkpoints, bars, book = run
    _cheat(monkeypatch, family, how)
    pred = predict(checkpoints[family], bars, book, 0, 0.0)
    with pytest.raises(
        DecisionClockError,
        match=rf"{family} on {TEST}: bar \d+ \(.*\) trades on data from .* after "
        r"its entry price traded at",
    ):
        check_decision_clock(family, TEST, np.asarray(bars.ts), pred.position, pred.decision_ts, entry_ts(bars, book))


def test_the_evaluator_refuses_a_cheating_checkpoint(run, monkeypatch, tmp_path, tiny_data):
    """`alpha evaluate` itself stops on look-ahead (it is a bug to fix, not a checkpoint to skip)."""
    checkpoints, _, _ = run
    models = next(p for p in checkpoints["kan"].ckpt.path.parents if p.name == "models")  # above the attempt folder
    _cheat(monkeypatch, "kan", "next bar")
    # the gate off: a near-chance tiny checkpoint would be excluded before it trades
    with pytest.raises(DecisionClockError, match="kan on 2024-Q"):
        main(
            [
                "evaluate",
                *flags(
                    models_dir=models, data_dir=tiny_data, output=tmp_path / "r.json", device="cpu", debug=True, min_val_auc=0
                ),
                "--min-val-sharpe=-1e9",
            ]
        )


@pytest.mark.parametrize("family", ["kan", "perception"])
def test_a_held_policy_decides_on_no_data_after_its_entry(run, monkeypatch, family):
    """A bet held 5 bars makes bar i's position depend on bars i-4..i: its decision time is the latest of theirs,
    never after bar i's entry, and a model reading past its entry still fails the check through the held bars."""
    from alpha_core.eval.policy import Policy

    checkpoints, bars, book = run
    held = Policy(name="fitted", horizon=1, threshold=0.0, hold=5, sizing="bet")
    one_bar = predict(checkpoints[family], bars, book, 1, 0.0, scored=False)
    pred = predict(checkpoints[family], bars, book, 1, 0.0, scored=False, policy=held)
    entry = entry_ts(bars, book)
    want = one_bar.decision_ts.copy()
    for k in range(1, 5):
        want[k:] = np.maximum(want[k:], one_bar.decision_ts[:-k])
    np.testing.assert_array_equal(pred.decision_ts, want)
    traded = _traded(pred.position)
    assert traded.sum() > 10 and len(np.unique(np.abs(pred.position))) > 3  # sized, averaged positions
    check_decision_clock(family, TEST, np.asarray(bars.ts), pred.position, pred.decision_ts, entry)
    _cheat(monkeypatch, family, "next bar" if family == "kan" else "next record")
    late = predict(checkpoints[family], bars, book, 1, 0.0, scored=False, policy=held)
    with pytest.raises(DecisionClockError, match=rf"{family} on {TEST}"):
        check_decision_clock(family, TEST, np.asarray(bars.ts), late.position, late.decision_ts, entry)


# --- future-blindness: probes that read around the row index, which the decision clock cannot see -----------------


def _probe(monkeypatch, checkpoints, how: str) -> str:
    """Install one probe; return the family it cheats for. Each reads the future without the row index knowing."""
    import alpha_core.eval.predict as predict_module

    if how == "batch neighbour":  # the network's output for window i is its output for window i + 1 of its batch
        net = checkpoints["kan"].net
        honest = net.last_position

        def neighbour(x):
            out = honest(x)
            return out[torch.clamp(torch.arange(len(out)) + 1, max=len(out) - 1)]

        monkeypatch.setattr(net, "last_position", neighbour)
        return "kan"
    if how == "next-bar price":  # a prediction nudged by the next bar's price, read from the sidecar directly
        honest_probs = predict_module.window_probs

        def peek(model, sc, rows=None):
            got, p, r = honest_probs(model, sc, rows)
            price = np.asarray(sc.price)
            move = price[np.minimum(got + 1, sc.rows - 1)] - price[got]
            return got, np.clip(p + 0.2 * np.sign(move)[:, None], 0, 1).astype(p.dtype), r

        monkeypatch.setattr(predict_module, "window_probs", peek)
        return "kan"
    # the book read a second after the close: each snapshot's features are those of the first one 1 s or more later
    honest_take = predict_module.take_rows

    def late(sc, name, rows):
        if name != "features" or sc.meta.kind != "book":
            return honest_take(sc, name, rows)
        ts = np.asarray(sc.ts)
        later = np.minimum(np.searchsorted(ts, ts[rows] + 1_000_000_000), sc.rows - 1)
        return honest_take(sc, name, later)

    monkeypatch.setattr(predict_module, "take_rows", late)
    return "perception"


@pytest.mark.parametrize("family", ["kan", "ppo", "perception"])
def test_an_honest_checkpoint_is_future_blind(run, family):
    from alpha_core.eval import blindness
    from alpha_core.eval.policy import Policy

    checkpoints, bars, book = run
    entry = entry_ts(bars, book)
    assert blindness.cut_points(bars.rows, checkpoints[family].window + 60)  # the tiny file holds the cuts
    policies = [None] if family == "ppo" else [None, Policy(name="fitted", horizon=2, threshold=0.01, hold=5, sizing="bet")]
    if family == "perception":  # its aux outcome heads' rule
        policies.append(Policy(name="fitted", horizon=1, threshold=0.0, hold=3, rule="aux"))
    for policy in policies:
        whole = predict(checkpoints[family], bars, book, 0, 0.05, entry=entry, policy=policy)
        assert blindness.check(checkpoints[family], bars, book, whole, entry) is None


@pytest.mark.parametrize("how", ["batch neighbour", "next-bar price", "book 1 s late"])
def test_a_probe_that_reads_around_the_index_is_not_future_blind(run, monkeypatch, how):
    """The three ways past the decision clock (issue 31): each passes the clock and fails future-blindness."""
    from alpha_core.eval import blindness

    checkpoints, bars, book = run
    family = _probe(monkeypatch, checkpoints, how)
    entry = entry_ts(bars, book)
    whole = predict(checkpoints[family], bars, book, 0, 0.05, entry=entry)
    check_decision_clock(family, TEST, np.asarray(bars.ts), whole.position, whole.decision_ts, entry)  # unseen by it
    reason = blindness.check(checkpoints[family], bars, book, whole, entry)
    assert reason is not None and reason.startswith("not future-blind: with the rows after bar ") and TEST in reason


def test_the_evaluator_excludes_a_checkpoint_that_is_not_future_blind(run, monkeypatch, tmp_path, tiny_data):
    import alpha_core.eval.evaluate as evaluate_module
    from alpha_core.eval.report import load_report

    checkpoints, _, _ = run
    models = next(p for p in checkpoints["kan"].ckpt.path.parents if p.name == "models")
    honest_load = evaluate_module.load

    def probed(ckpt, device):  # the batch-neighbour network, as a checkpoint of its own would load
        loaded = honest_load(ckpt, device)
        if ckpt.model == "kan":
            _probe(monkeypatch, {"kan": loaded}, "batch neighbour")
        return loaded

    monkeypatch.setattr(evaluate_module, "load", probed)
    out = tmp_path / "r.json"
    args = ["evaluate", *flags(models_dir=models, data_dir=tiny_data, output=out, device="cpu")]
    main([*args, "--min-val-auc", "0", "--min-val-sharpe=-1e9", "--debug"])
    report = load_report(out)
    assert "kan" not in report.symbols["ES.FUT"].models and "ppo" in report.symbols["ES.FUT"].models
    (reason,) = [e.reason for e in report.excluded if e.model == "kan"]
    assert reason.startswith("not future-blind: with the rows after bar ")
