"""`alpha evaluate` end to end on tiny demo data, and the proof that predictions never look ahead."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch

from alpha_core.cli import main
from alpha_core.data.sidecar import ARRAYS, Sidecar, load_sidecar
from alpha_core.eval import metrics
from alpha_core.eval.evaluate import find_checkpoints
from alpha_core.eval.predict import supervised_probs
from alpha_core.eval.report import load_report

FOLDS = ["--cv-n-folds", "2", "--cv-train-window", "2"]


@pytest.fixture(scope="module")
def trained(tiny_data, tmp_path_factory):
    """Checkpoints of two cheap supervised members, PPO and the flagship, laid out as the spec's models/ tree."""
    root = tmp_path_factory.mktemp("run")
    models, pd = root / "models", root / "pd"
    bars, book = tiny_data / "ES.FUT" / "ohlcv-1m", tiny_data / "ES.FUT" / "mbp-10"
    small = ["--epochs", "1", "--seq-len", "16", "--batch-size", "64", "--n-train-seqs", "512", "--n-val-seqs", "256",
             "--predecoded-dir", str(pd), "--device", "cpu", *FOLDS]
    for model in ("mamba2", "kan"):
        assert main(["train-supervised", "--model", model, "--data-dir", str(bars),
                     "--output-dir", str(models / model / "ES.FUT"), *small]) == 0
    assert main(["train-rl", "--model", "ppo", "--data-dir", str(bars), "--output-dir", str(models / "ppo" / "ES.FUT"),
                 "--epochs", "1", "--timesteps-per-epoch", "512", "--n-envs", "4", "--predecoded-dir", str(pd),
                 "--device", "cpu", "--cv-fold", "0", *FOLDS]) == 0
    assert main(["train", "--mbp10-data-dir", str(book), "--predecoded-dir", str(pd), "--device", "cpu",
                 "--out", str(models / "perception" / "ES.FUT" / "fold-0"), "--epochs", "1", "--batch-size", "32",
                 "--n-train-seqs", "128", "--n-val-seqs", "64", "--seq-len", "16", "--cv-fold", "0", *FOLDS]) == 0
    # a checkpoint whose weights are gone must be listed, not silently dropped
    broken = models / "kan" / "ES.FUT" / "fold-7"
    shutil.copytree(models / "kan" / "ES.FUT" / "fold-0", broken)
    (broken / "model.safetensors").unlink()
    for fold, change in ((8, {"test_files": []}), (9, {"gate_passed": False})):  # no test file; a failed gate
        odd = models / "mamba2" / "ES.FUT" / f"fold-{fold}"
        shutil.copytree(models / "mamba2" / "ES.FUT" / "fold-0", odd)
        summary = json.loads((odd / "summary.json").read_text())
        (odd / "summary.json").write_text(json.dumps({**summary, **change}))
    return root, pd


def test_report_end_to_end(trained, tiny_data):
    root, pd = trained
    out = root / "eval" / "ensemble_report.json"
    assert main(["evaluate", "--models-dir", str(root / "models"), "--data-dir", str(tiny_data), "--output", str(out),
                 "--symbols", "ES.FUT", "--predecoded-dir", str(pd), "--device", "cpu"]) == 0
    report = load_report(out)  # validates against the schema
    sym = report.symbols["ES.FUT"]
    assert set(sym.models) == {"mamba2", "kan", "ppo", "perception"}
    assert set(sym.ensembles) == {"equal_weight", "validation_weighted"}
    assert [f.test_file for f in sym.models["mamba2"].folds] == ["ES.FUT_2024-Q4.dbn.zst", "ES.FUT_2025-Q1.dbn.zst"]
    assert [f.test_file for f in sym.models["perception"].folds] == ["ES.FUT_2024-Q4.dbn.zst"]
    for result in [*sym.models.values(), *sym.ensembles.values()]:
        for key in ("sharpe", "max_drawdown", "win_rate", "turnover", "hit_rate", "psr", "dsr", "total_pnl"):
            assert result.oos[key] is not None and math.isfinite(result.oos[key]), (result.name, key)
    weights = sym.ensembles["validation_weighted"].folds[0].weights
    assert set(weights) == {"mamba2", "kan", "ppo", "perception"} and abs(sum(weights.values()) - 1) < 1e-9
    assert sym.models["kan"].folds[0].auc_per_horizon is not None and sym.models["ppo"].folds[0].auc_per_horizon is None
    assert sym.oracle_auc is not None and 0.6 < sym.oracle_auc[0] < 1
    reasons = {(e.model, e.fold): e.reason for e in report.excluded}
    assert reasons[("kan", 7)] == "missing model.safetensors"
    assert reasons[("mamba2", 8)] == "fold has no test file"
    assert reasons[("mamba2", 9)] == "its gate failed upstream"
    md = out.with_suffix(".md").read_text()
    assert "| **equal_weight** |" in md and "| mamba2 |" in md and "Excluded" in md
    for name in ("ES.FUT_equity.png", "ES.FUT_drawdown.png", "ES.FUT_fold_sharpe.png"):
        assert (out.parent / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _truncated(sc: Sidecar, n: int) -> Sidecar:
    arrays = {k: getattr(sc, k)[:n] for k in ARRAYS}
    return Sidecar(path=sc.path, meta=sc.meta.model_copy(update={"rows": n}), **arrays)


def test_predictions_use_only_bars_up_to_each_bar(trained):
    """Cut the test file after bar n: every prediction before n is unchanged, so none can use a later bar."""
    root, pd = trained
    (ckpt,) = [c for c in find_checkpoints(root / "models", ["ES.FUT"])[0] if c.model == "mamba2" and c.fold == 0]
    test = load_sidecar(next(pd.glob("ES.FUT_2024-Q4.ES.bars.*")))
    full = supervised_probs(ckpt, test, torch.device("cpu"))
    n = test.rows // 2
    cut = supervised_probs(ckpt, _truncated(test, n), torch.device("cpu"))
    np.testing.assert_array_equal(cut, full[:n])


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
