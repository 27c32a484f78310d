"""Folds that start warm (issue 33 item 2): every trainer points torch.compile's and Triton's caches, and keeps its
own NVRTC kernels, in `<root>/<code>-<card>-torch<version>-py<version>/`, so a second pod loads what the first
compiled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from alpha_core import compile_cache
from alpha_core.models import nvrtc
from alpha_core.train.configs import SupervisedTrainConfig
from alpha_core.train.supervised import train_supervised

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def fresh(monkeypatch):
    """This process as if nothing had chosen a cache folder yet; the environment is restored after the test."""
    for name in (compile_cache.ENV, "ALPHA_STORAGE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(compile_cache, "_active", None)
    return monkeypatch


def test_the_root_and_the_key(fresh, tmp_path):
    assert compile_cache.root() is None and compile_cache.use("cpu") is None  # no root: torch's defaults stay
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    fresh.setenv("ALPHA_STORAGE_ROOT", str(tmp_path / "storage"))
    assert compile_cache.root() == tmp_path / "storage" / "compile-cache"  # the shared output volume
    fresh.setenv(compile_cache.ENV, str(tmp_path / "explicit"))
    assert compile_cache.root() == tmp_path / "explicit"
    key = compile_cache.key("cpu")
    assert key.startswith(compile_cache.code_version() + "-cpu-torch" + torch.__version__.lower().replace("+", "-"))
    assert key.endswith(f"-py{sys.version_info.major}.{sys.version_info.minor}")
    folder = compile_cache.use("cpu")
    assert folder == tmp_path / "explicit" / key and compile_cache.active() == folder
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(folder / "triton")
    fresh.setenv(compile_cache.ENV, "off")
    assert compile_cache.root() is None


def test_the_code_version_follows_the_sources(tmp_path):
    """Another alpha_core (any source changed) is another key: an image never reads a stale generation."""
    copy = tmp_path / "alpha_core"
    subprocess.run(["cp", "-r", str(REPO / "alpha_core"), str(copy)], check=True)

    def version() -> str:
        probe = "import alpha_core.compile_cache as c; print(c.code_version())"
        env = {**os.environ, "PYTHONPATH": str(tmp_path)}
        done = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    assert version() == compile_cache.code_version()
    (copy / "models" / "xlstm.py").write_text((copy / "models" / "xlstm.py").read_text() + "\n# changed\n")
    assert version() != compile_cache.code_version()


@pytest.mark.slow
def test_a_trainer_points_the_compilers_at_the_keyed_folder(fresh, tiny_data, tmp_path):
    fresh.setenv("ALPHA_STORAGE_ROOT", str(tmp_path / "storage"))
    cfg = SupervisedTrainConfig(
        model="kan",
        data_dir=tiny_data / "ES.FUT" / "ohlcv-1m",
        output_dir=tmp_path / "kan",
        predecoded_dir=tmp_path / "pd",
        epochs=1,
        cv_n_folds=1,
        seq_len=16,
        batch_size=32,
        n_train_seqs=64,
        n_val_seqs=64,
        device="cpu",
    )
    train_supervised(cfg)
    folder = tmp_path / "storage" / "compile-cache" / compile_cache.key("cpu")
    assert compile_cache.active() == folder and os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder / "inductor")


@pytest.fixture
def nvrtc_cache(fresh, tmp_path):
    """NVRTC (skipped where its library is missing) with this process's cache folder under `tmp_path`."""
    try:
        nvrtc._nvrtc()
    except nvrtc.NvrtcUnavailable:
        pytest.skip("no NVRTC library here")
    fresh.setenv(compile_cache.ENV, str(tmp_path))
    compile_cache.use("cpu")
    return fresh


def test_nvrtc_kernels_are_compiled_once_per_cache_folder(nvrtc_cache):
    source, names = "__global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }", ("k",)
    cubin, lowered = nvrtc.cubin_for(source, names, "sm_90")
    (kept,) = (compile_cache.active() / "nvrtc").glob("*.json")
    assert json.loads(kept.read_text())["lowered"] == lowered

    def no_compiler(*_args, **_kwargs):
        raise AssertionError("compiled again")

    real = nvrtc.compile_cubin
    nvrtc_cache.setattr(nvrtc, "compile_cubin", no_compiler)
    assert nvrtc.cubin_for(source, names, "sm_90") == (cubin, lowered)  # what a second pod does: no NVRTC
    with pytest.raises(AssertionError):
        nvrtc.cubin_for(source, names, "sm_80")  # another architecture is another entry
    kept.write_text("{truncated")
    nvrtc_cache.setattr(nvrtc, "compile_cubin", real)
    assert nvrtc.cubin_for(source, names, "sm_90") == (cubin, lowered)  # unreadable: compiled and replaced
    assert json.loads(kept.read_text())["lowered"] == lowered


def test_a_background_compile_fills_the_cache_and_hands_on_its_error(nvrtc_cache):
    """`nvrtc.prefetch`'s thread: its result is `cubin_for`'s (kept in the cache folder, so `load` and a later pod
    find it), and a compile error reaches whoever takes the result, as a direct call would raise it."""
    source, names = "__global__ void k(float* x) { x[threadIdx.x] += 1.0f; }", ("k",)
    cubin, lowered = nvrtc.compile_in_background(source, names, "sm_90").result(timeout=120)
    assert lowered == {"k": "_Z1kPf"} and cubin[:4] == b"\x7fELF"
    assert nvrtc.cubin_for(source, names, "sm_90") == (cubin, lowered)
    broken = nvrtc.compile_in_background("__global__ void k() { undefined_name(); }", ("k",), "sm_90")
    with pytest.raises(RuntimeError, match=r"alpha\.cu\(\d+\).*undefined"):
        broken.result(timeout=120)


PROBE = """
import json, torch
from alpha_core import compile_cache
compile_cache.use("cpu")
from torch._dynamo.utils import counters
torch.compile(lambda x: (x * 2).tanh())(torch.randn(8))
print(json.dumps(dict(counters["inductor"])))
"""


@pytest.mark.slow
def test_a_second_process_loads_what_the_first_compiled(tmp_path):
    """Two processes with one cache root, as two pods of a run: the second hits Inductor's FX graph cache (on this
    2-core VM, a tiny model's forward and backward took 68.5 s to compile cold and 6.4 s warm)."""
    env = {**os.environ, compile_cache.ENV: str(tmp_path), "PYTHONPATH": str(REPO)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    runs = [
        json.loads(subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True).stdout)
        for _ in range(2)
    ]
    assert runs[0].get("fxgraph_cache_miss", 0) >= 1 and not runs[0].get("fxgraph_cache_hit")
    assert runs[1].get("fxgraph_cache_hit", 0) >= 1 and not runs[1].get("fxgraph_cache_miss")
    (folder,) = tmp_path.iterdir()
    assert folder.name.startswith(compile_cache.code_version()) and any((folder / "inductor").rglob("*"))
