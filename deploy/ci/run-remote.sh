#!/bin/sh
# CI's train job: `alpha run --remote` as a Job inside the cluster (alpha-run-job.yaml), followed to its end.
# The webserver is reachable only through the authenticating proxy or from that Job (deploy/README.md), so CI needs
# no UI credentials: creating the Job in namespace dagster takes the Kubernetes credentials it deploys with.
# Exits with the Job's result: 0 when every requested step succeeded, 1 otherwise (alpha run's own exit code).
set -eu
job="alpha-run-${CI_PIPELINE_ID}"
# the original system's variables that are set, as the environment alpha run reads (an empty RUN_ID means a new one)
set --
for var in SYMBOLS MODELS PHASE MAX_PARALLEL EPOCHS HYPEROPT_TRIALS RUN_ID; do
  eval "value=\${$var:-}"
  if [ -n "$value" ]; then set -- "$@" "--from-literal=$var=$value"; fi
done
kubectl -n dagster create configmap "$job" "$@"
sed -e "s/\${CI_COMMIT_SHA}/$CI_COMMIT_SHA/g" -e "s/\${JOB_NAME}/$job/g" deploy/ci/alpha-run-job.yaml \
  | kubectl -n dagster apply -f -
# the log stream may drop during a run of hours: follow it again while the Job is still active
finish() { kubectl -n dagster delete configmap "$job" >/dev/null; exit "$1"; }
while :; do
  kubectl -n dagster logs -f "job/$job" --pod-running-timeout=30m || true
  while :; do
    status="$(kubectl -n dagster get job "$job" -o jsonpath='{.status.succeeded}:{.status.failed}:{.status.active}')"
    case "$status" in
      1:*) finish 0 ;;
      *:1:*) finish 1 ;;
      *:*:1) break ;;   # still running (or pending): the stream ended early
    esac
    sleep 10   # finished, not yet counted
  done
done
