"""The sha256 of a file, read in 4 MiB blocks: one function for the data layer (a DBN file's content key) and the
artifact protocol (a manifest's entries), which must not import the data layer's databento stack."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 22):
            h.update(block)
    return h.hexdigest()
