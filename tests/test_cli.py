"""The `alpha` command line (as a real subprocess, or through `main`): commands, one-line errors, progress."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest

from alpha_core.cli import build_parser, main
from alpha_core.tb_events import crc32c

ALPHA = [sys.executable, "-m", "alpha_core.cli"]


def alpha(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([*ALPHA, *args], capture_output=True, text=True, timeout=300, env=env)


def test_console_script_is_installed():
    exe = Path(sys.executable).with_name("alpha")
    assert exe.exists(), "pip install -e . should install the `alpha` console script"
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for command in ("inspect", "predecode", "folds", "demo-data"):
        assert command in out.stdout


def test_inspect_json_reports_metadata_and_counts(samples):
    path = samples / "nautilus_trader/futures_ohlcv-1m_2024-07-01T23-40_2024-07-02T00-10.dbn.zst"
    out = alpha("inspect", str(path), "--json")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)
    assert row["schema"] == "ohlcv-1m" and row["dataset"] == "GLBX.MDP3" and row["dbn_version"] == 1
    assert row["symbols"] == ["ESU4", "NQU4"] and row["records"] == 60
    assert row["first_ts"] == "2024-07-01T23:40:00+00:00" and row["last_ts"] == "2024-07-02T00:09:00+00:00"


def test_inspect_fails_on_a_file_that_is_not_dbn(tmp_path, samples):
    junk = tmp_path / "junk.dbn.zst"
    junk.write_bytes(b"\x28\xb5\x2f\xfd" + b"not really zstd" * 10)
    good = samples / "databento-python/GLBX.MDP3/test_data.mbp-10.dbn.zst"
    out = alpha("inspect", str(good), str(junk))
    assert out.returncode == 2  # bad input; the good file is still shown
    assert out.stderr.startswith(f"alpha inspect: error: {junk}: ") and out.stderr.count("\n") == 1, out.stderr
    assert "schema=mbp-10" in out.stdout and "records=4" in out.stdout


def test_demo_data_predecode_then_reuse_then_folds(tmp_path):
    data, cache = tmp_path / "data", tmp_path / "pd"
    out = alpha("demo-data", "--scale", "tiny", "--out", str(data), "--symbols", "ZN.FUT", "--quarters", "4")
    assert out.returncode == 0, out.stderr
    assert len(list((data / "ZN.FUT").rglob("*.dbn.zst"))) == 8

    first = alpha("predecode", "--data-dir", str(data), "--predecoded-dir", str(cache))
    assert first.returncode == 0, first.stderr
    lines = first.stdout.strip().splitlines()
    assert len(lines) == 8 and all(line.startswith("built") for line in lines)
    assert all("ZN.FUT" in line for line in lines)

    again = alpha("predecode", "--data-dir", str(data), "--predecoded-dir", str(cache), "--symbols", "ZN.FUT")
    assert again.returncode == 0 and all(line.startswith("reused") for line in again.stdout.splitlines())

    untested = alpha("folds", "--data-dir", str(data / "ZN.FUT"), "--cv-n-folds", "2", "--cv-train-window", "2")
    assert untested.returncode == 2 and "mbp-10: fold(s) 1 would have no test quarter" in untested.stderr
    folds = alpha(
        "folds",
        "--data-dir",
        str(data / "ZN.FUT"),
        "--cv-n-folds",
        "2",
        "--cv-train-window",
        "2",
        "--allow-untested-folds",
        "--json",
    )
    assert folds.returncode == 0, folds.stderr  # with an UntestedFoldWarning (this helper ignores warnings)
    plans = json.loads(folds.stdout)
    assert set(plans) == {"mbp-10", "ohlcv-1m"}
    fold0 = plans["mbp-10"]["folds"][0]
    assert [f["name"] for f in fold0["train"]] == ["2024-Q1", "2024-Q2"]  # calendar quarters
    assert [[p["name"] for p in f["parts"]] for f in fold0["train"]] == [["ZN.FUT_2024-Q1.dbn.zst"], ["ZN.FUT_2024-Q2.dbn.zst"]]
    assert [f["name"] for f in fold0["val"]] == ["2024-Q3"]
    assert [f["name"] for f in fold0["test"]] == ["2024-Q4"]

    too_many = alpha("folds", "--data-dir", str(data / "ZN.FUT"), "--cv-n-folds", "3", "--cv-train-window", "2")
    assert too_many.returncode == 2
    assert "mbp-10: CV layout overflows: cv_fold=2 + window=2 + 1 val quarter > 4 quarters available" in too_many.stderr


# --- one naming, defaults from the configs, one-line errors, progress (issue 12 item 7, issue 11 item 4) ----------

KNOWN = "unknown symbol 'XX.FUT'; known symbols: ES.FUT, NQ.FUT, ZN.FUT, 6E.FUT"
SMALL_TFT = [
    "--model",
    "tft",
    "--epochs",
    "2",
    "--n-train-seqs",
    "256",
    "--n-val-seqs",
    "128",
    "--seq-len",
    "16",
    "--batch-size",
    "32",
    "--device",
    "cpu",
    "--param",
    "d_model=8",
    "--param",
    "n_heads=2",
    "--cv-n-folds",
    "2",
    "--cv-train-window",
    "2",
    "--cv-fold",
    "0",
]


def run_alpha(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*ALPHA, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})},
        **kw,
    )


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cli-cache")


def test_output_flags_have_one_naming_and_the_old_names_still_work():
    parser = build_parser()
    train = ["train", "--mbp10-data-dir", "d", "--predecoded-dir", "p"]
    assert parser.parse_args([*train, "--out", "o"]).out == parser.parse_args([*train, "--output-dir", "o"]).out
    assert parser.parse_args(["demo-data", "--out", "o"]).out == Path("o")
    assert parser.parse_args(["demo-data", "--output-dir", "o"]).out == Path("o")
    assert parser.parse_args(["predecode", "--data-dir", "d", "--predecoded-dir", "p"]).predecoded_dir == Path("p")
    assert parser.parse_args(["predecode", "--data-dir", "d", "--output-dir", "p"]).predecoded_dir == Path("p")
    args = parser.parse_args([*train, "--out", "o", "--batch-size", "4"])
    assert args.batch_size == 4 and not hasattr(args, "epochs")  # unset: the config's default applies


def _help(capsys, command: str) -> str:
    assert main([command, "--help"]) == 0
    return capsys.readouterr().out


def test_help_shows_the_defaults_written_once_in_the_configs(capsys):
    from alpha_core.train.perception import TrainConfig
    from alpha_core.train.supervised import SupervisedTrainConfig

    train = _help(capsys, "train")
    assert "--output-dir OUTPUT_DIR, --out OUTPUT_DIR" in train and "--no-fused-scan" in train
    for name in ("seq_len", "lr_cfc", "n_train_seqs", "early_stop_metric"):
        flag, default = f"--{name.replace('_', '-')}", TrainConfig.model_fields[name].default
        entry = train[train.index(f"\n  {flag} ") :].split("\n  --")[1]  # its line in the option list
        assert f"default: {default}" in " ".join(entry.split()), entry
    supervised = " ".join(_help(capsys, "train-supervised").split())
    assert f"--batch-size BATCH_SIZE default: {SupervisedTrainConfig.model_fields['batch_size'].default}" in supervised
    assert "--weight-decay" in supervised and "--debug" in supervised and "--quiet" in supervised


@pytest.mark.parametrize(
    "argv",
    [
        ["predecode", "--data-dir", "{data}", "--predecoded-dir", "{tmp}/pd", "--symbols", "ES.FUT,XX.FUT"],
        ["demo-data", "--scale", "tiny", "--output-dir", "{tmp}/demo", "--symbols", "XX.FUT"],
        ["evaluate", "--models-dir", "{tmp}", "--data-dir", "{data}", "--output", "{tmp}/r.json", "--symbols", "XX.FUT"],
        ["train-supervised", "--model", "tft", "--data-dir", "{data}/ES.FUT", "--output-dir", "{tmp}/m", "--symbol", "XX.FUT"],
        ["train-rl", "--model", "ppo", "--data-dir", "{data}/ES.FUT", "--output-dir", "{tmp}/m", "--symbol", "XX.FUT"],
        ["hyperopt", "--model", "tft", "--data-dir", "{data}/ES.FUT", "--output", "{tmp}/h.json", "--symbol", "XX.FUT"],
        ["run", "--symbols", "XX.FUT", "--dry-run"],
    ],
)
def test_unknown_symbols_are_rejected_by_every_command(capsys, tmp_path, tiny_data, argv):
    code = main([a.format(data=tiny_data, tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and KNOWN in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["demo-data", "--scale", "tiny", "--out", "{file}"],
        ["demo-data", "--scale", "tiny", "--output-dir", "{file}/sub"],
        ["predecode", "--data-dir", "{data}", "--output-dir", "{file}"],
        ["train", "--mbp10-data-dir", "{data}/ES.FUT/mbp-10", "--predecoded-dir", "{tmp}/pd", "--out", "{file}"],
        ["train", "--mbp10-data-dir", "{data}/ES.FUT/mbp-10", "--predecoded-dir", "{file}", "--out", "{tmp}/o"],
        ["train-supervised", "--model", "tft", "--data-dir", "{data}/ES.FUT", "--output-dir", "{file}"],
        ["train-rl", "--model", "ppo", "--data-dir", "{data}/ES.FUT", "--output-dir", "{file}"],
        ["hyperopt", "--model", "tft", "--data-dir", "{data}/ES.FUT", "--output", "{file}/results.json"],
        ["hyperopt", "--model", "tft", "--data-dir", "{data}/ES.FUT", "--output", "{tmp}"],
        ["evaluate", "--models-dir", "{tmp}", "--data-dir", "{data}", "--output", "{file}/report.json"],
    ],
)
def test_an_output_path_that_is_a_file_is_one_line_before_any_work(capsys, tmp_path, tiny_data, argv):
    file = tmp_path / "taken"
    file.write_text("not a directory")
    code = main([a.format(data=tiny_data, tmp=tmp_path, file=file) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert (str(file) if "{file}" in " ".join(argv) else str(tmp_path)) in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]  # nothing written


@pytest.mark.parametrize(
    "layout, symbols, message",
    [
        (None, [], "no such models directory"),
        ("tft/ES.FUT", [], "no checkpoints (expected <model>/<symbol>/fold-<k>/ folders)"),  # folders, no fold-<k>
        (
            "tft/ES.FUT/fold-0",
            ["--symbols", "NQ.FUT"],
            "no checkpoints for NQ.FUT (expected <model>/<symbol>/fold-<k>/ folders)",
        ),
    ],
)
def test_evaluate_fails_on_a_missing_or_empty_models_directory(capsys, tmp_path, tiny_data, layout, symbols, message):
    models = tmp_path / "models"
    if layout:
        (models / layout).mkdir(parents=True)
    code = main(
        [
            "evaluate",
            "--models-dir",
            str(models),
            "--data-dir",
            str(tiny_data),
            "--output",
            str(tmp_path / "eval" / "report.json"),
            *symbols,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err == f"alpha evaluate: error: {models}: {message}\n"
    assert not (tmp_path / "eval").exists()


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a small tmpfs (root only); skip with the reason where mounting is not permitted."""
    mounted = []

    def mount(name: str, options: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_read_only_output_directory_is_one_line(capsys, tmp_path, tiny_data, tmpfs):
    if os.geteuid() == 0:  # root ignores permission bits: a read-only file system refuses root too
        read_only = tmpfs("ro", "ro,size=64k")
    else:
        read_only = tmp_path / "ro"
        read_only.mkdir()
        read_only.chmod(0o555)
    for argv in (
        ["demo-data", "--scale", "tiny", "--output-dir", str(read_only / "data")],
        ["hyperopt", "--model", "tft", "--data-dir", str(tiny_data / "ES.FUT"), "--output", str(read_only / "results.json")],
        ["predecode", "--data-dir", str(tiny_data), "--output-dir", str(read_only)],
    ):
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and str(read_only) in err and "not writable" in err, err
    assert list(read_only.iterdir()) == []


def test_a_full_disk_says_no_space_left_naming_the_path(capsys, tmp_path, tiny_data, cache, tmpfs):
    full = tmpfs("full", "size=64k")
    code = main(["demo-data", "--scale", "tiny", "--output-dir", str(full / "data"), "--symbols", "ES.FUT", "--quarters", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "no space left on device" in err and str(full) in err, err

    small = tmpfs("small", "size=24k")  # the configs fit, the weights (safetensors, a Rust error) do not
    code = main(
        [
            "train-supervised",
            *SMALL_TFT,
            "--epochs",
            "1",
            "--data-dir",
            str(tiny_data / "ES.FUT"),
            "--output-dir",
            str(small / "models"),
            "--predecoded-dir",
            str(cache),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "no space left on device" in err and str(small) in err, err


def test_debug_shows_the_traceback_and_the_default_one_line(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("x")
    plain = run_alpha("demo-data", "--output-dir", str(taken))
    assert plain.returncode == 2 and plain.stderr == f"alpha demo-data: error: {taken}: exists and is not a directory\n"
    for argv, env in (
        (["--debug", "demo-data", "--output-dir", str(taken)], None),
        (["demo-data", "--output-dir", str(taken), "--debug"], None),
        (["demo-data", "--output-dir", str(taken)], {"ALPHA_DEBUG": "1"}),
    ):
        loud = run_alpha(*argv, env=env)
        assert loud.returncode != 0 and "Traceback (most recent call last)" in loud.stderr
        assert "DataError" in loud.stderr and "exists and is not a directory" in loud.stderr


UNEXPECTED = """
import resource, sys
import numpy
from alpha_core import cli
import alpha_core.data.demo
limit = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize() + 16 * 2**20
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))  # an out-of-memory machine
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_an_unexpected_error_is_one_line_with_its_type_and_the_traceback_only_with_debug(tmp_path):
    argv = ["demo-data", "--scale", "full", "--symbols", "ES.FUT", "--quarters", "1"]
    plain = subprocess.run(
        [sys.executable, "-c", UNEXPECTED, *argv, "--output-dir", str(tmp_path / "a")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert plain.returncode == 1, plain.stderr
    assert plain.stderr.startswith("alpha demo-data: error: ") and plain.stderr.count("\n") == 1, plain.stderr
    assert plain.stderr.endswith("(run with --debug for the traceback)\n") and "Traceback" not in plain.stderr
    loud = subprocess.run(
        [sys.executable, "-c", UNEXPECTED, "--debug", *argv, "--output-dir", str(tmp_path / "b")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert loud.returncode != 0 and "Traceback (most recent call last)" in loud.stderr


def _run_on_a_terminal(argv: list[str]) -> tuple[int, str, str]:
    """Run `alpha argv` with stderr on a pseudo-terminal (where progress shows); (exit code, stdout, stderr)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a new pty has 0 columns
    proc = subprocess.Popen(
        [*ALPHA, *argv], stdout=subprocess.PIPE, stderr=slave, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"}
    )
    os.close(slave)
    chunks: list[bytes] = []

    def drain():
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    out, _ = proc.communicate(timeout=600)
    reader.join(timeout=30)
    os.close(master)
    return proc.returncode, out, b"".join(chunks).decode(errors="replace")


def _events(path: Path) -> list[tuple[int, dict[str, float]]]:
    """(step, {tag: value}) of a TensorBoard event file, checking the TFRecord framing's CRC-32C."""
    data, out, i = path.read_bytes(), [], 0

    def masked(b: bytes) -> int:
        crc = crc32c(b)
        return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    def varint(b: bytes, j: int) -> tuple[int, int]:
        value, shift = 0, 0
        while True:
            value |= (b[j] & 0x7F) << shift
            shift, j = shift + 7, j + 1
            if b[j - 1] < 0x80:
                return value, j

    def fields(b: bytes):  # protobuf (field number, raw value); wire types 0, 1, 2 and 5
        j = 0
        while j < len(b):
            key, j = varint(b, j)
            size = {1: 8, 5: 4}.get(key & 7)
            if key & 7 == 0:
                value, j = varint(b, j)
            elif size:
                value, j = b[j : j + size], j + size
            else:
                n, j = varint(b, j)
                value, j = b[j : j + n], j + n
            yield key >> 3, value

    while i < len(data):
        (n,) = struct.unpack("<Q", data[i : i + 8])
        assert struct.unpack("<I", data[i + 8 : i + 12])[0] == masked(data[i : i + 8])
        payload = data[i + 12 : i + 12 + n]
        assert struct.unpack("<I", data[i + 12 + n : i + 16 + n])[0] == masked(payload)
        event = dict(fields(payload))
        scalars = {}
        for _, value in fields(event.get(5, b"")):
            v = dict(fields(value))
            scalars[v[1].decode()] = struct.unpack("<f", v[2])[0]
        out.append((event.get(2, 0), scalars))
        i += 16 + n
    return out


def test_crc32c_is_castagnoli():
    assert crc32c(b"123456789") == 0xE3069283  # the standard check value


@pytest.mark.slow
def test_progress_on_a_terminal_quiet_with_flag_and_curves_in_summary_and_tensorboard(tmp_path, tiny_data, cache):
    common = ["train-supervised", *SMALL_TFT, "--data-dir", str(tiny_data / "ES.FUT"), "--predecoded-dir", str(cache)]
    code, out, err = _run_on_a_terminal([*common, "--output-dir", str(tmp_path / "loud")])
    assert code == 0, err
    assert "tft fold 0 epoch 1: val_loss" in out  # the per-epoch lines stay on stdout
    assert "tft fold 0" in err and "epoch" in err and "step" in err and "<" in err  # bars with an ETA on stderr
    code, out, err = _run_on_a_terminal(["--quiet", *common, "--output-dir", str(tmp_path / "quiet")])
    assert code == 0 and "tft fold 0 epoch 1: val_loss" in out and err.strip() == "", err

    fold = tmp_path / "loud" / "fold-0"
    summary = json.loads((fold / "summary.json").read_text())
    rows = summary["epoch_metrics"]
    assert [r["epoch"] for r in rows] == [0, 1] and summary["epochs"] == 2
    assert {"train_loss", "val_loss", "val_auc_h5", "val_auc_h15", "val_auc_h60"} <= set(rows[0])
    assert [rows[e]["val_auc_h5"] for e in (0, 1)] != [None, None]
    (events_file,) = fold.glob("events.out.tfevents.*")
    scalars = [(step, values) for step, values in _events(events_file) if values]
    assert [step for step, _ in scalars] == [0, 1]
    for (_, values), row in zip(scalars, rows, strict=True):
        assert set(values) == set(row) - {"epoch"}
        assert all(values[k] == pytest.approx(row[k], rel=1e-6) for k in values)


@pytest.mark.slow
def test_ctrl_c_exits_130_quietly(tmp_path, tiny_data, cache):
    proc = subprocess.Popen(
        [
            *ALPHA,
            "train-supervised",
            *SMALL_TFT,
            "--epochs",
            "1000",
            "--early-stop-patience",  # it must still be training when the signal comes, on a loaded machine too
            "1000",
            "--data-dir",
            str(tiny_data / "ES.FUT"),
            "--predecoded-dir",
            str(cache),
            "--output-dir",
            str(tmp_path / "m"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        # as at a terminal: a suite started in the background by a shell inherits SIGINT ignored, and Python keeps it so
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert "epoch 0" in proc.stdout.readline()  # training is under way
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err == "", err
