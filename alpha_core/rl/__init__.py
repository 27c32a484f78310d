"""Reinforcement-learning members of alpha: a vectorised trading env over bar sidecars and SB3 DQN/PPO agents."""

from alpha_core.rl.agents import (
    CausalGRUEncoder,
    DQNConfig,
    EvalResult,
    PPOConfig,
    WindowEncoderExtractor,
    build_agent,
    evaluate,
    load_policy,
    save_policy,
)
from alpha_core.rl.env import EnvConfig, MarketSeries, SingleTradingEnv, TradingVecEnv, split_observation

__all__ = [
    "CausalGRUEncoder",
    "DQNConfig",
    "EnvConfig",
    "EvalResult",
    "MarketSeries",
    "PPOConfig",
    "SingleTradingEnv",
    "TradingVecEnv",
    "WindowEncoderExtractor",
    "build_agent",
    "evaluate",
    "load_policy",
    "save_policy",
    "split_observation",
]
