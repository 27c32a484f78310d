"""`checked_asset`: an asset with its one blocking check, which gates everything downstream of it."""

import dagster as dg

from alpha_assets.metadata import OWNERS


def checked_asset(key, partitions_def, check: str, check_description: str, **asset_kwargs):
    """`dg.asset` with a blocking check `check` on the same partitions (the lineage's gate pattern)."""
    return dg.asset(
        key=key,
        partitions_def=partitions_def,
        owners=OWNERS,
        check_specs=[
            dg.AssetCheckSpec(check, asset=key, blocking=True, partitions_def=partitions_def, description=check_description)
        ],
        **asset_kwargs,
    )
