"""alpha_assets: the Dagster definitions of alpha's lineage. Each asset is one call into alpha_core."""

import warnings

import dagster as dg

# Partitioned checks (Preview), MultiToSingleDimensionPartitionMapping and code references (Beta) are what this
# lineage is built on in Dagster 1.13: silence their warnings wherever any module here is imported first (`alpha
# run` imports the lineage before the definitions)
warnings.filterwarnings("ignore", category=dg.BetaWarning)
warnings.filterwarnings("ignore", category=dg.PreviewWarning)
