"""One host-to-device copy per dtype for a captured step's inputs.

A captured decode step reads a dozen static input tensors (`DecodeInputs`). Copying them one
by one costs a dozen PyTorch calls per step, and each call releases and re-acquires the GIL:
with the HTTP event loop busy in another thread, that wait (up to a switch interval) is paid
per call. `StagedInputs` lays the static inputs of one bucket out in one device buffer per
dtype (int64, int32, float32), mirrored by a pinned host buffer. A step writes its rows into
the host buffer with NumPy (no PyTorch call) and uploads three buffers.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import torch

from fishserve.engine.decode_step import DecodeInputs


class StagedInputs:
    """Static `DecodeInputs` of `rows` rows backed by one device buffer per dtype.

    Args:
        neutral: DecodeInputs of `rows` rows (any device) holding the neutral padding values;
            its shapes and dtypes define the layout.
        device: the CUDA device of the static inputs.

    Attributes:
        inputs: the static device inputs (views into the device buffers): capture graphs
            with these.
    """

    def __init__(self, neutral: DecodeInputs, device: torch.device) -> None:
        self.rows = neutral.columns.shape[0]
        self._neutral = {f.name: getattr(neutral, f.name).cpu().numpy() for f in fields(neutral)}
        sizes: dict[torch.dtype, int] = {}
        spans: dict[str, tuple[torch.dtype, int, tuple[int, ...]]] = {}
        for f in fields(neutral):
            t = getattr(neutral, f.name)
            spans[f.name] = (t.dtype, sizes.get(t.dtype, 0), tuple(t.shape))
            sizes[t.dtype] = sizes.get(t.dtype, 0) + t.numel()
        pinned = device.type == "cuda"
        self._device = {d: torch.empty(n, dtype=d, device=device) for d, n in sizes.items()}
        self._host = {d: torch.empty(n, dtype=d, pin_memory=pinned) for d, n in sizes.items()}
        views, self._host_views = {}, {}
        for name, (dtype, offset, shape) in spans.items():
            numel = int(np.prod(shape))
            views[name] = self._device[dtype][offset : offset + numel].view(shape)
            host = self._host[dtype].numpy()[offset : offset + numel].reshape(shape)
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
        """Copy the host buffers to the device (asynchronous from pinned memory).

        The host buffers must not be written again before the copy ran: callers synchronise
        with the device once per step (the frames' device-to-host copy) before staging again.
        """
        for dtype, device_buf in self._device.items():
            device_buf.copy_(self._host[dtype], non_blocking=True)
