"""`alpha run --remote URL`: a backfill on a running Dagster, through its webserver's GraphQL API (`{url}/graphql`).

`RemoteBackfill` launches the backfill (and sets the `gpu` pool's limit), reads its status, its runs and why a run
failed, and cancels it; it answers `alpha_assets.run.follow` as `run.LocalBackfill` does for the local instance. The
GraphQL documents it sends are the module's constants (LAUNCH, STATUS, SET_POOL, POOL_LIMIT, FAILURE, CANCEL).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from alpha_assets.backfill import Plan, RunState, describe_failure, run_state
from alpha_assets.dagster_private import FAILURE_ERROR_PREFIX
from alpha_assets.execution import CPU_TRAINING_POOL, GPU_POOL
from alpha_core.errors import PlanError

LAUNCH = """mutation Launch($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on RunConfigValidationInvalid { errors { message } }
  ... on Error { message } } }"""
STATUS = """query Status($id: String!) { partitionBackfillOrError(backfillId: $id) { __typename
  ... on PartitionBackfill { status runs { runId status tags { key value } assetSelection { path } } }
  ... on Error { message } } }"""
SET_POOL = "mutation Pool($key: String!, $limit: Int!) { setConcurrencyLimit(concurrencyKey: $key, limit: $limit) }"
POOL_LIMIT = "query Limit($key: String!) { instance { concurrencyLimit(concurrencyKey: $key) { limit } } }"
FAILURE = """query Failure($id: ID!) { logsForRun(runId: $id) { __typename ... on EventConnection { events {
  __typename ... on AssetCheckEvaluationEvent { evaluation { checkName success severity description assetKey { path } } }
  ... on ExecutionStepFailureEvent { stepKey error { message causes { message } } } } } } }"""
CANCEL = """mutation Cancel($id: String!) { cancelPartitionBackfill(backfillId: $id) { __typename
  ... on Error { message } } }"""


def _step_error(error: dict | None) -> str | None:
    """A step's error from GraphQL as `alpha_assets.run.LocalBackfill.failure` reads it: a dg.Failure's own line,
    else the deepest cause (the user code's error, not Dagster's wrapper)."""
    if error is None:
        return None
    if error["message"].startswith(FAILURE_ERROR_PREFIX):
        return error["message"].removeprefix(FAILURE_ERROR_PREFIX)
    return (error["causes"] or [error])[-1]["message"]


class RemoteBackfill:
    """A backfill on a running Dagster, through its GraphQL API (`{url}/graphql`)."""

    def __init__(self, url: str, backfill_id: str | None = None) -> None:
        self.url, self.backfill_id = url.rstrip("/") if "//" in url else f"http://{url.rstrip('/')}", backfill_id

    def query(self, text: str, variables: dict) -> dict:
        request = urllib.request.Request(
            f"{self.url}/graphql",
            data=json.dumps({"query": text, "variables": variables}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                body = json.loads(response.read())
        except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
            raise PlanError(f"{self.url}/graphql: {getattr(exc, 'reason', exc)}") from None
        if body.get("errors"):
            raise PlanError(f"{self.url}/graphql: {body['errors'][0].get('message')}")
        return body["data"]

    def cpu_training_limit(self) -> int | None:
        return self.query(POOL_LIMIT, {"key": CPU_TRAINING_POOL})["instance"]["concurrencyLimit"]["limit"]

    def launch(self, p: Plan) -> str:
        self.query(SET_POOL, {"key": GPU_POOL, "limit": p.max_parallel})
        params = {
            "partitionsByAssets": [
                {"assetKey": {"path": asset.split("/")}, "partitions": {"ranges": [{"start": k, "end": k} for k in keys]}}
                for asset, keys in p.targets.items()
            ],
            "tags": [{"key": k, "value": v} for k, v in p.tags.items()],
            "title": p.title,
            "description": p.description,
            "runConfigData": p.run_config,
        }
        result = self.query(LAUNCH, {"params": params})["launchPartitionBackfill"]
        if result["__typename"] != "LaunchBackfillSuccess":
            messages = [e["message"] for e in result.get("errors", [])] or [result.get("message", result["__typename"])]
            raise PlanError(f"{self.url}: the backfill was refused: {'; '.join(messages)}")
        self.backfill_id = result["backfillId"]
        return self.backfill_id

    def _backfill(self) -> dict:
        result = self.query(STATUS, {"id": self.backfill_id})["partitionBackfillOrError"]
        if result["__typename"] != "PartitionBackfill":
            raise PlanError(f"{self.url}: backfill {self.backfill_id}: {result.get('message', result['__typename'])}")
        return result

    def status(self) -> str:
        return self._backfill()["status"]

    def runs(self) -> list[RunState]:
        return [
            run_state(
                r["runId"],
                r["status"],
                {t["key"]: t["value"] for t in r["tags"]},
                ["/".join(a["path"]) for a in r["assetSelection"] or ()],
            )
            for r in self._backfill()["runs"]
        ]

    def failure(self, run_id: str) -> str:
        """As `LocalBackfill.failure` (checks of ERROR severity: GraphQL does not say which block), and the run's page."""
        events = self.query(FAILURE, {"id": run_id})["logsForRun"].get("events", [])
        missed = [
            ("/".join(e["evaluation"]["assetKey"]["path"]), e["evaluation"]["checkName"], e["evaluation"]["description"])
            for e in events
            if e["__typename"] == "AssetCheckEvaluationEvent"
            and not e["evaluation"]["success"]
            and e["evaluation"]["severity"] == "ERROR"
        ]
        failures = [(e["stepKey"], _step_error(e["error"])) for e in events if e["__typename"] == "ExecutionStepFailureEvent"]
        reason = describe_failure(missed, failures)
        return f"{reason} ({self.url}/runs/{run_id})" if reason else f"{self.url}/runs/{run_id}"

    def cancel(self) -> None:
        self.query(CANCEL, {"id": self.backfill_id})
