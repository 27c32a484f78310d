"""Shared test harness for the supervised model zoo: train briefly on planted-signal sidecars, score AUC.

Every supervised model maps a window x [B, K, F] to causal per-horizon logits [B, K, H] (position k may
only use x[:, :k+1], since its label looks at prices after k). This trains one with masked BCE at every
position and returns the validation AUC per horizon from each window's last position.
"""

from __future__ import annotations

import torch

from alpha_core.data.loader import WindowLoader
from alpha_core.data.norm import fit_norm_stats
from alpha_core.train.metrics import auc_per_horizon, masked_bce


def fit_and_score(
    model: torch.nn.Module,
    train,
    val,
    steps: int = 150,
    batch_size: int = 64,
    seq_len: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
) -> list[float]:
    torch.manual_seed(seed)
    norm = fit_norm_stats(train)
    loader = WindowLoader(train, seq_len, steps * batch_size, seed, norm)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for batch in loader.batches(batch_size, drop_last=True):
        loss = masked_bce(model(batch.x), batch.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    val_loader = WindowLoader(val, seq_len, 4000, seed + 1, norm)
    probs, labels = [], []
    with torch.no_grad():
        for batch in val_loader.batches(512):
            probs.append(torch.sigmoid(model(batch.x)[:, -1]))
            labels.append(batch.labels[:, -1])
    return auc_per_horizon(torch.cat(probs).numpy(), torch.cat(labels).numpy())


def assert_causal(model: torch.nn.Module, n_features: int, seq_len: int = 16) -> None:
    """Changing inputs at positions >= t must leave every output before t unchanged."""
    model.eval()
    torch.manual_seed(1)
    x = torch.randn(2, seq_len, n_features)
    with torch.no_grad():
        torch.manual_seed(2)  # sampling models (diffusion) draw the same noise in every call
        base = model(x)
        for t in (0, seq_len // 2, seq_len - 1):
            y = x.clone()
            y[:, t:] = torch.randn_like(y[:, t:])
            torch.manual_seed(2)
            out = model(y)
            torch.testing.assert_close(out[:, :t], base[:, :t], rtol=1e-5, atol=1e-5)
