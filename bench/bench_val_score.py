"""What recording a checkpoint's validation score costs its training step (`alpha_core.eval.validation.score`), per
supervised bar member: one brief `train-supervised` fold, then the score of its checkpoint on the validation file timed
three times in the same process (the first call pays what a trainer pays; the later ones what the work itself costs).

    python3 bench/bench_val_score.py --data-dir gpu/data/ES.FUT/ohlcv-1m --predecoded-dir gpu/pd --device cuda
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from alpha_core.data.dbn import OHLCV_1M
from alpha_core.data.predecode import predecode
from alpha_core.eval import validation
from alpha_core.eval.predict import Checkpoint, load
from alpha_core.models import registry
from alpha_core.train.configs import SupervisedTrainConfig
from alpha_core.train.supervised import train_supervised
from alpha_core.trainers import SUPERVISED


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--predecoded-dir", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", default=",".join(n for n, s in registry.REGISTRY.items() if s.trainer == "supervised"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    sidecars = {
        i.sidecar.meta.source.name: i.sidecar for i in predecode(args.data_dir, args.predecoded_dir, "ES.FUT", OHLCV_1M)
    }
    device = torch.device(args.device)
    results = {}
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            cfg = SupervisedTrainConfig(
                model=name,
                data_dir=args.data_dir,
                output_dir=Path(tmp),
                predecoded_dir=args.predecoded_dir,
                symbol="ES.FUT",
                epochs=1,
                n_train_seqs=2048,
                n_val_seqs=512,
                device=args.device,
                cv_n_folds=1,
                allow_untested_folds=True,
            )
            t = time.perf_counter()
            (summary,) = train_supervised(cfg)
            train_s = time.perf_counter() - t
            ckpt = Checkpoint(
                name, "ES.FUT", summary.fold, Path(tmp) / f"fold-{summary.fold}", SUPERVISED, summary.model_dump()
            )
            val = sidecars[summary.val_files[-1]]
            calls = []
            for _ in range(3):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t = time.perf_counter()
                validation.score(load(ckpt, device), val)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                calls.append(round(time.perf_counter() - t, 3))
        results[name] = {"train_s": round(train_s, 2), "score_s": calls, "val_bars": val.rows}
        print(name, results[name], flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
