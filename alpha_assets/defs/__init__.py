"""The dg defs folder: `alpha_assets.definitions` loads every module here with `dg.load_from_defs_folder`, which
takes each module's `@dg.definitions def defs()` at its bottom.

- `data`: the data assets [symbol]: book and bar sidecars, fold plans, and their blocking checks.
- `fetch`: `raw_dbn` [quarter x symbol], one calendar quarter of a symbol downloaded from Databento.
- `hyperopt`: the PSO search of each model with a search space [symbol], with its isolation check.
- `checkpoints`: every model's walk-forward folds [symbol x fold], each behind its validation gate.
- `report`: the ensemble report [symbol], the run summary and the comparison of runs.
- `automation`: the jobs, the new-DBN-files sensor, the automation-condition sensor and each symbol's weekly
  retrain.
- `cleanup`: the daily `storage_cleanup` job and its schedule.
- `resources`: the `data` and `storage` resources, bound to their environment defaults.

What these modules share is beside this folder, in `alpha_assets` (partitions, resources, metadata, the automation
conditions, where steps run). `dg scaffold defs dagster.asset x.py` adds a module here.
"""
