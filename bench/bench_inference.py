"""Inference throughput in the evaluation path: windows/s of `alpha_core.eval.predict._window_probs` at its batch
(4096), for every supervised registry model on bar sidecars and the flagship on book sidecars.

    python3 bench/bench_inference.py --predecoded-dir gpu/pd --device cuda [--repeats 3] [--out FILE]

Models are freshly initialised (throughput does not depend on the weights); a file shorter than `--min-windows`
windows is tiled in time up to that length, so each pass is long enough to time. Each model first runs once over
the whole file (warm-up: cuDNN/cuBLAS heuristics, allocator), then `--repeats` timed passes; every pass ends
with the probabilities back on the host, as `alpha evaluate` uses them. The sidecars must already exist
(`bench/prepare_gpu_carry.sh` builds them); reading them needs numpy only.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from alpha_core.data.norm import fit_norm_stats
from alpha_core.data.sidecar import load_sidecar
from alpha_core.devices import resolve_device
from alpha_core.eval.predict import BATCH, _window_probs
from alpha_core.models import registry
from alpha_core.models.perception import PerceptionConfig, PerceptionModel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--predecoded-dir", type=Path, required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-windows", type=int, default=200_000, help="tile a short file up to this many windows")
    parser.add_argument("--out", type=Path, default=Path("bench/out/bench_inference.json"))
    args = parser.parse_args()
    device = resolve_device(args.device)  # TF32 matmuls on cuda, as `alpha evaluate` runs
    bars = load_sidecar(sorted(args.predecoded_dir.glob("*.bars.*"))[-1])
    book = load_sidecar(sorted(args.predecoded_dir.glob("*.book.*"))[-1])
    models = {
        name: (spec.build(n_features=len(bars.meta.feature_names)), bars)
        for name, spec in registry.REGISTRY.items()
        if spec.trainer == "supervised"
    }
    flagship = PerceptionConfig(n_features=len(book.meta.feature_names))
    models["perception"] = (PerceptionModel(flagship), book)  # the fused Triton CfC scan on cuda
    models["perception_torch_scan"] = (PerceptionModel(flagship), book)
    models["perception_torch_scan"][0].fused_scan = False
    results = {}
    for name, (model, sc) in models.items():
        model.to(device).eval()
        norm = fit_norm_stats([sc])
        tiles = -(-args.min_windows // (sc.rows - args.seq_len + 1))
        features = np.tile(np.asarray(sc.features), (tiles, 1))
        dt = np.tile(np.asarray(sc.dt), tiles) if name.startswith("perception") else None

        def run(model=model, features=features, norm=norm, dt=dt):
            return _window_probs(model, features, dt, args.seq_len, norm, device)

        windows = len(run())
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        best = min(times)
        results[name] = {"windows": windows, "seconds": best, "windows_per_s": windows / best}
        print(f"{name:10s} {windows / best:12,.0f} windows/s  ({windows:,} windows in {best:.2f} s)", flush=True)
    info = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "batch": BATCH,
        "seq_len": args.seq_len,
        "models": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
