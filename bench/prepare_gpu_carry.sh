#!/usr/bin/env bash
# Prepare what a GPU run of bench_train_gpu.py carries to the device machine (Python 3.12, torch 2.11, no
# network, no pydantic/databento/zstandard): cp312 wheels in .whl/ and a small ES.FUT demo set with its book
# sidecars prebuilt in gpu/ (polars, the sidecar build stack, is too large to carry; reading needs numpy only).
# Both folders are listed in .git/info/exclude. Then, on the device: bash bench/gpu_bench.sh MODE...
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude || echo '/.whl/' >> .git/info/exclude
grep -qx '/gpu/' .git/info/exclude || echo '/gpu/' >> .git/info/exclude
rm -rf .whl gpu && mkdir -p .whl
for pkg in pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
           typing_extensions==4.15.0 databento==0.88.0 databento-dbn==0.70.0 zstandard==0.25.0; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$pkg"
done
.venv/bin/python - <<'PY'
import shutil
from pathlib import Path
from alpha_core.data.demo import generate_demo_data
from alpha_core.data.predecode import predecode
generate_demo_data(Path("gpu/src"), "small", 7, ["ES.FUT"], quarters=4)
book = Path("gpu/data/ES.FUT/mbp-10")
book.mkdir(parents=True)
for p in sorted(Path("gpu/src/ES.FUT/mbp-10").glob("*.dbn.zst")):
    shutil.copy(p, book / p.name)
shutil.rmtree("gpu/src")
print([(i.status, i.sidecar.rows) for i in predecode(book, "gpu/pd", "ES.FUT", "mbp-10")])
PY
du -sh .whl gpu
