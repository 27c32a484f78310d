"""`alpha evaluate` end to end on tiny demo data, and the proof that predictions never look ahead."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch
from helpers import flags

from alpha_core import metrics
from alpha_core.artifacts import seal
from alpha_core.cli import main
from alpha_core.data.features import BAR_FEATURES
from alpha_core.data.norm import NormStats
from alpha_core.data.oracle import oracle_probabilities
from alpha_core.data.sidecar import ARRAYS, Sidecar, load_sidecar
from alpha_core.eval import policy
from alpha_core.eval.evaluate import EvalConfig, evaluate, find_checkpoints
from alpha_core.eval.predict import (
    CPU_BATCH,
    _window_probs,
    at_rows,
    book_close_trade_ts,
    load,
    snapshots_at,
    window_probs,
)
from alpha_core.eval.report import Excluded, excluded_by_model, excluded_in_brief, load_report
from alpha_core.gates import GateThresholds
from alpha_core.models import registry

FOLDS = ["--cv-n-folds", "2", "--cv-train-window", "2"]
# the tiny models here are near chance, and these tests are about the report, not their skill: the gate stays on
# (a non-finite loss still fails it) with thresholds every finite checkpoint passes
NO_THRESHOLD = ["--min-val-auc", "0", "--min-val-sharpe", "-1000"]
ANY_FINITE = GateThresholds(min_val_auc=0.0, min_val_sharpe=-1000.0)


def evaluate_argv(root, data, out, pd, *extra: str) -> list[str]:
    """`alpha evaluate` of the checkpoints under `root/models` on ES.FUT, on CPU, into `out`."""
    return [
        "evaluate",
        *flags(models_dir=root / "models", data_dir=data, output=out, symbols="ES.FUT", predecoded_dir=pd, device="cpu"),
        *extra,
    ]


def window_probs_at(model, sc: Sidecar, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """([N, H] up-probabilities of the windows ending at `rows` of a bar or book file (every full window when
    None), NaN elsewhere; [N] the latest row each of those windows read, -1 elsewhere): `window_probs` laid out
    over every row of the file (a test's view; evaluation keeps the compact form)."""
    got, p, r = window_probs(model, sc, rows)
    probs = np.full((sc.rows, len(sc.meta.horizons)), np.nan, dtype=np.float32)
    read = np.full(sc.rows, -1, dtype=np.int64)
    probs[got], read[got] = p, r
    return probs, read


@pytest.fixture(scope="module")
def trained(tiny_data, tmp_path_factory):
    """Checkpoints of two cheap supervised members, PPO and the flagship, laid out as the original system's models/ tree."""
    root = tmp_path_factory.mktemp("run")
    models, pd = root / "models", root / "pd"
    bars, book = tiny_data / "ES.FUT" / "ohlcv-1m", tiny_data / "ES.FUT" / "mbp-10"
    small = [
        *flags(epochs=1, seq_len=16, batch_size=64, n_train_seqs=512, n_val_seqs=256, predecoded_dir=pd, device="cpu"),
        *FOLDS,
    ]
    for model in ("mamba2", "kan"):
        assert main(["train-supervised", *flags(model=model, data_dir=bars, output_dir=models / model / "ES.FUT"), *small]) == 0
    assert (
        main(
            [
                "train-rl",
                *flags(
                    model="ppo",
                    data_dir=bars,
                    output_dir=models / "ppo" / "ES.FUT",
                    epochs=1,
                    timesteps_per_epoch=512,
                    n_envs=4,
                    predecoded_dir=pd,
                    device="cpu",
                    cv_fold=0,
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
                    mbp10_data_dir=book,
                    predecoded_dir=pd,
                    device="cpu",
                    out=models / "perception" / "ES.FUT",
                    epochs=1,
                    batch_size=32,
                    n_train_seqs=128,
                    n_val_seqs=64,
                    seq_len=16,
                    cv_fold=0,
                ),
                *FOLDS,
            ]
        )
        == 0
    )
    # a checkpoint whose weights are gone must be listed, not silently dropped
    broken = models / "kan" / "ES.FUT" / "fold-7"
    shutil.copytree(models / "kan" / "ES.FUT" / "fold-0", broken)
    (broken / "model.safetensors").unlink()
    # no test file; a training loss that is not finite fails the gate at any threshold; fold 0 again
    for fold, change in ((8, {"test_files": []}), (9, {"final_train_loss": math.nan}), (10, {})):
        odd = models / "mamba2" / "ES.FUT" / f"fold-{fold}"
        shutil.copytree(models / "mamba2" / "ES.FUT" / "fold-0", odd)
        summary = json.loads((odd / "summary.json").read_text())
        (odd / "summary.json").write_text(json.dumps({**summary, **change}))
        seal(odd, f"edited-{fold}")  # a complete unit that says so: the change is the test's, not a crash's
    return root, pd


@pytest.fixture(scope="module")
def evaluated(trained, tiny_data):
    """`alpha evaluate` of `trained`, once, into `root/eval/ensemble_report.json`: what every test of the report
    reads, whichever of them runs first or alone."""
    root, pd = trained
    threads = torch.get_num_threads()
    assert main(evaluate_argv(root, tiny_data, root / "eval" / "ensemble_report.json", pd, *NO_THRESHOLD)) == 0
    assert torch.get_num_threads() == threads  # CPU evaluation runs one intra-op thread per worker, then restores it
    return root, pd


def test_report_end_to_end(evaluated):
    root, _ = evaluated
    out = root / "eval" / "ensemble_report.json"
    report = load_report(out)  # validates against the schema
    sym = report.symbols["ES.FUT"]
    assert set(sym.models) == {"mamba2", "kan", "ppo", "perception"}
    assert set(sym.ensembles) == {"equal_weight", "validation_weighted"}
    assert [f.test_file for f in sym.models["mamba2"].folds] == ["2024-Q4", "2025-Q1"]  # calendar quarters
    assert [f.test_file for f in sym.models["perception"].folds] == ["2024-Q4"]
    rows = [*sym.models.values(), *sym.ensembles.values()]
    for result in rows:
        for m in (result.oos, *(f.metrics for f in result.folds)):  # uncertainty on every row, oos and per fold
            for key in (
                "sharpe",
                "max_drawdown",
                "win_rate",
                "turnover",
                "hit_rate",
                "psr",
                "dsr",
                "total_pnl",
                "sharpe_se",
                "sharpe_ci_low",
                "sharpe_ci_high",
            ):
                assert getattr(m, key) is not None and math.isfinite(getattr(m, key)), (result.name, key)
            assert m.n_sessions >= 3 and m.sharpe_ci_low < m.sharpe_ci_high and m.sharpe_se > 0
            assert list(m.sharpe_by_cost) == ["0", "0.5", "1", "2"] and m.sharpe_by_cost["1"] == m.sharpe
            # no hyperopt behind these rows: N = the 6 rows compared x the 54 policies the flagship's fit compared (48
            # on its probabilities, 6 on its aux outcome heads), V = the null variance 1/(T-1)
            assert m.dsr_n_trials == 6 * 54 and m.dsr_variance == pytest.approx(1 / (m.n_sessions - 1))
            assert m.dsr < m.psr or m.psr in (0.0, 1.0)
            assert m.dsr == m.dsr_null  # no trials: V is the null variance
        assert result.n_configurations == 6 * 54 and result.dsr_estimator.startswith("null variance")
        assert result.n_policies == policy.grid_size(3, aux=True) == 54 and policy.grid_size(3) == 48
    for name in ("mamba2", "kan", "perception"):  # each checkpoint trades the policy fitted on its validation file
        for f in sym.models[name].folds:
            assert f.policy.name == "fitted" and f.policy_val_sharpe is not None
            assert 0.0 <= f.policy_pbo <= 1.0  # the choice's probability of backtest overfitting (CSCV)
    assert all(f.policy is None for f in sym.models["ppo"].folds)  # an agent trades its own actions
    assert report.policy == "fitted"
    assert sym.models["mamba2"].oos.n_sessions == sum(f.metrics.n_sessions for f in sym.models["mamba2"].folds)
    weights = sym.ensembles["validation_weighted"].folds[0].weights
    assert set(weights) == {"mamba2", "kan", "ppo", "perception"} and abs(sum(weights.values()) - 1) < 1e-9
    reasons = {(e.model, e.fold): e.reason for e in report.excluded}
    assert reasons[("kan", 7)].startswith("unreadable: ") and "model.safetensors: missing" in reasons[("kan", 7)]
    assert reasons[("mamba2", 8)] == "no test quarter"
    assert reasons[("mamba2", 9)].startswith("gate failed: mean validation AUC") and "not finite" in reasons[("mamba2", 9)]
    assert reasons[("mamba2", 10)] == "tests on 2024-Q4 like fold 0: one checkpoint per test quarter"
    md = out.with_suffix(".md").read_text()
    assert "| **equal_weight** |" in md and "| mamba2 |" in md and "Excluded" in md and "### Per fold" in md
    assert "95% CI" in md and "AUC against the oracle" in md and "### Policies" in md
    for name in ("ES.FUT_equity.png", "ES.FUT_drawdown.png", "ES.FUT_fold_sharpe.png"):
        assert (out.parent / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_model_is_compared_with_the_oracle_on_its_own_rows_and_horizons(evaluated, tiny_data):
    """Bar models on bar labels (5/15/60 minutes), the book model on its own book labels (10/100/1000 snapshots)
    of the test book file; the oracle on exactly the same rows; RL agents have no probabilities."""
    root, pd = evaluated
    report = load_report(root / "eval" / "ensemble_report.json")
    sym = report.symbols["ES.FUT"]
    kan, perception = sym.models["kan"], sym.models["perception"]
    assert kan.auc.scored_on == "bars" and kan.auc.horizons == [5, 15, 60] and kan.auc.horizon_unit == "minutes"
    assert perception.auc.scored_on == "book" and perception.auc.horizons == [10, 100, 1000]
    assert perception.auc.horizon_unit == "snapshots" and sym.models["ppo"].auc is None
    book = load_sidecar(next(pd.rglob("ES.FUT_2024-Q4.ES.book.*")))
    seq_len = json.loads(next((root / "models" / "perception" / "ES.FUT").glob("fold-0/alpha_train_summary.json")).read_text())[
        "seq_len"
    ]
    labelled = np.isfinite(np.asarray(book.labels))[seq_len - 1 :].sum(axis=0)
    assert perception.auc.n_rows == labelled.tolist()  # every labelled snapshot after the first full window
    for row in (kan, perception, sym.models["mamba2"]):
        for auc in (row.auc, *(f.auc for f in row.folds)):
            assert auc.oracle is not None and auc.oracle_note is None
            assert auc.gap == pytest.approx([o - m for o, m in zip(auc.oracle, auc.model, strict=True)])
            assert auc.oracle[0] > 0.6 and all(0 < v < 1 for v in (*auc.oracle, *auc.model))  # long horizons: few
            # independent labels on a tiny file, so only the shortest horizon's oracle is clearly above chance
    # the oracle on the perception rows is the generator's book oracle on the same snapshots
    oracle = oracle_probabilities(book)
    rows = np.zeros(book.rows, bool)
    rows[seq_len - 1 :] = True
    mask = rows[:, None] & np.isfinite(np.asarray(book.labels))
    want = metrics.auc(oracle, np.where(mask, np.asarray(book.labels), np.nan))
    np.testing.assert_allclose(perception.auc.oracle, want, rtol=1e-12)
    md = (root / "eval" / "ensemble_report.md").read_text()
    assert "| perception | book | 10 snapshots |" in md and "| kan | bars | 5 minutes |" in md


def test_every_expected_model_and_fold_is_listed(trained, tiny_data):
    root, pd = trained
    report = evaluate(
        EvalConfig(
            models_dir=root / "models",
            data_dir=tiny_data,
            output=root / "eval2" / "r.json",
            symbols=["ES.FUT"],
            predecoded_dir=pd,
            device="cpu",
            gate=ANY_FINITE,
            expected=[("kan", 0), ("kan", 1), ("tft", 0), ("tft", 1), ("mamba2", 9)],
        )
    )
    reasons = {(e.model, e.fold): e.reason for e in report.excluded}
    assert reasons[("tft", 0)] == reasons[("tft", 1)] == "never materialized"
    assert reasons[("mamba2", 9)].startswith("gate failed: ") and ("kan", 0) not in reasons


def _truncated(sc: Sidecar, n: int) -> Sidecar:
    arrays = {k: getattr(sc, k)[:n] for k in ARRAYS}
    return Sidecar(path=sc.path, meta=sc.meta.model_copy(update={"rows": n}), **arrays)


def test_predictions_use_only_bars_up_to_each_bar(trained):
    """Cut the test file after bar n: every prediction before n is unchanged, so none can use a later bar."""
    root, pd = trained
    (ckpt,) = [c for c in find_checkpoints(root / "models", ["ES.FUT"])[0] if c.model == "mamba2" and c.fold == 0]
    test = load_sidecar(next(pd.rglob("ES.FUT_2024-Q4.ES.bars.*")))
    model = load(ckpt, torch.device("cpu"))
    full, read = window_probs_at(model, test)
    n = test.rows // 2
    cut, cut_read = window_probs_at(model, _truncated(test, n))
    np.testing.assert_array_equal(cut, full[:n])
    decided = read >= 0
    assert (read[decided] == np.flatnonzero(decided)).all()  # each window read up to its own bar, no further


def test_a_cheating_model_is_exposed_by_the_one_bar_shift():
    """A position computed from the NEXT bar's move earns every move; the same signal one bar late earns ~0."""
    rng = np.random.default_rng(0)
    moves = rng.choice([-1.0, 0.0, 1.0], size=5000)
    ts = np.arange(5000, dtype=np.int64) * 60_000_000_000 + 1_704_150_000_000_000_000
    cheat = np.sign(moves)  # knows move t->t+1 at bar t: look-ahead
    honest = np.r_[0.0, np.sign(moves[:-1])]  # the same signal once it is known
    cheat_pnl = metrics.bar_pnl(cheat, moves, 0.0).sum()
    honest_pnl = metrics.bar_pnl(honest, moves, 0.0).sum()
    assert cheat_pnl == np.abs(moves).sum()
    assert abs(honest_pnl) < 0.1 * cheat_pnl
    assert metrics.summarize(ts, cheat, moves, 0.0)["sharpe"] > 10 * abs(metrics.summarize(ts, honest, moves, 0.0)["sharpe"])


def test_the_book_model_decides_on_nothing_after_each_close_trade(trained):
    """Cut the test book file at bar m's close trade: bar m's probability is unchanged, so the book path reads no
    snapshot received after the price it trades at (the last snapshot at or before the close trade)."""
    root, pd = trained
    (ckpt,) = [c for c in find_checkpoints(root / "models", ["ES.FUT"])[0] if c.model == "perception"]
    book = load_sidecar(next(pd.rglob("ES.FUT_2024-Q4.ES.book.*")))
    bars = load_sidecar(next(pd.rglob("ES.FUT_2024-Q4.ES.bars.*")))
    close = book_close_trade_ts(bars, book)
    model = load(ckpt, torch.device("cpu"))
    rows = snapshots_at(book.ts, close)
    full, read = (at_rows(a, rows, fill) for a, fill in zip(window_probs_at(model, book), (np.nan, -1), strict=True))
    checked = 0
    for m in np.flatnonzero(np.isfinite(full[:, 0]))[:: max(1, bars.rows // 6)]:
        keep = int(np.searchsorted(np.asarray(book.ts), close[m], side="right"))  # snapshots with ts <= close trade
        cut = _truncated(book, keep)
        probs, cut_read = window_probs_at(model, cut, rows[m : m + 1])
        np.testing.assert_allclose(probs[rows[m]], full[m], rtol=1e-5, atol=1e-6)
        assert cut_read[rows[m]] == read[m] == rows[m] and np.asarray(book.ts)[read[m]] <= close[m]
        checked += 1
    assert checked >= 4


def _windows(model, values: np.ndarray, normalise: bool = True) -> torch.Tensor:
    """Every window of a file, as float32, normalised with the checkpoint's statistics: [windows, K, F] (or [windows,
    K])."""
    t = torch.from_numpy(np.array(values, dtype=np.float32))
    if normalise:
        mean, std = (torch.from_numpy(a) for a in model.norm.arrays())
        t = (t - mean) / std
    w = t.unfold(0, model.window, 1)
    return (w.transpose(1, 2) if w.dim() == 3 else w).contiguous()


@pytest.mark.slow
def test_batched_inference_gives_the_model_s_own_numbers(trained):
    """Evaluation's inference shortcuts give the model's own numbers: the book model's trunk-only `last_logits` under
    inference mode equals its training forward; windows in small padded batches over worker threads equal one pass
    over the whole file; predicting only some snapshots (the validation path) gives those rows and NaN elsewhere.
    (Equal up to float rounding here; on the demo checkpoints the report is the same to the bit: bench_evaluate.py
    --demo --reference.)"""
    root, pd = trained
    checkpoints = {c.model: c for c in find_checkpoints(root / "models", ["ES.FUT"])[0] if c.fold == 0}
    book = load_sidecar(next(pd.rglob("ES.FUT_2024-Q4.ES.book.*")))
    model = load(checkpoints["perception"], torch.device("cpu"))
    x, dt, k = _windows(model, book.features), _windows(model, book.dt, normalise=False), model.window
    assert len(x) > 2 * CPU_BATCH  # several batches, so the worker threads share the file
    whole = torch.sigmoid(model.net(x, dt)["logits"][:, -1]).detach().numpy()  # with autograd, aux trunk and all
    with torch.inference_mode():
        torch.testing.assert_close(
            model.net.last_logits(x[:64], dt[:64]), model.net(x[:64], dt[:64])["logits"][:, -1], rtol=0, atol=1e-6
        )
    snap, _ = window_probs_at(model, book)
    np.testing.assert_allclose(snap[k - 1 :], whole, rtol=0, atol=1e-6)
    assert np.isnan(snap[: k - 1]).all()
    rows = np.array([0, k - 2, k - 1, k + 5, book.rows - 1, k + 5])  # before the first window, repeated, last
    some, _ = window_probs_at(model, book, rows)
    picked = np.array([k - 1, k + 5, book.rows - 1])
    np.testing.assert_allclose(some[picked], snap[picked], rtol=0, atol=1e-6)
    assert np.isnan(np.delete(some, picked, axis=0)).all()
    bars = load_sidecar(next(pd.rglob("ES.FUT_2024-Q4.ES.bars.*")))
    mamba2 = load(checkpoints["mamba2"], torch.device("cpu"))
    with torch.no_grad():
        whole = torch.sigmoid(mamba2.net(_windows(mamba2, bars.features))[:, -1]).numpy()
    np.testing.assert_allclose(window_probs_at(mamba2, bars)[0][mamba2.window - 1 :], whole, rtol=0, atol=1e-6)


def test_the_tft_s_variable_selection_once_per_bar_gives_its_forward_s_numbers():
    """Evaluation runs the TFT's position-wise variable selection once per bar and the rest on windows of its output:
    the probabilities of its forward on every window (the bar sidecar's feature width, several batches)."""
    torch.manual_seed(3)
    n = len(BAR_FEATURES)
    model = registry.get("tft").build(n_features=n).eval()
    features = np.random.default_rng(3).normal(size=(3 * CPU_BATCH + 40, n)).astype(np.float32)
    norm = NormStats(feature_names=list(BAR_FEATURES), mean=[0.0] * n, std=[1.0] * n, rows=len(features), sources=[])
    windows = torch.from_numpy(features).unfold(0, 16, 1).transpose(1, 2).contiguous()
    with torch.no_grad():
        whole = torch.sigmoid(model(windows)[:, -1]).numpy()
    probs, read = _window_probs(model, features, None, 16, norm, torch.device("cpu"), np.arange(15, len(features)))
    np.testing.assert_allclose(probs, whole, rtol=0, atol=1e-6)
    assert (read == np.arange(15, len(features))).all()


def test_alpha_evaluate_applies_the_gate_of_promotion_to_every_checkpoint(trained, tiny_data):
    """Checkpoints trained outside Dagster (the CLI) meet the same rule as promotion: reported only above the gate,
    and every one at or below it listed as "gate failed" with its metric and threshold."""
    root, pd = trained
    out = root / "eval-gated" / "ensemble_report.json"
    assert main(evaluate_argv(root, tiny_data, out, pd, "--min-val-auc", "0.52")) == 0
    report = load_report(out)
    sym = report.symbols.get("ES.FUT")
    reported = {(m, f.fold) for m, r in (sym.models.items() if sym else []) for f in r.folds}
    reasons = {(e.model, e.fold): e.reason for e in report.excluded}
    checked = 0
    for model, fold in [(m, k) for m in ("mamba2", "kan", "ppo", "perception") for k in (0, 1)]:
        folder = root / "models" / model / "ES.FUT" / f"fold-{fold}"
        if not folder.exists():
            continue
        kind = registry.get(model).kind
        trainer = kind.name
        summary = json.loads((folder / kind.summary_file).read_text())
        value, _ = kind.gated_value(summary)
        passes = value > (0.0 if trainer == "rl" else 0.52)
        assert ((model, fold) in reported) == passes, (model, fold, value, reasons.get((model, fold)))
        if not passes:
            label = "validation Sharpe" if trainer == "rl" else "mean validation AUC"
            assert reasons[(model, fold)] == f"gate failed: {label} {value:.4f} <= {0.0 if trainer == 'rl' else 0.52}" + (
                "" if trainer == "rl" else f", train loss {summary['final_train_loss']:.4f}"
            ), reasons[(model, fold)]
        checked += 1
    assert checked >= 6 and 0 < len(reported) < checked, "the tiny models straddle the gate: both sides are checked"


def test_a_second_evaluate_into_the_same_report_fails_fast_and_sets_stay_one_writers(trained, tiny_data, capsys):
    """Two `alpha evaluate` into one --output: the second is refused while the first writes (never a JSON of one
    and plots of the other), and a set whose companion was replaced afterwards is refused by `load_report`."""
    from alpha_core.errors import DataError
    from alpha_core.locks import Lock

    root, pd = trained
    out = root / "eval-race" / "ensemble_report.json"
    argv = evaluate_argv(root, tiny_data, out, pd, *NO_THRESHOLD)
    out.parent.mkdir(parents=True)
    with Lock(out.with_name(f".{out.name}.lock"), run="first-writer", step=str(out)).hold():
        assert main(argv) == 2
        assert "is being written by" in capsys.readouterr().err and not out.exists()
    assert main(argv) == 0
    load_report(out)
    out.with_suffix(".md").write_text("another writer's Markdown\n")
    with pytest.raises(DataError, match="not the one written with this report"):
        load_report(out)


@pytest.mark.slow
def test_a_full_disk_under_the_report_names_the_report_s_path(trained, tiny_data, tmp_path, capsys):
    """The report's folder fills up: the one line names where the write failed, not the sidecar cache."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    full = tmp_path / "full"
    full.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(full)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    root, pd = trained
    out = full / "ensemble_report.json"
    try:
        code = main(evaluate_argv(root, tiny_data, out, pd, *NO_THRESHOLD))
    finally:
        subprocess.run(["umount", "-l", str(full)], check=False)
    errors = [line for line in capsys.readouterr().err.splitlines() if ": warning: " not in line]
    assert code == 2 and len(errors) == 1 and "no space left on device" in errors[0], errors
    assert errors[0].startswith(f"alpha evaluate: error: {full}/") and str(pd) not in errors[0], errors


def test_evaluation_reads_each_checkpoint_from_the_attempt_it_named(trained, tmp_path):
    """A training that promotes another attempt while `alpha evaluate` runs changes nothing the evaluation reads:
    each checkpoint is read by its attempt, whose name the report records."""
    from alpha_core import artifacts

    root, _ = trained
    fold0 = root / "models" / "kan" / "ES.FUT" / "fold-0"
    (ckpt,) = [c for c in find_checkpoints(root / "models", ["ES.FUT"], ANY_FINITE)[0] if (c.model, c.fold) == ("kan", 0)]
    before = artifacts.promoted(fold0)
    assert ckpt.path == before.path.resolve()
    other = artifacts.Attempt(fold0, "a-later-run")
    shutil.copytree(before.path, other.path)
    (other.path / artifacts.MANIFEST).unlink()
    (other.path / "model.safetensors").chmod(0o644)  # a sealed attempt's files are read-only
    (other.path / "model.safetensors").write_bytes(b"not the weights this evaluation named")
    artifacts.seal(other.path, other.id)  # another training's complete attempt (a damaged one is never promoted)
    artifacts.promote(other)
    try:
        assert load(ckpt, torch.device("cpu")).net is not None  # read from its own attempt, not the promoted one
        assert ckpt.weights.parent == before.path.resolve() != other.path.resolve()
    finally:
        artifacts.promote(before)
        shutil.rmtree(other.path)


def _whole_file_probs(model, features, dt, seq_len, norm, rows):
    """The evaluation of commit 243e5a4 (before streaming), kept as the reference: `np.array` of the whole file,
    normalised once (book features upcast from their stored float16), TFT variable selection over every row, then
    windows in padded batches of CPU_BATCH (or the model's own `cpu_batch`)."""
    from alpha_core.eval.predict import SAMPLING_SEED, _padded

    mean, std = (torch.from_numpy(a) for a in norm.arrays())
    values = torch.from_numpy(np.array(features, dtype=np.float32)).sub_(mean).div_(std)
    sampling = hasattr(model, "forward_last")
    generator = torch.Generator().manual_seed(SAMPLING_SEED) if sampling else None
    parallel = not sampling
    if hasattr(model, "position_wise"):
        (values,) = _padded(
            lambda r: (model.position_wise(values[r][None])[0],), torch.arange(len(values)), CPU_BATCH * seq_len, parallel
        )
    times = None if dt is None else torch.from_numpy(np.array(dt))
    lags = torch.arange(-seq_len + 1, 1)

    def run(end):
        index = end[:, None] + lags
        x = values[index]
        if times is not None:
            last = model.last_logits(x, times[index])
        elif sampling:
            last = model.forward_last(x, generator=generator)
        elif hasattr(model, "last_position"):
            last = model.last_position(x)
        else:
            last = (model.forward_windows(x) if hasattr(model, "position_wise") else model(x))[:, -1]
        return torch.sigmoid(last.float()), index.amax(dim=1)

    batch = getattr(model, "cpu_batch", CPU_BATCH)
    probs, read = _padded(run, torch.from_numpy(np.asarray(rows, dtype=np.int64)), batch, parallel, pad=not sampling)
    return probs.numpy(), read.numpy()


@pytest.mark.slow
def test_streaming_evaluation_gives_the_whole_file_numbers_to_the_bit(trained, monkeypatch):
    """Windows gathered chunk by chunk from the sidecar (dense spans and sparse rows, chunks far smaller than the
    file) give the probabilities, and the rows read, of the whole-file evaluation, bit for bit: the book model on
    its decision rows and on every snapshot, a bar model, the position-wise paths (TFT, TGGN), the last-position
    paths (TGGN, TLOB, KAN, Mamba2) and the sampling Diffusion."""
    import alpha_core.eval.predict as predict_module
    from alpha_core.eval.predict import book_decision_rows, window_probs

    root, pd = trained
    checkpoints = {c.model: c for c in find_checkpoints(root / "models", ["ES.FUT"], ANY_FINITE)[0] if c.fold == 0}
    book = load_sidecar(next(pd.rglob("ES.FUT_2024-Q4.ES.book.*")))
    bars = load_sidecar(next(pd.rglob("ES.FUT_2024-Q4.ES.bars.*")))
    perception, mamba2 = (load(checkpoints[m], torch.device("cpu")) for m in ("perception", "mamba2"))
    n = len(BAR_FEATURES)
    others = []
    for name in ("tft", "diffusion", "tggn", "tlob", "kan", "mamba2"):
        torch.manual_seed(5)
        net = registry.get(name).build(n_features=n).eval()
        others.append(type(mamba2)(mamba2.ckpt, mamba2.device, mamba2.norm, mamba2.window, net))
    decision = book_decision_rows(bars, book)
    cases = [
        (perception, book, decision[decision >= 0]),
        (perception, book, None),
        (mamba2, bars, None),
        *((m, bars, None) for m in others),
    ]
    for model, sc, rows in cases:
        k = model.window
        want_rows = np.arange(k - 1, sc.rows) if rows is None else np.unique(rows[rows >= k - 1])
        dt = sc.dt if model.ckpt.trainer.reads_book else None
        want = _whole_file_probs(model.net, sc.features, dt, k, model.norm, want_rows)
        for chunk in (predict_module.CHUNK_ROWS, 3 * k + 5, k * CPU_BATCH + 1):
            monkeypatch.setattr(predict_module, "CHUNK_ROWS", chunk)
            got_rows, probs, read = window_probs(model, sc, rows)
            np.testing.assert_array_equal(got_rows, want_rows)
            np.testing.assert_array_equal(probs, want[0])
            np.testing.assert_array_equal(read, want[1])


def test_the_book_s_times_scanned_in_blocks_give_the_whole_array_answers(trained, monkeypatch):
    """Close trades, the snapshot at or before a time, and decision times, with the book read in blocks of 1,000
    rows, equal the whole-array computations they replace."""
    import alpha_core.eval.predict as predict_module
    from alpha_core.eval.predict import NS_PER_MINUTE, book_decision_times, book_snapshots_at, decision_times

    _, pd = trained
    book = load_sidecar(next(pd.rglob("ES.FUT_2024-Q4.ES.book.*")))
    bars = load_sidecar(next(pd.rglob("ES.FUT_2024-Q4.ES.bars.*")))
    trade = np.unique(np.asarray(book.trade_ts)[np.asarray(book.trade_ts) >= 0])
    minute = trade // NS_PER_MINUTE * NS_PER_MINUTE
    bar_ts = np.asarray(bars.ts)
    last = np.searchsorted(minute, bar_ts, side="right") - 1
    ok = (last >= 0) & (minute[np.maximum(last, 0)] == bar_ts)
    want_close = np.where(ok, trade[np.maximum(last, 0)], -1)
    rng = np.random.default_rng(0)
    ts = np.asarray(book.ts)
    clock = np.concatenate([want_close, ts[rng.integers(0, book.rows, 500)], [-1, ts[0] - 1, ts[-1], ts[-1] + 1]])
    for block in (1 << 20, 1000, 7):
        monkeypatch.setattr(predict_module, "BLOCK_ROWS", block)
        np.testing.assert_array_equal(book_close_trade_ts(bars, book), want_close)
        np.testing.assert_array_equal(book_snapshots_at(book, clock), snapshots_at(ts, clock))
    read = np.r_[-1, rng.integers(0, book.rows, 300), -1]
    np.testing.assert_array_equal(book_decision_times(read, book), decision_times(read, ts))


def test_the_book_auc_sample_is_fixed_seeded_and_every_row_of_a_small_file():
    from alpha_core.eval.predict import AUC_SAMPLE, auc_rows

    np.testing.assert_array_equal(auc_rows(24_000, 64), np.arange(63, 24_000))  # a demo file: every snapshot
    big = auc_rows(200_000_000, 64)
    assert len(big) == AUC_SAMPLE == len(np.unique(big)) and big[0] >= 63 and big[-1] < 200_000_000
    assert (np.diff(big) > 0).all()
    np.testing.assert_array_equal(big, auc_rows(200_000_000, 64))  # the same rows for every checkpoint and run


def _delong_by_pairs(p: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """DeLong's AUC and variance from every (positive, negative) pair: the definition, O(m n)."""
    pos, neg = p[y == 1], p[y == 0]
    psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
    return psi.mean(), v10.var(ddof=1) / len(pos) + v01.var(ddof=1) / len(neg)


def test_the_auc_interval_is_delong_s():
    from alpha_core.eval.evaluate import auc_interval

    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, size=(700, 2)).astype(np.float64)
    p = np.round(rng.normal(size=(700, 2)) + 0.6 * y, 1)  # rounded: ties count 1/2
    y[rng.random(700) < 0.1, 1] = np.nan
    low, high = auc_interval(p, y)
    for j in range(2):
        ok = ~np.isnan(y[:, j])
        auc, var = _delong_by_pairs(p[ok, j], y[ok, j])
        assert auc == pytest.approx(metrics.auc(p[ok, j], y[ok, j]), abs=1e-12)
        assert (low[j], high[j]) == pytest.approx((auc - 1.959964 * var**0.5, auc + 1.959964 * var**0.5), abs=1e-12)
    assert auc_interval(np.array([[0.2], [0.9]]), np.array([[0.0], [1.0]])) == ([0.0], [1.0])  # too few to say


@pytest.mark.slow
def test_validation_files_are_predicted_only_for_the_weights_that_need_them(trained, tiny_data, tmp_path, monkeypatch):
    """A test file only one model trades needs no validation Sharpe (its weight is 1); where several share it, each
    checkpoint's validation Sharpe is its summary's record (the evaluator's own number, computed by its trainer), and
    only a checkpoint without one (the flagship) has its validation file predicted, once; the weights are the very
    ones of predicting every validation file here."""
    import alpha_core.eval.evaluate as evaluate_module
    import alpha_core.eval.validation as validation_module

    root, pd = trained
    calls = []
    honest = evaluate_module.predict

    def counted(model, bars, *a, **k):
        calls.append((model.ckpt.model, bars.meta.source.name, a[3] if len(a) > 3 else k.get("scored", True)))
        return honest(model, bars, *a, **k)

    monkeypatch.setattr(evaluate_module, "predict", counted)
    monkeypatch.setattr(validation_module, "predict", counted)
    alone = tmp_path / "models"
    shutil.copytree(root / "models" / "kan", alone / "kan", symlinks=True)
    cfg = EvalConfig(
        models_dir=alone,
        data_dir=tiny_data,
        output=tmp_path / "alone" / "r.json",
        symbols=["ES.FUT"],
        predecoded_dir=pd,
        device="cpu",
        gate=ANY_FINITE,
    )
    report = evaluate(cfg)
    assert all(scored for *_, scored in calls) and len(calls) == 2  # two test files, no validation file
    assert [f.weights for f in report.symbols["ES.FUT"].ensembles["validation_weighted"].folds] == [{"kan": 1.0}] * 2

    calls.clear()
    cfg = cfg.model_copy(update={"models_dir": root / "models", "output": tmp_path / "all" / "r.json"})
    weighted = evaluate(cfg).symbols["ES.FUT"].ensembles["validation_weighted"].folds
    # kan, mamba2: the policy their trainers fitted (and its validation Sharpe); ppo: its summary's Sharpe
    assert [m for m, _, scored in calls if not scored] == ["perception"]
    monkeypatch.setattr(validation_module, "recorded_sharpe", lambda *a: None)
    monkeypatch.setattr(validation_module, "recorded_policy", lambda *a: None)
    calls.clear()
    again = evaluate(cfg.model_copy(update={"output": tmp_path / "all2" / "r.json"}))
    val_calls = [(m, f) for m, f, scored in calls if not scored]
    assert sorted(m for m, _ in val_calls) == ["kan", "kan", "mamba2", "mamba2", "perception", "ppo"]
    assert len(set(val_calls)) == len(val_calls)  # once per checkpoint
    assert [f.weights for f in again.symbols["ES.FUT"].ensembles["validation_weighted"].folds] == [f.weights for f in weighted]


def test_data_without_a_checkpoint_s_test_quarter_excludes_it_with_that_reason(trained, tiny_data, tmp_path):
    """Evaluating on data that lacks 2024-Q4 (fold 0's test quarter) lists fold 0 of every model with that reason,
    never a KeyError, and still reports fold 1 where 2025-Q1 is at hand."""
    root, pd = trained
    data = tmp_path / "data"
    shutil.copytree(tiny_data / "ES.FUT", data / "ES.FUT", ignore=shutil.ignore_patterns("*2024-Q4*"))
    report = evaluate(
        EvalConfig(
            models_dir=root / "models",
            data_dir=data,
            output=tmp_path / "e" / "r.json",
            symbols=["ES.FUT"],
            predecoded_dir=pd,
            device="cpu",
            gate=ANY_FINITE,
        )
    )
    reasons = {(e.model, e.fold): e.reason for e in report.excluded}
    for model in ("mamba2", "kan", "ppo"):
        assert reasons[(model, 0)] == (
            "no ohlcv-1m data for its test quarter 2024-Q4 (the ohlcv-1m quarters at hand: 2024-Q1, 2024-Q2, 2024-Q3, 2025-Q1)"
        )
    assert reasons[("perception", 0)].startswith("no ohlcv-1m data for its test quarter 2024-Q4")
    assert not any("KeyError" in r for r in reasons.values())
    assert [f.test_file for f in report.symbols["ES.FUT"].models["mamba2"].folds] == ["2025-Q1"]


@pytest.mark.slow
@pytest.mark.parametrize("split", ["monthly", "single", "daily"])
def test_other_splits_of_the_test_data_score_the_checkpoints_on_the_same_quarters(trained, tiny_data, tmp_path, split):
    """The same demo records split by month, in one file or by day give every checkpoint its test quarter: monthly,
    the very report of the quarterly files (one file: a quarter's first rows see the previous one's last hour; daily:
    each day's file picks its own front month, as a sidecar is built from its file alone)."""
    from alpha_core.data.demo import generate_demo_data

    root, pd = trained
    generate_demo_data(tmp_path / "data", "tiny", seed=7, symbols=["ES.FUT"], split=split)

    def run(data, cache, name):
        cfg = EvalConfig(
            models_dir=root / "models",
            data_dir=data,
            output=tmp_path / name / "r.json",
            symbols=["ES.FUT"],
            predecoded_dir=cache,
            device="cpu",
            gate=ANY_FINITE,
        )
        return evaluate(cfg)

    want, got = run(tiny_data, pd, "quarterly"), run(tmp_path / "data", tmp_path / "pd", split)
    assert [(e.model, e.fold, e.reason) for e in got.excluded] == [(e.model, e.fold, e.reason) for e in want.excluded]
    for name, row in want.symbols["ES.FUT"].models.items():
        other = got.symbols["ES.FUT"].models[name]
        assert [f.test_file for f in other.folds] == [f.test_file for f in row.folds]
        assert other.oos.n_sessions == row.oos.n_sessions
        assert (other.auc is None) == (row.auc is None)  # RL models have no probabilities
        assert other.auc is None or other.auc.oracle is not None  # the demo's oracle, whichever files hold the rows
        if split == "monthly":  # each quarter is one monthly file: the very sidecar of its quarterly file
            assert other.oos == row.oos and [f.metrics for f in other.folds] == [f.metrics for f in row.folds]
            assert other.auc == row.auc


def test_the_policy_is_the_trainers_fit_applied_unchanged_from_every_door(evaluated, tiny_data):
    """A checkpoint's policy is the one fitted on its validation file: recorded by its trainer, the same when
    `alpha evaluate` (CLI, or Dagster's report through the same `evaluate` and defaults) fits it again, and the
    report's test positions are that policy's positions."""
    from alpha_core.eval import validation
    from alpha_core.eval.configs import EvalConfig as Config
    from alpha_core.eval.validation import fit_policy

    root, pd = evaluated
    assert Config.model_fields["policy"].default == "fitted"
    report = load_report(root / "eval" / "ensemble_report.json")
    (ckpt,) = [c for c in find_checkpoints(root / "models", ["ES.FUT"])[0] if c.model == "kan" and c.fold == 0]
    val_name = ckpt.summary["val_files"][-1]
    recorded = validation.recorded_policy(ckpt, val_name, metrics.DEFAULT_COST_TICKS)
    assert recorded is not None and recorded.n_policies == 48
    fold = next(f for f in report.symbols["ES.FUT"].models["kan"].folds if f.fold == 0)
    assert fold.policy == recorded.policy and fold.policy_val_sharpe == recorded.sharpe
    val = load_sidecar(next(pd.rglob(f"ES.FUT_{val_name}.ES.bars.*")))
    again = fit_policy(load(ckpt, torch.device("cpu")), val, None, metrics.DEFAULT_COST_TICKS)
    assert again.policy == recorded.policy and again.sharpe == pytest.approx(recorded.sharpe)


def test_the_report_sets_each_row_beside_the_oracle_strategy(evaluated, tiny_data, samples, tmp_path):
    """The ceiling: the generator's exact probabilities through the same policy fitting (on each fold's validation
    file), traded on the same test files; each row shows its net Sharpe and the row's capture of it; real data n/a."""
    from alpha_core.data.sidecar import ensure_sidecar
    from alpha_core.eval.evaluate import oracle_strategy
    from alpha_core.eval.report import markdown
    from alpha_core.eval.validation import next_move_ticks

    root, pd = evaluated
    report = load_report(root / "eval" / "ensemble_report.json")
    sym = report.symbols["ES.FUT"]
    cfg = EvalConfig(models_dir=root / "models", data_dir=tiny_data, output=tmp_path / "r.json")

    def bars(name: str) -> Sidecar:
        return load_sidecar(next(pd.rglob(f"ES.FUT_{name}.ES.bars.*")))

    ts, pos, moves = [], [], []
    for f in sym.models["mamba2"].folds:
        summary = json.loads((root / "models" / "mamba2" / "ES.FUT" / f"fold-{f.fold}" / "summary.json").read_text())
        val, test = bars(summary["val_files"][-1]), bars(f.test_file)
        oracle = oracle_strategy(cfg, val, test)
        fold_sharpe = metrics.sharpe(metrics.daily_pnl(test.ts, metrics.bar_pnl(oracle, next_move_ticks(test), 1.0))[1])
        assert f.oracle_sharpe == fold_sharpe
        ts.append(np.asarray(test.ts))
        pos.append(oracle)
        moves.append(next_move_ticks(test))
    want = metrics.sharpe(
        metrics.daily_pnl(np.concatenate(ts), metrics.bar_pnl(np.concatenate(pos), np.concatenate(moves), 1.0))[1]
    )
    for row in (sym.models["mamba2"], sym.models["kan"], *sym.ensembles.values()):  # the same test files: one ceiling
        assert row.oracle_sharpe == pytest.approx(want)
        assert row.capture == (None if want <= 0 else pytest.approx(row.oos.sharpe / want))
    assert "### Against the oracle strategy" in markdown(report)
    # real data: no generator oracle, nothing to compare with
    real, _ = ensure_sidecar(samples / "databento-python/GLBX.MDP3/test_data.mbp-10.dbn.zst", tmp_path / "sc")
    assert oracle_strategy(cfg, real, real) is None
    row = sym.models["kan"].model_copy(update={"oracle_sharpe": None, "capture": None})
    real_report = report.model_copy(update={"symbols": {"ES.FUT": sym.model_copy(update={"models": {"kan": row}})}})
    assert "| kan | " in markdown(real_report) and "n/a (no generator oracle: real data)" in markdown(real_report)


def test_params_without_their_search_make_a_row_of_unknown_search(trained, tiny_data, tmp_path):
    """A search's best_params copied into a plain params file: training accepts it, and the report marks the row
    "search unknown", its DSR at an assumed N of trials, instead of "no hyperopt trials behind this row"."""
    from alpha_core.eval.evaluate import ASSUMED_SEARCH_TRIALS

    root, pd = trained
    models = tmp_path / "models"
    copied = tmp_path / "copied_params.json"
    for fold_dir in sorted((root / "models" / "kan" / "ES.FUT").glob("fold-[01]")):
        dest = models / "kan" / "ES.FUT" / fold_dir.name
        shutil.copytree(fold_dir.resolve(), dest)
        summary = json.loads((dest / "summary.json").read_text())
        (dest / "summary.json").write_text(json.dumps({**summary, "params_file": str(copied), "hyperopt": None}))
        seal(dest, f"copied-{fold_dir.name}")
    cfg = EvalConfig(
        models_dir=models,
        data_dir=tiny_data,
        output=tmp_path / "eval" / "r.json",
        symbols=["ES.FUT"],
        predecoded_dir=pd,
        device="cpu",
        gate=ANY_FINITE,
    )
    sym = evaluate(cfg).symbols["ES.FUT"]
    for row in (sym.models["kan"], *sym.ensembles.values()):
        assert row.search_unknown == [str(copied)] and row.n_trials == ASSUMED_SEARCH_TRIALS == 100
        assert row.oos.dsr_n_trials == 100 * row.n_configurations
        assert row.dsr_estimator.startswith(f"search unknown: {copied} carries no search record, so N assumes 100")
    assert "Search unknown" in (tmp_path / "eval" / "r.md").read_text()


def test_each_row_is_costed_under_named_cost_models(evaluated, tiny_data):
    """Beside the flat tick cost: half the book's spread at each decision (MBP-10) and a linear impact per unit."""
    from alpha_core.eval.evaluate import half_spreads
    from alpha_core.eval.predict import book_decision_rows

    root, pd = evaluated
    sym = load_report(root / "eval" / "ensemble_report.json").symbols["ES.FUT"]
    for row in (*sym.models.values(), *sym.ensembles.values()):
        assert set(row.sharpe_by_cost_model) == {"flat", "half_spread", "impact"}
        assert row.sharpe_by_cost_model["flat"] == pytest.approx(row.oos.sharpe)
        assert row.sharpe_by_cost_model["impact"] <= row.sharpe_by_cost_model["flat"] + 1e-9  # impact only adds cost
        assert row.sharpe_by_cost_model["half_spread"] is not None and row.half_spread_share > 0.9
    bars = load_sidecar(next(pd.rglob("ES.FUT_2024-Q4.ES.bars.*")))
    book = load_sidecar(next(pd.rglob("ES.FUT_2024-Q4.ES.book.*")))
    half = half_spreads(bars, book)
    rows = book_decision_rows(bars, book)
    spread = np.asarray(book.features)[:, book.meta.feature_names.index("spread_ticks")].astype(np.float64)
    np.testing.assert_array_equal(half[rows >= 0], spread[rows[rows >= 0]] / 2)
    assert set(np.unique(half[rows >= 0])) <= {0.5, 1.0}  # the demo's touch is 1 tick wide, 2 ticks 5% of the time
    pos = np.array([0.0, 1.0, 1.0, -1.0])
    np.testing.assert_allclose(metrics.cost_per_unit("impact", pos, 1.0), [1.0, 1.5, 1.0, 2.0])
    md = (root / "eval" / "ensemble_report.md").read_text()
    assert "### Cost models (out of sample)" in md


def test_excluded_reads_every_reason_in_one_line_per_model_and_reason():
    """What a report left out, as the printed summary and the page's first screen show it: a model whose folds were
    left out for different reasons shows each reason with its folds, never only the first."""
    excluded = [
        Excluded(model="tft", symbol="ES.FUT", fold=0, reason="never materialized"),
        Excluded(model="tft", symbol="ES.FUT", fold=1, reason="gate failed: mean validation AUC 0.47 <= 0.99"),
        Excluded(model="tft", symbol="ES.FUT", fold=2, reason="never materialized"),
        Excluded(model="ppo", symbol="ES.FUT", fold=None, reason="models/ppo/ES.FUT/x: not a checkpoint folder"),
    ]
    assert excluded_by_model(excluded) == [
        "tft fold 0, 2: never materialized",
        "tft fold 1: gate failed: mean validation AUC 0.47 <= 0.99",
        "ppo: models/ppo/ES.FUT/x: not a checkpoint folder",
    ]
    assert excluded_in_brief(excluded).startswith("4 left out. tft fold 0, 2: never materialized; tft fold 1: gate")
    assert excluded_in_brief([]) == "none: every checkpoint found was evaluated"
