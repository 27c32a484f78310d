"""The CLI answers at once and speaks one language (issue 21 items 1 and 5): no heavy import to show help or list
models, no prefix matching, two-line usage errors, one meaning per folder flag, symbols normalised or refused,
exit codes as documented, one line per hyperopt trial, --version."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from alpha_core.cleanup import STORAGE_MARKER
from alpha_core.cli import COMMANDS, build_parser, main

HEAVY = ("torch", "dagster", "nevergrad", "scipy")
CHILD = f"""
import contextlib, io, json, sys
from alpha_core.cli import COMMANDS, main
cases = [["--help"], ["--version"], ["models"], ["models", "--json"], ["trian"],
         ["train-supervised", "--model", "tft", "--data-dir", "d", "--output-dir", "o", "--bogus", "1"],
         *([c, "--help"] for c in COMMANDS)]
seen = {{}}
for argv in cases:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(argv)
    seen[" ".join(argv)] = [code, [m for m in {HEAVY!r} if m in sys.modules]]
print(json.dumps(seen))
"""


def test_help_models_and_usage_errors_import_no_torch_or_dagster():
    """What the user waits for before the first answer: none of these may load torch, Dagster, nevergrad or scipy
    (checked in a fresh interpreter after each, in order, so the first offender is named)."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert set(seen) >= {"--help", "models", *(f"{c} --help" for c in COMMANDS)}
    assert {argv: heavy for argv, (_, heavy) in seen.items() if heavy} == {}
    assert {argv: code for argv, (code, _) in seen.items()} == {
        **{argv: 0 for argv in seen},
        "trian": 2,
        "train-supervised --model tft --data-dir d --output-dir o --bogus 1": 2,
    }


def test_the_data_commands_import_no_torch_or_dagster(tiny_data, tmp_path):
    """inspect, folds and predecode do their work without the training stack."""
    book = sorted((tiny_data / "ES.FUT" / "mbp-10").iterdir())[0]
    cases = [
        ["inspect", str(book)],
        ["folds", "--data-dir", str(tiny_data), "--symbol", "ES", "--cv-n-folds", "2"],
        ["predecode", "--data-dir", str(tiny_data / "NQ.FUT"), "--output-dir", str(tmp_path / "pd")],
    ]
    child = CHILD.replace("cases = [", f"cases = [*{cases!r}, ", 1)
    done = subprocess.run(
        [sys.executable, "-c", child],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert {" ".join(argv): seen[" ".join(argv)] for argv in cases} == {" ".join(argv): [0, []] for argv in cases}


def _filled(command: str) -> tuple[list[str], str]:
    """(argv giving every required argument of `command` a valid-looking value, a prefix of one of its options)."""
    parser = build_parser(command).chosen
    argv, prefix = [command], None
    for action in parser._actions:
        value = str(action.choices[0]) if action.choices else "1"
        if getattr(action.type, "__name__", "") == "fromisoformat":  # a date (alpha fetch --start)
            value = "2024-01-01"
        if not action.option_strings:
            argv.append(value)
        elif action.required:
            argv += [action.option_strings[0], value]
        long = [s for s in action.option_strings if s.startswith("--") and len(s) > 5]
        if prefix is None and long and long[0][:-1] not in parser._option_string_actions and action.dest != "help":
            prefix = long[0][:-1]
    return argv, prefix


@pytest.mark.parametrize("command", list(COMMANDS))
def test_no_prefix_matching_and_a_usage_error_is_two_lines(capsys, command):
    argv, prefix = _filled(command)
    assert main([*argv, prefix, "1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2, err
    assert err[0].startswith(f"usage: alpha {command} ") and err[0].endswith("[options] (--help lists them)"), err
    assert err[1].startswith(f"alpha {command}: error: unrecognized arguments: {prefix}"), err


def test_cv_n_is_not_cv_n_folds(capsys, tmp_path):
    code = main(
        ["train-supervised", "--model", "tft", "--data-dir", str(tmp_path), "--output-dir", str(tmp_path / "o"), "--cv-n", "3"]
    )
    assert code == 2 and capsys.readouterr().err.splitlines()[1] == (
        "alpha train-supervised: error: unrecognized arguments: --cv-n 3"
    )


def test_an_unknown_command_is_two_lines_with_the_closest(capsys):
    assert main(["trian", "--epochs", "3"]) == 2
    usage, error = capsys.readouterr().err.splitlines()
    assert usage == "usage: alpha COMMAND ... [options] (--help lists them)"
    assert error.startswith("alpha: error: unknown command 'trian' (did you mean train?); commands: inspect, ")


def test_version_is_the_installed_package_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"alpha {importlib.metadata.version('alpha')}\n"


def test_help_is_exit_0_for_every_command(capsys):
    for command in COMMANDS:
        assert main([command, "--help"]) == 0, command
        assert capsys.readouterr().out.startswith(f"usage: alpha {command} ")


def test_demo_data_help_shows_the_generators_own_defaults(capsys):
    """Read from the generator's source (no scipy import): they must be the function's real defaults."""
    import inspect

    from alpha_core.data.demo import SCALES, generate_demo_data

    assert main(["demo-data", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    defaults = inspect.signature(generate_demo_data).parameters
    assert f"{{{','.join(SCALES)}}}" in text
    assert f"(default: {defaults['scale'].default})" in text and f"--seed SEED default: {defaults['seed'].default}" in text


# --- folders and symbols -----------------------------------------------------------------------------------------


def _folds(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["folds", "--cv-n-folds", "2", "--json", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _planned(out: str) -> set[str]:
    """The files the plans train on (the parts of their calendar quarters)."""
    return {p["name"] for plan in json.loads(out).values() for fold in plan["folds"] for f in fold["train"] for p in f["parts"]}


def test_data_dir_is_a_root_or_one_symbols_folder(capsys, tiny_data, tmp_path):
    code, out, err = _folds(capsys, "--data-dir", str(tiny_data), "--symbol", "nq")  # a root, the symbol in any case
    assert code == 0, err
    assert _planned(out) and all(name.startswith("NQ.FUT_") for name in _planned(out))

    code, out, err = _folds(capsys, "--data-dir", str(tiny_data / "ES.FUT"))  # a symbol's folder
    assert code == 0 and all(name.startswith("ES.FUT_") for name in _planned(out)), err
    code, out, err = _folds(capsys, "--data-dir", str(tiny_data / "ES.FUT" / "mbp-10"), "--symbol", "ES")  # its schema
    assert code == 0 and set(json.loads(out)) == {"mbp-10"}, err

    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "ES.FUT").symlink_to(tiny_data / "ES.FUT", target_is_directory=True)
    code, out, err = _folds(capsys, "--data-dir", str(lone))  # a root of one symbol: that symbol
    assert code == 0 and all(name.startswith("ES.FUT_") for name in _planned(out)), err

    code, _, err = _folds(capsys, "--data-dir", str(tiny_data))
    assert code == 2 and err == (
        f"alpha folds: error: {tiny_data} is a data root with ES.FUT, NQ.FUT: choose one with --symbol\n"
    )
    code, _, err = _folds(capsys, "--data-dir", str(tiny_data / "ES.FUT"), "--symbol", "NQ.FUT")
    assert code == 2 and err == f"alpha folds: error: {tiny_data / 'ES.FUT'} is ES.FUT's folder, but --symbol is NQ.FUT\n"
    code, _, err = _folds(capsys, "--data-dir", str(tiny_data), "--symbol", "ZN")
    assert code == 2 and err.startswith(f"alpha folds: error: {tiny_data / 'ZN.FUT'}: no data directory for ZN.FUT")


def test_evaluate_takes_a_symbols_folder_as_that_symbol_under_its_root(capsys, tiny_data, tmp_path):
    (tmp_path / "models").mkdir()
    argv = ["evaluate", "--models-dir", str(tmp_path / "models"), "--output", str(tmp_path / "e" / "r.json")]
    assert main([*argv, "--data-dir", str(tiny_data / "ES.FUT"), "--symbols", "NQ"]) == 2
    assert capsys.readouterr().err == (
        f"alpha evaluate: error: {tiny_data / 'ES.FUT'} is ES.FUT's folder, but --symbols is NQ.FUT\n"
    )
    assert main([*argv, "--data-dir", str(tiny_data / "ES.FUT")]) == 2  # the root's ES.FUT: no checkpoints for it
    assert capsys.readouterr().err == (
        f"alpha evaluate: error: {tmp_path / 'models'}: no checkpoints for ES.FUT "
        f"(expected <model>/<symbol>/fold-<k>/ folders)\n"
    )


def test_symbols_are_normalised_never_a_second_cache_folder(capsys, tiny_data, tmp_path):
    cache = tmp_path / "pd"
    assert main(["predecode", "--data-dir", str(tiny_data), "--output-dir", str(cache), "--symbols", "es"]) == 0
    built = capsys.readouterr().out.splitlines()
    assert built and all(line.startswith("built") and f"{cache / 'ES.FUT'}/" in line for line in built)
    assert main(["predecode", "--data-dir", str(tiny_data), "--output-dir", str(cache), "--symbols", "ES.FUT,ES"]) == 0
    again = capsys.readouterr().out.splitlines()
    assert len(again) == len(built) and all(line.startswith("reused") for line in again)
    assert main(["predecode", "--data-dir", str(tiny_data / "ES.FUT"), "--output-dir", str(cache)]) == 0  # a folder
    assert all(line.startswith("reused") for line in capsys.readouterr().out.splitlines())
    assert sorted(p.name for p in cache.iterdir()) == [STORAGE_MARKER, "ES.FUT"]
    assert main(["predecode", "--data-dir", str(tiny_data), "--output-dir", str(cache), "--symbols", "XX"]) == 2
    assert capsys.readouterr().err == (
        "alpha predecode: error: unknown symbol 'XX'; known symbols: ES.FUT, NQ.FUT, ZN.FUT, 6E.FUT\n"
    )


def test_train_takes_data_dir_like_the_others_and_keeps_mbp10_data_dir():
    parser = build_parser("train")
    common = ["train", "--predecoded-dir", "p", "--output-dir", "o"]
    assert (
        parser.parse_args([*common, "--data-dir", "d"]).mbp10_data_dir
        == parser.parse_args([*common, "--mbp10-data-dir", "d"]).mbp10_data_dir
    )


def test_the_original_commands_keep_their_folders(monkeypatch, tmp_path, tiny_data):
    """`alpha hyperopt/train-supervised --data-dir D/ES.FUT ...` as the original pipeline writes them: the same
    folder, the symbol its name; the default cache under $ALPHA_STORAGE_ROOT is the symbol's, as Dagster's."""
    from alpha_core.cli import resolve_one_symbol

    data = tiny_data / "ES.FUT"
    for argv in (
        ["hyperopt", "--model", "tft", "--data-dir", str(data), "--output", "H/results.json"],
        [
            "train-supervised",
            "--model",
            "tft",
            "--epochs",
            "50",
            "--data-dir",
            str(data),
            "--output-dir",
            "M/tft/ES.FUT",
            "--params-file",
            "H/results.json",
        ],
    ):
        monkeypatch.delenv("ALPHA_STORAGE_ROOT", raising=False)
        args = build_parser(argv[0]).parse_args(argv)
        resolve_one_symbol(args)
        assert (args.data_dir, args.symbol, getattr(args, "predecoded_dir", None)) == (data, "ES.FUT", None)
        monkeypatch.setenv("ALPHA_STORAGE_ROOT", str(tmp_path))
        args = build_parser(argv[0]).parse_args(argv)
        resolve_one_symbol(args)
        assert args.predecoded_dir == tmp_path / "predecoded" / "ES.FUT"
    args = build_parser("train").parse_args(
        ["train", "--mbp10-data-dir", str(data / "mbp-10"), "--predecoded-dir", "storage/predecoded/ES.FUT", "--out", "runs/es"]
    )
    resolve_one_symbol(args)
    assert (args.mbp10_data_dir, args.predecoded_dir) == (data / "mbp-10", Path("storage/predecoded/ES.FUT"))


# --- hyperopt: a line per trial, the best params rounded, results.json whole -----------------------------------------

TRIAL = re.compile(
    r"^hyperopt tft trial (\d) \[(\d)/2\]: lr=(\S+) d_model=(\d+) n_heads=(\d+) -> val_mean_auc "
    r"(0\.\d{4}) \(best 0\.\d{4}, trial \d\)$"
)


def test_hyperopt_prints_a_line_per_trial_and_the_best_params_rounded(capsys, tiny_data, tmp_path):
    out = tmp_path / "h" / "results.json"
    code = main(
        [
            "hyperopt",
            "--model",
            "tft",
            "--trials",
            "2",
            "--epochs",
            "1",
            "--data-dir",
            str(tiny_data),
            "--symbol",
            "ES",
            "--output",
            str(out),
            "--seq-len",
            "16",
            "--batch-size",
            "32",
            "--n-train-seqs",
            "64",
            "--n-val-seqs",
            "64",
            "--predecoded-dir",
            str(tmp_path / "pd"),
            "--device",
            "cpu",
            "--seed",
            "3",
        ]
    )
    stdout, err = capsys.readouterr()
    assert code == 0, err
    results = json.loads(out.read_text())
    trials = [TRIAL.match(line) for line in stdout.splitlines() if line.startswith("hyperopt tft trial")]
    assert [(m.group(1), m.group(2)) for m in trials if m] == [("0", "1"), ("1", "2")], stdout
    for m, trial in zip(trials, results["trials"], strict=True):
        assert float(m.group(3)) == pytest.approx(trial["params"]["lr"], rel=5e-3)  # 3 significant digits
        assert len(m.group(3).replace("0.", "").lstrip("0").replace("e-", "")) <= 5
        assert float(m.group(6)) == pytest.approx(trial["score"], abs=5e-5)
    best = stdout.splitlines()[-1]
    lr = results["best_params"]["lr"]
    assert len(repr(lr)) > 10  # the file keeps full precision ...
    assert best.startswith(
        f"best validation mean AUC (higher is better): {results['best_score']:.4f} with lr={lr:.3g} d_model="
    ) and best.endswith(f"-> {out} (full precision)"), best  # ... not the line
    # the cache root got the symbol's folder (and the marker `alpha clean` requires)
    assert sorted(p.name for p in (tmp_path / "pd").iterdir()) == [STORAGE_MARKER, "ES.FUT"]


# --- exit codes: 0 done, 1 the work failed, 2 bad input or usage ---------------------------------------------------

BAD_INPUT = {
    "inspect": ["inspect", "{tmp}/none.dbn.zst"],
    "predecode": ["predecode", "--data-dir", "{tmp}/none", "--output-dir", "{tmp}/pd"],
    "folds": ["folds", "--data-dir", "{tmp}/none"],
    "demo-data": ["demo-data", "--output-dir", "{tmp}/d", "--quarters", "many"],
    "train": ["train", "--data-dir", "{tmp}/none", "--predecoded-dir", "{tmp}/pd", "--output-dir", "{tmp}/o"],
    "train-supervised": ["train-supervised", "--model", "nope", "--data-dir", "{data}/ES.FUT", "--output-dir", "{tmp}/o"],
    "train-rl": ["train-rl", "--model", "ppo", "--data-dir", "{data}/ES.FUT", "--output-dir", "{tmp}/o", "--epochs", "0"],
    "hyperopt": ["hyperopt", "--model", "kan", "--data-dir", "{data}/ES.FUT", "--output", "{tmp}/h.json"],
    "evaluate": ["evaluate", "--models-dir", "{tmp}/none", "--data-dir", "{data}", "--output", "{tmp}/r.json"],
    "fetch": ["fetch", "--symbol", "XX", "--start", "2024-01-01", "--end", "2024-04-01", "--data-dir", "{tmp}/d"],
    "run": ["run", "--symbols", "ES,XX", "--dry-run"],
    "models": ["models", "--jsn"],
    "clean": ["clean", "{tmp}/none"],
    "compare": ["compare", "nosuchrun", "other", "--storage-root", "{tmp}"],
    "ui": ["ui", "--port", "many"],
}


def test_bad_input_exits_2_in_one_line_on_every_command(capsys, tmp_path, tiny_data):
    assert set(BAD_INPUT) == set(COMMANDS)
    for command, argv in BAD_INPUT.items():
        code = main([a.format(tmp=tmp_path, data=tiny_data) for a in argv])
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if not line.startswith("usage: ")]
        assert code == 2 and len(lines) == 1 and lines[0].startswith(f"alpha {command}: error: "), (command, err)
    assert list(tmp_path.iterdir()) == []


def test_work_that_fails_exits_1(capsys, tmp_path, tiny_data):
    """Nothing evaluable (an unfinished checkpoint): the report lists it and the command fails."""
    (tmp_path / "models" / "tft" / "ES.FUT" / "fold-0").mkdir(parents=True)
    code = main(
        [
            "evaluate",
            "--models-dir",
            str(tmp_path / "models"),
            "--data-dir",
            str(tiny_data / "ES.FUT"),
            "--output",
            str(tmp_path / "e" / "r.json"),
            "--device",
            "cpu",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and "alpha evaluate: error: nothing could be evaluated (1 checkpoint(s) excluded" in err, err
