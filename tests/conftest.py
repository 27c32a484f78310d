"""Shared fixtures: the real Databento samples in tests/data/databento and small generated demo data."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)  # 2-core CI machines: oversubscription makes timings swing 10-40x

SAMPLES = Path(__file__).resolve().parent / "data" / "databento"  # sources and licences: its README.md


# pytest-xdist (`--dist loadfile`) hands a worker its next file once its current file has 2 tests or fewer left,
# and that file waits behind them: a long file's longest test goes first in it (test_webserver.py), not last.
LONGEST_FILES = (
    "test_webserver.py",
    "test_crash_recovery.py",
    "test_run.py",
    "test_k8s_executor.py",
    "test_fencing.py",
    "test_evaluate.py",
    "test_compile_cache.py",
    "test_one_run.py",
)


def pytest_collection_modifyitems(items):
    """The longest files first, so that `make test`'s two workers (pytest-xdist, a file each) start them at once
    instead of ending on them; the CUDA test set (`@pytest.mark.cuda`) is skipped, with its reason, where no GPU
    exists."""
    first = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: the files' own order otherwise
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: the CUDA test set runs on a GPU machine with `pytest -m cuda`")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def samples() -> Path:
    """Real Databento DBN files, part of the repository, so a plain clone runs every test."""
    return SAMPLES


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """`alpha demo-data --scale tiny` for ES.FUT and NQ.FUT: five quarterly files per schema."""
    from alpha_core.data.demo import generate_demo_data

    out = tmp_path_factory.mktemp("demo-tiny")
    generate_demo_data(out, "tiny", seed=7, symbols=["ES.FUT", "NQ.FUT"])
    return out


@pytest.fixture(scope="session")
def tiny_sidecars(tiny_data, tmp_path_factory):
    """Book and bar sidecars of ES.FUT, built once for the session."""
    from alpha_core.data.predecode import predecode

    out = tmp_path_factory.mktemp("predecoded")
    book = [p.sidecar for p in predecode(tiny_data / "ES.FUT", out, "ES.FUT", "mbp-10")]
    bars = [p.sidecar for p in predecode(tiny_data / "ES.FUT", out, "ES.FUT", "ohlcv-1m")]
    return {"book": book, "bars": bars}
