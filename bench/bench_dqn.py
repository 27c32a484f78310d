"""What one DQN epoch costs on the CPU, and where: learning (`timesteps_per_epoch` environment steps at the defaults,
one gradient step every `train_freq` vectorised steps) and its parts, at several torch thread counts, in one process.

    python3 bench/bench_dqn.py --data-dir gpu/data/ES.FUT --predecoded-dir gpu/pd --threads 16,4,1 --out r.json

For each thread count it builds fold 0's environment and a DQN with the defaults (same seed), trains it for
`--warm` steps (past `learning_starts`), then times one epoch of `learn` and, separately, `--parts` gradient steps
split into SB3's phases (replay sample, target, forward, backward, clipping, Adam) and the policy's `predict`.
Whether the learned weights equal the first thread count's tells whether threads change the numbers. Why: a CPU
training pod's process sets torch's threads to its cores (`alpha_core.cpus`), and DQN's networks are tiny.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F


def parts(agent, n: int) -> dict[str, float]:
    """Microseconds per gradient step in each phase of SB3's `DQN.train`, and per `predict` of a vectorised step."""
    marks: dict[str, float] = {}

    def mark(name: str, t0: float) -> float:
        t1 = time.perf_counter()
        marks[name] = marks.get(name, 0.0) + t1 - t0
        return t1

    opt = agent.policy.optimizer
    for _ in range(n):
        t = time.perf_counter()
        data = agent.replay_buffer.sample(agent.batch_size, env=agent._vec_normalize_env)
        t = mark("sample", t)
        with torch.no_grad():
            target = data.rewards + (1 - data.dones) * agent.gamma * agent.q_net_target(data.next_observations).max(dim=1)[
                0
            ].reshape(-1, 1)
        t = mark("target", t)
        loss = F.smooth_l1_loss(torch.gather(agent.q_net(data.observations), 1, data.actions.long()), target)
        t = mark("forward", t)
        opt.zero_grad()
        loss.backward()
        t = mark("backward", t)
        torch.nn.utils.clip_grad_norm_(agent.policy.parameters(), agent.max_grad_norm)
        t = mark("clip", t)
        opt.step()
        mark("adam", t)
    obs = agent.env.reset()
    t = time.perf_counter()
    for _ in range(n):
        agent.predict(obs)
    mark("predict", t)
    return {k: round(v / n * 1e6, 1) for k, v in marks.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data-dir", type=Path, required=True, help="the symbol's folder (ohlcv-1m inside)")
    p.add_argument("--predecoded-dir", type=Path, required=True)
    p.add_argument("--threads", default="16,4,1")
    p.add_argument("--warm", type=int, default=2000)
    p.add_argument("--parts", type=int, default=1000)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    warnings.simplefilter("ignore")
    from alpha_core.data.dbn import OHLCV_1M
    from alpha_core.data.norm import fit_norm_stats
    from alpha_core.data.predecode import walk_forward
    from alpha_core.rl import DQNConfig, EnvConfig, TradingVecEnv, build_agent, evaluate
    from alpha_core.train.configs import RLTrainConfig

    defaults = RLTrainConfig.model_fields
    (fold,) = walk_forward(args.data_dir, OHLCV_1M, args.predecoded_dir, args.data_dir.name, 3, 1, 0, True)
    norm = fit_norm_stats(fold.train)
    env_cfg = EnvConfig(
        window=defaults["window"].default, episode_len=defaults["episode_len"].default, n_envs=defaults["n_envs"].default
    )
    steps = defaults["timesteps_per_epoch"].default
    rows, first = [], None
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        agent = build_agent("dqn", TradingVecEnv(fold.train, env_cfg, norm, seed=0), DQNConfig(), seed=0, device="cpu")
        agent.learn(args.warm)
        t, c = time.perf_counter(), time.process_time()
        agent.learn(steps, reset_num_timesteps=False)
        learn_s, learn_cpu = time.perf_counter() - t, time.process_time() - c
        t = time.perf_counter()
        sharpe = evaluate(agent, fold.val, env_cfg, norm).sharpe
        weights = torch.cat([q.detach().flatten() for q in agent.q_net.parameters()])
        first = weights if first is None else first
        rows.append(
            {
                "threads": threads,
                "learn_s": round(learn_s, 2),
                "learn_cpu_s": round(learn_cpu, 2),
                "eval_s": round(time.perf_counter() - t, 3),
                "val_sharpe": sharpe,
                "same_weights_as_first": bool(torch.equal(weights, first)),
                "us_per_step": parts(agent, args.parts),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    args.out.write_text(json.dumps({"timesteps_per_epoch": steps, "n_envs": env_cfg.n_envs, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
