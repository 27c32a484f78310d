"""A process's first stages (alpha_core/stages.py): `process_start` ends at alpha_core's first import, and `imports`
holds what comes after it (torch, the trainer's modules), so a fold's summary says which of the two grew."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

FRESH_PROCESS = """
import json, time
import alpha_core  # what a door imports first
time.sleep(0.5)  # stands for torch and the trainer's modules
from alpha_core.stages import StageClock
print(json.dumps(StageClock().as_dict()))
"""


def test_imports_after_alpha_core_count_as_imports_not_as_process_start():
    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    stages = json.loads(done.stdout)
    assert stages["imports"] >= 0.5, stages
    assert stages["process_start"] < stages["total"] - 0.5, stages
