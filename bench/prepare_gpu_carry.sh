#!/usr/bin/env bash
# Prepare what a GPU run of the benches (bench_train_gpu.py, bench_ensemble.py, the CUDA tests) carries to the device
# machine (Python 3.12, torch 2.11, no network, no pydantic/databento/zstandard/SB3/nevergrad): cp312 wheels in
# .whl/ (always fetched again) and a small ES.FUT demo set with its book and bar sidecars prebuilt in gpu/ (polars,
# the sidecar build stack, is too large to carry; reading needs numpy only). gpu/ is built only when it is missing
# (rm -rf gpu to rebuild it). Then also: python3 bench/bench_models.py --device cuda --batch 4096 --data-dir
# gpu/data/ES.FUT/ohlcv-1m --predecoded-dir gpu/pd
# Both folders are listed in .git/info/exclude. Then, on the device: bash bench/gpu_bench.sh MODE...
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude || echo '/.whl/' >> .git/info/exclude
grep -qx '/gpu/' .git/info/exclude || echo '/gpu/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
# nevergrad (hyperopt) comes with what it requires that the device lacks (it has numpy, scipy, scikit-learn, pandas)
for pkg in pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
           typing_extensions==4.15.0 databento==0.88.0 databento-dbn==0.70.0 zstandard==0.25.0 \
           stable-baselines3==2.9.2 gymnasium==1.4.0 farama-notifications==0.0.6 ncps==1.0.1 future==1.0.0 \
           nevergrad==1.0.12 cma==4.5.0 bayesian-optimization==1.4.0 directsearch==1.1; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$pkg"
done
if [ -d gpu ]; then
  echo "gpu/ exists: its demo data and sidecars are kept (rm -rf gpu to rebuild them)"
else
.venv/bin/python - <<'PY'
import shutil
from pathlib import Path
from alpha_core.data.demo import generate_demo_data
from alpha_core.data.predecode import predecode
generate_demo_data(Path("gpu/src"), "small", 7, ["ES.FUT"], quarters=4)
for schema in ("mbp-10", "ohlcv-1m"):
    target = Path("gpu/data/ES.FUT") / schema
    target.mkdir(parents=True)
    for p in sorted(Path("gpu/src/ES.FUT", schema).glob("*.dbn.zst")):
        shutil.copy(p, target / p.name)
    print(schema, [(i.status, i.sidecar.rows) for i in predecode(target, "gpu/pd", "ES.FUT", schema)])
shutil.rmtree("gpu/src")
PY
fi
du -sh .whl gpu
