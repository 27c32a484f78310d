"""The names alpha uses at a storage root, and the one rule for a RUN_ID (every door checks it here).

A storage root holds the sidecar cache (`predecoded/`), the marker `alpha clean` requires (`.alpha-storage`), the
compile caches of the step pods (`.cache/`) and one folder per RUN_ID. A RUN_ID is a folder name (a tag reaches
here from whoever can reach the webserver's API: `..` or `/` would write outside the root) and never one of the
root's own names: a run called `predecoded` would write its models into the shared sidecar cache.
"""

from __future__ import annotations

import re

PREDECODED = "predecoded"  # the content-addressed sidecar cache, shared by every run
STORAGE_MARKER = ".alpha-storage"  # written in every storage root alpha writes into (`alpha_core.cleanup`)
RESERVED_RUN_IDS = (PREDECODED,)  # names of the root's own folders a RUN_ID could spell (dot names cannot)
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # a folder name and a tag value


def run_id_problem(run_id: str) -> str | None:
    """Why `run_id` cannot name a run's folder, or None when it can."""
    if not isinstance(run_id, str) or not RUN_ID_RE.fullmatch(run_id):
        return "a run id must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
    if run_id.lower() in RESERVED_RUN_IDS:  # case-insensitive volumes: Predecoded is predecoded there
        reserved = ", ".join(RESERVED_RUN_IDS)
        return f"{run_id!r} is reserved: the storage root's {PREDECODED}/ is the shared sidecar cache (reserved: {reserved})"
    return None
