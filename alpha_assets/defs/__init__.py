"""The dg defs folder: `alpha_assets.definitions` loads every module here with `dg.load_from_defs_folder`, which
takes each module's `@dg.definitions def defs()` at its bottom.

- `data`: the data assets [symbol]: book and bar sidecars, fold plans, and their blocking checks.
- `training`: hyperopt [symbol], checkpoints [symbol x fold], the ensemble report [symbol] and the run summary.
- `automation`: the jobs, the new-DBN-files sensor, the automation-condition sensor and each symbol's weekly
  retrain.
- `cleanup`: the daily `storage_cleanup` job and its schedule.
- `resources`: the `data` and `storage` resources, bound to their environment defaults.

What these modules share is beside this folder, in `alpha_assets` (partitions, resources, metadata, the automation
conditions, where steps run). `dg scaffold defs dagster.asset x.py` adds a module here.
"""
