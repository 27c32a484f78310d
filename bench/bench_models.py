"""Training throughput of every supervised registry model, and PPO environment steps/s.

    .venv/bin/python bench/bench_models.py [--batch 256] [--seq-len 64] [--steps 3] [--device cpu] [--n-envs 1024]

Windows come from real bar sidecars through the loader (a `--scale small` demo set generated on the fly).
Each model runs one warm-up step, then `--steps` timed steps of forward + backward + AdamW, one torch thread.
PPO then learns on the batched trading environment with `--n-envs` parallel environments.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from alpha_core.data.demo import generate_demo_data
from alpha_core.data.loader import WindowLoader
from alpha_core.data.norm import fit_norm_stats
from alpha_core.data.predecode import predecode
from alpha_core.models import registry
from alpha_core.train.metrics import masked_bce


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--n-envs", type=int, default=1024)
    parser.add_argument("--data-dir", type=Path, help="an ES.FUT folder with OHLCV-1m files (default: generate)")
    parser.add_argument("--predecoded-dir", type=Path, help="its sidecar cache (prebuilt, for machines without polars)")
    parser.add_argument("--out", type=Path, default=Path("bench/out/bench_models.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        if args.data_dir is None:  # generate (the build stack needs polars: on a GPU image pass prebuilt sidecars)
            generate_demo_data(Path(tmp), "small", 7, ["ES.FUT"], quarters=2)
            args.data_dir, args.predecoded_dir = Path(tmp, "ES.FUT"), Path(tmp, "pd")
        bars = [p.sidecar for p in predecode(args.data_dir, args.predecoded_dir, "ES.FUT", "ohlcv-1m")]
        loader = WindowLoader(bars, args.seq_len, 10**9, 0, fit_norm_stats(bars), device=device)
        batches = []
        while len(batches) < args.steps + 1:  # a small set may hold fewer windows than the steps need: more epochs
            batch = loader.next_batch(args.batch, drop_last=True)
            if batch is None:
                loader.reset(len(batches) + 1)
                continue
            batches.append(batch)
        tick = bars[0].meta.tick_size
        results = {}
        for name, spec in registry.REGISTRY.items():
            if spec.trainer != "supervised":
                continue
            model = spec.build(n_features=len(bars[0].meta.feature_names)).to(device)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

            def step(batch, model=model, opt=opt):
                loss = model.loss(batch, tick) if hasattr(model, "loss") else masked_bce(model(batch.x), batch.labels)
                opt.zero_grad()
                loss.backward()
                opt.step()

            step(batches[0])
            start = time.perf_counter()
            for batch in batches[1:]:
                step(batch)
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = (time.perf_counter() - start) / args.steps
            results[name] = {
                "samples_per_s": args.batch / seconds,
                "s_per_step": seconds,
                "params": sum(p.numel() for p in model.parameters()),
            }
            print(
                f"{name:8s} {args.batch / seconds:10,.0f} samples/s  {seconds * 1e3:8.0f} ms/step  "
                f"{results[name]['params']:>9,} params",
                flush=True,
            )
        rl = ppo_env_steps(bars, args)
        print(f"ppo      {rl['env_steps_per_s']:10,.0f} env steps/s with {args.n_envs} environments", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"batch": args.batch, "seq_len": args.seq_len, "device": args.device, "threads": 1, "models": results, "ppo": rl},
            indent=2,
        )
    )


def ppo_env_steps(bars, args) -> dict:
    from alpha_core.rl import EnvConfig, PPOConfig, TradingVecEnv, build_agent

    env = TradingVecEnv(bars, EnvConfig(n_envs=args.n_envs, window=32, episode_len=256), fit_norm_stats(bars))
    agent = build_agent("ppo", env, PPOConfig(n_steps=16, batch_size=4096, n_epochs=1), device=args.device)
    agent.learn(args.n_envs * 16)  # warm-up: one rollout + update
    start = time.perf_counter()
    agent.learn(args.n_envs * 16 * 4, reset_num_timesteps=False)
    seconds = time.perf_counter() - start
    return {
        "n_envs": args.n_envs,
        "env_steps": args.n_envs * 64,
        "seconds": seconds,
        "env_steps_per_s": args.n_envs * 64 / seconds,
    }


if __name__ == "__main__":
    main()
