"""`alpha clean`: what crashed writers left goes, what a live writer holds stays."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from alpha_core import artifacts
from alpha_core.atomic import TMP_MARK, owner_tag
from alpha_core.cleanup import TRIAL_PREFIX
from alpha_core.cli import main


def _dead_owner() -> str:
    pid = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout)
    return f"{owner_tag().rsplit('~', 1)[0]}~{pid}"


def _age(path: Path, days: float) -> None:
    then = time.time() - days * 86_400
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        os.utime(p, (then, then), follow_symlinks=False)


def _attempt(root: Path, fold: int, attempt_id: str, complete: bool) -> artifacts.Attempt:
    attempt = artifacts.Attempt(root / "run" / "models" / "tft" / "ES.FUT" / f"fold-{fold}", attempt_id)
    attempt.path.mkdir(parents=True)
    (attempt.path / "model.safetensors").write_text("w")
    if complete:
        artifacts.seal(attempt.path, attempt_id)
    return attempt


def test_clean_removes_what_crashed_writers_left_and_keeps_what_live_ones_hold(tmp_path, capsys, monkeypatch):
    storage, tmp = tmp_path / "storage", tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # where hyperopt's trial folders go
    dead = _dead_owner()
    stale_tmp = storage / "predecoded" / "ES.FUT" / f".x{TMP_MARK}{dead}~ab12"
    stale_tmp.mkdir(parents=True)
    live_tmp = storage / "predecoded" / "ES.FUT" / f".y{TMP_MARK}{owner_tag()}~cd34"
    live_tmp.mkdir()
    done = _attempt(storage, 0, "done", complete=True)
    (done.path / artifacts.LOCK).write_text(json.dumps({"run": "done", "step": "s", "owner": dead, "token": "t"}))
    abandoned = _attempt(storage, 1, "abandoned", complete=False)
    _age(abandoned.path, 8)
    recent = _attempt(storage, 2, "recent", complete=False)  # what a --resume would continue: kept a week
    held = _attempt(storage, 0, "held", complete=False)
    _age(held.path, 30)
    dead_trial = tmp / f"{TRIAL_PREFIX}{dead}~xyz"
    dead_trial.mkdir()
    live_trial = tmp / f"{TRIAL_PREFIX}{owner_tag()}~xyz"
    live_trial.mkdir()
    with artifacts.writing(held) as writer:  # a live writer of an old attempt: its own, new generation
        assert writer.folder != held.path.parent / "held"
        assert main(["clean", str(storage), "--dry-run"]) == 0
        listed = capsys.readouterr().out
        assert str(abandoned.path) in listed and stale_tmp.exists() and abandoned.path.exists()
        assert main(["clean", str(storage)]) == 0
        out = capsys.readouterr().out
    assert not stale_tmp.exists() and live_tmp.exists()
    assert not (done.path / artifacts.LOCK).exists() and done.complete
    assert not abandoned.path.exists() and recent.path.exists() and held.path.exists()
    assert not dead_trial.exists() and live_trial.exists()
    # the old attempt's first generation, superseded and untouched for 30 days, goes; the live generation stays
    assert not (held.path.parent / "held").exists()
    assert "incomplete attempt, no live writer" in out and "5 item(s) removed" in out, out
