"""SB3 DQN/PPO agents on the trading env: configs, a window-encoder features extractor, safetensors I/O, greedy
positions and their evaluation (the evaluator's daily-session Sharpe).

Policies are MLPs over the flat observation by default. `extractor="gru"` (or `build_agent(..., encoder=...)`)
instead runs an encoder over the [B, window, F] feature window and appends the position: any torch module
mapping [B, window, F] -> [B, d] (or per-position [B, window, d], of which the last position is used, as the
causal sequence models of `alpha_core.models` produce) can be reused this way.

Weights are saved with `alpha_core.weights.save_weights` on `agent.policy` (SB3 policies alias one extractor
under several names: it keeps each alias once). SB3's own `.zip` (cloudpickle) is not used.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, Field
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.preprocessing import preprocess_obs
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor, FlattenExtractor
from stable_baselines3.common.vec_env import VecEnv

from alpha_core.bounds import MAX_COUNT, Count, Dim, LearningRate, NonNegFloat, NonNegInt, PositiveFloat, UnitFloat
from alpha_core.data.norm import NormStats
from alpha_core.data.sidecar import Sidecar
from alpha_core.rl.env import ACTION_TO_POSITION, EnvConfig, MarketData, MarketSeries, TradingVecEnv, as_series
from alpha_core.sb3_private import subclass_with_setup

OBS_BATCH_ELEMENTS = 2**24  # one batched policy forward in greedy_positions: 64 MiB of float32 observations


class _AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    learning_rate: LearningRate = 1e-3
    gamma: float = Field(0.9, gt=0, le=1)  # short horizon: a bar's reward is mostly its own action's
    net_arch: list[Dim] = Field(default_factory=lambda: [64, 64], max_length=64)
    extractor: Literal["mlp", "gru"] = "mlp"  # "gru": the CausalGRUEncoder window extractor
    gru_hidden: Dim = 32


class DQNConfig(_AgentConfig):
    """DQN's settings. `learning_rate` and `train_freq` are SB3's own defaults (docs/models.md, "DQN"): one gradient
    step of 64 samples every 4 vectorised steps (32 transitions) at 1e-4. The earlier 1e-3 and one step every
    vectorised step (8 transitions) fitted the noise of a few thousand training bars: validation Sharpe peaked in
    the first epoch and fell as turnover rose (the numbers: docs/models.md)."""

    learning_rate: LearningRate = 1e-4
    buffer_size: Count = 50_000
    learning_starts: NonNegInt = 500
    batch_size: Count = 64
    train_freq: Count = 4  # vectorised env steps between updates (n_envs transitions each)
    gradient_steps: int = Field(1, ge=-1, le=MAX_COUNT)  # -1: as many as env steps
    target_update_interval: Count = 500  # env transitions
    exploration_fraction: float = Field(0.3, gt=0, le=1)
    exploration_initial_eps: UnitFloat = 1.0
    exploration_final_eps: UnitFloat = 0.05


class PPOConfig(_AgentConfig):
    learning_rate: LearningRate = 3e-4
    n_steps: Count = 128  # per env and rollout
    batch_size: int = Field(256, ge=2, le=MAX_COUNT)
    n_epochs: Count = 4
    gae_lambda: UnitFloat = 0.95
    clip_range: PositiveFloat = 0.2
    ent_coef: NonNegFloat = 0.01
    vf_coef: NonNegFloat = 0.5
    max_grad_norm: PositiveFloat = 0.5


class CausalGRUEncoder(torch.nn.Module):
    """A small causal encoder [B, window, F] -> [B, hidden]: the GRU's state after the window's last bar."""

    def __init__(self, n_features: int, hidden: int = 32) -> None:
        super().__init__()
        self.gru = torch.nn.GRU(n_features, hidden, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, h = self.gru(x)
        return h[-1]


class WindowEncoderExtractor(BaseFeaturesExtractor):
    """Features = [encoder(window), position] from the flat trading observation.

    `encoder` is a module (deep-copied per extractor, so DQN's online and target nets do not share it) or a
    zero-argument factory. Its output width is found by one dry forward pass."""

    def __init__(
        self,
        observation_space: spaces.Box,
        window: int,
        n_features: int,
        encoder: torch.nn.Module | Callable[[], torch.nn.Module],
    ) -> None:
        module = copy.deepcopy(encoder) if isinstance(encoder, torch.nn.Module) else encoder()
        if observation_space.shape != (window * n_features + 1,):
            raise ValueError(f"observation shape {observation_space.shape} != window*F+1 = {window * n_features + 1}")
        with torch.no_grad():
            was_training = module.training
            module.eval()
            d = self._encode(module, torch.zeros(1, window, n_features)).shape[-1]
            module.train(was_training)
        super().__init__(observation_space, features_dim=int(d) + 1)
        self.encoder = module
        self.window, self.n_features = window, n_features

    @staticmethod
    def _encode(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        h = module(x)
        if h.dim() == 3:  # per-position outputs of a causal sequence model: the last bar's
            h = h[:, -1]
        return h

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        b = observations.shape[0]
        x = observations[:, :-1].reshape(b, self.window, self.n_features)
        return torch.cat([self._encode(self.encoder, x), observations[:, -1:]], dim=1)


def _plain_mlp(net: torch.nn.Module) -> list[torch.nn.Module] | None:
    """The layers of an SB3 Q-network that is a flattened observation into Linear and ReLU layers only (the default
    `MlpPolicy`), else None."""
    layers = list(getattr(net, "q_net", []))
    if not isinstance(getattr(net, "features_extractor", None), FlattenExtractor) or not layers:
        return None
    plain = all(type(m) in (torch.nn.Linear, torch.nn.ReLU) and not getattr(m, "inplace", False) for m in layers)
    return layers if plain else None


def _mlp_forward(self, obs: torch.Tensor) -> torch.Tensor:
    """`QNetwork.forward` of a plain MLP as the same functional ops (bitwise the same values and gradients) without
    the eight module calls (`_call_impl` and hooks) around them."""
    x = torch.flatten(preprocess_obs(obs, self.observation_space, normalize_images=self.normalize_images), 1)
    for layer in self._plain_layers:
        x = F.linear(x, layer.weight, layer.bias) if isinstance(layer, torch.nn.Linear) else F.relu(x)
    return x


def _lean(self: DQN) -> None:
    """SB3's DQN, the same update to the bit (tests/test_rl.py), cheaper per gradient step on a CPU pod (issue 33
    item 5: then one gradient step per vectorised environment step, 2,500 an epoch, each about 100 small ops of Python;
    625 at today's `train_freq` 4):
    Adam's multi-tensor (`foreach`) form, the same arithmetic in fewer calls; the plain MLP Q-networks run their
    Linear and ReLU layers as functions rather than through eight module calls; and the policy's train/eval switch,
    which SB3 makes before every gradient step and every action (a walk over every submodule), is skipped where no
    module behaves differently in training (no dropout, no batch norm)."""
    policy = self.policy
    for net in (policy.q_net, policy.q_net_target):
        layers = _plain_mlp(net)
        if layers is not None:
            net._plain_layers = layers
            net.forward = types.MethodType(_mlp_forward, net)
    if policy.device.type == "cpu":  # on CUDA torch picks foreach (or fused) itself
        for group in policy.optimizer.param_groups:
            group["foreach"] = True
    if all(type(m) in _MODE_FREE or type(m).__module__.startswith("stable_baselines3") for m in policy.modules()):
        policy.set_training_mode = types.MethodType(_record_mode, policy)


_MODE_FREE = (torch.nn.Linear, torch.nn.ReLU, torch.nn.Flatten, torch.nn.Sequential)  # train() changes nothing


def _record_mode(self, mode: bool) -> None:
    """`set_training_mode` of a policy whose modules ignore it: the flag, without the walk over its submodules."""
    self.training = mode


LeanDQN = subclass_with_setup(DQN, _lean, "LeanDQN")


def build_agent(
    name: Literal["dqn", "ppo"],
    env: VecEnv,
    cfg: DQNConfig | PPOConfig | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
    encoder: torch.nn.Module | Callable[[], torch.nn.Module] | None = None,
) -> BaseAlgorithm:
    """An SB3 DQN or PPO on `env` (a TradingVecEnv, possibly wrapped, e.g. in VecMonitor).

    The policy is an MLP (`cfg.net_arch`) over the flat observation, unless `encoder` is given (any module
    [B, window, F] -> [B, d], or a factory of one) or `cfg.extractor == "gru"` (a CausalGRUEncoder); then
    the MLP runs on [encoder(window), position]."""
    if name not in ("dqn", "ppo"):
        raise ValueError(f"unknown agent {name!r} (dqn or ppo)")
    cfg = cfg or (DQNConfig() if name == "dqn" else PPOConfig())
    if not isinstance(cfg, DQNConfig if name == "dqn" else PPOConfig):
        raise TypeError(f"{name} needs a {'DQNConfig' if name == 'dqn' else 'PPOConfig'}, got {type(cfg).__name__}")
    policy_kwargs: dict = {"net_arch": list(cfg.net_arch)}
    if encoder is None and cfg.extractor == "gru":
        n_features, hidden = env.get_attr("n_features")[0], cfg.gru_hidden
        encoder = lambda: CausalGRUEncoder(n_features, hidden)  # noqa: E731
    if encoder is not None:
        window, n_features = env.get_attr("window")[0], env.get_attr("n_features")[0]
        policy_kwargs["features_extractor_class"] = WindowEncoderExtractor
        policy_kwargs["features_extractor_kwargs"] = {"window": window, "n_features": n_features, "encoder": encoder}
    common = dict(
        learning_rate=cfg.learning_rate, gamma=cfg.gamma, policy_kwargs=policy_kwargs, seed=seed, device=device, verbose=0
    )
    if name == "dqn":
        agent = LeanDQN(
            "MlpPolicy",
            env,
            buffer_size=cfg.buffer_size,
            learning_starts=cfg.learning_starts,
            batch_size=cfg.batch_size,
            train_freq=cfg.train_freq,
            gradient_steps=cfg.gradient_steps,
            target_update_interval=cfg.target_update_interval,
            exploration_fraction=cfg.exploration_fraction,
            exploration_initial_eps=cfg.exploration_initial_eps,
            exploration_final_eps=cfg.exploration_final_eps,
            **common,
        )
    else:
        agent = PPO(
            "MlpPolicy",
            env,
            n_steps=cfg.n_steps,
            batch_size=cfg.batch_size,
            n_epochs=cfg.n_epochs,
            gae_lambda=cfg.gae_lambda,
            clip_range=cfg.clip_range,
            ent_coef=cfg.ent_coef,
            vf_coef=cfg.vf_coef,
            max_grad_norm=cfg.max_grad_norm,
            **common,
        )
    # SB3's default logger makes an empty /tmp/SB3-<time> folder per learn() call; ours reports progress itself
    agent.set_logger(Logger(folder=None, output_formats=[]))
    return agent


def save_policy(agent: BaseAlgorithm, path: str | Path, metadata: dict[str, str] | None = None) -> Path:
    """The policy's weights as safetensors (SB3's shared extractor tensors kept once; no pickle)."""
    from alpha_core.weights import save_weights

    path = Path(path)
    meta = {"algo": type(agent).__name__, "policy": type(agent.policy).__name__, **(metadata or {})}
    save_weights(agent.policy, path, metadata=meta)
    return path


def load_policy(agent: BaseAlgorithm, path: str | Path) -> BaseAlgorithm:
    """Load weights saved by `save_policy` into an agent built with the same config (architecture must match)."""
    from alpha_core.weights import load_weights

    load_weights(agent.policy, path, agent.device)  # raises on a mismatch
    return agent


class EvalResult(BaseModel):
    """Greedy-policy results over whole files, scored like the evaluator scores a backtest: `sharpe` is
    `alpha_core.metrics.summarize`'s annualised daily-session Sharpe of the positions, in ticks, at
    `cost_ticks` per unit of position change. `mean_reward` is the environment's reward per acting bar."""

    model_config = ConfigDict(extra="forbid")

    sharpe: float
    n_sessions: int
    total_pnl: float  # ticks, net of cost
    mean_reward: float  # per acting bar, reward units (ticks or log return), net of cost
    turnover: float  # mean |position change| per bar
    long_frac: float
    short_frac: float
    n_bars: int  # acting bars with a next-bar return
    cost_ticks: float
    reward_unit: str


def _market(
    data: TradingVecEnv | Sequence[Sidecar | MarketSeries], env_cfg: EnvConfig | None, norm: NormStats | None
) -> tuple[MarketData, EnvConfig]:
    base = getattr(data, "unwrapped", data)  # a VecMonitor-wrapped env counts too
    if isinstance(base, TradingVecEnv):
        return base.data, base.cfg
    cfg = env_cfg or EnvConfig()
    return MarketData(data, cfg.window, norm, cfg.reward_unit), cfg


def greedy_positions(
    agent: BaseAlgorithm,
    data: TradingVecEnv | Sequence[Sidecar | MarketSeries],
    env_cfg: EnvConfig | None = None,
    norm: NormStats | None = None,
    segment_len: int | None = None,
) -> list[np.ndarray]:
    """The positions of `greedy_decisions`, one array per file."""
    return [positions for positions, _ in greedy_decisions(agent, data, env_cfg, norm, segment_len)]


def greedy_decisions(
    agent: BaseAlgorithm,
    data: TradingVecEnv | Sequence[Sidecar | MarketSeries],
    env_cfg: EnvConfig | None = None,
    norm: NormStats | None = None,
    segment_len: int | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per file: the greedy (deterministic) position of the policy at every bar, held over the next bar, and the
    latest row of the file that position depends on (-1 where it read nothing), for the evaluator's clock.

    The agent acts at bars window-1 .. N-1 of a file, starting flat; its position is part of the next
    observation, so a file is a sequence. It is still batched: the position takes three values only, so one
    batched forward pass (`_greedy_actions`) gives the action at every bar from each of the three previous
    positions, and the sequence follows that table bar by bar without the policy (the same actions as stepping
    the policy one bar at a time). Bars before the first full window are flat. `segment_len` cuts each file into
    segments that start flat (approximate); None (the default, and what the evaluator does) runs each file as
    one sequence. `data`: sidecars/series with `env_cfg` and the training `norm`, or a TradingVecEnv whose
    files, config and normalisation are reused.

    A position depends on its own observation and, through the position it starts from, on every earlier one
    of its sequence: the latest row it read is the running maximum of the rows its observations gathered."""
    market, cfg = _market(data, env_cfg, norm)
    acting = [np.arange(off + cfg.window - 1, off + n) for off, n in zip(market.offsets, market.lengths, strict=True)]
    rows = np.concatenate(acting)
    table = np.ones((int(market.lengths.sum()), 3), dtype=np.int64)  # the flat action where the agent does not act
    read = np.full(len(table), -1, dtype=np.int64)
    table[rows], read[rows] = _greedy_actions(agent, market, rows)
    steps = table.tolist()  # Python lists: the walk below costs ~0.1 us a bar
    action = np.ones(len(table), dtype=np.int64)
    for bars in acting:
        step = segment_len or max(len(bars), 1)
        for lo in range(0, len(bars), step):
            a, path = 1, []  # flat
            for g in bars[lo : lo + step].tolist():
                a = steps[g][a]
                path.append(a)
            action[bars[lo : lo + step]] = path
            read[bars[lo : lo + step]] = np.maximum.accumulate(read[bars[lo : lo + step]])
    held = ACTION_TO_POSITION[action]
    return [
        (held[off : off + n], np.where(read[off : off + n] >= 0, read[off : off + n] - off, -1))
        for off, n in zip(market.offsets, market.lengths, strict=True)
    ]


def _greedy_actions(agent: BaseAlgorithm, market: MarketData, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([len(rows), 3]: the greedy action at each global row from each previous position (short, flat, long),
    which is also the index of the position it takes; [len(rows)]: the latest global row each observation read),
    observations in batches of at most OBS_BATCH_ELEMENTS."""
    width = market.window * market.n_features + 1
    per_batch = max(1, OBS_BATCH_ELEMENTS // (len(ACTION_TO_POSITION) * width))
    out = np.empty((len(rows), len(ACTION_TO_POSITION)), dtype=np.int64)
    read = np.empty(len(rows), dtype=np.int64)
    for lo in range(0, len(rows), per_batch):
        g = rows[lo : lo + per_batch]
        obs, seen = market.observations(np.repeat(g, len(ACTION_TO_POSITION)), np.tile(ACTION_TO_POSITION, len(g)))
        actions, _ = agent.predict(obs, deterministic=True)
        out[lo : lo + len(g)] = np.asarray(actions, dtype=np.int64).reshape(len(g), len(ACTION_TO_POSITION))
        read[lo : lo + len(g)] = seen.reshape(len(g), len(ACTION_TO_POSITION)).max(axis=1)
    return out, read


def evaluate(
    agent: BaseAlgorithm,
    data: TradingVecEnv | Sequence[Sidecar | MarketSeries],
    env_cfg: EnvConfig | None = None,
    norm: NormStats | None = None,
    segment_len: int | None = None,
) -> EvalResult:
    """Score the greedy policy on whole files with the evaluator's metric (see `EvalResult`).

    The files' bars, in time order, form one series (each file's last bar has no next move); every series
    needs bar timestamps (`MarketSeries.ts`, a sidecar's `ts`) for the daily sessions. The cost is the
    environment's `cost_per_turnover` (the project's `DEFAULT_COST_TICKS` unless set otherwise)."""
    from alpha_core.metrics import headline  # summarize's numbers that this reads, without the rest

    market, cfg = _market(data, env_cfg, norm)
    positions = greedy_positions(agent, data, env_cfg, norm, segment_len)
    if any(s.ts is None for s in market.series):
        raise ValueError("evaluate needs the bars' timestamps (MarketSeries.ts) for the daily-session Sharpe")
    order = np.argsort([int(s.ts[0]) if len(s.ts) else 0 for s in market.series], kind="stable")
    ts = np.concatenate([np.asarray(market.series[i].ts, dtype=np.int64) for i in order])
    pos = np.concatenate([positions[i] for i in order])
    moves = np.concatenate(
        [
            np.append(np.diff(np.asarray(market.series[i].price, dtype=np.float64)), 0.0) / market.series[i].tick_size
            for i in order
        ]
    )
    stats = headline(ts, pos, moves, cfg.cost_per_turnover)
    acting = np.concatenate(
        [np.arange(off + cfg.window - 1, off + n - 1) for off, n in zip(market.offsets, market.lengths, strict=True)]
    )
    if not len(acting):
        raise ValueError(f"no file is longer than window + 1 = {cfg.window + 1} bars")
    held = np.concatenate(positions)
    prev = np.concatenate([np.r_[0.0, p[:-1]] for p in positions])
    rewards = held[acting] * market.ret[acting] - cfg.cost_per_turnover * market.cost_scale[acting] * np.abs(
        held[acting] - prev[acting]
    )
    return EvalResult(
        sharpe=stats["sharpe"],
        n_sessions=stats["n_sessions"],
        total_pnl=stats["total_pnl"],
        mean_reward=float(rewards.mean()),
        turnover=stats["turnover"],
        long_frac=float((held[acting] > 0).mean()),
        short_frac=float((held[acting] < 0).mean()),
        n_bars=len(acting),
        cost_ticks=cfg.cost_per_turnover,
        reward_unit=cfg.reward_unit,
    )


Span = tuple[int, int, int]  # (file, first bar, end bar) of one session


def session_spans(data: Sequence[Sidecar | MarketSeries], n_sessions: int, seed: int) -> list[Span] | None:
    """A fixed seeded choice of `n_sessions` of the files' CME sessions (drawn without replacement, in time order),
    for a validation whose cost does not grow with the files; None when the files have no more sessions than that
    (then they are scored whole)."""
    from alpha_core.sessions import session_days

    spans = []
    for f, s in enumerate(as_series(data)):
        if s.ts is None:
            raise ValueError("session_spans needs the bars' timestamps (MarketSeries.ts)")
        days = session_days(np.asarray(s.ts))
        edges = np.r_[0, np.flatnonzero(np.diff(days)) + 1, len(days)]
        spans += [(f, int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]
    if len(spans) <= n_sessions:
        return None
    pick = np.sort(np.random.default_rng(seed).choice(len(spans), size=n_sessions, replace=False))
    return [spans[i] for i in pick]


def evaluate_sessions(
    agent: BaseAlgorithm,
    data: Sequence[Sidecar | MarketSeries],
    spans: Sequence[Span],
    env_cfg: EnvConfig | None = None,
    norm: NormStats | None = None,
) -> EvalResult:
    """`evaluate` on some sessions only (`session_spans`): the evaluator's number on what it scores. Each session
    runs as the evaluator runs a file (from flat, its windows reading the bars before it; a bar after it gives its
    last bar the file's next move), and `sharpe` is `summarize`'s daily-session Sharpe over those sessions' bars.
    Its cost is the sessions', whatever the files' length."""
    from alpha_core.metrics import headline  # summarize's numbers that this reads, without the rest

    cfg = env_cfg or EnvConfig()
    series = as_series(data)
    parts, scored = [], []
    for f, a, b in spans:
        s = series[f]
        lo, hi = max(0, a - cfg.window + 1), min(b + 1, len(s.price))
        parts.append(
            MarketSeries(features=s.features[lo:hi], price=s.price[lo:hi], tick_size=s.tick_size, name=s.name, ts=s.ts[lo:hi])
        )
        scored.append((a - lo, b - lo))
    market = MarketData(parts, cfg.window, norm, cfg.reward_unit)
    positions = greedy_positions(agent, parts, cfg, norm)
    ts, pos, moves, rewards, held, acting_n = [], [], [], [], [], 0
    for k, (p, part, (i, j)) in enumerate(zip(positions, parts, scored, strict=True)):
        ts.append(np.asarray(part.ts, dtype=np.int64)[i:j])
        pos.append(p[i:j])
        moves.append((np.append(np.diff(np.asarray(part.price, dtype=np.float64)), 0.0) / part.tick_size)[i:j])
        acting = np.arange(max(i, cfg.window - 1), min(j, len(p) - 1))  # acting bars with a next bar
        g = market.offsets[k] + acting
        prev = np.r_[0.0, p[:-1]]
        rewards.append(
            p[acting] * market.ret[g] - cfg.cost_per_turnover * market.cost_scale[g] * np.abs(p[acting] - prev[acting])
        )
        held.append(p[acting])
        acting_n += len(acting)
    if not acting_n:
        raise ValueError(f"no session is longer than window + 1 = {cfg.window + 1} bars")
    stats = headline(np.concatenate(ts), np.concatenate(pos), np.concatenate(moves), cfg.cost_per_turnover)
    held_all = np.concatenate(held)
    return EvalResult(
        sharpe=stats["sharpe"],
        n_sessions=stats["n_sessions"],
        total_pnl=stats["total_pnl"],
        mean_reward=float(np.concatenate(rewards).mean()),
        turnover=stats["turnover"],
        long_frac=float((held_all > 0).mean()),
        short_frac=float((held_all < 0).mean()),
        n_bars=acting_n,
        cost_ticks=cfg.cost_per_turnover,
        reward_unit=cfg.reward_unit,
    )
