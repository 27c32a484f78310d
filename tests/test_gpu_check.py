"""The GPU regression check's report (bench/gpu_check.py): every target gets its figure and PASS or FAIL, and a stage
that failed, timed out or did not run is a FAIL with its reason, never a silent gap."""

from __future__ import annotations

import importlib.util
import io
import json
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


def _outputs(tmp_path: Path, raw: dict[str, dict], log: str) -> Path:
    with tarfile.open(tmp_path / "raw.tgz", "w:gz") as tar:
        for name, content in raw.items():
            data = json.dumps(content).encode()
            info = tarfile.TarInfo(f"raw/{name}.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (tmp_path / "gpu_check.log").write_text(log)
    return tmp_path


def _job(model: str, wall: float, rc: int = 0, error: str | None = None) -> dict:
    return {"id": f"train/{model}/0", "run": True, "result": {"wall_s": wall, "rc": rc, "error": error}}


def test_every_target_is_judged_and_a_missing_figure_fails(tmp_path):
    ensemble = [_job(m, 8.0) for m in gpu_check.SUPERVISED if m != "liquid"] + [_job("liquid", 0.0, 1, "OOM")]
    out = _outputs(
        tmp_path,
        {
            "b1_fp32": {"modes": [{"sequences_per_s": 3100.0}]},
            "b4096_bf16": {"modes": [{"error": "RuntimeError: index out of bounds"}]},
            "fold_cold": {"marks": [["fit done", 24.0]]},
            "ensemble_fold": {"jobs": ensemble},
            "dqn_fold": {"jobs": [_job("dqn", 44.0)]},
        },
        "\n===== cuda_tests: pytest\nFAILED tests/test_a.py::test_b - x\n1 failed, 30 passed in 99s\n===== b1_fp32: x\n",
    )
    stages = {name: {"rc": 0} for name in gpu_check.DEFAULT_STAGES.split(",")}
    stages["cuda_tests"]["rc"] = 1
    stages["b4096_fp32"] = {"rc": "timeout"}
    rows = {r["target"].split(",")[0]: r for r in gpu_check.verdicts(gpu_check.figures(out, stages), stages)}
    assert len(rows) == 8
    assert not rows["CUDA test set (pytest -m cuda)"]["pass"]
    assert "tests/test_a.py::test_b" in rows["CUDA test set (pytest -m cuda)"]["note"]
    assert rows["flagship B=1 fp32"]["pass"] and rows["flagship fold at the defaults"]["pass"]
    assert not rows["flagship B=4096 bf16"]["pass"]  # the mode failed: no figure
    assert not rows["flagship B=4096 fp32"]["pass"] and "timeout" in rows["flagship B=4096 fp32"]["note"]
    liquid = rows["Liquid fold at the defaults (GPU)"]
    assert not liquid["pass"] and liquid["note"] == "OOM"  # a failed job's wall time is no figure
    assert not rows["ensemble fold: 8 supervised members at the defaults (GPU)"]["pass"]
    assert rows["DQN fold at the defaults"]["pass"]
