"""Bad input or an impossible plan fails a step at once, in one line: a retry (for pre-empted GPU nodes) would only
fail again after working for nothing, and Dagster's default error would be a stack trace."""

from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg
from pydantic import ValidationError

from alpha_core.errors import DataError, PlanError, describe_validation_error


@contextmanager
def fail_without_retry() -> Iterator[None]:
    try:
        yield
    except (DataError, PlanError) as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    except ValidationError as exc:  # a run config value the core's own config refuses
        raise dg.Failure(description=f"run config: {describe_validation_error(exc)}", allow_retries=False) from exc
