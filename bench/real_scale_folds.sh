#!/usr/bin/env bash
# One fold of xlstm and one of the flagship at the `real` scale's density, by the CLI as a user runs them (every flag
# at its default but the folders), each fold's summary printed: what the small-data GPU check cannot show (issue 33).
# xlstm: bars only, 8 quarters, fold 0 of the default plan. The flagship: 4 quarters with one book session around
# each roll (~0.7M snapshots a quarter, a real session's density), fold 0 with a one-quarter training window.
# On the device, after `source bench/device_setup.sh` (about 2 minutes):  bash bench/real_scale_folds.sh
set -euo pipefail
work=${WORK:-/tmp/real-scale-folds}
alpha() { python3 -m alpha_core.cli --quiet "$@"; }
show() { python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(sys.argv[2], {k: d.get(k) for k in sys.argv[3:]})" "$@"; }
rm -rf "$work" && mkdir -p "$work"

alpha demo-data --out "$work/bars" --scale real --difficulty realistic --symbols ES.FUT --book-sessions 0
alpha predecode --data-dir "$work/bars" --output-dir "$work/bars-pd" --symbols ES.FUT
time alpha train-supervised --model xlstm --cv-fold 0 --data-dir "$work/bars/ES.FUT" --predecoded-dir "$work/bars-pd" \
    --output-dir "$work/xlstm" --device cuda
show "$work/xlstm/fold-0/summary.json" xlstm epochs wall_time_s best_mean_auc stage_s

alpha demo-data --out "$work/book" --scale real --difficulty realistic --symbols ES.FUT --quarters 4 --book-sessions 1
alpha predecode --data-dir "$work/book" --output-dir "$work/book-pd" --symbols ES.FUT
time alpha train --cv-fold 0 --cv-n-folds 3 --cv-train-window 1 --allow-untested-folds \
    --mbp10-data-dir "$work/book/ES.FUT/mbp-10" --predecoded-dir "$work/book-pd" --out "$work/flagship" --device cuda
show "$work/flagship/fold-0/alpha_train_summary.json" flagship epochs cuda_graph compiled sequences_per_s \
    best_mean_auc stage_s
