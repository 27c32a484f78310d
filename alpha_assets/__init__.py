"""alpha_assets: the Dagster definitions of alpha's lineage. Each asset is one call into alpha_core."""
