"""Messages between the server's processes (`server.channel`): what goes in comes out, arrays
included, whatever their size, and a closed pipe reads as end of file."""

from __future__ import annotations

import multiprocessing as mp
import threading

import numpy as np
import pytest
import torch

from fishserve.server.channel import recv_message, send_message, widen_pipe


def pipe():
    reader, writer = mp.Pipe(duplex=False)
    widen_pipe(reader)
    return reader, writer


def through(message, reader=None, writer=None):
    """`message` after a trip through a pipe (written from a thread: it may not fit)."""
    if reader is None:
        reader, writer = pipe()
    sender = threading.Thread(target=send_message, args=(writer, message))
    sender.start()
    got = recv_message(reader)
    sender.join(10)
    return got


def test_arrays_and_objects_arrive_equal():
    samples = np.random.default_rng(0).standard_normal(31 * 2048).astype(np.float32)
    codes = np.arange(64, dtype=np.int64).reshape(8, 8)
    message = ("audio", 7, samples, {"codes": codes, "f": np.asfortranarray(codes)}, None)
    kind, job, got, extra, none = through(message)
    assert (kind, job, none) == ("audio", 7, None)
    assert got.dtype == np.float32 and np.array_equal(got, samples)
    assert np.array_equal(extra["codes"], codes) and np.array_equal(extra["f"], codes)
    assert got.flags.writeable  # the receiver owns its copy
    strided = codes[:, ::2]  # not contiguous: pickled in band
    assert np.array_equal(through(strided), strided)
    assert through(np.zeros((0, 8), np.int64)).shape == (0, 8)


def test_a_message_larger_than_the_pipe_and_many_arrays_arrive_whole():
    big = np.arange(3_000_000, dtype=np.int32)  # 12 MB: many partial writes and reads
    many = [np.full(3, i, np.int16) for i in range(1500)]  # more buffers than one writev takes
    reader, writer = pipe()
    got_big = through(("big", big), reader, writer)[1]
    got_many = through(many, reader, writer)
    assert np.array_equal(got_big, big)
    assert [int(a[0]) for a in got_many] == list(range(1500))


def test_messages_keep_their_order_and_torch_tensors_travel_by_value():
    reader, writer = pipe()
    tensor = torch.arange(6).reshape(2, 3)
    sent = [("status", i, np.full(4, i)) for i in range(50)] + [("encoded", 1, tensor)]

    def send_all() -> None:
        for message in sent:
            send_message(writer, message)

    thread = threading.Thread(target=send_all)
    thread.start()
    got = [recv_message(reader) for _ in sent]
    thread.join(10)
    assert [m[1] for m in got[:-1]] == list(range(50))
    assert torch.equal(got[-1][2], tensor)
    odd = [torch.ones(3, dtype=torch.bfloat16), torch.ones(2, requires_grad=True), tensor.t()]
    back = through(odd)
    assert back[0].dtype == torch.bfloat16 and back[1].requires_grad
    assert all(torch.equal(a.detach(), b.detach()) for a, b in zip(back, odd, strict=True))


def test_a_closed_writer_reads_as_end_of_file_and_bad_messages_write_nothing():
    reader, writer = pipe()
    with pytest.raises(TypeError):
        send_message(writer, ("x", threading.Lock()))  # cannot be pickled
    send_message(writer, ("after", 1))
    assert recv_message(reader) == ("after", 1)  # nothing of the failed message was written
    writer.close()
    with pytest.raises(EOFError):
        recv_message(reader)
