"""`alpha train-supervised`: walk-forward training of any supervised registry model (the original system's
`train_baseline_supervised`).

Per fold of the symbol's fold plan: normalisation fitted on the training files, AdamW on linear warm-up +
cosine decay, masked BCE at every labelled position (or the model's own `loss`), a validation pass per
epoch (AUC per horizon at each window's last position), the original system's three best trackers and early stopping.
What is validated and written is an exponential moving average of the trained weights (`weight_ema`, 0.99 a step;
0: the trained weights): on bars whose signal is weak, the last steps' weights fit their own batches' noise, and
the average keeps what the steps agree on (at the `realistic` level it raised kan's and tft's test AUC and their
Sharpe at 1 tick: docs/models.md).
The checkpoint of the best epoch by the early-stop metric (mean AUC when `none`) is written as
`fold-<k>/model.safetensors` beside `norm_stats.json`, `model_config.json`, `params.json`, `train_config.json`
and `summary.json`, which records that checkpoint's validation score as `alpha evaluate` computes it
(`alpha_core.eval.validation`: the ensemble's weight, computed once). Each fold is one attempt
(`alpha_core.artifacts`): written in its own folder, sealed, and promoted to `fold-<k>` only when whole: the
folds of one call together, once all are complete (or by the caller, after its gate, when `promote` is False).
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path

import torch
from pydantic import ValidationError

from alpha_core import artifacts, compile_cache, cpus
from alpha_core.atomic import atomic_write_json
from alpha_core.bounds import MAX_BATCH_ELEMENTS, check_batch_fits
from alpha_core.data.dbn import MBP10, OHLCV_1M
from alpha_core.data.loader import WindowLoader
from alpha_core.data.norm import fit_norm_stats
from alpha_core.data.predecode import FoldData, default_predecoded_dir, walk_forward
from alpha_core.devices import resolve_device
from alpha_core.errors import PlanError, describe_validation_error
from alpha_core.eval import validation
from alpha_core.eval.predict import Checkpoint, load
from alpha_core.models import registry
from alpha_core.models.hooks import OwnLoss, Sampling
from alpha_core.params import ParamsFile, check_isolation, load_params_file, resolve
from alpha_core.progress import TrainingReporter, horizon_metrics
from alpha_core.stages import StageClock
from alpha_core.train.bar_folds import BarFoldSummary, train_folds, versions
from alpha_core.train.configs import SupervisedTrainConfig
from alpha_core.train.metrics import auc_per_horizon, masked_bce
from alpha_core.train.schedule import lr_at
from alpha_core.train.tracking import EARLY_STOP_METRICS, Trackers
from alpha_core.train.walk_forward import fold_unit
from alpha_core.trainers import SUPERVISED
from alpha_core.weights import save_weights

SCHEMA_OF_INPUT = {"bars": OHLCV_1M, "book": MBP10}


class FoldSummary(BarFoldSummary):
    """A supervised fold's summary: the checkpoint's epoch and its validation AUC per horizon, the three trackers'
    bests, the final losses; `epoch_metrics` rows hold train_loss, val_loss and val_auc_h<horizon>."""

    horizons: list[int]
    checkpoint_metric: str
    checkpoint_epoch: int
    val_auc: list[float]  # at the checkpoint's epoch
    best_val_loss: float
    best_mean_auc: float
    best_mean_auc_epoch: int
    best_auc_long: float
    best_auc_long_epoch: int
    final_train_loss: float
    final_val_loss: float
    final_val_auc: list[float]
    n_train_seqs_consumed: int
    sequences_per_s: float


def train_supervised(
    cfg: SupervisedTrainConfig,
    params_file: str | Path | None = None,
    explicit_params: dict | None = None,
    *,
    attempt_id: str | None = None,
    promote: bool = True,
    retry: bool = False,
    folds: list[FoldData] | None = None,
) -> list[FoldSummary]:
    """Train every requested fold; precedence: defaults < params file < explicit (CLI) values.

    Each fold is written as attempt `attempt_id` (a new id when None; `retry`: the orchestrator's retry of this
    step takes it over) and, with `promote`, every fold is promoted to `fold-<k>` once all are complete.
    """
    clock = StageClock()  # the process's stages so far, and the first fold's
    cpus.apply()  # threads for the CPUs this step was given (alpha_core/cpus.py)
    spec = registry.get(cfg.model)
    if spec.kind is not SUPERVISED:
        raise PlanError(f"model {cfg.model!r} is trained by `alpha {spec.kind.command}`")
    if cfg.early_stop_metric not in EARLY_STOP_METRICS:
        raise PlanError(f"--early-stop-metric must be one of: {', '.join(EARLY_STOP_METRICS)} (got `{cfg.early_stop_metric}`)")
    device = resolve_device(cfg.device)
    compile_cache.use(device)
    with clock.stage("data"):
        folds = folds or walk_forward(  # given folds: hyperopt's own split of the files before the first test file
            cfg.data_dir,
            SCHEMA_OF_INPUT[spec.input],
            default_predecoded_dir(cfg.predecoded_dir, cfg.output_dir),
            cfg.symbol,
            cfg.cv_n_folds,
            cfg.cv_train_window,
            cfg.cv_fold,
            cfg.allow_untested_folds,
            cfg.purge_sessions,
            cfg.embargo_sessions,
        )
    first = folds[0].train[0].meta
    data_fields = {"n_features": len(first.feature_names), "horizons": tuple(first.horizons)}
    source = load_params_file(params_file)
    leaks = {f.fold: check_isolation(source, cfg.model, f.fold, f.test_names, cfg.allow_hyperopt_leakage) for f in folds}
    model_cfg, file_train, cli_train = resolve(
        spec.config_class(), data_fields, source.values, explicit_params or {}, str(params_file)
    )
    for where, values in ((str(params_file), file_train), ("command line", {**file_train, **cli_train})):
        try:
            cfg = SupervisedTrainConfig(**{**cfg.model_dump(), **values})
        except ValidationError as exc:
            raise PlanError(f"{where}: {describe_validation_error(exc)}") from exc
    check_batch_fits(batch_size=cfg.batch_size, seq_len=cfg.seq_len, n_features=data_fields["n_features"])
    train_overrides = {**file_train, **cli_train}
    params = {**model_cfg.model_dump(mode="json"), **{k: getattr(cfg, k) for k in train_overrides}}
    attempt_id = attempt_id or artifacts.new_attempt_id()
    unit = fold_unit({**cfg.model_dump(mode="json"), "params": params}) if promote else None
    return train_folds(
        cfg.output_dir,
        folds,
        attempt_id,
        promote,
        retry,
        FoldSummary,
        lambda fold, out, fold_clock: _train_fold(
            cfg, spec, model_cfg, params, fold, device, out, attempt_id, unit, source, leaks[fold.fold], fold_clock
        ),
        clock,
    )


def _train_fold(
    cfg,
    spec,
    model_cfg,
    params,
    fold: FoldData,
    device,
    out: Path,
    attempt_id: str,
    unit: str | None,
    source: ParamsFile,
    leaks: list[str],
    clock: StageClock,
) -> FoldSummary:
    train_files, val_files = fold.train, fold.val
    with clock.stage("data"):
        norm = fit_norm_stats(train_files)
        norm.save(out / "norm_stats.json")
        atomic_write_json(out / "model_config.json", model_cfg.model_dump(mode="json"))
        atomic_write_json(out / "params.json", params)
        atomic_write_json(out / "train_config.json", cfg.model_dump(mode="json"))  # seq_len etc. for evaluation
        tick_size = train_files[0].meta.tick_size
        train_loader = WindowLoader(train_files, cfg.seq_len, cfg.n_train_seqs, cfg.seed, norm, device=device)
        val_loader = WindowLoader(val_files, cfg.seq_len, cfg.n_val_seqs, cfg.seed + 1, norm, device=device)

    with clock.stage("build"):
        torch.manual_seed(cfg.seed + fold.fold)
        model = spec.builder()(model_cfg).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        average = WeightAverage(model, cfg.weight_ema) if cfg.weight_ema else None
        scored = model if average is None else average.module  # what is validated and written
    total_steps = cfg.epochs * math.ceil(train_loader.n_windows / cfg.batch_size)
    metric = "mean_auc" if cfg.early_stop_metric == "none" else cfg.early_stop_metric
    t = Trackers()
    checkpoint_epoch, checkpoint_auc = 0, []
    report = TrainingReporter(out, f"{cfg.model} fold {fold.fold}", cfg.epochs, total_steps // cfg.epochs)
    started = time.perf_counter()
    own_loss = isinstance(model, OwnLoss)  # else the masked BCE of its logits
    for epoch in range(cfg.epochs):
        epoch_started, first_step_s = time.perf_counter(), 0.0
        model.train()
        train_loader.reset(cfg.seed + epoch)
        loss_sum, steps = torch.zeros((), device=device), 0
        for batch in train_loader.batches(cfg.batch_size):
            step_started = time.perf_counter()
            for group in optimizer.param_groups:
                group["lr"] = lr_at(cfg.lr, cfg.lr * cfg.lr_min_factor, t.global_step, cfg.lr_warmup_steps, total_steps)
            loss = model.loss(batch, tick_size) if own_loss else masked_bce(model(batch.x), batch.labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if average is not None:
                average.update()
            loss_sum += loss.detach()
            steps += 1
            t.global_step += 1
            t.train_seqs += len(batch)
            report.step()
            if t.global_step == 1:  # the process's first step: lazy kernel compilation (Triton, cuDNN) lands here
                if device.type == "cuda":
                    torch.cuda.synchronize()
                first_step_s = time.perf_counter() - step_started
        t.train_loss_sum += float(loss_sum)
        t.train_steps += steps
        clock.add("first_step", first_step_s)
        clock.add("epochs", time.perf_counter() - epoch_started - first_step_s)
        with clock.stage("validation"):
            val_loss, aucs = _validate(scored, val_loader, cfg, epoch, len(norm.feature_names))
        t.final_val_loss, t.final_val_auc, t.epochs_completed = val_loss, aucs, epoch + 1
        improved = t.update(epoch, val_loss, aucs)
        if improved[metric]:
            with clock.stage("writing"):
                save_weights(scored, out / "model.safetensors")
            checkpoint_epoch, checkpoint_auc = epoch, aucs
        report.epoch(
            epoch,
            train_loss=float(loss_sum) / max(steps, 1),
            val_loss=val_loss,
            **horizon_metrics("val_auc", train_files[0].meta.horizons, aucs),
        )
        report.say(
            f"{cfg.model} fold {fold.fold} epoch {epoch}: val_loss {val_loss:.4f} auc "
            f"{' '.join(f'h{h} {a:.3f}' for h, a in zip(train_files[0].meta.horizons, aucs, strict=True))}"
        )
        if t.should_stop(cfg.early_stop_metric, cfg.early_stop_patience):
            t.early_stopped = True
            break
    with clock.stage("val_score"):
        val_score = validation.score(
            load(Checkpoint(cfg.model, cfg.symbol or "", fold.fold, out, SUPERVISED, {}), device), val_files[-1]
        )
    wall = time.perf_counter() - started
    report.close()
    summary = FoldSummary(
        model=cfg.model,
        fold=fold.fold,
        train_files=fold.train_names,
        val_files=fold.val_names,
        test_files=fold.test_names,
        purge_sessions=fold.purge_sessions,
        embargo_sessions=fold.embargo_sessions,
        horizons=list(train_files[0].meta.horizons),
        epochs=t.epochs_completed,
        early_stopped=t.early_stopped,
        checkpoint_metric=metric,
        checkpoint_epoch=checkpoint_epoch,
        val_auc=checkpoint_auc,
        best_epoch=t.best_epoch,
        best_val_loss=t.best_val_loss,
        best_mean_auc=t.best_mean_auc,
        best_mean_auc_epoch=t.best_mean_auc_epoch,
        best_auc_long=t.best_auc_h1000,
        best_auc_long_epoch=t.best_auc_h1000_epoch,
        final_train_loss=t.train_loss_sum / max(t.train_steps, 1),
        final_val_loss=t.final_val_loss,
        final_val_auc=t.final_val_auc,
        val_score=val_score,
        epoch_metrics=report.epoch_metrics,
        params=params,
        params_file=source.path,
        hyperopt=source.hyperopt,
        hyperopt_leakage=leaks,
        n_train_seqs_consumed=t.train_seqs,
        device=str(device),
        wall_time_s=wall,
        sequences_per_s=t.train_seqs / max(wall, 1e-9),
        stage_s=clock.as_dict(),
        versions=versions(),
        attempt=attempt_id,
        unit=unit,
    )
    summary.write(out)
    return summary


class WeightAverage:
    """An exponential moving average of a model's weights and buffers, updated after each optimizer step by one
    fused lerp. Its decay warms up as (1 + t) / (10 + t) before it reaches `decay` (the schedule of TensorFlow's
    ExponentialMovingAverage), so a run of a few dozen steps is not held at its first weights."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.module = copy.deepcopy(model).requires_grad_(False)
        self.decay, self.steps = decay, 0
        mine = [*self.module.parameters(), *self.module.buffers()]
        theirs = [*model.parameters(), *model.buffers()]
        floats = [i for i, tensor in enumerate(mine) if tensor.is_floating_point()]
        self._averaged = ([mine[i] for i in floats], [theirs[i] for i in floats])
        self._copied = [(m, t) for i, (m, t) in enumerate(zip(mine, theirs, strict=True)) if i not in floats]

    @torch.no_grad()
    def update(self) -> None:
        self.steps += 1
        torch._foreach_lerp_(*self._averaged, 1.0 - min(self.decay, (1 + self.steps) / (10 + self.steps)))
        for mine, theirs in self._copied:  # integer buffers (counters, masks): the model's own
            mine.copy_(theirs)


@torch.no_grad()
def _validate(
    model, loader: WindowLoader, cfg: SupervisedTrainConfig, epoch: int, n_features: int
) -> tuple[float, list[float]]:
    """Loss and AUC per horizon in batches of `val_batch_size` (at most 2**31 input elements). Both pool every
    window (the loss is the masked BCE mean over all labelled positions), and a sampling model draws the same
    seeded noise for every batch, so the metrics do not depend on the validation batch size (and validation
    leaves the global RNG, which training draws from, alone)."""
    model.eval()
    loader.reset(cfg.seed + 1 + epoch)
    batch_size = min(cfg.val_batch_size, max(1, MAX_BATCH_ELEMENTS // (cfg.seq_len * n_features)))
    bce_sum, count, probs, labels = 0.0, 0, [], []
    sampling = isinstance(model, Sampling)
    for batch in loader.batches(batch_size):
        if sampling:  # sampling models: score the last position only (the AUC's position)
            noise = torch.Generator(device=batch.x.device).manual_seed(cfg.seed + 1)  # the same every epoch too
            last = model.forward_last(batch.x, generator=noise)
            scored = batch.labels[:, -1:]
            loss = masked_bce(last[:, None], scored)
        else:
            logits = model(batch.x)
            scored = batch.labels
            loss = masked_bce(logits, scored)
            last = logits[:, -1]
        n = torch.isfinite(scored).sum()
        bce_sum, count = bce_sum + loss * n, count + n  # the batch's masked mean back to a sum
        probs.append(torch.sigmoid(last.float()))
        labels.append(batch.labels[:, -1])
    aucs = auc_per_horizon(torch.cat(probs).cpu().numpy(), torch.cat(labels).cpu().numpy())
    return float(bce_sum / max(int(count), 1)), aucs
