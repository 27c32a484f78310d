#!/usr/bin/env bash
# The GPU regression check (issue 22, item 6), in one device call of under 10 minutes: installs what the machine lacks
# from the carried wheels, generates its data (bench/device_setup.sh), runs the CUDA test set and every GPU target,
# and prints each figure against its target, PASS or FAIL (bench/gpu_check.py); the JSON lands in $OUT/gpu_check.json,
# every stage's output in $OUT/gpu_check.log and the stages' own JSON files in $OUT/raw.tgz.
#   here:          bash bench/prepare_gpu_carry.sh            (the cp312 wheels in .whl/)
#   on the device: run(command="GPU_CHECK_COMMIT=<sha> bash bench/gpu_check.sh", carry=[".whl"], timeout_s=600)
# Exit status 1 (a FAIL blocks) when a figure regressed beyond its noise band against the last check recorded in
# bench/results/ for the same card, a figure is missing, or a CUDA test failed; commit $OUT/gpu_check.json where its
# report says (bench/results/<gpu>-<date>/) so the next check compares with it. Run it in any session that touches
# models, trainers, kernels, the loader or evaluation, and put its output in the closing note.
set -uo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
out=${OUT:-bench/out/gpu_check}
mkdir -p "$out"
source bench/device_setup.sh || { echo "gpu_check: the set-up failed"; exit 2; }
echo "set-up (wheels, bytecode, data): $((SECONDS - started)) s"
python3 bench/gpu_check.py --out "$out" --deadline-s $((575 - (SECONDS - started))) "$@"
