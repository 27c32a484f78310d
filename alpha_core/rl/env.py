"""A vectorised trading environment over bar sidecars, stepped in one batched numpy step (an SB3 `VecEnv`).

Timing. At acting bar t the agent sees the normalised features of bars t-window+1..t (each bar's features
use data up to and including that bar) and its current position p_prev, picks an action
a in {0, 1, 2} -> position p = a - 1 in {-1 (short), 0 (flat), +1 (long)}, holds p from the close of bar t
to the close of bar t+1 and receives

    reward_t = p * r_{t+1} - cost_per_turnover * |p - p_prev|

where r_{t+1} is the next-bar return of the stitched reference price (`Sidecar.price`, the close for bars):
in ticks, (price[t+1] - price[t]) / tick_size (`reward_unit="ticks"`, the default), or the log return
log(price[t+1] / price[t]) (`reward_unit="log"`). `cost_per_turnover` is always given in ticks per unit of
position change; with log rewards it is converted at the current price (cost * tick_size / price[t]).

Episodes. Each of the `n_envs` episodes acts on `episode_len` consecutive bars of one file, starting flat at
a bar drawn uniformly over every valid start of every file (so longer files are drawn more often); a start
is valid when the whole window and every next-bar return of the episode lie inside the file, so no
episode ever crosses a file end (files too short for one episode are skipped). When an episode ends, SB3
`VecEnv` semantics apply: the returned observation is the first one of a fresh episode, and the info holds
`terminal_observation` (the window after the last bar) and `TimeLimit.truncated=True` (the cut is
artificial; the position is not force-closed). Randomness comes from one numpy Generator seeded by
`seed` (or by `VecEnv.seed`, which SB3 algorithms call), so runs are deterministic.

Observation: float32 vector of length window * F + 1: the [window, F] feature window flattened row-major
(oldest bar first) followed by the current position. `split_observation` undoes the layout.

Memory: the files' features are normalised once into one resident float32 array (bar sidecars are small;
this is not meant for book sidecars of many millions of rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, Field
from stable_baselines3.common.vec_env import VecEnv

from alpha_core.bounds import MAX_COUNT, MAX_FLOAT
from alpha_core.data.norm import NormStats
from alpha_core.data.sidecar import Sidecar
from alpha_core.errors import DataError
from alpha_core.metrics import DEFAULT_COST_TICKS

N_ACTIONS = 3  # 0 short, 1 flat, 2 long
ACTION_TO_POSITION = np.array([-1.0, 0.0, 1.0])


class EnvConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    window: int = Field(32, ge=1, le=MAX_COUNT, description="bars of features in each observation")
    episode_len: int = Field(256, ge=1, le=MAX_COUNT, description="acting bars per episode")
    cost_per_turnover: float = Field(
        DEFAULT_COST_TICKS, ge=0.0, le=MAX_FLOAT, description="ticks charged per unit of |position change|"
    )
    n_envs: int = Field(8, ge=1, le=MAX_COUNT, description="parallel episodes")
    reward_unit: Literal["ticks", "log"] = "ticks"


@dataclass(frozen=True)
class MarketSeries:
    """The part of a sidecar the environment uses; also how tests hand-make a price series."""

    features: np.ndarray  # [N, F]
    price: np.ndarray  # [N] float64
    tick_size: float = 1.0
    name: str = ""
    ts: np.ndarray | None = None  # [N] int64 bar timestamps (ns): the sessions of the evaluation's daily Sharpe

    @classmethod
    def from_sidecar(cls, sc: Sidecar) -> MarketSeries:
        return cls(features=sc.features, price=sc.price, tick_size=float(sc.meta.tick_size), name=sc.path.name, ts=sc.ts)


def as_series(data: Sequence[Sidecar | MarketSeries]) -> list[MarketSeries]:
    return [d if isinstance(d, MarketSeries) else MarketSeries.from_sidecar(d) for d in data]


class MarketData:
    """Every file's normalised features and next-bar returns, concatenated (file f owns rows offsets[f]..)."""

    def __init__(
        self, data: Sequence[Sidecar | MarketSeries], window: int, norm: NormStats | None = None, reward_unit: str = "ticks"
    ) -> None:
        series = as_series(data)
        if not series:
            raise DataError(None, "the trading environment needs at least one file")
        n_feat = series[0].features.shape[1]
        mean, std = (np.zeros(n_feat, np.float32), np.ones(n_feat, np.float32)) if norm is None else norm.arrays()
        if len(mean) != n_feat:
            raise DataError(None, f"norm stats have {len(mean)} features, the data {n_feat}")
        feats, rets, costs, lengths = [], [], [], []
        for s in series:
            if s.features.ndim != 2 or s.features.shape[1] != n_feat or len(s.price) != len(s.features):
                raise DataError(None, f"{s.name or 'series'}: features {s.features.shape} / price {s.price.shape} mismatch")
            price = np.asarray(s.price, dtype=np.float64)
            if not (np.isfinite(price).all() and (price > 0).all()):
                raise DataError(None, f"{s.name or 'series'}: prices must be finite and positive")
            feats.append(((np.asarray(s.features, dtype=np.float32) - mean) / std).astype(np.float32))
            ret = np.full(len(price), np.nan)
            ret[:-1] = np.diff(price) / s.tick_size if reward_unit == "ticks" else np.diff(np.log(price))
            rets.append(ret)  # ret[t]: return from bar t to bar t+1 (NaN on the file's last bar)
            costs.append(np.ones(len(price)) if reward_unit == "ticks" else s.tick_size / price)
            lengths.append(len(price))
        self.series = series
        self.window = window
        self.n_features = n_feat
        self.features = np.concatenate(feats)
        self.ret = np.concatenate(rets)
        self.cost_scale = np.concatenate(costs)  # reward units per tick at each bar
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self._lags = np.arange(-window + 1, 1)

    def windows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """([B, window, F] features of the bars ending at global rows `rows`, [B] the latest global row each
        window read): one gather, no per-env loop; the rows read come from the gather's own index."""
        index = rows[:, None] + self._lags
        return self.features[index], index.max(axis=1)

    def observations(self, rows: np.ndarray, position: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(flat observations, the latest global row each read): the window, then the current position."""
        win, read = self.windows(rows)
        return np.concatenate([win.reshape(len(rows), -1), position[:, None].astype(np.float32)], axis=1), read


def split_observation(obs, window: int, n_features: int):
    """(window [..., window, F], position [..., 1]) of flat observations (numpy or torch)."""
    lead = obs.shape[:-1]
    return obs[..., :-1].reshape(*lead, window, n_features), obs[..., -1:]


class TradingVecEnv(VecEnv):
    """`n_envs` independent trading episodes over bar sidecars, stepped together (see the module docstring)."""

    def __init__(
        self,
        data: Sequence[Sidecar | MarketSeries],
        cfg: EnvConfig | None = None,
        norm: NormStats | None = None,
        seed: int | None = 0,
    ) -> None:
        """`norm`: statistics applied to the features (fit them on the training files with `fit_norm_stats`);
        None uses the features as they are."""
        self.cfg = cfg or EnvConfig()
        self.window, self.episode_len = self.cfg.window, self.cfg.episode_len
        self.data = MarketData(data, self.window, norm, self.cfg.reward_unit)
        self.n_features = self.data.n_features
        # valid local starts of file f: window-1 .. lengths-1-episode_len
        self._n_starts = np.maximum(self.data.lengths - self.episode_len - self.window + 1, 0)
        if self._n_starts.sum() == 0:
            raise DataError(None, f"no file has {self.window + self.episode_len} bars for one episode")
        self._cum_starts = np.cumsum(self._n_starts)
        self.render_mode = None
        obs_space = spaces.Box(-np.inf, np.inf, shape=(self.window * self.n_features + 1,), dtype=np.float32)
        super().__init__(self.cfg.n_envs, obs_space, spaces.Discrete(N_ACTIONS))
        self._rng = np.random.default_rng(seed)
        n = self.num_envs
        self.file = np.zeros(n, dtype=np.int64)  # file of each env's episode
        self.t = np.zeros(n, dtype=np.int64)  # global row of the next acting bar
        self.end = np.zeros(n, dtype=np.int64)  # global row of the episode's last acting bar
        self.position = np.zeros(n)
        self.episode_return = np.zeros(n)
        self._actions = np.ones(n, dtype=np.int64)
        self._started = False

    # -- episode bookkeeping --------------------------------------------------------------------------
    def _draw_starts(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        k = self._rng.integers(0, self._cum_starts[-1], size=count)
        f = np.searchsorted(self._cum_starts, k, side="right")
        local = k - (self._cum_starts[f] - self._n_starts[f]) + self.window - 1
        return f, self.data.offsets[f] + local

    def start_episodes(self, idx: np.ndarray) -> None:
        f, start = self._draw_starts(len(idx))
        self.file[idx] = f
        self.t[idx] = start
        self.end[idx] = start + self.episode_len - 1
        self.position[idx] = 0.0
        self.episode_return[idx] = 0.0

    def observe(self) -> np.ndarray:
        return self.data.observations(self.t, self.position)[0]

    # -- VecEnv API ------------------------------------------------------------------------------------
    def reset(self) -> np.ndarray:
        rng = np.random.default_rng(self._seeds[0]) if self._seeds[0] is not None else self._rng
        self._reset_seeds()  # SB3 VecEnv's own bookkeeping
        self._reset_options()
        return self.start(rng)

    def start(self, rng: np.random.Generator) -> np.ndarray:
        """Draw every env's episode with `rng` (which then drives later starts too) and return the observations."""
        self._rng = rng
        self.start_episodes(np.arange(self.num_envs))
        self._started = True
        return self.observe()

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions, dtype=np.int64).reshape(self.num_envs)

    def advance(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Apply one action per env (no auto-reset): rewards [n] float64 and which episodes just ended."""
        if not self._started:
            raise RuntimeError("call reset() before step()")
        if ((actions < 0) | (actions >= N_ACTIONS)).any():
            raise ValueError(f"actions must be in 0..{N_ACTIONS - 1}, got {actions}")
        new_pos = ACTION_TO_POSITION[actions]
        g = self.t
        cost = self.cfg.cost_per_turnover * self.data.cost_scale[g] * np.abs(new_pos - self.position)
        rewards = new_pos * self.data.ret[g] - cost
        self.position = new_pos
        self.episode_return += rewards
        self.t = g + 1
        return rewards, self.t > self.end

    def step_wait(self):
        rewards, dones = self.advance(self._actions)
        obs = self.observe()
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        done_idx = np.flatnonzero(dones)
        if len(done_idx):
            for i in done_idx:
                infos[i]["terminal_observation"] = obs[i].copy()
                infos[i]["TimeLimit.truncated"] = True
                infos[i]["episode_return"] = float(self.episode_return[i])
            self.start_episodes(done_idx)
            obs[done_idx] = self.data.observations(self.t[done_idx], self.position[done_idx])[0]
        return obs, rewards.astype(np.float32), dones, infos

    def close(self) -> None:
        pass

    def get_attr(self, attr_name: str, indices=None) -> list[Any]:
        value = getattr(self, attr_name)
        return [value for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices=None) -> None:
        setattr(self, attr_name, value)

    def env_method(self, method_name: str, *method_args, indices=None, **method_kwargs) -> list[Any]:
        method = getattr(self, method_name)
        return [method(*method_args, **method_kwargs) for _ in self._get_indices(indices)]

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices=None) -> list[bool]:
        return [False for _ in self._get_indices(indices)]


class SingleTradingEnv(gym.Env):
    """One episode of a `TradingVecEnv` as a plain gymnasium Env (for `check_env` and debugging)."""

    metadata = {"render_modes": []}

    def __init__(
        self, data: Sequence[Sidecar | MarketSeries], cfg: EnvConfig | None = None, norm: NormStats | None = None
    ) -> None:
        cfg = (cfg or EnvConfig()).model_copy(update={"n_envs": 1})
        self.vec = TradingVecEnv(data, cfg, norm, seed=None)
        self.observation_space = self.vec.observation_space
        self.action_space = self.vec.action_space

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return self.vec.start(self.np_random)[0], {}  # gymnasium's seeded generator drives the starts

    def step(self, action):
        rewards, dones = self.vec.advance(np.asarray([action], dtype=np.int64).reshape(1))
        return self.vec.observe()[0], float(rewards[0]), False, bool(dones[0]), {}
