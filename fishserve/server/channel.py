"""Messages between the HTTP process and the engine core: pickles with out-of-band buffers.

`multiprocessing.connection.Connection.send`/`recv` copy a message's bytes several times: the
pickle holds a copy of every array, the sender slices the rest of the message after each
partial write, and the receiver gathers the pieces in a `BytesIO` and then copies them out;
a 254 KB audio chunk (31 frames of float32 samples, what a decoder job held at 768 streams
on the H200) cost ~1 ms of the receiving thread on the development CPU, 2 ms per MB, with the
GIL held for most of it (round 28, docs/benchmarks.md §6.28). Here a message is pickled with
protocol 5 (PEP 574), so NumPy arrays travel as out-of-band buffers: written straight from
the array with `os.writev` and read straight into the new array's memory with `os.readv`.

Wire format: an 8-byte header ``(pickle_bytes, buffers)`` (two little-endian uint32), the
buffers' sizes (uint64 each), the pickle, then the buffers. CPU tensors travel by value as
NumPy arrays (`Connection.send` would move them through shared memory; the few sent here, a
reference's codes, are small). Both ends of a pipe must use this module. A read of end of
file raises EOFError; a closed pipe OSError, as `Connection` does.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import pickle
import struct
from multiprocessing.connection import Connection
from typing import Any

import torch

_HEADER = struct.Struct("<II")
# Linux's F_SETPIPE_SZ (fcntl.h); the default pipe holds 64 KiB, so a larger message took
# several writes and reads.
_F_SETPIPE_SZ = 1031
PIPE_BYTES = 1 << 20  # Linux's default /proc/sys/fs/pipe-max-size
# Buffers per writev/readv call at most (POSIX guarantees IOV_MAX >= 16; Linux allows 1,024).
_MAX_VECTORS = 512


def widen_pipe(conn: Connection, size: int = PIPE_BYTES) -> None:
    """Let the pipe of `conn` hold `size` bytes (Linux; elsewhere, or when refused, nothing
    changes)."""
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(conn.fileno(), _F_SETPIPE_SZ, size)


def send_message(conn: Connection, message: Any) -> None:
    """Write `message` to `conn`'s pipe (blocks while the pipe is full).

    Raises:
        OSError: the pipe is closed (e.g. the reading process is gone).
        pickle.PicklingError, TypeError, ...: `message` cannot be pickled (nothing written).
    """
    buffers: list[pickle.PickleBuffer] = []
    data = io.BytesIO()
    _Pickler(data, protocol=5, buffer_callback=buffers.append).dump(message)
    body = data.getbuffer()
    raws = [buffer.raw() for buffer in buffers]
    head = _HEADER.pack(body.nbytes, len(raws)) + struct.pack(
        f"<{len(raws)}Q", *(raw.nbytes for raw in raws)
    )
    _write_all(conn.fileno(), [head, body, *raws])


class _Pickler(pickle.Pickler):
    """Pickles CPU tensors as their NumPy arrays (out of band, rebuilt with
    `torch.from_numpy`): torch's own reduction took ~10x longer for a reference's (8, 650)
    codes. Tensors NumPy cannot hold (bfloat16, on a GPU, needing grad) pickle as torch does."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is torch.Tensor and obj.device.type == "cpu" and not obj.requires_grad:
            try:
                return torch.from_numpy, (obj.numpy(),)
            except (TypeError, RuntimeError):  # e.g. bfloat16, conjugated views
                return NotImplemented
        return NotImplemented


def recv_message(conn: Connection) -> Any:
    """Read one message written by `send_message` (blocks until it is there).

    Raises:
        EOFError: the writing end is closed; OSError: the pipe is unusable.
    """
    fd = conn.fileno()
    size, count = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    sizes = struct.unpack(f"<{count}Q", _read_exact(fd, 8 * count)) if count else ()
    body = bytearray(size)
    buffers = [bytearray(n) for n in sizes]
    _read_into(fd, [body, *buffers])
    return pickle.loads(body, buffers=buffers)


def _write_all(fd: int, parts: list[Any]) -> None:
    views = [memoryview(part).cast("B") for part in parts]
    views = [view for view in views if view.nbytes]
    while views:
        written = os.writev(fd, views[:_MAX_VECTORS])
        while views and written >= views[0].nbytes:
            written -= views[0].nbytes
            views.pop(0)
        if written:
            views[0] = views[0][written:]


def _read_exact(fd: int, size: int) -> bytes:
    chunk = bytearray(size)
    _read_into(fd, [chunk])
    return bytes(chunk)


def _read_into(fd: int, parts: list[Any]) -> None:
    views = [memoryview(part).cast("B") for part in parts if len(part)]
    while views:
        got = os.readv(fd, views[:_MAX_VECTORS])
        if got == 0:
            raise EOFError("the other end of the pipe is closed")
        while views and got >= views[0].nbytes:
            got -= views[0].nbytes
            views.pop(0)
        if got:
            views[0] = views[0][got:]
