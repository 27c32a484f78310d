"""`alpha hyperopt`: particle swarm optimisation (nevergrad's PSO, ask/tell) over a registry model's search space.

Each generation asks `workers` particles and evaluates them concurrently (threads: the work is torch
training, which releases the GIL); each trial is a short walk-forward training run scored on validation
(mean AUC over horizons and folds for supervised models), and PSO minimises the negated score. With one
worker the search is deterministic for a seed. `results.json` holds the best params (loadable as a
`--params-file`), every trial with its score, the seed, the search space and versions.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nevergrad as ng
import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

import alpha_core
from alpha_core.atomic import atomic_write_json
from alpha_core.bounds import Count, NonNegInt, Seed
from alpha_core.errors import PlanError
from alpha_core.models import registry
from alpha_core.models.registry import SearchParam


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


def pso_minimize(objective: Callable[[dict], float], space: dict[str, SearchParam], trials: int, workers: int = 1,
                 seed: int = 0) -> tuple[dict, list[dict]]:
    """Minimise `objective(params)` with PSO in generations of `workers` concurrent evaluations."""
    optimizer = ng.optimizers.PSO(parametrization=parametrization(space, seed), budget=trials, num_workers=workers)
    history: list[dict] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        while len(history) < trials:
            asked = [optimizer.ask() for _ in range(min(workers, trials - len(history)))]
            started = time.perf_counter()
            losses = list(pool.map(lambda c: float(objective(dict(c.value))), asked))
            for candidate, loss in zip(asked, losses, strict=True):
                optimizer.tell(candidate, loss)
                history.append({"trial": len(history), "params": _plain(candidate.value), "loss": loss,
                                "wall_s": time.perf_counter() - started})
    best = min(history, key=lambda h: h["loss"])
    return best["params"], history


def _plain(values: dict) -> dict:
    return {k: (v.item() if isinstance(v, np.generic) else v) for k, v in values.items()}


class HyperoptConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str
    data_dir: Path
    output: Path
    trials: Count = 20  # the spec's HYPEROPT_TRIALS
    epochs: Count = 3
    timesteps_per_epoch: Count = 5_000  # RL trials
    workers: int = Field(1, ge=1, le=256)  # threads, one particle each
    seed: Seed = 0
    cv_n_folds: Count = 1
    cv_train_window: NonNegInt = 0
    seq_len: Count = 64
    batch_size: Count = 256
    n_train_seqs: Count = 20_000
    n_val_seqs: Count = 5_000
    predecoded_dir: Path | None = None
    symbol: str | None = None
    device: str | None = None


def hyperopt(cfg: HyperoptConfig) -> dict:
    from alpha_core.train.supervised import SupervisedTrainConfig, train_supervised

    spec = registry.get(cfg.model)
    if spec.search_space is None:
        raise PlanError(f"model {cfg.model!r} has no hyperopt search space (models with one: "
                        f"{', '.join(n for n, s in registry.REGISTRY.items() if s.search_space)})")
    if spec.trainer == "perception":
        raise PlanError("the perception model is tuned through `alpha train` flags, not `alpha hyperopt`")

    def objective(params: dict) -> float:
        torch.set_num_threads(1)
        if spec.trainer == "rl":
            return -_rl_trial_score(cfg, params)
        with tempfile.TemporaryDirectory(prefix="alpha-trial-") as tmp:
            train_cfg = SupervisedTrainConfig(
                model=cfg.model, data_dir=cfg.data_dir, output_dir=Path(tmp), predecoded_dir=cfg.predecoded_dir,
                symbol=cfg.symbol, epochs=cfg.epochs, seq_len=cfg.seq_len, batch_size=cfg.batch_size,
                n_train_seqs=cfg.n_train_seqs, n_val_seqs=cfg.n_val_seqs, cv_n_folds=cfg.cv_n_folds,
                cv_train_window=cfg.cv_train_window, seed=cfg.seed, device=cfg.device, early_stop_metric="mean_auc",
            )
            summaries = train_supervised(train_cfg, explicit_params=params)
        return -float(np.mean([s.best_mean_auc for s in summaries]))

    best, history = pso_minimize(objective, spec.search_space, cfg.trials, cfg.workers, cfg.seed)
    results = {
        "model": cfg.model,
        "metric": ("validation Sharpe" if spec.trainer == "rl" else "validation mean AUC") + " (higher is better)",
        "best_params": best,
        "best_score": -min(h["loss"] for h in history),
        "trials": [{"trial": h["trial"], "params": h["params"], "score": -h["loss"], "wall_s": h["wall_s"]}
                   for h in history],
        "seed": cfg.seed,
        "workers": cfg.workers,
        "search_space": {k: v.model_dump(exclude_none=True) for k, v in spec.search_space.items()},
        "settings": cfg.model_dump(mode="json"),
        "versions": {"alpha": alpha_core.__version__, "nevergrad": ng.__version__, "torch": torch.__version__},
    }
    atomic_write_json(cfg.output, results)
    return results


def _rl_trial_score(cfg: HyperoptConfig, params: dict) -> float:
    from alpha_core.train.rl import RLTrainConfig, train_rl

    with tempfile.TemporaryDirectory(prefix="alpha-trial-") as tmp:
        train_cfg = RLTrainConfig(
            model=cfg.model, data_dir=cfg.data_dir, output_dir=Path(tmp), predecoded_dir=cfg.predecoded_dir,
            symbol=cfg.symbol, epochs=cfg.epochs, timesteps_per_epoch=cfg.timesteps_per_epoch,
            cv_n_folds=cfg.cv_n_folds, cv_train_window=cfg.cv_train_window, seed=cfg.seed, device=cfg.device,
        )
        return float(np.mean([s.val_sharpe for s in train_rl(train_cfg, explicit_params=params)]))
