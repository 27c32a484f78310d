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


class FetchError(RuntimeError):
    """A download that failed (refused key or entitlement, rate limits or server errors past their retries, an
    expired batch job); the message names the symbol, schema and range, and never the API key."""


_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def describe_validation_error(exc: Exception) -> str:
    """One line naming every bad field from a pydantic ValidationError (`lr must be > 0 (got -1.0)`, or
    `key: problem`); str(exc) otherwise."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    return "; ".join(_describe(e) for e in errors())


def _describe(error: dict) -> str:
    key = ".".join(str(p) for p in error["loc"]) or "<root>"
    if error["type"] in _BOUNDS:
        limit = next(iter(error.get("ctx", {}).values()), "?")
        return f"{key} must be {_BOUNDS[error['type']]} {limit} (got {error.get('input')!r})"
    if error["type"] == "finite_number":
        return f"{key} must be a finite number (got {error.get('input')!r})"
    return f"{key}: {error['msg']}"
