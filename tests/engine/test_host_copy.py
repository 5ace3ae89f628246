"""Pinned host<->device copies (`fishserve.engine.host_copy`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fishserve.engine.host_copy import PinnedDownload, copy_to_device_, to_device

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    ),
]


@pytest.mark.parametrize("device", DEVICES)
def test_download_is_an_owned_copy(device: str) -> None:
    down = PinnedDownload(torch.device(device), nbytes=8)  # grows on the first copy
    first = torch.arange(12, dtype=torch.int64, device=device).view(3, 4)
    got = down.download(first)
    again = down.download(first * 10)  # reuses the buffer
    assert got.dtype == np.int64 and got.shape == (3, 4)
    np.testing.assert_array_equal(got, np.arange(12).reshape(3, 4))
    np.testing.assert_array_equal(again, 10 * np.arange(12).reshape(3, 4))


@pytest.mark.parametrize("device", DEVICES)
def test_download_view_reads_float_rows(device: str) -> None:
    down = PinnedDownload(torch.device(device))
    wave = torch.randn(4, 1, 50, device=device)
    np.testing.assert_array_equal(down.download_view(wave[:2, 0]), wave[:2, 0].cpu().numpy())


@pytest.mark.parametrize("device", DEVICES)
def test_uploads_land_on_the_device(device: str) -> None:
    dst = torch.zeros(2, 3, dtype=torch.int64, device=device)
    lens = torch.zeros(2, dtype=torch.int64, device=device)
    copy_to_device_(dst, torch.from_numpy(np.arange(6).reshape(2, 3)))
    copy_to_device_(lens, torch.from_numpy(np.array([3, 1])))
    assert dst.cpu().tolist() == [[0, 1, 2], [3, 4, 5]] and lens.cpu().tolist() == [3, 1]


@pytest.mark.parametrize("device", DEVICES)
def test_to_device_and_copy_to_device(device: str) -> None:
    dev = torch.device(device)
    host = torch.arange(5)
    moved = to_device(host, dev)
    assert moved.device.type == device and moved.cpu().tolist() == [0, 1, 2, 3, 4]
    dst = torch.zeros(5, dtype=torch.int64, device=device)
    copy_to_device_(dst, host * 2)
    assert dst.cpu().tolist() == [0, 2, 4, 6, 8]
