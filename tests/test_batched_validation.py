"""Validation runs in large batches whatever the training batch size, and its metrics do not depend on how the
validation windows are batched: the per-window path and the batched one give the same numbers."""

from __future__ import annotations

import numpy as np
import pytest

from alpha_core.train.perception import PerceptionTrainer, TrainConfig


def test_perception_validation_does_not_depend_on_its_batch_size(tiny_data, tmp_path):
    cfg = TrainConfig(mbp10_data_dir=tiny_data / "ES.FUT" / "mbp-10", predecoded_dir=tmp_path / "pd",
                      out=tmp_path / "out", device="cpu", epochs=1, batch_size=1, n_train_seqs=8, n_val_seqs=96,
                      seq_len=8)
    trainer = PerceptionTrainer(cfg)
    trainer.fit()
    batched = trainer.validate_epoch(0)  # one batch of 96 (val_batch_size 4096), although training runs at B=1
    for size in (1, 7):
        trainer.cfg = cfg.model_copy(update={"val_batch_size": size})
        loss, aucs = trainer.validate_epoch(0)
        assert loss == pytest.approx(batched[0], rel=1e-5)
        np.testing.assert_allclose(aucs, batched[1], atol=1e-6)
    assert trainer.trackers.n_val_seqs_consumed == 96
