"""`alpha train`: the original system's `alpha_train`, the Mamba2 -> CfC -> heads perception trainer, in PyTorch.

Walk-forward split of the MBP-10 files (`--cv-*`, the original system's rules), predecoded sidecars (built on a miss),
normalisation fitted on the training files, then per epoch: reshuffled training windows, AdamW with three
parameter groups (Mamba2, CfC trunk + heads, aux) on linear warm-up + cosine decay, a validation pass
(loss, and AUC per horizon from the last position of each window), independent best trackers for val_loss,
mean AUC and the long-horizon AUC (each with its own checkpoint), and early stopping on the chosen metric.
A full training state (`train_state/`: tensors and trackers, committed as one folder) is saved after every
epoch, so `--resume` continues a killed run and ends with the same summary; it refuses a state saved with
other settings or files. Each run is an attempt (`alpha_core.artifacts`): it writes into its own folder and
`--out` becomes a link to it once it completes, so a crash or a second run never leaves a mix of files.
Outputs in `--out`: `alpha_train_summary.json`, `trunk_best_h1000.safetensors` (and the other best
checkpoints), `model_config.json`, `norm_stats.json`, `train_state/`, `manifest.json`.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import threading
import time
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from safetensors.torch import load_file, save_file

import alpha_core
from alpha_core import artifacts, compile_cache, cpus
from alpha_core.atomic import atomic_directory, atomic_write_json
from alpha_core.bounds import (
    MAX_BATCH_ELEMENTS,
    check_batch_fits,
)
from alpha_core.data.dbn import MBP10
from alpha_core.data.folds import plan_folds
from alpha_core.data.loader import EpochCursor, WindowLoader
from alpha_core.data.norm import fit_norm_stats
from alpha_core.data.predecode import file_ref, fold_data, predecode
from alpha_core.data.sidecar import LabelConfig
from alpha_core.devices import resolve_device
from alpha_core.errors import PlanError
from alpha_core.faults import crash_point
from alpha_core.models.perception import PerceptionConfig, PerceptionModel
from alpha_core.progress import TrainingReporter, horizon_metrics
from alpha_core.stages import StageClock
from alpha_core.torch_private import foreach_norm, one_config_gemm_templates, one_config_reductions, start_compile_workers
from alpha_core.train.configs import TrainConfig
from alpha_core.train.metrics import auc_per_horizon
from alpha_core.train.one_launch_adamw import OneLaunchAdamW
from alpha_core.train.schedule import lr_at
from alpha_core.train.trace import StepTrace
from alpha_core.train.tracking import EARLY_STOP_METRICS, Trackers
from alpha_core.train.walk_forward import fold_unit
from alpha_core.weights import save_weights

VAL_SEED_OFFSET = 0xC0FFEE
SMALL_BATCH = 64  # up to this batch, no kernel is big enough for a choice of block size to matter
SUMMARY = "alpha_train_summary.json"
STATE_DIR, STATE_TENSORS, STATE_JSON = "train_state", "tensors.safetensors", "state.json"
# they change nothing trained: a state saved on a GPU pod resumes on the CPU, and the other way round
RESUME_MAY_DIFFER = ("resume", "device", "kernel_step_trace", "val_batch_size", "compile", "fused_scan")
CHECKPOINTS = {
    "val_loss": "model_best_val_loss.safetensors",
    "mean_auc": "model_best_mean_auc.safetensors",
    "auc_h1000": "trunk_best_h1000.safetensors",
}


class TrainSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    epochs: int
    seq_len: int
    horizons: list[int]
    final_train_loss: float
    final_val_loss: float
    final_val_auc: list[float]
    n_train_seqs_consumed: int
    n_val_seqs_consumed: int
    best_epoch: int
    best_val_loss: float
    best_val_auc: list[float]
    best_mean_auc_epoch: int
    best_mean_auc: float
    best_mean_auc_per_horizon: list[float]
    best_auc_h1000_epoch: int
    best_auc_h1000: float
    best_auc_h1000_per_horizon: list[float]
    early_stopped: bool
    best_h1000_ckpt_path: str | None = None
    final_smooth_loss_per_horizon: list[float]
    # beyond the original system
    cv_fold: int
    train_files: list[str]
    val_files: list[str]
    test_files: list[str]  # the fold's test file (what `alpha evaluate` trades it on)
    purge_sessions: int = 0  # the fold plan's (folds.py): its train and val rows were cut so
    embargo_sessions: int = 0  # and its test quarter is scored without its first sessions
    # the one checkpoint the gate judges and evaluation loads: the best epoch by the early-stop metric
    # (mean AUC when it is `none`), as every supervised trainer keeps
    checkpoint_metric: str
    checkpoint: str  # file name in the fold folder
    checkpoint_epoch: int
    val_auc: list[float]  # per horizon, at the checkpoint's epoch
    loss_ema_per_horizon: list[float]
    lambda_per_horizon: list[float]
    aux_stop_grad_lifted: bool
    bucket_warmup_cap_steps: int
    device: str
    precision: str
    cuda_graph: bool = False  # the step ran as one captured CUDA graph (the default on cuda)
    compiled: bool = False  # its forward + loss through torch.compile (the default on cuda)
    wall_time_s: float
    sequences_per_s: float
    # seconds per stage (alpha_core/stages.py): process_start and imports (the first fold of a process), data, build,
    # compile (the first steps: torch.compile, warm-up and CUDA graph capture), epochs, validation, writing, total
    stage_s: dict[str, float] = {}
    versions: dict[str, str]
    epoch_metrics: list[dict[str, int | float]] = []  # per epoch: train_loss, val_loss, val_auc_h<horizon>
    attempt: str = ""
    unit: str | None = None  # the run whose folds were promoted together (`alpha train`); None: one by one


def parse_horizon_weights(cfg: TrainConfig, n_horizons: int) -> list[float]:
    """Explicit > auto > uniform (auto is uniform, as in the original system: the lambda controller rebalances)."""
    if cfg.horizon_weights is not None:
        try:
            parts = [float(s.strip()) for s in cfg.horizon_weights.split(",")]
        except ValueError as exc:
            raise PlanError(f"horizon weight parse: {cfg.horizon_weights!r} ({exc})") from exc
        if len(parts) != n_horizons:
            raise PlanError(f"--horizon-weights expected {n_horizons} floats, got {len(parts)}")
        return parts
    return [1.0] * n_horizons


def validate(cfg: TrainConfig) -> None:
    """The original system's up-front checks, with its messages (the bounds of single values are the config's)."""
    if cfg.early_stop_metric not in EARLY_STOP_METRICS:
        raise PlanError(
            f"--early-stop-metric must be one of: val_loss, mean_auc, auc_h1000, none (got `{cfg.early_stop_metric}`)"
        )
    if cfg.cv_n_folds < 1:
        raise PlanError(f"--cv-n-folds must be >= 1 (got {cfg.cv_n_folds})")
    if cfg.cv_fold is not None and cfg.cv_fold >= cfg.cv_n_folds:
        raise PlanError(f"--cv-fold {cfg.cv_fold} must be < --cv-n-folds {cfg.cv_n_folds}")
    if cfg.cv_train_window < 0:
        raise PlanError(f"--cv-train-window must be >= 0 (got {cfg.cv_train_window})")


def fold_dir(out: Path, fold: int) -> Path:
    """Where a fold's checkpoint is promoted: `fold-<k>` under the output directory, as every trainer writes."""
    return Path(out) / f"fold-{fold}"


def compile_options(batch_size: int, multiprocessors: int) -> dict[str, object]:
    """Inductor's options for the training step. Up to `SMALL_BATCH` no kernel is big enough for a choice of block
    size to matter, so nothing is benchmarked (pointwise and reduction kernels get one configuration each),
    independent small kernels run as one launch (combo kernels) and the products go through Triton templates fused
    with their epilogues: a B=1 step 161 -> 117 kernels, 2,270 -> 2,873 seq/s on an H100 (132 multiprocessors; a GPU
    of fewer than 68 gets no templates, which Inductor does not offer there). A large batch keeps Inductor's defaults
    (combo kernels cost B=4096 fp32 8% there). bench/README.md, "The seventh check of 2026-12-06"."""
    if batch_size > SMALL_BATCH:
        return {}
    return {
        "triton.autotune_pointwise": False,
        **one_config_reductions(),
        "combo_kernels": True,
        **one_config_gemm_templates(multiprocessors),
    }


def use_captured_step(asked: bool | None, gpu: bool, n_windows: int, batch_size: int, fold: int) -> bool:
    """Whether to capture the step: a graph's shapes are fixed, so its epoch is `n_windows // batch_size` whole
    batches, and a fold with fewer training windows than a batch would train nothing. The default then takes
    the eager step (which trains the partial batch), and an explicit --cuda-graph is refused."""
    if not gpu or asked is False:
        return False
    if n_windows >= batch_size:
        return True
    why = f"--batch-size {batch_size} exceeds fold {fold}'s {n_windows} training windows"
    if asked:
        raise PlanError(f"--cuda-graph trains whole batches only: {why}; lower --batch-size or pass --no-cuda-graph")
    print(f"CUDA graph off: {why}, so the eager step trains them as one partial batch", flush=True)
    return False


class PerceptionTrainer:
    """One attempt at training fold `cfg.cv_fold` (0 when unset; `train` runs every fold) into `cfg.out/fold-<k>`:
    a fresh one, the one `--resume` continues, or `attempt_id`'s."""

    def __init__(self, cfg: TrainConfig, attempt_id: str | None = None, unit: str | None = None, retry: bool = False) -> None:
        self.clock = StageClock()
        validate(cfg)
        self.unit, self.retry = unit, retry
        self.device = resolve_device(cfg.device)
        if (cfg.cuda_graph or cfg.compile) and self.device.type != "cuda":
            raise PlanError("--cuda-graph and --compile are for cuda devices (CPU runs never compile)")
        gpu = self.device.type == "cuda"  # the fast path's default: on for cuda, whatever door started the run
        self.cfg = cfg = cfg.model_copy(
            update={"cv_fold": cfg.cv_fold or 0, "compile": gpu if cfg.compile is None else cfg.compile}
        )
        self.dest = fold_dir(cfg.out, cfg.cv_fold)
        compile_cache.use(self.device)  # before anything compiles: a pod after the first of its run starts warm
        if cfg.compile:  # the workers start while the data loads and the model builds, not after Dynamo's trace
            start_compile_workers()
        self.attempt = self._choose_attempt(attempt_id)
        self.out = self.attempt.path
        with self.clock.stage("data"):
            self._prepare_data()
        graph = use_captured_step(cfg.cuda_graph, gpu, self.train_loader.n_windows, cfg.batch_size, cfg.cv_fold)
        self.cfg = cfg.model_copy(update={"cuda_graph": graph})
        with self.clock.stage("build"):
            self._build()

    def _build(self) -> None:
        """The model, its optimiser, the compiled step and the captured graph's LR table (the `build` stage)."""
        cfg = self.cfg
        check_batch_fits(batch_size=cfg.batch_size, seq_len=cfg.seq_len, n_features=len(self.norm.feature_names))
        n_h = len(self.horizons)
        self.model_cfg = model_cfg = PerceptionConfig(
            n_features=len(self.norm.feature_names),
            horizons=tuple(self.horizons),
            mamba2_state_dim=cfg.mamba2_state_dim,
            smoothness_base_lambda=cfg.smoothness_base_lambda,
            bucket_warmup_cap_steps=cfg.bucket_warmup_cap_steps,
            horizon_weights=tuple(parse_horizon_weights(cfg, n_h)),
            time_scale=self.time_scale,
        )
        torch.manual_seed(cfg.seed)
        self.model = PerceptionModel(model_cfg).to(self.device)
        self.model.fused_scan = cfg.fused_scan
        self.model.prefetch_kernels(cfg.batch_size, torch.bfloat16 if cfg.precision == "bf16" else torch.float32)
        groups = self.model.param_groups()
        self.lr_max = {"mamba2": cfg.lr_mamba2, "cfc": cfg.lr_cfc, "aux": cfg.lr_aux if cfg.lr_aux is not None else cfg.lr_cfc}
        steps_per_epoch = (
            self.train_loader.n_windows // cfg.batch_size
            if cfg.cuda_graph
            else math.ceil(self.train_loader.n_windows / cfg.batch_size)
        )
        self.total_steps = cfg.epochs * steps_per_epoch
        # a captured step's LRs are device tensors, and then every group's update is one launch (one_launch_adamw.py);
        # elsewhere torch's fused AdamW, one kernel per group: what a small batch waits on
        self.optimizer = OneLaunchAdamW(
            [{"params": groups[name], "lr": self._lr_value(self.lr_max[name]), "name": name} for name in groups],
            fused=self.device.type == "cuda",
            capturable=cfg.cuda_graph,
        )
        # compiled (cuda only), the forward+loss and the ~30 tiny controller ops each become a few fused kernels
        self.forward_loss, self.update_controllers = self._forward_loss, self.model.update_controllers
        if cfg.compile:
            sms = torch.cuda.get_device_properties(self.device).multi_processor_count
            options = compile_options(cfg.batch_size, sms)
            self.forward_loss = torch.compile(self._forward_loss, options=options)
            self.update_controllers = torch.compile(self.model.update_controllers, options=options)
        self.graph: CapturedStep | None = CapturedStep(self) if cfg.cuda_graph else None
        # the steps that compile (and warm up and capture the graph): their seconds are the `compile` stage
        self._first_steps = CapturedStep.WARMUP_STEPS if cfg.cuda_graph else 1 if cfg.compile else 0
        self._validation_warmup: threading.Thread | None = None  # started once the compiled step has run
        self.trackers = Trackers()
        self.trace: StepTrace | None = None  # opened in `fit`, inside the generation this run acquires

    def _inside_attempt(self, path: Path) -> Path:
        """A file asked for under `--out` goes into the attempt, so it is promoted (and sealed) with the rest."""
        out, path = Path(os.path.abspath(self.cfg.out)), Path(os.path.abspath(path))
        return self.out / path.relative_to(out) if path.is_relative_to(out) else path

    def _choose_attempt(self, attempt_id: str | None) -> artifacts.Attempt:
        """`attempt_id` as given (Dagster: the run id, so a retried step continues it); with `--resume`, the
        latest attempt, finished or not (`fit` checks it against this command); else a new attempt."""
        if attempt_id is not None:
            return artifacts.Attempt(self.dest, attempt_id)
        if self.cfg.resume:
            found = artifacts.attempts(self.dest)
            if found:
                return found[0]
            print(f"--resume: no training state in {self.dest}; starting from scratch", flush=True)
        return artifacts.Attempt(self.dest, artifacts.new_attempt_id())

    # --- data ------------------------------------------------------------------------------------------

    def _prepare_data(self) -> None:
        cfg = self.cfg
        labels = LabelConfig(outcome_label_cost=cfg.outcome_label_cost)
        sidecars = [p.sidecar for p in predecode(cfg.mbp10_data_dir, cfg.predecoded_dir, None, MBP10, labels)]
        try:
            plan = plan_folds(
                [file_ref(sc) for sc in sidecars],
                cfg.cv_n_folds,
                cfg.cv_train_window,
                cfg.allow_untested_folds,
                MBP10,
                purge_sessions=cfg.purge_sessions,
                embargo_sessions=cfg.embargo_sessions,
            )
        except PlanError as exc:
            raise PlanError(f"{cfg.mbp10_data_dir}: {exc}") from exc
        (fold,) = fold_data(plan, sidecars, cfg.cv_fold)
        self.train_files, self.val_files = fold.train, fold.val  # the sidecars of the fold's calendar quarters
        self.train_names, self.val_names, self.test_names = fold.train_names, fold.val_names, fold.test_names
        self.horizons = self.train_files[0].meta.horizons
        # a tensor, like the model's time scale: one compiled graph for every product
        self.tick_size = torch.tensor(self.train_files[0].meta.tick_size, device=self.device)
        self.norm = fit_norm_stats(self.train_files)
        self.time_scale = median_spacing(self.train_files)
        self.train_loader = WindowLoader(
            self.train_files, cfg.seq_len, cfg.n_train_seqs, cfg.seed, self.norm, device=self.device
        )
        self.val_loader = WindowLoader(
            self.val_files, cfg.seq_len, cfg.n_val_seqs, cfg.seed + VAL_SEED_OFFSET, self.norm, device=self.device
        )

    # --- one epoch -------------------------------------------------------------------------------------

    def _autocast(self):
        enabled = self.cfg.precision == "bf16"
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled, cache_enabled=not self.cfg.cuda_graph)

    def _lr_value(self, lr: float) -> float | torch.Tensor:
        """A captured step reads its LR from a device tensor (a Python float would be baked into the graph)."""
        return torch.tensor(lr, device=self.device) if self.cfg.cuda_graph else lr

    def lrs_at(self, step: int) -> dict[str, float]:
        cfg = self.cfg
        return {
            name: lr_at(lr, lr * cfg.lr_min_factor, step, cfg.lr_warmup_steps, self.total_steps)
            for name, lr in self.lr_max.items()
        }

    def _forward_loss(self, x, dt, labels, outcome_long, outcome_short) -> tuple[torch.Tensor, dict]:
        with self._autocast():
            out = self.model(x, dt)
        return self.model.loss(out, labels, outcome_long, outcome_short, self.tick_size)

    def step(self, x, dt, labels, outcome_long, outcome_short) -> tuple[torch.Tensor, dict, torch.Tensor | None]:
        """One optimiser step: forward, loss, backward, AdamW, controller update. No host sync.

        The gradient norm is computed only for the step trace: at batch 1 every kernel counts.
        """
        model = self.model
        loss, parts = self.forward_loss(x, dt, labels, outcome_long, outcome_short)
        self.optimizer.zero_grad(set_to_none=True)  # backward then writes the gradients: no fill, no add kernels
        loss.backward()
        grad_norm = None
        if self.trace is not None:
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            grad_norm = torch.linalg.vector_norm(torch.stack(foreach_norm(grads)))
        self.optimizer.step()
        self.update_controllers(parts)
        return loss.detach(), parts, grad_norm

    def train_epoch(self, epoch: int) -> float:
        cfg, model, t = self.cfg, self.model, self.trackers
        model.train()
        self.train_loader.reset(cfg.seed + epoch)
        loss_sum = torch.zeros((), device=self.device)
        steps = 0
        if self.graph is not None:  # the graph gathers its own batches: the loop only replays it
            self.graph.start_epoch()
            batches = itertools.repeat(None, self.train_loader.n_windows // cfg.batch_size)
        else:
            batches = self.train_loader.batches(cfg.batch_size)
        epoch_started, compile_s = time.perf_counter(), 0.0
        for batch in batches:
            step_started = time.perf_counter()
            lrs = self.lrs_at(t.global_step) if self.graph is None or self.trace is not None else None
            if self.graph is not None:
                loss, parts, grad_norm = self.graph()
            else:
                for group in self.optimizer.param_groups:
                    group["lr"] = lrs[group["name"]]
                loss, parts, grad_norm = self.step(batch.x, batch.dt, batch.labels, batch.outcome_long, batch.outcome_short)
            loss_sum += loss
            if self.trace is not None:
                self.trace.record(epoch, t.global_step, lrs, loss, parts, grad_norm, model)
            steps += 1
            t.global_step += 1
            t.train_seqs += cfg.batch_size if batch is None else len(batch)
            self.report.step()
            if self._first_steps:
                self._first_steps -= 1
                if not self._first_steps:
                    torch.cuda.synchronize(self.device)  # once a process: the compiled step has run
                    self._validation_warmup = self._warm_validation()
                compile_s += time.perf_counter() - step_started
        total = float(loss_sum)  # one host sync per epoch
        self.clock.add("compile", compile_s)
        self.clock.add("epochs", time.perf_counter() - epoch_started - compile_s)
        t.train_loss_sum += total
        t.train_steps += steps
        if self.trace is not None:
            self.trace.flush()
        return total / max(steps, 1)

    def _val_batch_size(self) -> int:
        return min(self.cfg.val_batch_size, max(1, MAX_BATCH_ELEMENTS // (self.cfg.seq_len * len(self.norm.feature_names))))

    def _warm_validation(self) -> threading.Thread:
        """The first validation pays for the model's kernels at the validation batch (Triton's compile on a cold
        pod, their load on a warm one: 1.8 s and 0.5 s of a fold on an H100, 2026-12-07). A thread runs the model
        once per validation batch size, over constant inputs on a stream of its own, while the first epoch's
        captured steps run and the host mostly waits on them; `validate_epoch` waits for it. The forward reads the
        weights as they train and writes nothing of the model's; its output is dropped."""
        cfg, device = self.cfg, self.device
        size, n = self._val_batch_size(), self.val_loader.n_windows
        sizes = ({size} if n >= size else set()) | ({n % size} - {0})
        rows = (cfg.seq_len, len(self.norm.feature_names))

        def run() -> None:
            try:
                with torch.cuda.stream(torch.cuda.Stream(device)), torch.no_grad(), self._autocast():
                    for b in sorted(sizes):
                        self.model(torch.ones(b, *rows, device=device), torch.ones(b, cfg.seq_len, device=device))
                    torch.cuda.current_stream(device).synchronize()
            except Exception:  # validation runs the same kernels and reports what fails
                pass

        thread = threading.Thread(target=run, name="validation-warmup", daemon=True)
        thread.start()
        return thread

    @torch.no_grad()
    def validate_epoch(self, epoch: int) -> tuple[float, list[float]]:
        """Loss and AUC per horizon over the validation windows, in batches of `val_batch_size` (at most 2**31
        input elements): at B=1 training, validating at B=1 would cost as much as an epoch. Both metrics pool
        every window (the loss is the masked BCE mean per horizon over all labelled positions), so they do not
        depend on the validation batch size."""
        model, cfg = self.model, self.cfg
        if self._validation_warmup is not None:
            self._validation_warmup.join()
            self._validation_warmup = None
        model.eval()
        self.val_loader.reset(cfg.seed + VAL_SEED_OFFSET + epoch)
        batch_size = self._val_batch_size()
        bce_sum = count = torch.zeros(len(self.horizons), device=self.device)
        probs, labels = [], []
        for batch in self.val_loader.batches(batch_size):
            with self._autocast():
                out = model(batch.x, batch.dt)
            _, parts = model.loss(out, batch.labels, batch.outcome_long, batch.outcome_short, self.tick_size)
            labelled = torch.isfinite(batch.labels).sum(dim=(0, 1))
            bce_sum = bce_sum + parts["bce"] * labelled  # the batch's masked mean back to a sum
            count = count + labelled
            probs.append(torch.sigmoid(out["logits"][:, -1].float()))
            labels.append(batch.labels[:, -1])
        self.trackers.n_val_seqs_consumed = self.val_loader.yielded()
        aucs = auc_per_horizon(torch.cat(probs).cpu().numpy(), torch.cat(labels).cpu().numpy())
        return float((model.horizon_weights * bce_sum / count.clamp_min(1)).sum()), aucs

    # --- the run ---------------------------------------------------------------------------------------

    def fit(self, promote: bool = True) -> TrainSummary:
        """Train (or finish) the attempt, seal it and, with `promote`, make its fold folder show it. A complete
        attempt (a resume of a finished run) is checked against this command's settings like an unfinished one."""
        with artifacts.writing(self.attempt, self.retry, inherit=True) as writer:
            self.out = writer.folder  # this acquisition's generation: a takeover never writes where its predecessor did
            if self.cfg.kernel_step_trace:
                self.trace = StepTrace(self._inside_attempt(self.cfg.kernel_step_trace))
            if writer.complete:
                self._check_resumable(json.loads((self.out / STATE_DIR / STATE_JSON).read_text()), self.out)
                print(f"--resume: {self.out} is complete, with these settings", flush=True)
                summary = TrainSummary.model_validate_json((self.out / SUMMARY).read_text())
            else:
                summary = self._train(writer)
        if promote:
            artifacts.promote(self.attempt)
        return summary

    def _train(self, writer: artifacts.Writer) -> TrainSummary:
        cfg = self.cfg
        atomic_write_json(self.out / "model_config.json", self.model_cfg.model_dump())
        self.norm.save(self.out / "norm_stats.json")
        if (self.out / STATE_DIR).is_dir():  # a resumed attempt (or a retried Dagster step) continues its state
            self._load_state()
        t = self.trackers
        self.report = TrainingReporter(
            self.out, f"perception fold {cfg.cv_fold}", cfg.epochs, self.total_steps // cfg.epochs, t.epoch_metrics
        )
        started = time.perf_counter() - t.wall_time_s
        for epoch in range(t.epochs_completed, cfg.epochs if not t.early_stopped else t.epochs_completed):
            train_loss = self.train_epoch(epoch)
            with self.clock.stage("validation"):
                val_loss, aucs = self.validate_epoch(epoch)
            t.final_val_loss, t.final_val_auc, t.epochs_completed = val_loss, aucs, epoch + 1
            with self.clock.stage("writing"):
                self._track(epoch, val_loss, aucs)
            self.report.epoch(
                epoch, train_loss=train_loss, val_loss=val_loss, **horizon_metrics("val_auc", self.horizons, aucs)
            )
            self.report.say(
                f"fold {cfg.cv_fold} epoch {epoch}: train_loss {train_loss:.4f} val_loss {val_loss:.4f} auc "
                f"{' '.join(f'h{h} {a:.3f}' for h, a in zip(self.horizons, aucs, strict=True))}"
            )
            t.wall_time_s = time.perf_counter() - started
            stop = self._early_stop()
            t.early_stopped = stop
            with self.clock.stage("writing"):
                self._save_state()
            if stop:
                self.report.say(f"early stopping at epoch {epoch} on {cfg.early_stop_metric}")
                break
        self.report.close()
        summary = self._summary()
        atomic_write_json(self.out / SUMMARY, summary.model_dump())
        artifacts.complete(self.attempt, writer)
        return summary

    def _track(self, epoch: int, val_loss: float, aucs: list[float]) -> None:
        improved = self.trackers.update(epoch, val_loss, aucs)
        if improved["auc_h1000"]:
            self.trackers.best_h1000_ckpt_path = CHECKPOINTS["auc_h1000"]
        for metric, better in improved.items():
            if better:
                save_weights(self.model, self.out / CHECKPOINTS[metric])

    def _early_stop(self) -> bool:
        return self.trackers.should_stop(self.cfg.early_stop_metric, self.cfg.early_stop_patience)

    def _summary(self) -> TrainSummary:
        t, m = self.trackers, self.model
        metric = "mean_auc" if self.cfg.early_stop_metric == "none" else self.cfg.early_stop_metric
        kept = {
            "val_loss": (t.best_epoch, t.best_val_auc),
            "mean_auc": (t.best_mean_auc_epoch, t.best_mean_auc_per_horizon),
            "auc_h1000": (t.best_auc_h1000_epoch, t.best_auc_h1000_per_horizon),
        }
        return TrainSummary(
            epochs=t.epochs_completed,
            seq_len=self.cfg.seq_len,
            horizons=list(self.horizons),
            final_train_loss=t.train_loss_sum / max(t.train_steps, 1),
            final_val_loss=t.final_val_loss,
            final_val_auc=t.final_val_auc,
            n_train_seqs_consumed=t.train_seqs,
            n_val_seqs_consumed=t.n_val_seqs_consumed,
            best_epoch=t.best_epoch,
            best_val_loss=t.best_val_loss,
            best_val_auc=t.best_val_auc,
            best_mean_auc_epoch=t.best_mean_auc_epoch,
            best_mean_auc=t.best_mean_auc,
            best_mean_auc_per_horizon=t.best_mean_auc_per_horizon,
            best_auc_h1000_epoch=t.best_auc_h1000_epoch,
            best_auc_h1000=t.best_auc_h1000,
            best_auc_h1000_per_horizon=t.best_auc_h1000_per_horizon,
            early_stopped=t.early_stopped,
            best_h1000_ckpt_path=t.best_h1000_ckpt_path,
            final_smooth_loss_per_horizon=m.last_smoothness_loss_per_horizon(),
            cv_fold=self.cfg.cv_fold,
            train_files=self.train_names,  # calendar quarters (`folds.py`)
            val_files=self.val_names,
            test_files=self.test_names,
            purge_sessions=self.cfg.purge_sessions,
            embargo_sessions=self.cfg.embargo_sessions,
            checkpoint_metric=metric,
            checkpoint=CHECKPOINTS[metric],
            checkpoint_epoch=kept[metric][0],
            val_auc=kept[metric][1],
            loss_ema_per_horizon=m.loss_ema_snapshot(),
            lambda_per_horizon=m.lambda_snapshot(),
            aux_stop_grad_lifted=bool(m.aux_lifted),
            bucket_warmup_cap_steps=int(m.warmup_cap),
            device=str(self.device),
            precision=self.cfg.precision,
            cuda_graph=bool(self.cfg.cuda_graph),
            compiled=bool(self.cfg.compile),
            wall_time_s=t.wall_time_s,
            sequences_per_s=t.train_seqs / max(t.wall_time_s, 1e-9),
            stage_s=self.clock.as_dict(),
            versions={"alpha": alpha_core.__version__, "torch": torch.__version__, "numpy": np.__version__},
            epoch_metrics=t.epoch_metrics,
            attempt=self.attempt.id,
            unit=self.unit,
        )

    # --- resumable state (safetensors for tensors, JSON for the rest: no pickle) -----------------------

    def _save_state(self) -> None:
        """Tensors and trackers as one folder, swapped in atomically: a resume never sees half a state."""
        tensors = {f"model.{k}": v.detach().contiguous() for k, v in self.model.state_dict().items()}
        opt = self.optimizer.state_dict()
        for idx, state in opt["state"].items():
            for key, value in state.items():
                tensors[f"opt.{idx}.{key}"] = torch.as_tensor(value).detach().contiguous()
        tensors["rng.cpu"] = torch.get_rng_state()
        if self.device.type == "cuda":
            tensors["rng.cuda"] = torch.cuda.get_rng_state(self.device)
        with atomic_directory(self.out / STATE_DIR, replace=True) as tmp:
            save_file({k: v.cpu() for k, v in tensors.items()}, str(tmp / STATE_TENSORS))
            (tmp / STATE_JSON).write_text(
                json.dumps(
                    {
                        "trackers": self.trackers.model_dump(),
                        "config": self.cfg.model_dump(mode="json"),
                        "files": self._file_identity(),
                    },
                    indent=2,
                )
            )
        crash_point("state.after_commit")

    def _file_identity(self) -> dict[str, list[list[str]]]:
        """The training and validation files by name and content hash: what a resumed state must match."""
        return {
            split: [[sc.meta.source.name, sc.meta.source.sha256] for sc in files]
            for split, files in (("train", self.train_files), ("val", self.val_files))
        }

    def _check_resumable(self, saved: dict, where: Path) -> None:
        """Refuse a state saved by another fold, other files or another training config, naming the field."""
        now = self.cfg.model_dump(mode="json")
        n_windows, batch = self.train_loader.n_windows, self.cfg.batch_size
        may_differ = RESUME_MAY_DIFFER + (("cuda_graph",) if n_windows % batch == 0 else ())  # same steps either way
        for key, value in now.items():
            if key not in may_differ and saved["config"].get(key) != value:
                why = (
                    f" (the captured step trains {n_windows // batch} whole batches an epoch, the eager one "
                    f"{math.ceil(n_windows / batch)})"
                    if key == "cuda_graph"
                    else ""
                )
                raise PlanError(
                    f"--resume: {where} was saved with {key}={saved['config'].get(key)!r}, this command "
                    f"has {key}={value!r}{why}; rerun with the same settings, or without --resume"
                )
        for split, files in self._file_identity().items():
            if saved["files"][split] != files:
                raise PlanError(
                    f"--resume: {where} was trained with {split} files {saved['files'][split]}, this "
                    f"command's fold has {files}; rerun without --resume"
                )

    def _load_state(self) -> None:
        where = self.out / STATE_DIR
        saved = json.loads((where / STATE_JSON).read_text())
        self._check_resumable(saved, where)
        tensors = load_file(str(where / STATE_TENSORS))  # CPU; load_state_dict moves values to the parameters
        model_state = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
        self.model.load_state_dict(model_state)
        opt = self.optimizer.state_dict()
        state: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in tensors.items():
            if key.startswith("opt."):
                _, idx, name = key.split(".", 2)
                state.setdefault(int(idx), {})[name] = value
        opt["state"] = state
        self.optimizer.load_state_dict(opt)
        torch.set_rng_state(tensors["rng.cpu"].cpu())
        if "rng.cuda" in tensors and self.device.type == "cuda":
            torch.cuda.set_rng_state(tensors["rng.cuda"].cpu(), self.device)
        self.trackers = Trackers.model_validate(saved["trackers"])
        print(f"resumed after epoch {self.trackers.epochs_completed - 1} from {self.out}", flush=True)


def median_spacing(files, block: int = 1 << 20) -> float:
    """The median positive `dt` after each file's first row (1.0 when there is none), exactly as `np.median` of
    their concatenation gives it, in O(block) memory: positive float32 values order as their bit patterns, so two
    passes of 65,536-bin histograms (the high 16 bits, then the low 16 bits inside the bins holding the middle
    ranks) find the two middle values, which `np.median` averages."""

    def values():
        for sc in files:
            for a in range(1, sc.rows, block):
                v = sc.read("dt", a, min(a + block, sc.rows))
                yield v[v > 0].view(np.uint32)

    high = np.zeros(1 << 16, dtype=np.int64)
    for bits in values():
        high += np.bincount(bits >> 16, minlength=1 << 16)
    n = int(high.sum())
    if n == 0:
        return 1.0
    ranks = ((n - 1) // 2, n // 2)  # the middle order statistics (one when n is odd)
    below = np.cumsum(high) - high  # values in lower bins
    bins = [int(np.searchsorted(np.cumsum(high), r, side="right")) for r in ranks]
    low = {b: np.zeros(1 << 16, dtype=np.int64) for b in set(bins)}
    for bits in values():
        for b, hist in low.items():
            hist += np.bincount(bits[(bits >> 16) == b] & 0xFFFF, minlength=1 << 16)
    middle = [
        np.uint32((b << 16) | int(np.searchsorted(np.cumsum(low[b]), r - below[b], side="right")))
        for r, b in zip(ranks, bins, strict=True)
    ]
    return float(np.median(np.array(middle, dtype=np.uint32).view(np.float32)))


class CapturedStep:
    """The whole training step in one CUDA graph, its batch included: the graph gathers the windows at a device
    cursor into the epoch's order (`EpochCursor`: `WindowLoader.batch_at` at positions clamped to the epoch),
    advances the cursor, reads the LR from a device table and steps the capturable AdamW. A replay then needs
    nothing from the host, which at batch 1 would otherwise take longer to feed the step than the GPU takes to
    run it; the host only counts the steps, and a step past the epoch's windows is an `EpochOverrun`.

    The first `WARMUP_STEPS` steps run eagerly on a side stream (they are real steps and initialise the
    optimiser state); the next call captures the step, and every later one replays it.
    """

    WARMUP_STEPS = 3

    def __init__(self, trainer: PerceptionTrainer) -> None:
        self.trainer = trainer
        device, batch = trainer.device, trainer.cfg.batch_size
        names = [g["name"] for g in trainer.optimizer.param_groups]
        table = [[lrs[name] for name in names] for lrs in map(trainer.lrs_at, range(trainer.total_steps + 1))]
        self.lr_table = torch.tensor(table, device=device)
        self.lr_now = torch.empty(1, len(names), device=device)  # this step's row: the groups' LRs are its views
        self.epoch = EpochCursor(trainer.train_loader, batch)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs = None
        self.calls = 0

    def start_epoch(self) -> None:
        """Rewind the cursor, after the loader drew the epoch's windows into its buffers (in place)."""
        self.epoch.rewind()

    def _body(self):
        tr = self.trainer
        step = tr.model.step.clamp_max(len(self.lr_table) - 1).view(1)
        torch.index_select(self.lr_table, 0, step, out=self.lr_now)  # `table[step]` would sync on the host
        for i, group in enumerate(tr.optimizer.param_groups):  # bound here, after any `load_state_dict`
            group["lr"] = self.lr_now[0, i]  # a view: the one gather sets every group's LR, no copies
        batch = self.epoch.next_batch()
        return tr.step(batch.x, batch.dt, batch.labels, batch.outcome_long, batch.outcome_short)

    def __call__(self):
        self.epoch.claim()  # on the host, before anything runs: past the epoch's windows is an error, not a replay
        self.calls += 1
        if self.graph is not None:
            self.graph.replay()
            return self.outputs
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            result = self._body()
        torch.cuda.current_stream().wait_stream(side)
        if self.calls == self.WARMUP_STEPS:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.outputs = self._body()
        return result


def train(cfg: TrainConfig) -> list[TrainSummary]:
    """`alpha train`: every fold of the plan (or `cv_fold` alone), each into `cfg.out/fold-<k>`, as one run whose
    folds are promoted together once all are complete. `--resume` continues the latest run (its id is the newest
    attempt of any fold): its complete folds are checked and kept, its unfinished one continues, the rest start."""
    validate(cfg)
    cpus.apply()  # threads for the CPUs this step was given (alpha_core/cpus.py)
    folds = range(cfg.cv_n_folds) if cfg.cv_fold is None else [cfg.cv_fold]
    latest = [a for k in folds for a in artifacts.attempts(fold_dir(cfg.out, k))[:1]] if cfg.resume else []
    attempt = max(latest, key=lambda a: a.path.stat().st_mtime).id if latest else artifacts.new_attempt_id()
    if cfg.resume and not latest:
        print(f"--resume: no training state in {cfg.out}; starting from scratch", flush=True)
    unit = fold_unit(cfg.model_dump(mode="json"))
    trainers = [PerceptionTrainer(cfg.model_copy(update={"cv_fold": k}), attempt_id=attempt, unit=unit) for k in folds]
    summaries = [trainer.fit(promote=False) for trainer in trainers]
    artifacts.promote_all([trainer.attempt for trainer in trainers])
    return summaries
