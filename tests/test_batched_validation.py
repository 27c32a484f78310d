"""Validation runs in large batches whatever the training batch size, and its metrics do not depend on how the
validation windows are batched: the per-window path and the batched one give the same numbers."""

from __future__ import annotations

import numpy as np
import pytest

from alpha_core.data.norm import fit_norm_stats
from alpha_core.rl.agents import DQNConfig, PPOConfig, build_agent, greedy_positions
from alpha_core.rl.env import ACTION_TO_POSITION, EnvConfig, MarketData, TradingVecEnv
from alpha_core.train.perception import PerceptionTrainer, TrainConfig
from alpha_core.train.supervised import SupervisedTrainConfig, train_supervised


@pytest.mark.slow
def test_perception_validation_does_not_depend_on_its_batch_size(tiny_data, tmp_path):
    cfg = TrainConfig(
        mbp10_data_dir=tiny_data / "ES.FUT" / "mbp-10",
        predecoded_dir=tmp_path / "pd",
        out=tmp_path / "out",
        device="cpu",
        epochs=1,
        batch_size=1,
        n_train_seqs=8,
        n_val_seqs=96,
        seq_len=8,
    )
    trainer = PerceptionTrainer(cfg)
    trainer.fit()
    batched = trainer.validate_epoch(0)  # one batch of 96 (val_batch_size 4096), although training runs at B=1
    for size in (1, 7):
        trainer.cfg = cfg.model_copy(update={"val_batch_size": size})
        loss, aucs = trainer.validate_epoch(0)
        assert loss == pytest.approx(batched[0], rel=1e-5)
        np.testing.assert_allclose(aucs, batched[1], atol=1e-6)
    assert trainer.trackers.n_val_seqs_consumed == 96


@pytest.mark.parametrize("model", ["kan", "diffusion"])  # diffusion samples: each batch draws the same seeded noise
def test_supervised_validation_does_not_depend_on_its_batch_size(model, tiny_data, tmp_path):
    def fold(val_batch_size: int):
        cfg = SupervisedTrainConfig(
            model=model,
            data_dir=tiny_data / "ES.FUT" / "ohlcv-1m",
            output_dir=tmp_path / str(val_batch_size),
            predecoded_dir=tmp_path / "pd",
            device="cpu",
            epochs=2,
            seq_len=8,
            batch_size=32,
            n_train_seqs=64,
            n_val_seqs=96,
            cv_n_folds=2,
            cv_train_window=2,
            cv_fold=0,
            early_stop_patience=0,
            val_batch_size=val_batch_size,
        )
        (summary,) = train_supervised(cfg)
        return summary

    batched, small = fold(4096), fold(5)  # one batch of 96 windows; 20 batches, the last one short
    # two epochs: validation leaves training alone (the sampling model's noise does not come from the global RNG)
    for a, b in zip(batched.epoch_metrics, small.epoch_metrics, strict=True):
        assert a["train_loss"] == b["train_loss"]
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)
    np.testing.assert_allclose(batched.final_val_auc, small.final_val_auc, atol=1e-6)


def stepped_positions(agent, files, cfg: EnvConfig, norm) -> list[np.ndarray]:
    """The per-bar path: the policy asked for one bar at a time, its new position fed into the next observation."""
    market = MarketData(files, cfg.window, norm, cfg.reward_unit)
    out = []
    for off, n in zip(market.offsets, market.lengths, strict=True):
        held, position = np.zeros(n), 0.0
        for t in range(cfg.window - 1, n):
            action, _ = agent.predict(market.observations(np.array([off + t]), np.array([position]))[0], deterministic=True)
            held[t] = position = ACTION_TO_POSITION[int(action[0])]
        out.append(held)
    return out


@pytest.mark.parametrize("name", ["dqn", "ppo"])
def test_rl_validation_batched_gives_the_per_bar_positions(name, tiny_sidecars):
    """The position is part of the observation; the batched path scores every bar from each of the three previous
    positions in one forward pass and follows that table: the same positions, so the same validation Sharpe."""
    bars = tiny_sidecars["bars"]
    train, val = bars[:4], bars[4:]
    norm = fit_norm_stats(train)
    cfg = EnvConfig(window=8, episode_len=64, n_envs=4)
    agent_cfg = (
        DQNConfig(learning_starts=64, target_update_interval=64)
        if name == "dqn"
        else PPOConfig(n_steps=32, batch_size=64, n_epochs=1)
    )
    agent = build_agent(name, TradingVecEnv(train, cfg, norm, seed=0), agent_cfg, seed=0).learn(256)
    want = stepped_positions(agent, val, cfg, norm)
    got = greedy_positions(agent, val, cfg, norm)
    assert len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    assert len(np.unique(np.concatenate(want))) > 1  # the policy trades: the comparison is not of two flat lines
    market, rows = MarketData(val, cfg.window, norm), np.arange(cfg.window - 1, val[0].rows)
    acts = [
        agent.predict(market.observations(rows, np.full(len(rows), p))[0], deterministic=True)[0] for p in ACTION_TO_POSITION
    ]
    assert (acts[0] != acts[1]).any() or (acts[1] != acts[2]).any()  # and what it does depends on its position
    segments = greedy_positions(agent, val, cfg, norm, segment_len=100)  # each segment starts flat
    first = cfg.window - 1
    assert np.array_equal(segments[0][: first + 100], want[0][: first + 100])
