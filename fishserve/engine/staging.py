"""One host-to-device copy for a captured step's inputs.

A captured decode step reads a dozen static input tensors (`DecodeInputs`). Copying them one
by one costs a dozen PyTorch calls per step, and each call releases and re-acquires the GIL:
with other threads of the engine's process busy, that wait (~0.5 ms under load on an H200,
docs/benchmarks.md §6.15) is paid per call. `StagedInputs` lays the static inputs of one
bucket out in one device byte buffer (each field a typed view at a 128-byte aligned offset),
mirrored by a pinned host buffer. A step writes its rows into the host buffer with NumPy (no
PyTorch call) and uploads it with one copy.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import torch

from fishserve.engine.decode_step import DecodeInputs
from fishserve.engine.host_copy import ALIGN_BYTES, align_up

ALIGN = ALIGN_BYTES  # each field's view starts at a multiple of these bytes


class StagedInputs:
    """Static `DecodeInputs` of `rows` rows backed by one device byte buffer.

    Args:
        neutral: DecodeInputs of `rows` rows (any device) holding the neutral padding values;
            its shapes and dtypes define the layout.
        device: the CUDA device of the static inputs (or the CPU, for tests).

    Attributes:
        inputs: the static device inputs (typed views into the device buffer): capture graphs
            with these.
        nbytes: bytes per upload (the fields, each padded to `ALIGN`).
    """

    def __init__(self, neutral: DecodeInputs, device: torch.device) -> None:
        self.rows = neutral.columns.shape[0]
        self._neutral = {f.name: getattr(neutral, f.name).cpu().numpy() for f in fields(neutral)}
        spans: dict[str, tuple[torch.dtype, int, tuple[int, ...]]] = {}
        self.nbytes = 0
        for f in fields(neutral):
            t = getattr(neutral, f.name)
            spans[f.name] = (t.dtype, self.nbytes, tuple(t.shape))
            self.nbytes += align_up(t.numel() * t.element_size(), ALIGN)
        pinned = device.type == "cuda"
        self._device = torch.empty(self.nbytes, dtype=torch.uint8, device=device)
        self._host = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=pinned)
        host_bytes = self._host.numpy()
        views, self._host_views = {}, {}
        for name, (dtype, offset, shape) in spans.items():
            size = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
            views[name] = self._device[offset : offset + size].view(dtype).view(shape)
            np_dtype = self._neutral[name].dtype
            host = host_bytes[offset : offset + size].view(np_dtype).reshape(shape)
            host[...] = self._neutral[name]
            self._host_views[name] = host
        self.inputs = DecodeInputs(**views)
        self._filled = self.rows  # host rows that may hold non-neutral values
        self.upload()

    def stage(self, host: DecodeInputs) -> None:
        """Write `host`'s B rows (CPU tensors) into the host buffers; later rows neutral."""
        b = host.columns.shape[0]
        if b > self.rows:
            raise ValueError(f"{b} rows do not fit a staged bucket of {self.rows}")
        for name, view in self._host_views.items():
            view[:b] = getattr(host, name).numpy()
            if self._filled > b:
                view[b : self._filled] = self._neutral[name][b : self._filled]
        self._filled = b

    def upload(self) -> None:
        """Copy the host buffer to the device: one copy (asynchronous from pinned memory).

        The host buffer must not be written again before the copy ran: callers synchronise
        with the device once per step (the frames' device-to-host copy) before staging again.
        """
        self._device.copy_(self._host, non_blocking=True)
