"""Helpers shared by several test files (fixtures live in conftest.py)."""

from __future__ import annotations


def flags(**settings) -> list[str]:
    """Command-line flags from keywords, in their order: `flags(seq_len=16, quiet=True)` is
    `["--seq-len", "16", "--quiet"]` (a value is passed as `str(value)`; True is a flag without a value)."""
    out = []
    for name, value in settings.items():
        out.append("--" + name.replace("_", "-"))
        if value is not True:
            out.append(str(value))
    return out


# the smallest bar training the tests run (`train-supervised`, `hyperopt`): one epoch of 16-bar windows on CPU
SMALL_BARS = {"epochs": 1, "seq_len": 16, "batch_size": 32, "n_train_seqs": 96, "n_val_seqs": 96, "device": "cpu"}
# the flagship's (`train`), fold 0: three epochs of 8-snapshot windows, so a run has epochs to kill and resume
SMALL_BOOK = {
    "device": "cpu",
    "epochs": 3,
    "batch_size": 32,
    "n_train_seqs": 128,
    "n_val_seqs": 64,
    "seq_len": 8,
    "lr_warmup_steps": 2,
    "cv_fold": 0,
}
