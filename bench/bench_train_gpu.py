"""GPU throughput of the perception trainer, with data from real sidecars through the (device-resident) loader.

    python bench/bench_train_gpu.py --data-dir DIR/ES.FUT/mbp-10 --predecoded-dir PD --out results.json

For each mode (batch size x precision x eager/CUDA graph x compile x fused or torch CfC scan) it builds
the real `PerceptionTrainer` (K=64, default widths), runs warm-up steps (the graph is captured there), then
times `--steps` training steps, each including the device-resident loader's gather, with CUDA events, and
reports sequences/s, the time to the first step (compile and capture included) and peak GPU memory. The run is
sized to the data: the timed steps go on into new epochs (the loader reshuffled, the captured step's cursor
rewound) once an epoch's full batches are used, as `train_epoch` does, so no step reads past the epoch's windows
(at B=4096 over 100 steps the captured cursor once ran past them: a device-side index assert). It also
times forward-only inference at batch 4096, and optionally (`--auc-parity`) trains fp32 and bf16 side by side to
compare validation AUC.
Run one mode per process: a failed capture poisons the CUDA state of the process.
"""

from __future__ import annotations

import argparse
import ast
import json
import time
from pathlib import Path

import torch

from alpha_core.models import cfc_triton, mamba2
from alpha_core.models import perception as models_perception
from alpha_core.models.mamba2 import Mamba2Config
from alpha_core.train import perception
from alpha_core.train.perception import PerceptionTrainer, TrainConfig

# fold 0 of the 3-fold plan over the device's demo set (4 files): one training file, the next for validation
# (fold_timeline.py's plan; the default plan needs 5 files, a test file per fold)
FOLD = {"cv_fold": 0, "cv_n_folds": 3, "cv_train_window": 1, "allow_untested_folds": True}


def run_mode(args, batch: int, precision: str, graph: bool, steps: int, compiled: bool = False, fused: bool = True) -> dict:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    warmup = 5
    cfg = TrainConfig(
        mbp10_data_dir=args.data_dir,
        predecoded_dir=args.predecoded_dir,
        out=args.out_dir / f"b{batch}",
        device="cuda",
        batch_size=batch,
        seq_len=64,
        n_train_seqs=batch * (warmup + steps + args.profile),
        epochs=1,
        precision=precision,
        cuda_graph=graph,
        lr_warmup_steps=10,
        compile=compiled,
        fused_scan=fused,
        **FOLD,
    )
    t0 = time.perf_counter()
    trainer = PerceptionTrainer(cfg)
    trainer.model.train()
    loader = trainer.train_loader
    per_epoch = loader.n_windows // batch  # full batches the data holds: the steps are sized to it
    if per_epoch < 1:
        raise ValueError(f"the training files hold {loader.n_windows} windows, fewer than one batch of {batch}")
    epoch = 0

    def next_batch():  # eager steps: the device-resident loader's gather is part of every timed step
        nonlocal epoch
        b = loader.next_batch(batch, drop_last=True)
        if b is None:
            epoch += 1
            loader.reset(epoch)
            b = loader.next_batch(batch, drop_last=True)
        return b

    if graph:  # the captured step gathers its own batch; a new epoch starts before its cursor passes the data
        trainer.graph.start_epoch()
        in_epoch = 0

        def run(_):
            nonlocal epoch, in_epoch
            if in_epoch == per_epoch:
                epoch += 1
                loader.reset(epoch)
                trainer.graph.start_epoch()
                in_epoch = 0
            in_epoch += 1
            return trainer.graph()

        def next_batch():
            return None
    else:

        def run(b):
            return trainer.step(b.x, b.dt, b.labels, b.outcome_long, b.outcome_short)

    run(next_batch())
    torch.cuda.synchronize()
    first_step_s = time.perf_counter() - t0
    for _ in range(warmup - 1):
        run(next_batch())
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        loss, _, _ = run(next_batch())
    end.record()
    torch.cuda.synchronize()
    n = steps
    ms = start.elapsed_time(end) / n
    prof = profile_steps(run, next_batch, args.profile) if args.profile else None
    return {
        "batch": batch,
        "precision": precision,
        "cuda_graph": graph,
        "compile": compiled,
        "fused_scan": fused,
        "profile": prof,
        "steps": n,
        "ms_per_step": ms,
        "windows": loader.n_windows,
        "steps_per_epoch": per_epoch,
        "epochs_spanned": epoch + 1,
        "sequences_per_s": batch * 1000 / ms,
        "first_step_s": first_step_s,
        "peak_gpu_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
        "final_loss": float(loss),
    }


def profile_steps(run, next_batch, steps: int) -> dict:
    """Kernels per step and where the GPU time goes, from torch.profiler over `steps` steps (graph replays too)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run(next_batch())
        torch.cuda.synchronize()
    events = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda e: e.time_range.start
    )
    kernels: dict[str, list[float]] = {}
    for event in events:
        kernels.setdefault(event.name[:120], []).append(event.device_time)
    total = sum(sum(v) for v in kernels.values())
    top = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))
    per_step = len(events) // steps
    last = events[-per_step:] if per_step else []  # the last step's kernels in launch order: which stage each is
    return {
        "kernels_per_step": len(events) / steps,
        "gpu_us_per_step": total / steps,
        "top": [{"name": k, "per_step": len(v) / steps, "us_per_step": sum(v) / steps} for k, v in top],
        # name, GPU time and start (us after the step's first kernel started): the gaps are launch latency
        "last_step": [
            [e.name[:90], round(e.device_time, 2), round(e.time_range.start - last[0].time_range.start, 2)] for e in last
        ],
    }


@torch.no_grad()
def inference(args, batch: int = 4096, reps: int = 20) -> dict:
    cfg = TrainConfig(
        mbp10_data_dir=args.data_dir,
        predecoded_dir=args.predecoded_dir,
        out=args.out_dir / "inf",
        device="cuda",
        batch_size=batch,
        seq_len=64,
        n_train_seqs=batch,
        epochs=1,
        **FOLD,
    )
    trainer = PerceptionTrainer(cfg)
    trainer.model.eval()
    b = trainer.train_loader.next_batch(batch)
    for _ in range(3):
        trainer.model(b.x, b.dt)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        trainer.model(b.x, b.dt)
    torch.cuda.synchronize()
    return {"batch": batch, "inference_sequences_per_s": batch * reps / (time.perf_counter() - t)}


def auc_parity(args) -> dict:
    """Same seed, data and schedule in fp32 and bf16: validation AUC must agree within noise."""
    out = {}
    for precision in ("fp32", "bf16"):
        cfg = TrainConfig(
            mbp10_data_dir=args.data_dir,
            predecoded_dir=args.predecoded_dir,
            out=args.out_dir / f"parity-{precision}",
            device="cuda",
            batch_size=256,
            seq_len=64,
            n_train_seqs=20_000,
            n_val_seqs=5_000,
            epochs=3,
            lr_warmup_steps=50,
            precision=precision,
            cuda_graph=True,
            early_stop_metric="none",
            **FOLD,
        )
        s = PerceptionTrainer(cfg).fit()
        out[precision] = {
            "best_mean_auc": s.best_mean_auc,
            "per_horizon": s.best_mean_auc_per_horizon,
            "final_val_auc": s.final_val_auc,
            "sequences_per_s": s.sequences_per_s,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--predecoded-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--out-dir", type=Path, default=Path("/tmp/bench_train_gpu"))
    parser.add_argument(
        "--modes",
        default="1:fp32:0,1:fp32:1,64:fp32:1,4096:fp32:0,4096:fp32:1,4096:bf16:1",
        help="batch:precision:graph(0|1)[:c for torch.compile][:t for the torch CfC scan]"
        "[:r for Triton's row kernel in place of the CUDA one at small batch], comma-separated",
    )
    parser.add_argument("--skip-inference", action="store_true")
    parser.add_argument("--auc-parity", action="store_true", help="also train fp32 vs bf16 and compare AUC")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--profile", type=int, default=0, help="also profile this many steps per mode")
    parser.add_argument(
        "--inductor",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Inductor option KEY (a Python literal) over the trainer's `compile_options` for every mode: an "
        "experiment, not the trainer's default",
    )
    parser.add_argument(
        "--mamba2-chunk",
        type=int,
        default=None,
        metavar="Q",
        help="the flagship encoder's SSD chunk length (default: Mamba2Config's): an experiment, the same model",
    )
    parser.add_argument(
        "--cfc-tiles",
        metavar="ROWS:WARPS[:REGISTERS]",
        help="the fused CfC scan's tile above batch 64 (default: LAUNCH_PLAN's), and a cap on its registers under "
        "bf16: an experiment, the same model",
    )
    parser.add_argument(
        "--ssd-matmuls",
        action="store_true",
        help="the flagship encoder's SSD products as matmuls at every batch (default: broadcasts up to 64 on a GPU): "
        "an experiment, the same model",
    )
    parser.add_argument(
        "--ssd-chunked",
        action="store_true",
        help="the flagship encoder's SSD as `ssd_chunked` at every batch (default: the window kernel of ssd_triton.py "
        "above 64 on a GPU): an experiment, the same model",
    )
    args = parser.parse_args()
    if args.ssd_chunked:
        mamba2.window_kernel = lambda cfg, x, B: None
    if args.ssd_matmuls:
        mamba2.broadcast_products = lambda u: False
    if args.cfc_tiles:
        rows, warps, *registers = map(int, args.cfc_tiles.split(":"))
        cfc_triton.LAUNCH_PLAN = [*cfc_triton.LAUNCH_PLAN[:1], (None, "tiles", rows, warps)]
        cfc_triton.HALF_TILE_REGISTERS = registers[0] if registers else cfc_triton.HALF_TILE_REGISTERS
    if args.mamba2_chunk is not None:  # the chunk is an implementation choice, not a saved setting: the same model
        chunk = args.mamba2_chunk
        models_perception.PerceptionConfig.mamba2 = lambda self: Mamba2Config(
            d_model=self.d_model, d_state=self.mamba2_state_dim, n_layers=self.mamba2_layers, chunk_size=chunk
        )
    overrides = {key: ast.literal_eval(value) for key, _, value in (s.partition("=") for s in args.inductor)}
    # over the trainer's own options too: torch.compile's options win over the global config for the keys they set
    trainer_options = perception.compile_options
    perception.compile_options = lambda batch_size, sms: {**trainer_options(batch_size, sms), **overrides}
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    results = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "inductor": args.inductor,
        "mamba2_chunk": args.mamba2_chunk,
        "cfc_tiles": args.cfc_tiles,
        "ssd_matmuls": args.ssd_matmuls,
        "ssd_chunked": args.ssd_chunked,
        "modes": [],
    }
    for spec in args.modes.split(","):
        batch, precision, graph, *flags = spec.split(":")
        plan = cfc_triton.LAUNCH_PLAN
        if "r" in flags:
            cfc_triton.LAUNCH_PLAN = [(64, "rows", 1, 8), *plan[1:]]
        try:
            r = run_mode(args, int(batch), precision, graph == "1", args.steps, compiled="c" in flags, fused="t" not in flags)
        except Exception as exc:  # report and go on: one broken mode must not cost the whole device call
            r = {"mode": spec, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        cfc_triton.LAUNCH_PLAN = plan
        r["small_batch_scan"] = "rows" if "r" in flags else "cuda"
        print(json.dumps(r), flush=True)
        results["modes"].append(r)
        args.out.write_text(json.dumps(results, indent=2))
    if args.auc_parity:
        results["auc_parity"] = auc_parity(args)
        print(json.dumps(results["auc_parity"]), flush=True)
        args.out.write_text(json.dumps(results, indent=2))
    if not args.skip_inference:
        results["inference"] = inference(args)
        print(json.dumps(results["inference"]), flush=True)
    args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
