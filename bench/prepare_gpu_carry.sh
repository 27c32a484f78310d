#!/usr/bin/env bash
# Prepare what a GPU run of the benches (gpu_check.sh, bench_train_gpu.py, bench_ensemble.py, the CUDA tests) carries to
# the device machine (Python 3.12, torch 2.11, no network, no pydantic/databento/zstandard/polars/SB3/nevergrad):
# cp312 wheels in .whl/ (always fetched again), listed in .git/info/exclude. The data is generated there, by
# bench/device_setup.sh, with the code under test. Then, on the device: bash bench/gpu_check.sh (carry .whl).
# polars 1.30.0 is pyproject's floor: the pinned 2.1.0 brings a 54 MB runtime wheel that does not fit the carry's
# 64 MiB beside the others (1.30.0: 36 MB), and both build the same sidecars (compared byte for byte, 2026-12-02).
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
grep -qx '/gpu/' "$exclude" 2>/dev/null || echo '/gpu/' >> "$exclude"
rm -rf .whl && mkdir -p .whl
# nevergrad (hyperopt) comes with what it requires that the device lacks (it has numpy, scipy, scikit-learn, pandas)
for pkg in pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
           typing_extensions==4.15.0 databento==0.88.0 databento-dbn==0.70.0 zstandard==0.25.0 polars==1.30.0 \
           stable-baselines3==2.9.2 gymnasium==1.4.0 farama-notifications==0.0.6 ncps==1.0.1 future==1.0.0 \
           nevergrad==1.0.12 cma==4.5.0 bayesian-optimization==1.4.0 directsearch==1.1; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$pkg"
done
du -sh .whl
