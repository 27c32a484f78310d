"""Every private databento API alpha uses, behind one small function, so an upgrade has one module to check.

databento and databento-dbn are pinned (pyproject.toml). Reading a DBN file's records into a numpy structured array
without a Python object per record needs each record's exact layout, which the client keeps in a private attribute:

- `message_dtype` (`databento.common.dbnstore`'s record classes' `_dtypes`, e.g. `MBP10Msg._dtypes`): the
  (name, dtype) fields of one record, in file order.

On an upgrade: check `_dtypes` still lists every field with its size (the DBN version may add fields), then run
tests/test_real_samples.py (real Databento files) and tests/test_demo_data.py (files written with this layout).
"""

from __future__ import annotations

import numpy as np


def message_dtype(record_class) -> np.dtype:
    """The numpy dtype of one record of `record_class` (e.g. databento's `MBP10Msg`), as it lies in a DBN file."""
    return np.dtype(record_class._dtypes)
