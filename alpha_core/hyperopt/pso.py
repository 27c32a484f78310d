"""`alpha hyperopt`: particle swarm optimisation (nevergrad's PSO, ask/tell) over a registry model's search space.

Each generation asks `workers` particles and evaluates them concurrently (threads: the work is torch
training, which releases the GIL); each trial is a short training run scored on validation (mean AUC over
horizons for supervised models, the evaluator's validation Sharpe for RL), and PSO minimises the negated
score. With one worker the search is deterministic for a seed.

Isolation: the search never sees a test file. By default it uses the files strictly before the earliest test
file of the symbol's fold plan (`cv_n_folds` / `cv_train_window`, the training defaults), the last of them
validating (`alpha_core.data.folds.hyperopt_files`); `cv_fold=k` is the nested alternative, tuned on fold k's
own train/validation files for fold k alone. Every trial also records its validation Sharpe (the evaluator's
daily-session Sharpe at `DEFAULT_COST_TICKS`; supervised trials trade P(up) at the evaluator's default horizon
and band), whose variance across trials is the V of the report's deflated Sharpe.

`results.json` holds the best params (loadable as a `--params-file`), every trial with its score and validation
Sharpe, the files it trained and validated on (`train_files`, `val_files`), the seed, the search space and versions.
"""

from __future__ import annotations

import math
import secrets
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nevergrad as ng
import numpy as np
import torch

import alpha_core
from alpha_core import cpus, progress
from alpha_core.atomic import atomic_write_json, guard, owner_tag
from alpha_core.cleanup import TRIAL_PREFIX
from alpha_core.data.dbn import MBP10, OHLCV_1M
from alpha_core.data.folds import FoldPlan, hyperopt_files, plan_folds
from alpha_core.data.predecode import FoldData, default_predecoded_dir, file_ref, predecode, unit_sidecars
from alpha_core.errors import PlanError
from alpha_core.faults import crash_point
from alpha_core.hyperopt.configs import HyperoptConfig
from alpha_core.locks import Lock
from alpha_core.metrics import DEFAULT_COST_TICKS
from alpha_core.models import registry
from alpha_core.models.registry import SearchParam
from alpha_core.params import search_signature


def parametrization(space: dict[str, SearchParam], seed: int) -> ng.p.Dict:
    params = {}
    for name, p in space.items():
        if p.kind == "log":
            params[name] = ng.p.Log(lower=p.low, upper=p.high)
        elif p.kind == "float":
            params[name] = ng.p.Scalar(lower=p.low, upper=p.high)
        elif p.kind == "int":
            params[name] = ng.p.Scalar(lower=p.low, upper=p.high).set_integer_casting()
        else:
            params[name] = ng.p.Choice(p.choices)
    out = ng.p.Dict(**params)
    out.random_state = np.random.RandomState(seed)
    return out


def pso_minimize(
    objective: Callable[[dict], float | tuple[float, dict]],
    space: dict[str, SearchParam],
    trials: int,
    workers: int = 1,
    seed: int = 0,
    on_trial: Callable[[dict], None] | None = None,
) -> tuple[dict, list[dict]]:
    """Minimise `objective(params)` with PSO in generations of `workers` concurrent evaluations.

    The objective returns the loss, or (loss, extra): extra's keys are recorded with the trial. `on_trial` gets
    each trial's record as it joins the history (numbered as the history numbers it)."""
    optimizer = ng.optimizers.PSO(parametrization=parametrization(space, seed), budget=trials, num_workers=workers)
    history: list[dict] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        while len(history) < trials:
            asked = [optimizer.ask() for _ in range(min(workers, trials - len(history)))]
            started = time.perf_counter()
            outcomes = [
                out if isinstance(out, tuple) else (out, {}) for out in pool.map(lambda c: objective(dict(c.value)), asked)
            ]
            for candidate, (loss, extra) in zip(asked, outcomes, strict=True):
                optimizer.tell(candidate, float(loss))
                history.append(
                    {
                        "trial": len(history),
                        "params": _plain(candidate.value),
                        "loss": float(loss),
                        **extra,
                        "wall_s": time.perf_counter() - started,
                    }
                )
                if on_trial is not None:
                    on_trial(history[-1])
    best = min(history, key=lambda h: h["loss"])
    return best["params"], history


def _plain(values: dict) -> dict:
    return {k: (v.item() if isinstance(v, np.generic) else v) for k, v in values.items()}


def hyperopt(cfg: HyperoptConfig, run: str | None = None, retry: bool = False) -> dict:
    """The search, holding the output's lock for its whole run: a second search into the same output fails fast
    naming the first (`retry`: the orchestrator's retry of this run's step, `run`, takes it over at once), and a
    search frozen past the lock's staleness whose output another has since written stops at its commit
    (`LockLost`, exit 2) instead of replacing those results."""
    cpus.apply()  # threads for the CPUs this step was given (alpha_core/cpus.py)
    spec = registry.get(cfg.model)
    if spec.search_space is None:
        raise PlanError(
            f"model {cfg.model!r} has no hyperopt search space (models with one: "
            f"{', '.join(n for n, s in registry.REGISTRY.items() if s.search_space)})"
        )
    if spec.kind.search_objective is None:
        raise PlanError("the perception model is tuned through `alpha train` flags, not `alpha hyperopt`")
    split, plan = search_split(cfg, spec.input)
    output = Path(cfg.output)
    lock = Lock(output.with_name(f".{output.name}.lock"), run=run or secrets.token_hex(6), step=str(output))
    with lock.hold(takeover_same_step=retry), guard(output, lock.check):
        return _search(cfg, spec, split, plan)


def _search(cfg: HyperoptConfig, spec, split: FoldData, plan: FoldPlan) -> dict:
    """The trials, and their results written to `cfg.output`."""

    def objective(params: dict) -> tuple[float, dict]:
        torch.set_num_threads(1)
        if spec.kind.trades_actions:
            sharpe, sessions = _rl_trial(cfg, params, split)
            return -sharpe, {"val_sharpe": sharpe, "val_sessions": sessions}
        mean_auc, sharpe, sessions = _supervised_trial(cfg, params, split)
        return -mean_auc, {"val_sharpe": sharpe, "val_sessions": sessions}

    trials_bar, best_score = progress.bar(total=cfg.trials, desc=f"hyperopt {cfg.model}", unit="trial"), -math.inf

    def counted(params: dict) -> float:  # the trials bar, with the best score so far
        nonlocal best_score
        loss, extra = objective(params)
        best_score = max(best_score, -loss)
        trials_bar.set_postfix(best_score=f"{best_score:.4f}", refresh=False)
        trials_bar.update()
        return loss, extra

    score_name, leader = spec.kind.search_objective, {"score": -math.inf}

    def say_trial(trial: dict) -> None:  # one stdout line per trial, numbered as in results.json
        score = -trial["loss"]
        if score > leader["score"]:
            leader.update(score=score, trial=trial["trial"])
        progress.say(
            f"hyperopt {cfg.model} trial {trial['trial']} [{trial['trial'] + 1}/{cfg.trials}]: "
            f"{progress.params_text(trial['params'])} -> {score_name} {score:.4f} "
            f"(best {leader['score']:.4f}, trial {leader['trial']})"
        )

    with trials_bar:
        best, history = pso_minimize(counted, spec.search_space, cfg.trials, cfg.workers, cfg.seed, say_trial)
    results = {
        "model": cfg.model,
        "metric": f"{spec.kind.search_metric} (higher is better)",
        "best_params": best,
        "best_score": -min(h["loss"] for h in history),
        "trials": [
            {
                "trial": h["trial"],
                "params": h["params"],
                "score": -h["loss"],
                "val_sharpe": h["val_sharpe"],
                "val_sessions": h["val_sessions"],
                "wall_s": h["wall_s"],
            }
            for h in history
        ],
        "val_sharpe": "daily-session Sharpe of each trial's validation positions, annualised, "
        f"{DEFAULT_COST_TICKS} tick(s) per unit of turnover (the evaluator's), over val_sessions sessions",
        "train_files": split.train_names,  # calendar quarters (`folds.py`)
        "val_files": split.val_names,
        "cv_fold": cfg.cv_fold,
        "plan_test_files": [r.name for f in plan.folds for r in f.test],
        "seed": cfg.seed,
        "workers": cfg.workers,
        "search_space": {k: v.model_dump(exclude_none=True) for k, v in spec.search_space.items()},
        "settings": cfg.model_dump(mode="json"),
        "versions": {"alpha": alpha_core.__version__, "nevergrad": ng.__version__, "torch": torch.__version__},
    }
    results["signature"] = search_signature(results)  # checked wherever the params are used (alpha_core/params.py)
    crash_point("hyperopt.before_results")
    atomic_write_json(cfg.output, results)
    return results


def search_split(cfg: HyperoptConfig, model_input: str) -> tuple[FoldData, FoldPlan]:
    """The one train/validation split every trial uses (see the module docstring), and the plan it stays out of."""
    schema = OHLCV_1M if model_input == "bars" else MBP10
    predecoded = default_predecoded_dir(cfg.predecoded_dir, cfg.output.parent)
    sidecars = [item.sidecar for item in predecode(cfg.data_dir, predecoded, cfg.symbol, schema)]
    plan = plan_folds(
        [file_ref(sc) for sc in sidecars],
        cfg.cv_n_folds,
        cfg.cv_train_window,
        cfg.allow_untested_folds,
        schema,
        purge_sessions=cfg.purge_sessions,
        embargo_sessions=cfg.embargo_sessions,
    )
    if cfg.cv_fold is None:
        train, val = hyperopt_files(plan)
    else:
        fold = plan.fold(cfg.cv_fold)
        train, val = fold.train, fold.val
    by_path = {sc.meta.source.path: sc for sc in sidecars}
    return FoldData(
        0,
        [sc for u in train for sc in unit_sidecars(u, by_path)],
        [sc for u in val for sc in unit_sidecars(u, by_path)],
        [],
        [u.name for u in train],
        [u.name for u in val],
        plan.purge_sessions,
        plan.embargo_sessions,
    ), plan


def _trial_settings(cfg: HyperoptConfig, tmp: str) -> dict:
    """The settings a trial of either bar trainer takes from the search: the model, the data, the epochs, the seed
    and the device; its checkpoint goes to the trial's temporary folder."""
    return {
        "model": cfg.model,
        "data_dir": cfg.data_dir,
        "output_dir": Path(tmp),
        "predecoded_dir": cfg.predecoded_dir,
        "symbol": cfg.symbol,
        "epochs": cfg.epochs,
        "seed": cfg.seed,
        "device": cfg.device,
    }


def _supervised_trial(cfg: HyperoptConfig, params: dict, split: FoldData) -> tuple[float, float, int]:
    """(best validation mean AUC, the evaluator's validation Sharpe of that checkpoint, its sessions)."""
    from alpha_core.train.supervised import SupervisedTrainConfig, train_supervised

    with tempfile.TemporaryDirectory(prefix=f"{TRIAL_PREFIX}{owner_tag()}~") as tmp:
        train_cfg = SupervisedTrainConfig(
            **_trial_settings(cfg, tmp),
            seq_len=cfg.seq_len,
            batch_size=cfg.batch_size,
            n_train_seqs=cfg.n_train_seqs,
            n_val_seqs=cfg.n_val_seqs,
            early_stop_metric="mean_auc",
        )
        (summary,) = train_supervised(train_cfg, explicit_params=params, folds=[split])
        return float(summary.best_mean_auc), summary.val_score.sharpe, summary.val_score.sessions


def _rl_trial(cfg: HyperoptConfig, params: dict, split: FoldData) -> tuple[float, int]:
    """The trial's validation Sharpe (the RL trainer's, which is the evaluator's) and its sessions."""
    from alpha_core.train.rl import RLTrainConfig, train_rl

    with tempfile.TemporaryDirectory(prefix=f"{TRIAL_PREFIX}{owner_tag()}~") as tmp:
        train_cfg = RLTrainConfig(**_trial_settings(cfg, tmp), timesteps_per_epoch=cfg.timesteps_per_epoch)
        (summary,) = train_rl(train_cfg, explicit_params=params, folds=[split])
        return float(summary.val_sharpe), summary.val_sessions
