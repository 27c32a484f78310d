#!/usr/bin/env bash
# On the device machine (carry .whl from bench/prepare_gpu_carry.sh; the data is generated there): one process per mode, since a
# failed CUDA-graph capture poisons the process. Results land in $OUT (or bench/out). Example modes:
#   1:fp32:1:c 4096:bf16:1:c 4096:fp32:1
set -uo pipefail
source bench/device_setup.sh || exit
out=${OUT:-bench/out}
mkdir -p "$out"
for mode in "$@"; do
  timeout 280 python3 bench/bench_train_gpu.py --data-dir gpu/data/ES.FUT/mbp-10 --predecoded-dir gpu/pd \
    --out "$out/train_${mode//:/_}.json" --steps 100 --modes "$mode" --skip-inference 2>&1 | grep -E '^\{|Error'
done
