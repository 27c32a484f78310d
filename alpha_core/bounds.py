"""Bounded field types that every config shares (trainers, agents, models, evaluation, hyperopt).

The CLI flags, `--param`, params files and Dagster run configs all build the same pydantic models, so a value
out of range (NaN, -1, 1e308, a zero batch) fails in one place with a message naming its key.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field

from alpha_core.errors import PlanError

MAX_COUNT = 2**31 - 1  # counts, steps and indices stay within int32 index arithmetic
MAX_DIM = 8192  # model widths, heads and layers: far above any model here, far below an allocation failure
MAX_FLOAT = 1e12  # costs, weights and scales: large enough for any real use, small enough that sums stay finite
MAX_BATCH_ELEMENTS = 2**31  # one input batch (batch_size x seq_len x n_features)

Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]
NonNegInt = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Dim = Annotated[int, Field(ge=1, le=MAX_DIM)]
Layers = Annotated[int, Field(ge=0, le=MAX_DIM)]
Seed = Annotated[int, Field(ge=0, le=MAX_COUNT)]  # numpy and SB3 seeds must be non-negative 32-bit
LearningRate = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
UnitFloat = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]  # fractions and factors in [0, 1]
Dropout = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0, le=MAX_FLOAT, allow_inf_nan=False)]
PositiveFloat = Annotated[float, Field(gt=0, le=MAX_FLOAT, allow_inf_nan=False)]
FiniteFloat = Annotated[float, Field(ge=-MAX_FLOAT, le=MAX_FLOAT, allow_inf_nan=False)]
Device = Annotated[str, Field(pattern=r"^(cpu|cuda(:\d+)?|mps|xpu(:\d+)?)$")]  # a torch device name


def check_batch_fits(**sizes: int) -> None:
    """Refuse a batch tensor that cannot be allocated sensibly, before any work (known once the data is), e.g.
    `check_batch_fits(batch_size=256, seq_len=64, n_features=40)`; the message names the keys to lower."""
    elements = math.prod(sizes.values())
    if elements > MAX_BATCH_ELEMENTS:
        raise PlanError(f"{' x '.join(sizes)} = {' x '.join(str(v) for v in sizes.values())} = {elements:,} elements "
                        f"in one batch (limit 2**31): lower {' or '.join(list(sizes)[:-1])}")
