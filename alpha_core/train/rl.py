"""`alpha train-rl`: walk-forward training of the DQN/PPO members (the original system's `train_baseline_rl`).

Per fold: normalisation fitted on the training files, a batched `TradingVecEnv` over them, an SB3 agent
trained for `epochs` x `timesteps_per_epoch` environment steps; after each epoch the greedy policy is
evaluated on the validation file with the evaluator's metric (the daily-session Sharpe of its greedy positions at
`DEFAULT_COST_TICKS`), on at most `val_sessions_per_epoch` of its sessions (a fixed seeded subset, so an epoch's
cost does not grow with the file); early stopping follows `Trackers`, the policy with the best validation Sharpe
is kept, and that policy is scored once on the whole validation files: `val_sharpe`, the number the gate and
hyperopt read and `alpha evaluate` computes from the checkpoint. It is kept as `fold-<k>/model.safetensors`
(with `norm_stats.json`, `agent_config.json`, `env_config.json`, `params.json`, `summary.json`), written as one
attempt (`alpha_core.artifacts`); the folds of one call are promoted together once all are complete.
Agent parameters resolve as: defaults < params file < explicit values.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from pydantic import BaseModel, ValidationError

from alpha_core import artifacts, compile_cache, cpus
from alpha_core.atomic import atomic_write_json
from alpha_core.bounds import check_batch_fits
from alpha_core.data.dbn import OHLCV_1M
from alpha_core.data.norm import fit_norm_stats
from alpha_core.data.predecode import FoldData, default_predecoded_dir, walk_forward
from alpha_core.devices import resolve_device
from alpha_core.errors import PlanError, describe_validation_error
from alpha_core.eval.validation import ValidationScore
from alpha_core.params import ParamsFile, check_isolation, load_params_file, split_params
from alpha_core.progress import TrainingReporter
from alpha_core.rl import DQNConfig, EnvConfig, PPOConfig, TradingVecEnv, build_agent, evaluate, load_policy, save_policy
from alpha_core.rl.agents import evaluate_sessions, session_spans
from alpha_core.stages import StageClock
from alpha_core.train.bar_folds import BarFoldSummary, train_folds, versions
from alpha_core.train.configs import RLTrainConfig
from alpha_core.train.tracking import Trackers
from alpha_core.train.walk_forward import fold_unit

AGENT_CONFIGS = {"dqn": DQNConfig, "ppo": PPOConfig}


class RLFoldSummary(BarFoldSummary):
    """An RL fold's summary: the kept policy's validation Sharpe and its parts, the Sharpe per epoch; `epoch_metrics`
    rows hold val_sharpe, val_mean_reward, val_turnover and the learning diagnostics (`RL_DIAGNOSTICS`)."""

    # annualised daily-session Sharpe (the evaluator's: `alpha evaluate` computes this number from the checkpoint) of
    # the kept policy on the whole validation files; `val_score` is its evaluator's record where there is one file
    val_sharpe: float
    val_sessions: int  # the sessions that Sharpe was measured on
    val_mean_reward: float  # ticks per bar
    val_turnover: float
    val_sharpe_per_epoch: list[float]  # what early stopping and the kept epoch follow
    # the sessions each epoch's Sharpe scored: a fixed seeded subset of the validation files' sessions
    # (`agents.evaluate_sessions`, the evaluator's number on those sessions); None: the whole files, every epoch
    val_sessions_per_epoch: int | None = None
    timesteps: int
    env_steps_per_s: float


def train_rl(
    cfg: RLTrainConfig,
    params_file: str | Path | None = None,
    explicit_params: dict | None = None,
    *,
    attempt_id: str | None = None,
    promote: bool = True,
    retry: bool = False,
    folds: list[FoldData] | None = None,
) -> list[RLFoldSummary]:
    """Train every requested fold, each as attempt `attempt_id` (`retry`: the orchestrator's retry of this step
    takes it over); with `promote`, every fold is promoted to `fold-<k>` once all are complete."""
    clock = StageClock()  # the process's stages so far, and the first fold's
    device = resolve_device(cfg.device)
    compile_cache.use(device)
    # threads for the CPUs this step was given (alpha_core/cpus.py); DQN on a CPU takes one: its gradient step is about
    # a hundred ops on [64, 417] tensors at most, too small to share, and the step's other threads only wait at
    # every op's barrier (bench/bench_dqn.py times an epoch and its parts by thread count)
    cpus.apply(1 if cfg.model == "dqn" and device.type == "cpu" else None)
    agent_cls = AGENT_CONFIGS[cfg.model]
    source = load_params_file(params_file)
    file_params = _agent_params(source.values, agent_cls, str(params_file))
    cli_params = _agent_params(explicit_params or {}, agent_cls, "command line")
    for where, values in ((str(params_file), file_params), ("command line", {**file_params, **cli_params})):
        try:  # the file's values on their own too: one the command line overrides is still checked
            agent_cfg = agent_cls(**values)
        except ValidationError as exc:
            raise PlanError(f"{where}: {describe_validation_error(exc)}") from exc
    with clock.stage("data"):
        folds = folds or walk_forward(  # given folds: hyperopt's own split of the files before the first test file
            cfg.data_dir,
            OHLCV_1M,
            default_predecoded_dir(cfg.predecoded_dir, cfg.output_dir),
            cfg.symbol,
            cfg.cv_n_folds,
            cfg.cv_train_window,
            cfg.cv_fold,
            cfg.allow_untested_folds,
            cfg.purge_sessions,
            cfg.embargo_sessions,
        )
    leaks = {f.fold: check_isolation(source, cfg.model, f.fold, f.test_names, cfg.allow_hyperopt_leakage) for f in folds}
    check_batch_fits(n_envs=cfg.n_envs, window=cfg.window, n_features=len(folds[0].train[0].meta.feature_names))
    attempt_id = attempt_id or artifacts.new_attempt_id()
    unit = fold_unit({**cfg.model_dump(mode="json"), "params": agent_cfg.model_dump(mode="json")}) if promote else None
    return train_folds(
        cfg.output_dir,
        folds,
        attempt_id,
        promote,
        retry,
        RLFoldSummary,
        lambda fold, out, fold_clock: _train_fold(
            cfg, agent_cfg, fold, device, out, attempt_id, unit, source, leaks[fold.fold], fold_clock
        ),
        clock,
    )


RL_DIAGNOSTICS = {  # SB3's name of the epoch's last update -> ours (docs/models.md, "Metric names"), as CleanRL logs them
    "train/approx_kl": "approx_kl",
    "train/clip_fraction": "clip_fraction",
    "train/explained_variance": "explained_variance",
    "train/entropy_loss": "entropy",  # SB3 records the loss, -entropy
    "train/loss": "train_loss",
}


def learning_diagnostics(agent) -> dict[str, float]:
    """What makes an RL result checkable beside its validation Sharpe: PPO's approximate KL to the old policy, the
    clipped fraction, the value function's explained variance and the policy's entropy; DQN's TD loss. Read from
    the agent's logger after `learn`, which holds the epoch's last update."""
    recorded = agent.logger.name_to_value
    out = {ours: float(recorded[theirs]) for theirs, ours in RL_DIAGNOSTICS.items() if theirs in recorded}
    if "entropy" in out:
        out["entropy"] = -out["entropy"]
    return out


def _agent_params(params: dict, agent_cls: type[BaseModel], source: str) -> dict:
    """Only the agent's own fields are hyperparameters here (no supervised training keys)."""
    agent, other = split_params(params, agent_cls, source)
    if other:
        key = next(iter(other))
        raise PlanError(f"{source}: unknown parameter {key!r} (accepted: {', '.join(sorted(agent_cls.model_fields))})")
    return agent


def _train_fold(
    cfg: RLTrainConfig,
    agent_cfg,
    fold: FoldData,
    device,
    out: Path,
    attempt_id: str,
    unit: str | None,
    source: ParamsFile,
    leaks: list[str],
    clock: StageClock,
) -> RLFoldSummary:
    train, val = fold.train, fold.val
    data_started = time.perf_counter()
    norm = fit_norm_stats(train)
    norm.save(out / "norm_stats.json")
    params = agent_cfg.model_dump(mode="json")
    atomic_write_json(out / "agent_config.json", params)
    atomic_write_json(out / "params.json", params)
    env_cfg = EnvConfig(
        window=cfg.window, episode_len=cfg.episode_len, n_envs=cfg.n_envs, cost_per_turnover=cfg.cost_per_turnover
    )
    atomic_write_json(out / "env_config.json", env_cfg.model_dump(mode="json"))  # the observation layout
    torch.manual_seed(cfg.seed + fold.fold)
    env = TradingVecEnv(train, env_cfg, norm, seed=cfg.seed + fold.fold)
    clock.add("data", time.perf_counter() - data_started)
    with clock.stage("build"):
        agent = build_agent(cfg.model, env, agent_cfg, seed=cfg.seed + fold.fold, device=str(device))
    tracker, curve, result = Trackers(), [], None
    report = TrainingReporter(out, f"{cfg.model} fold {fold.fold}", cfg.epochs, cfg.timesteps_per_epoch)
    started = time.perf_counter()
    # per epoch, a fixed seeded subset of the validation sessions when the files hold more (bounded cost)
    spans = session_spans(val, cfg.val_sessions_per_epoch, cfg.seed + fold.fold) if cfg.val_sessions_per_epoch else None
    for epoch in range(cfg.epochs):
        with clock.stage("epochs"):
            agent.learn(cfg.timesteps_per_epoch, reset_num_timesteps=False, callback=lambda *_: report.step(cfg.n_envs))
        with clock.stage("validation"):  # the evaluator's daily-session Sharpe, on the whole files or the subset's sessions
            scored = (
                evaluate(agent, val, env_cfg, norm) if spans is None else evaluate_sessions(agent, val, spans, env_cfg, norm)
            )
        curve.append(scored.sharpe)
        report.epoch(
            epoch,
            val_sharpe=scored.sharpe,
            val_mean_reward=scored.mean_reward,
            val_turnover=scored.turnover,
            **learning_diagnostics(agent),
        )
        report.say(
            f"{cfg.model} fold {fold.fold} epoch {epoch}: val sharpe {scored.sharpe:.3f} "
            f"mean reward {scored.mean_reward:.4f} turnover {scored.turnover:.3f}"
        )
        if tracker.update_sharpe(epoch, scored.sharpe) or result is None:
            result = scored
            with clock.stage("writing"):
                save_policy(agent, out / "model.safetensors", {"model": cfg.model, "epoch": str(epoch)})
        if tracker.should_stop("val_sharpe", cfg.early_stop_patience):
            tracker.early_stopped = True
            break
    if spans is not None:  # the number the gate, hyperopt and the report use: the kept policy on the whole files
        with clock.stage("val_score"):
            result = evaluate(load_policy(agent, out / "model.safetensors"), val, env_cfg, norm)
    wall = time.perf_counter() - started
    report.close()
    early, best_epoch = tracker.early_stopped, tracker.best_val_sharpe_epoch
    summary = RLFoldSummary(
        model=cfg.model,
        fold=fold.fold,
        train_files=fold.train_names,
        val_files=fold.val_names,
        test_files=fold.test_names,
        purge_sessions=fold.purge_sessions,
        embargo_sessions=fold.embargo_sessions,
        epochs=len(curve),
        early_stopped=early,
        best_epoch=best_epoch,
        val_sharpe=result.sharpe,
        val_sessions=result.n_sessions,
        val_mean_reward=result.mean_reward,
        val_turnover=result.turnover,
        val_score=None
        if len(val) != 1 or len(fold.val_names) != 1  # several parts: the evaluator scores them concatenated
        else ValidationScore(
            file=fold.val_names[0],
            sharpe=result.sharpe,
            sessions=result.n_sessions,
            horizon=None,
            band=None,
            cost_ticks=env_cfg.cost_per_turnover,
            device=str(device),
        ),
        val_sharpe_per_epoch=curve,
        val_sessions_per_epoch=None if spans is None else len(spans),
        epoch_metrics=report.epoch_metrics,
        params=params,
        params_file=source.path,
        hyperopt=source.hyperopt,
        hyperopt_leakage=leaks,
        timesteps=int(agent.num_timesteps),
        device=str(device),
        wall_time_s=wall,
        env_steps_per_s=agent.num_timesteps / max(wall, 1e-9),
        stage_s=clock.as_dict(),
        versions=versions(),
        attempt=attempt_id,
        unit=unit,
    )
    summary.write(out)
    return summary
