"""Bounded field types that every config shares (trainers, agents, models, evaluation, hyperopt), and the bounds on
what an input file may make alpha read, decode and write.

The CLI flags, `--param`, params files and Dagster run configs all build the same pydantic models, so a value
out of range (NaN, -1, 1e308, a zero batch) fails in one place with a message naming its key.

Input bounds are environment variables read at each use, so a pod or a test
can set them; the defaults admit real CME data with room to spare and refuse what only a crafted file holds:

- `ALPHA_MAX_METADATA_BYTES` (64 MiB): a DBN metadata header. It is 100 fixed bytes plus the symbols and the
  symbology mappings, 79 bytes per mapping interval (DBN v2/v3): a parent request such as ES.FUT over a quarter
  (outrights and calendar spreads) is some tens of KB, and 64 MiB holds 800,000 intervals. The declared length is
  a u32, so without a bound a 129 KB zstd file can make a reader allocate 4 GiB.
- `ALPHA_MAX_RECORDS` (2**32): records in one file. A real ES MBP-10 quarter holds about 3e8 (5M a session, 63
  sessions), so one file may hold some 13 such quarters (1.5 TB decoded).
- `ALPHA_MAX_ZSTD_RATIO` (200): decoded bytes per compressed byte, past the first ZSTD_RATIO_FREE_BYTES (16 MiB,
  so tiny files and their metadata are never refused). MBP-10 compresses about 15x (the demo data 10.5x, real
  MBP-1 4x, OHLCV-1m 4x); zstd itself can reach some 30,000x on repeated bytes, which is what a bomb is made of.
- `ALPHA_MAX_SIDECAR_BYTES` (1 TiB): one sidecar, known from the first pass (rows x bytes per row) before any
  array is written, and checked against the cache's free space too. A real ES quarter's book sidecar is about
  39 GB (220.5M rows of 176 bytes; issue 23).
"""

from __future__ import annotations

import math
import os
from typing import Annotated

from pydantic import Field

from alpha_core.errors import PlanError

MAX_COUNT = 2**31 - 1  # counts, steps and indices stay within int32 index arithmetic
MAX_DIM = 8192  # model widths, heads and layers: far above any model here, far below an allocation failure
MAX_FLOAT = 1e12  # costs, weights and scales: large enough for any real use, small enough that sums stay finite
MAX_BATCH_ELEMENTS = 2**31  # one input batch (batch_size x seq_len x n_features)
MAX_GAP_SESSIONS = 66  # a purge or an embargo: at most the most sessions a calendar quarter can have

Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]
NonNegInt = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Dim = Annotated[int, Field(ge=1, le=MAX_DIM)]
Layers = Annotated[int, Field(ge=0, le=MAX_DIM)]
Seed = Annotated[int, Field(ge=0, le=MAX_COUNT)]  # numpy and SB3 seeds must be non-negative 32-bit
LearningRate = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
UnitFloat = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]  # fractions and factors in [0, 1]
Dropout = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]
Decay = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]  # a moving average's weight on its past
NonNegFloat = Annotated[float, Field(ge=0, le=MAX_FLOAT, allow_inf_nan=False)]
PositiveFloat = Annotated[float, Field(gt=0, le=MAX_FLOAT, allow_inf_nan=False)]
FiniteFloat = Annotated[float, Field(ge=-MAX_FLOAT, le=MAX_FLOAT, allow_inf_nan=False)]
GapSessions = Annotated[int, Field(ge=0, le=MAX_GAP_SESSIONS)]  # purge_sessions, embargo_sessions (folds.py)
Device = Annotated[str, Field(pattern=r"^(cpu|cuda(:\d+)?|mps|xpu(:\d+)?)$")]  # a torch device name


def check_batch_fits(**sizes: int) -> None:
    """Refuse a batch tensor that cannot be allocated sensibly, before any work (known once the data is), e.g.
    `check_batch_fits(batch_size=256, seq_len=64, n_features=40)`; the message names the keys to lower."""
    elements = math.prod(sizes.values())
    if elements > MAX_BATCH_ELEMENTS:
        raise PlanError(
            f"{' x '.join(sizes)} = {' x '.join(str(v) for v in sizes.values())} = {elements:,} elements "
            f"in one batch (limit 2**31): lower {' or '.join(list(sizes)[:-1])}"
        )


MAX_METADATA_BYTES = ("ALPHA_MAX_METADATA_BYTES", 64 << 20)
MAX_RECORDS = ("ALPHA_MAX_RECORDS", 2**32)
MAX_ZSTD_RATIO = ("ALPHA_MAX_ZSTD_RATIO", 200)
MAX_SIDECAR_BYTES = ("ALPHA_MAX_SIDECAR_BYTES", 1 << 40)
ZSTD_RATIO_FREE_BYTES = 16 << 20  # decoded bytes of a file the ratio does not apply to


def input_bound(bound: tuple[str, int]) -> int:
    """The value of an input bound (`MAX_RECORDS`, ...): its environment variable, a positive integer, else the
    default. A bad value fails with one line naming the variable."""
    name, default = bound
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)  # 1e9 reads as well as 1000000000
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 1 and value == int(value)):
        raise PlanError(f"{name} must be a positive integer (got {raw!r})")
    return int(value)
