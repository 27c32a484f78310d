"""TensorBoard scalar event files, written without the `tensorboard` package.

`torch.utils.tensorboard` needs `tensorboard` (a web server, ~20 MB with its dependencies) only to write a
file whose format is small: TFRecord framing (length, masked CRC-32C, payload, masked CRC-32C) around
`Event` protocol buffers holding `Summary.Value(tag, simple_value)`. TensorBoard reads any file named
`events.out.tfevents.*` in a run folder.
"""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

from alpha_core.atomic import check_writable


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum of TFRecord framing."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _event(wall_time: float, step: int, *, file_version: str | None = None, scalars: dict[str, float] | None = None) -> bytes:
    """An `Event`: wall_time (1, double), step (2, int64), file_version (3) or summary (5) of simple values."""
    out = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step)
    if file_version is not None:
        out += _field(3, file_version.encode())
    if scalars:
        values = b"".join(
            _field(1, _field(1, tag.encode()) + b"\x15" + struct.pack("<f", value)) for tag, value in scalars.items()
        )
        out += _field(5, values)
    return out


def _record(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", _masked(crc32c(length))) + data + struct.pack("<I", _masked(crc32c(data)))


class EventWriter:
    """Appends scalar events to `{directory}/events.out.tfevents.<time>.<host>`, flushed per call."""

    def __init__(self, directory: str | Path) -> None:
        now = time.time()
        self.path = Path(directory) / f"events.out.tfevents.{int(now)}.{socket.gethostname()}"
        self._file = self.path.open("ab")
        self._write(_event(now, 0, file_version="brain.Event:2"))

    def add_scalars(self, step: int, scalars: dict[str, float]) -> None:
        self._write(_event(time.time(), step, scalars={k: float(v) for k, v in scalars.items()}))

    def _write(self, event: bytes) -> None:
        check_writable(self.path)  # a writer that lost its attempt's lock stops here (alpha_core.atomic.guard)
        self._file.write(_record(event))
        self._file.flush()

    def close(self) -> None:
        self._file.close()
