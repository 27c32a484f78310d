"""The declarative automation conditions of the assets, and the weekly retrain cron they and the retrain sensors share.

- `FOLD_PLANS_AUTOMATION` (fold plans): `eager`, so fold plans follow any new sidecars.
- `TRAINING_AUTOMATION` (hyperopt, checkpoints): once per RETRAIN_CRON period, after all their inputs have been
  refreshed since the tick and their blocking checks passed, unless already in progress (e.g. in a retrain
  backfill).
- `REPORT_AUTOMATION` (the report): once every checkpoint has been retrained or has failed since the tick.

The `automation_conditions` sensor that evaluates them and the `retrain_<symbol>` sensors are in
`alpha_assets.defs.automation`; the asset modules import only this module, never the sensors'.
"""

import dagster as dg

RETRAIN_CRON = "0 2 * * 6"  # Saturday 02:00, after the week's last CME session
RETRAIN_TIMEZONE = "America/Chicago"

_tick = dg.AutomationCondition.cron_tick_passed(RETRAIN_CRON, RETRAIN_TIMEZONE)

FOLD_PLANS_AUTOMATION = dg.AutomationCondition.eager()
TRAINING_AUTOMATION = (
    dg.AutomationCondition.on_cron(RETRAIN_CRON, RETRAIN_TIMEZONE)
    & dg.AutomationCondition.all_deps_blocking_checks_passed()
    & ~dg.AutomationCondition.in_progress()  # e.g. inside a retrain backfill: that backfill trains it
).with_label("retrain on the weekly cron")
_attempted = (
    dg.AutomationCondition.newly_updated().since(_tick) | dg.AutomationCondition.execution_failed()
)  # a checkpoint below its gate must not hold the report back
REPORT_AUTOMATION = (
    dg.AutomationCondition.in_latest_time_window()
    & _tick.since_last_handled()
    # all_deps_match would accept ANY fold of a checkpoint asset (the fold -> symbol mapping fans in): say "no fold
    # is still waiting" instead
    & ~dg.AutomationCondition.any_deps_match(~_attempted).with_label("a checkpoint not retrained since the tick")
    & ~dg.AutomationCondition.any_deps_in_progress()
    & ~dg.AutomationCondition.in_progress()
).with_label("report after the weekly retrain")
