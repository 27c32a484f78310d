"""A captured training step's batch in one Triton kernel: the windows at a device cursor, gathered from the
loader's epoch buffers, upcast and normalised (the CUDA fast path of `EpochCursor.next_batch`).

Why: at batch 1 the flagship's step is latency-bound, and written in torch its batch took 15 small kernels
(the cursor's positions, each window's first row, one gather per array, the upcasts and the normalisation),
about a tenth of the step inside the CUDA graph. Here one launch does all of it; the cursor is advanced after
it, by the caller, so every program reads the same cursor.

The result is exactly `WindowLoader.batch_at`'s at the cursor's positions (clamped to the epoch's last window):
the same dtypes and the same arithmetic, `(x - mean) / std` in float32 with an IEEE division. Tested on the
CPU through Triton's interpreter (TRITON_INTERPRET=1) and on cuda against the torch gather.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_K = 32  # a program's window positions: 32 x the features stays in registers for the book's F


@triton.jit
def _gather_kernel(
    cursor,
    last_window,
    first,
    file_of,
    start_of,
    features,
    mean,
    std,
    dt,
    labels,
    outcome_long,
    outcome_short,
    x_out,
    dt_out,
    labels_out,
    long_out,
    short_out,
    file_out,
    start_out,
    K,
    F,
    H,
    NORMALISE: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_F: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)  # the batch row
    pos = tl.minimum(tl.load(cursor) + b, last_window)
    k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    k_ok = k < K
    row = tl.load(first + pos) + k  # the window's rows in the buffer
    out_row = b * K + k

    f = tl.arange(0, BLOCK_F)
    f_ok = k_ok[:, None] & (f < F)[None, :]
    x = tl.load(features + row[:, None] * F + f[None, :], mask=f_ok).to(tl.float32)
    if NORMALISE:
        mu = tl.load(mean + f, mask=f < F, other=0.0)
        sd = tl.load(std + f, mask=f < F, other=1.0)
        x = tl.math.div_rn(x - mu[None, :], sd[None, :])
    tl.store(x_out + out_row[:, None] * F + f[None, :], x, mask=f_ok)

    tl.store(dt_out + out_row, tl.load(dt + row, mask=k_ok), mask=k_ok)
    h = tl.arange(0, BLOCK_H)
    h_ok = k_ok[:, None] & (h < H)[None, :]
    src, dst = row[:, None] * H + h[None, :], out_row[:, None] * H + h[None, :]
    tl.store(labels_out + dst, tl.load(labels + src, mask=h_ok).to(tl.float32), mask=h_ok)
    tl.store(long_out + dst, tl.load(outcome_long + src, mask=h_ok), mask=h_ok)
    tl.store(short_out + dst, tl.load(outcome_short + src, mask=h_ok), mask=h_ok)

    if tl.program_id(1) == 0:
        tl.store(file_out + b, tl.load(file_of + pos))
        tl.store(start_out + b, tl.load(start_of + pos))


def gather_windows(
    cursor: torch.Tensor,
    batch_size: int,
    seq_len: int,
    first: torch.Tensor,
    file_of: torch.Tensor,
    start_of: torch.Tensor,
    buffers: dict[str, torch.Tensor],
    mean: torch.Tensor | None,
    std: torch.Tensor | None,
) -> dict[str, torch.Tensor]:
    """The `batch_size` windows at positions cursor .. cursor + batch_size - 1 (clamped to the last of `first`),
    as `WindowBatch` fields: x float32 [B, K, F] (normalised when mean/std are given), dt [B, K], labels float32
    [B, K, H], the outcomes [B, K, H] in their stored dtype, file_index and start int64 [B]. `buffers` are the
    loader's contiguous row buffers [rows, ...]; each window is `seq_len` consecutive rows from its first."""
    feats, dt, labels = buffers["features"], buffers["dt"], buffers["labels"]
    longs, shorts = buffers["outcome_long"], buffers["outcome_short"]
    n_features, n_horizons = feats.shape[1], labels.shape[1]
    shape, dev = (batch_size, seq_len), feats.device
    out = {
        "x": torch.empty((*shape, n_features), dtype=torch.float32, device=dev),
        "dt": torch.empty(shape, dtype=dt.dtype, device=dev),
        "labels": torch.empty((*shape, n_horizons), dtype=torch.float32, device=dev),
        "outcome_long": torch.empty((*shape, n_horizons), dtype=longs.dtype, device=dev),
        "outcome_short": torch.empty((*shape, n_horizons), dtype=shorts.dtype, device=dev),
        "file_index": torch.empty(batch_size, dtype=torch.long, device=dev),
        "start": torch.empty(batch_size, dtype=torch.long, device=dev),
    }
    normalise = mean is not None
    _gather_kernel[(batch_size, triton.cdiv(seq_len, BLOCK_K))](
        cursor,
        len(first) - 1,
        first,
        file_of,
        start_of,
        feats,
        mean if normalise else feats,
        std if normalise else feats,
        dt,
        labels,
        longs,
        shorts,
        *out.values(),
        seq_len,
        n_features,
        n_horizons,
        NORMALISE=normalise,
        BLOCK_K=BLOCK_K,
        BLOCK_F=max(2, triton.next_power_of_2(n_features)),  # a one-lane block is Triton's corner case: avoided
        BLOCK_H=max(2, triton.next_power_of_2(n_horizons)),
    )
    return out
