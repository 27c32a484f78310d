# Sourced on the device machine (`source bench/device_setup.sh`), carrying .whl from bench/prepare_gpu_carry.sh:
# installs the wheels, gives every later process compiled bytecode, as a production image has (pip compiles at
# install, deploy/Dockerfile), and generates the benches' and the CUDA tests' data in gpu/ unless it is there. The
# device's Python sets PYTHONDONTWRITEBYTECODE=1 and its torch ships no bytecode, so without this each process
# compiled torch's sources again: 5.7 s of a flagship fold's 10 s start-up (2026-12-01).
# gpu/ (ignored): 4 quarterly ES.FUT files of the `small` demo scale in gpu/data/ES.FUT/{mbp-10,ohlcv-1m}, their book
# and bar sidecars in gpu/pd, built with the code being tested (a carried set went stale with every feature change).
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache
site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
python3 -m compileall -q -j 0 "$site" /tmp/site alpha_core bench > /dev/null 2>&1 || true
if [ ! -d gpu/pd ]; then
python3 - <<'PY' || return 1
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
