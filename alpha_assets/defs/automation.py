"""Jobs, the new-DBN-files sensor, the automation-condition sensor and the weekly retrain of each symbol."""

import dagster as dg

from alpha_assets.automation import jobs, sensors


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(jobs=jobs, sensors=sensors)
