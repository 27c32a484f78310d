"""Where one flagship fold's wall time goes, phase by phase, on a GPU.

    python3 bench/fold_timeline.py --data-dir gpu/data/ES.FUT/mbp-10 --predecoded-dir gpu/pd --out $OUT/fold.json

Trains one fold at the seed's defaults (5 epochs x 8,000 sequences at B=1, torch.compile + the whole step in
one CUDA graph, as the asset's GPU fast path) in this process and prints JSON with the seconds since the process
started at each mark: torch imported, CUDA up, the trainer imported, data prepared, trainer built, the captured
step's first calls (compilation, warm-up, capture), each epoch and validation, checkpoints; and Dynamo's own
compile-time breakdown. Run it twice with the same TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR to see a cold and a
warm compile cache (step pods share theirs on the output volume). `--profile FILE` also writes cProfile's top
functions of the training (by cumulative and by own time) to FILE.
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()

import argparse  # noqa: E402
import cProfile  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pstats  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

marks: list[tuple[str, float]] = []


def mark(name: str) -> None:
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    marks.append((name, round(time.perf_counter() - STARTED, 3)))


def instrument(trainer_module) -> None:
    """Marks around the trainer's phases and the captured step's first calls."""
    captured_call = trainer_module.CapturedStep.__call__

    def call(self):
        result = captured_call(self)
        if self.calls <= trainer_module.CapturedStep.WARMUP_STEPS + 1:
            mark(f"captured step, call {self.calls}")
        return result

    trainer_module.CapturedStep.__call__ = call
    for name in ("_prepare_data", "train_epoch", "validate_epoch", "_track", "_save_state"):
        method = getattr(trainer_module.PerceptionTrainer, name)

        def timed(self, *args, _method=method, _name=name, **kwargs):
            mark(f"{_name} start")
            result = _method(self, *args, **kwargs)
            mark(f"{_name} end")
            return result

        setattr(trainer_module.PerceptionTrainer, name, timed)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", type=Path, required=True, help="the symbol's mbp-10 folder")
    parser.add_argument("--predecoded-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/fold_timeline"))
    parser.add_argument("--fold", type=int, default=0)
    parser.add_argument("--profile", type=Path, help="write cProfile's top functions of the training here")
    args = parser.parse_args()
    mark("torch imported")
    torch.zeros(1, device="cuda")
    mark("CUDA up")
    from alpha_core.train import perception

    mark("trainer imported")
    instrument(perception)
    cfg = perception.TrainConfig(
        mbp10_data_dir=args.data_dir,
        predecoded_dir=args.predecoded_dir,
        out=args.work_dir / f"fold-{args.fold}",
        cv_fold=args.fold,
        cv_n_folds=3,
        cv_train_window=1,
        allow_untested_folds=True,
        device="cuda",  # the GPU fast path (compile + CUDA graph) is the default there
    )
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    trainer = perception.PerceptionTrainer(cfg)
    mark("trainer built")
    summary = trainer.fit()
    mark("fit done")
    if profiler:
        profiler.disable()
        text = io.StringIO()
        for order in ("cumulative", "tottime"):
            pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(45)
        args.profile.write_text(text.getvalue())
    from torch._dynamo.utils import compile_times

    result = {
        "marks": marks,
        "sequences_per_s": summary.sequences_per_s,
        "best_mean_auc": summary.best_mean_auc,
        "epoch_s": [m.get("epoch_s") for m in summary.epoch_metrics],
        "stage_s": summary.stage_s,  # the trainer's own stages (alpha_core/stages.py)
        "compile_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),  # where this process's compiled kernels went
        "dynamo_compile_times": compile_times(repr="str"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "dynamo_compile_times"}))


if __name__ == "__main__":
    main()
