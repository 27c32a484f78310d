"""Every private argparse API alpha uses, behind one small function (argparse ships with Python; `requires-python`
in pyproject.toml bounds the versions).

- `actions` (`ArgumentParser._actions`, `argparse._SubParsersAction`): a parser's arguments in order, to print the
  short usage line (`usage: alpha train-supervised --data-dir DATA_DIR ... [options]`) of a usage error; argparse's
  public `format_usage` lists every option, which for a generated command is a screen of text.

On a new Python: check both names, then run tests/test_cli_flags.py.
"""

from __future__ import annotations

import argparse


def actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return list(parser._actions)


def is_subcommands(action: argparse.Action) -> bool:
    return isinstance(action, argparse._SubParsersAction)
