"""`alpha train`: learning on the planted signal, the original system's validation errors, CV split, summary, resume."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_model

from alpha_core.cli import main
from alpha_core.data.oracle import oracle_auc
from alpha_core.errors import PlanError
from alpha_core.models.perception import PerceptionConfig, PerceptionModel
from alpha_core.train.perception import SUMMARY, PerceptionTrainer, TrainConfig, compile_options, use_captured_step

SPEC_FIELDS = {
    "epochs": int,
    "seq_len": int,
    "horizons": list,
    "final_train_loss": float,
    "final_val_loss": float,
    "final_val_auc": list,
    "n_train_seqs_consumed": int,
    "n_val_seqs_consumed": int,
    "best_epoch": int,
    "best_val_loss": float,
    "best_val_auc": list,
    "best_mean_auc_epoch": int,
    "best_mean_auc": float,
    "best_mean_auc_per_horizon": list,
    "best_auc_h1000_epoch": int,
    "best_auc_h1000": float,
    "best_auc_h1000_per_horizon": list,
    "early_stopped": bool,
    "best_h1000_ckpt_path": str,
    "final_smooth_loss_per_horizon": list,
}
FAST = dict(epochs=1, batch_size=32, n_train_seqs=64, n_val_seqs=64, seq_len=8, lr_warmup_steps=2)


@pytest.fixture
def book_dir(tiny_data):
    return tiny_data / "ES.FUT" / "mbp-10"


def config(book_dir, tmp_path, **overrides) -> TrainConfig:
    values = dict(mbp10_data_dir=book_dir, predecoded_dir=tmp_path / "pd", out=tmp_path / "out", device="cpu")
    return TrainConfig(**{**values, **FAST, **overrides})


@pytest.mark.slow
def test_learns_the_planted_signal_below_the_oracle(book_dir, tmp_path):
    cfg = config(
        book_dir,
        tmp_path,
        epochs=2,
        batch_size=64,
        n_train_seqs=3000,
        n_val_seqs=2000,
        seq_len=32,
        lr_warmup_steps=20,
        early_stop_metric="none",
        cv_n_folds=1,
    )  # 4 tiny files to learn from
    trainer = PerceptionTrainer(cfg)
    summary = trainer.fit()
    auc_h10 = summary.best_mean_auc_per_horizon[0]
    ceiling = oracle_auc(trainer.val_files)[0]
    assert 0.6 < auc_h10 < ceiling, (auc_h10, ceiling)


def test_summary_has_every_spec_field_and_checkpoints(book_dir, tmp_path):
    cfg = config(book_dir, tmp_path, epochs=2, kernel_step_trace=tmp_path / "out" / "trace.jsonl")
    PerceptionTrainer(cfg).fit()
    out = tmp_path / "out" / "fold-0"
    summary = json.loads((out / SUMMARY).read_text())
    for name, kind in SPEC_FIELDS.items():
        assert isinstance(summary[name], kind), (name, summary[name])
    assert summary["horizons"] == [10, 100, 1000] and summary["epochs"] == 2 and summary["seq_len"] == 8
    assert all(len(summary[k]) == 3 for k in SPEC_FIELDS if SPEC_FIELDS[k] is list and k != "horizons")
    assert summary["n_train_seqs_consumed"] == 128 and summary["n_val_seqs_consumed"] == 64
    assert summary["best_h1000_ckpt_path"] == "trunk_best_h1000.safetensors"
    assert summary["device"] == "cpu" and summary["precision"] == "fp32" and summary["sequences_per_s"] > 0
    assert {"alpha", "torch", "numpy"} <= set(summary["versions"])
    for name in ("trunk_best_h1000.safetensors", "norm_stats.json", "model_config.json"):
        assert (out / name).exists()
    lines = [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(4))  # 2 epochs x 64 seqs / batch 32
    assert set(lines[0]) >= {
        "loss",
        "bce",
        "lambda",
        "bce_ema",
        "aux_huber_ema",
        "aux_acc_ema",
        "lr",
        "grad_norm",
        "aux_stop_grad_lifted",
        "buckets_tied",
    }
    assert lines[0]["lr"]["mamba2"] == pytest.approx(0.5e-3) and lines[0]["lr"]["cfc"] == pytest.approx(1.5e-3)


def test_best_checkpoint_reproduces_its_validation_auc(book_dir, tmp_path):
    cfg = config(book_dir, tmp_path, epochs=3, n_train_seqs=256, n_val_seqs=256)
    summary = PerceptionTrainer(cfg).fit()
    fresh = PerceptionTrainer(cfg)  # same data and config, untrained weights
    out = cfg.out / "fold-0"
    load_model(fresh.model, str(out / summary.best_h1000_ckpt_path))
    _, aucs = fresh.validate_epoch(summary.best_auc_h1000_epoch)
    np.testing.assert_allclose(aucs, summary.best_auc_h1000_per_horizon, atol=1e-9)
    # the checkpoint the gate judges (and evaluation loads) reproduces the AUCs its summary gates on
    load_model(fresh.model, str(out / summary.checkpoint))
    _, aucs = fresh.validate_epoch(summary.checkpoint_epoch)
    assert summary.checkpoint_metric == "mean_auc" and summary.checkpoint == "model_best_mean_auc.safetensors"
    np.testing.assert_allclose(aucs, summary.val_auc, atol=1e-9)
    assert summary.val_auc == summary.best_mean_auc_per_horizon
    model = PerceptionModel(PerceptionConfig(**json.loads((out / "model_config.json").read_text())))
    load_model(model, str(out / "trunk_best_h1000.safetensors"))
    load_model(fresh.model, str(out / summary.best_h1000_ckpt_path))  # the same checkpoint (its epoch may differ)
    x, dt = torch.randn(2, 8, model.cfg.n_features), torch.rand(2, 8)
    torch.testing.assert_close(model(x, dt)["logits"], fresh.model.cpu()(x, dt)["logits"])


def test_cv_split_default_walk_forward_single_fold_and_sliding_window(book_dir, tmp_path):
    default = PerceptionTrainer(config(book_dir, tmp_path / "d", cv_fold=2))  # the pipeline's plan: 3 folds, a test each
    assert [sc.meta.source.name for sc in default.train_files] == ["ES.FUT_2024-Q3.dbn.zst"]
    assert [Path(sc.meta.source.path).name for sc in default.val_files] == ["ES.FUT_2024-Q4.dbn.zst"]
    assert [sc.meta.source.name for sc in default.val_files] == ["2024-Q4"]  # a quarter of one file: named for it
    assert default.test_names == ["2025-Q1"] and default.dest == tmp_path / "d" / "out" / "fold-2"  # calendar quarters
    assert (default.train_names, default.val_names) == (["2024-Q3"], ["2024-Q4"])
    single = PerceptionTrainer(config(book_dir, tmp_path / "a", cv_n_folds=1))
    assert [sc.meta.source.name for sc in single.train_files] == [f"ES.FUT_2024-Q{i}.dbn.zst" for i in (1, 2, 3, 4)]
    assert [Path(sc.meta.source.path).name for sc in single.val_files] == ["ES.FUT_2025-Q1.dbn.zst"]
    sliding = PerceptionTrainer(config(book_dir, tmp_path / "b", cv_n_folds=2, cv_train_window=2, cv_fold=1))
    assert [sc.meta.source.name for sc in sliding.train_files] == ["ES.FUT_2024-Q2.dbn.zst", "ES.FUT_2024-Q3.dbn.zst"]
    assert [Path(sc.meta.source.path).name for sc in sliding.val_files] == ["ES.FUT_2024-Q4.dbn.zst"]


@pytest.mark.slow
def test_every_fold_compiles_to_one_graph(book_dir, tmp_path):
    """Folds differ in time scale (and products in tick size); as tensors, not constants baked into the traced
    graph, they leave it unchanged, so the compile cache that step pods share serves every fold after the first."""
    graphs = []

    def keep_code(gm, _inputs):
        graphs.append(gm.code)
        return gm.forward

    trainers = [
        PerceptionTrainer(config(book_dir, tmp_path / str(fold), cv_n_folds=2, cv_train_window=2, cv_fold=fold))
        for fold in (0, 1)
    ]
    assert trainers[0].time_scale != trainers[1].time_scale
    trainers[1].tick_size.fill_(0.0001)  # as for a product with another tick size
    for trainer in trainers:
        batch = trainer.train_loader.next_batch(2)
        torch._dynamo.reset()
        torch.compile(trainer._forward_loss, backend=keep_code)(
            batch.x, batch.dt, batch.labels, batch.outcome_long, batch.outcome_short
        )
    assert len(graphs) == 2 and graphs[0] == graphs[1]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--batch-size", "0"], "batch_size must be >= 1"),
        (
            ["--early-stop-metric", "sharpe"],
            "--early-stop-metric must be one of: val_loss, mean_auc, auc_h1000, none (got `sharpe`)",
        ),
        (["--horizon-weights", "1.0,0.5"], "--horizon-weights expected 3 floats, got 2"),
        (["--horizon-weights", "1.0,x,1"], "horizon weight parse"),
        (["--cv-n-folds", "0"], "--cv-n-folds must be >= 1 (got 0)"),
        (["--cv-fold", "2", "--cv-n-folds", "2"], "--cv-fold 2 must be < --cv-n-folds 2"),
        (
            ["--cv-n-folds", "3", "--cv-train-window", "3"],
            "mbp-10: CV layout overflows: cv_fold=2 + window=3 + 1 val quarter > 5 quarters available",
        ),
        (
            ["--cv-n-folds", "5"],
            "mbp-10: 5 quarters (2024-Q1, 2024-Q2, 2024-Q3, 2024-Q4, 2025-Q1) are too few for 5 walk-forward folds",
        ),
        (["--cuda-graph"], "--cuda-graph and --compile are for cuda devices"),
    ],
)
def test_spec_validation_errors(book_dir, tmp_path, capsys, flags, message):
    argv = [
        "train",
        "--mbp10-data-dir",
        str(book_dir),
        "--predecoded-dir",
        str(tmp_path / "pd"),
        "--out",
        str(tmp_path / "out"),
        "--device",
        "cpu",
        *flags,
    ]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_single_quarter_cannot_be_split(book_dir, tmp_path, capsys):
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "only.dbn.zst").write_bytes(next(book_dir.glob("*.dbn.zst")).read_bytes())
    argv = ["train", "--mbp10-data-dir", str(lone), "--predecoded-dir", str(tmp_path / "pd"), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert re.search(rf"{re.escape(str(lone))}: mbp-10: 1 quarter \(\d{{4}}-Q\d\) is too few for 3 walk-forward folds", err), (
        err
    )
    assert "at least 5 calendar quarters" in err
    assert main([*argv, "--cv-n-folds", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{lone}: mbp-10: need >= 2 calendar quarters for a single-fold temporal split, found 1 quarter (" in err


@pytest.mark.slow
def test_early_stopping_when_nothing_improves(book_dir, tmp_path):
    cfg = config(
        book_dir, tmp_path, epochs=10, early_stop_patience=2, lr_cfc=1e-30, lr_mamba2=1e-30, lr_aux=1e-30, n_val_seqs=100_000
    )  # every val window every epoch: a frozen model (lr must be > 0: 1e-30 is below
    # float32 resolution, so no weight moves) scores the same AUC
    summary = PerceptionTrainer(cfg).fit()
    assert summary.early_stopped and summary.epochs == 3 and summary.best_mean_auc_epoch == 0
    # where the fold's seconds went (issue 33 item 1); nothing compiles on the CPU
    assert set(summary.stage_s) >= {"data", "build", "compile", "epochs", "validation", "writing", "total"}
    assert summary.stage_s["compile"] == 0 and summary.stage_s["epochs"] > 0
    assert not summary.cuda_graph and not summary.compiled, "the GPU fast path's default is off on the CPU"


def test_a_batch_larger_than_the_fold_never_trains_zero_steps(capsys):
    """The captured step trains whole batches only; a fold with fewer windows than one batch takes the eager step
    by default (it trains the partial batch) and refuses an explicit --cuda-graph with the numbers."""
    assert use_captured_step(None, True, 5000, 4096, 0) and use_captured_step(True, True, 4096, 4096, 0)
    assert not use_captured_step(False, True, 5000, 4096, 0) and not use_captured_step(None, False, 5000, 4096, 0)
    assert not use_captured_step(None, True, 1000, 4096, 2)
    assert "--batch-size 4096 exceeds fold 2's 1000 training windows" in capsys.readouterr().out
    with pytest.raises(PlanError, match=r"--cuda-graph trains whole batches only: --batch-size 4096 exceeds fold 1's 1000"):
        use_captured_step(True, True, 1000, 4096, 1)


@pytest.mark.slow
def test_aux_stop_gradient_lifts_on_a_constant_signal():
    """The original system's own synthetic check: constant outcomes -> aux Huber EMA converges, accuracy 1.0, lift fires."""
    torch.manual_seed(0)
    model = PerceptionModel(PerceptionConfig(n_features=6, d_model=16, cfc_hidden=16, cfc_backbone=16, aux_hidden=16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    b, k = 8, 12
    labels = torch.ones(b, k, 3)
    long, short = torch.full((b, k, 3), 0.75), torch.full((b, k, 3), -1.25)  # price units, tick 0.25
    encoder_before = [p.detach().clone() for p in model.encoder.parameters()]
    lifted_at = None
    for step in range(300):
        x, dt = torch.randn(b, k, 6), torch.rand(b, k)
        loss, parts = model.loss(model(x, dt), labels, long, short, tick_size=0.25)
        opt.zero_grad()
        loss.backward()
        opt.step()
        model.update_controllers(parts)
        if lifted_at is None and bool(model.aux_lifted):
            lifted_at = step
    assert (model.aux_huber_ema < 0.1).all() and (parts["aux_acc"] == 1.0).all() and (model.aux_acc_ema > 0.99).all()
    assert lifted_at is not None and lifted_at < 200, "the stop-gradient lift fires within the first 200 steps"
    assert any(not torch.equal(a, b) for a, b in zip(encoder_before, model.encoder.parameters(), strict=True))


def test_the_time_scale_is_np_median_of_the_training_spacing_streamed(tiny_sidecars):
    """`median_spacing` reads dt in blocks and gives the number the whole-array `np.median` gave, to the bit:
    odd and even counts, ties, non-positive spacing left out, and no spacing at all."""
    from alpha_core.data.sidecar import ARRAYS, Sidecar
    from alpha_core.train.perception import median_spacing

    def whole(files):
        spacing = np.concatenate([np.asarray(sc.dt[1:]) for sc in files])
        return float(np.median(spacing[spacing > 0])) if (spacing > 0).any() else 1.0

    def with_dt(sc, dt):
        arrays = {k: np.asarray(getattr(sc, k))[: len(dt)] for k in ARRAYS}
        return Sidecar(sc.path, sc.meta.model_copy(update={"rows": len(dt)}), **{**arrays, "dt": dt})

    books = tiny_sidecars["book"][:3]
    for files in (books, books[:1], books[1:]):
        assert median_spacing(files) == whole(files)
        assert median_spacing(files, block=1000) == whole(files)
    sc = books[0]
    rng = np.random.default_rng(0)
    for dt in (
        np.array([0, 3, 1, 2], np.float32),
        np.array([0, 3, 1, 2, 7], np.float32),
        np.array([5, 0, -1, 0, np.nan], np.float32),
        rng.choice([0.25, 0.5, 1e-9, 3e4, -2], 999).astype(np.float32),
        rng.exponential(0.05, 4001).astype(np.float32),
    ):
        assert median_spacing([with_dt(sc, dt)]) == whole([with_dt(sc, dt)])
    two = [with_dt(sc, np.array([9, 1, 2], np.float32)), with_dt(sc, np.array([9, 4], np.float32))]
    assert median_spacing(two) == whole(two) == 2.0  # each file's first row left out


def test_this_torch_starts_inductor_s_compile_workers_before_the_first_compile():
    """The GPU trainer starts Inductor's Triton compile workers as it starts (`start_compile_workers`, a private
    name): an upgrade that drops it fails here on the CPU. In a process of its own, so that no pool outlives it."""
    probe = (
        "from torch._inductor.async_compile import AsyncCompile, get_compile_threads\n"
        "from alpha_core.torch_private import start_compile_workers\n"
        "start_compile_workers()\n"
        "print(get_compile_threads(), AsyncCompile.process_pool.cache_info().currsize)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    threads, pools = map(int, done.stdout.split())
    assert pools == (1 if threads > 1 else 0)  # one compile thread: Inductor compiles in the process, no pool


@pytest.mark.parametrize("batch_size", [1, 64, 65, 4096])
@pytest.mark.parametrize("multiprocessors", [132, 58])  # an H100 or H200; an L4
def test_this_torch_takes_the_compile_options_of_the_gpu_step(batch_size, multiprocessors):
    """The GPU step's Inductor options are private knobs: torch.compile checks their names and types when it is
    called, so an upgrade that drops or retypes one fails here on the CPU rather than on the first GPU pod. Up to
    batch 64 the products go through one-configuration Triton templates, on a GPU where Inductor offers them (on
    an L4 Triton as the only backend would leave a product no kernel); above it Inductor keeps its defaults."""
    options = compile_options(batch_size, multiprocessors)
    torch.compile(lambda x: x + 1, options=options)  # raises on an unknown option or a wrong type
    if batch_size > 64:
        assert options == {}
    elif multiprocessors >= 68:
        assert options["test_configs.max_mm_configs"] == 1 and options["max_autotune_gemm_backends"] == "TRITON"
        assert options["combo_kernels"] and options["test_configs.force_filter_reduction_configs"]
    else:
        assert options["combo_kernels"] and not options.get("max_autotune_gemm")
