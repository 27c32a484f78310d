#!/usr/bin/env bash
# The original system's three stages as its CI generator writes them (hyperopt, train, evaluate), with only their
# flags, on generated data; then every fold of every model must have an out-of-sample row in the report.
#   scripts/original-commands.sh              the original defaults (EPOCHS 50, HYPEROPT_TRIALS 20): a GPU machine
#   SMALL=1 scripts/original-commands.sh      small sizes added to each command, for a laptop (a few minutes)
# MODELS (default tft,mamba2,kan) and SYMBOL (ES.FUT) as in the original trigger; WORK: where everything goes.
set -euo pipefail
cd "$(dirname "$0")/.."
ALPHA=${ALPHA:-.venv/bin/alpha}
WORK=${WORK:-$(mktemp -d)}
SYMBOL=${SYMBOL:-ES.FUT}
MODELS=${MODELS:-tft,mamba2,kan}
EPOCHS=${EPOCHS:-50}
HYPEROPT_TRIALS=${HYPEROPT_TRIALS:-20}
SIZES=()
if [ -n "${SMALL:-}" ]; then
  EPOCHS=2 HYPEROPT_TRIALS=3
  SIZES=(--seq-len 32 --batch-size 64 --n-train-seqs 2000 --n-val-seqs 1000)
fi
DATA=$WORK/data RUN=$WORK/output/run
"$ALPHA" demo-data --scale small --out "$DATA" --symbols "$SYMBOL" >/dev/null
for MODEL in ${MODELS//,/ }; do  # models with a search space are tuned first, as in the original pipeline
  if "$ALPHA" models --json | python3 -c "import json,sys; sys.exit(0 if any(m['name']=='$MODEL' and m['hyperopt'] for m in json.load(sys.stdin)) else 1)"; then
    "$ALPHA" hyperopt --model "$MODEL" --trials "$HYPEROPT_TRIALS" --data-dir "$DATA/$SYMBOL" \
      --output "$RUN/hyperopt/$MODEL/$SYMBOL/results.json" "${SIZES[@]}"
  fi
  "$ALPHA" train-supervised --model "$MODEL" --epochs "$EPOCHS" --data-dir "$DATA/$SYMBOL" \
    --output-dir "$RUN/models/$MODEL/$SYMBOL" --params-file "$RUN/hyperopt/$MODEL/$SYMBOL/results.json" "${SIZES[@]}"
done
"$ALPHA" evaluate --models-dir "$RUN/models" --data-dir "$DATA" --output "$RUN/eval/ensemble_report.json" >/dev/null || true
python3 - "$RUN/eval/ensemble_report.json" "$MODELS" "$SYMBOL" <<'PY'
import json, sys
report, models, symbol = json.load(open(sys.argv[1])), sys.argv[2].split(","), sys.argv[3]
rows = report["symbols"].get(symbol, {}).get("models", {})
for e in report["excluded"]:
    print(f"excluded: {e['model']} fold {e['fold']}: {e['reason']}")
for m in models:
    folds = [f["fold"] for f in rows[m]["folds"]] if m in rows else []
    print(f"{m}: out-of-sample folds {folds}, Sharpe {rows[m]['oos']['sharpe']:.2f}, DSR {rows[m]['oos']['dsr']}, "
          f"N {rows[m]['oos']['dsr_n_trials']}" if m in rows else f"{m}: no row")
missing = [m for m in models if m not in rows or [f["fold"] for f in rows[m]["folds"]] != [0, 1, 2]]
print(f"report: {sys.argv[1]}")
sys.exit(f"FAIL: no out-of-sample row for every fold of {', '.join(missing)}" if missing else 0)
PY
