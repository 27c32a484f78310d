# Sourced on the device machine (`source bench/device_setup.sh`), after carrying .whl and gpu from
# bench/prepare_gpu_carry.sh: installs the wheels and gives every later process compiled bytecode, as a
# production image has (pip compiles at install, deploy/Dockerfile). The device's Python sets
# PYTHONDONTWRITEBYTECODE=1 and its torch ships no bytecode, so without this each process compiled torch's
# sources again: 5.7 s of a flagship fold's 10 s start-up (2026-12-01).
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache
site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
python3 -m compileall -q -j 0 "$site" /tmp/site alpha_core bench > /dev/null 2>&1 || true
