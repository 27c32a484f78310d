"""alpha_assets: the Dagster definitions of alpha's lineage (each asset is one call into alpha_core), and `alpha run`.

- `defs/`: the definitions themselves, loaded by `definitions.py` (`dg.load_from_defs_folder`): `fetch`, `data`,
  `hyperopt`, `checkpoints`, `report`, `automation` (sensors, jobs), `cleanup`, `resources`.
- What they share: `partitions`, `resources` (resource classes, run tags), `asset_configs` (Launchpad configs),
  `records` (what a run's earlier steps recorded), `checked` (an asset with its blocking check), `metadata` (how
  values show in the UI), `failures`, `conditions` (automation conditions, the retrain cron), `execution`
  (executor, step placement, pool names, GPU leases), `pod_spec` (step pods on Kubernetes).
- `alpha run`: `run` (plan, follow, launch), `backfill` (a Plan and what is read of its runs), `lineage` (a phase's
  asset partitions, also the retrain sensors'), `daemon` (the local daemon), `remote` (the GraphQL client).
- `dagster_private`: every private Dagster API alpha uses.
"""

import warnings

import dagster as dg

# Partitioned checks (Preview), MultiToSingleDimensionPartitionMapping and code references (Beta) are what this
# lineage is built on in Dagster 1.13: silence their warnings wherever any module here is imported first (`alpha
# run` imports its own modules before the definitions)
warnings.filterwarnings("ignore", category=dg.BetaWarning)
warnings.filterwarnings("ignore", category=dg.PreviewWarning)
