"""One error type for bad input, so the CLI and Dagster can show it without a traceback."""

from __future__ import annotations

from pathlib import Path


class DataError(ValueError):
    """Bad or unusable input data; the message names the file and what is wrong."""

    def __init__(self, path: str | Path | None, message: str) -> None:
        self.path = None if path is None else Path(path)
        super().__init__(f"{path}: {message}" if path is not None else message)


class PlanError(ValueError):
    """An impossible request (fold layout, horizon, symbol); the message says which numbers do not fit."""


def describe_validation_error(exc: Exception) -> str:
    """One line per bad field (`key: problem`) from a pydantic ValidationError; str(exc) otherwise."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in errors())
