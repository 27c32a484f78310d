"""The `data` and `storage` resources: where data is read and artifacts are written (ALPHA_DATA_DIR,
ALPHA_STORAGE_ROOT; the classes and their defaults are `alpha_assets.resources`)."""

import dagster as dg

from alpha_assets.resources import default_resources


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(resources=default_resources())
