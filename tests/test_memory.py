"""Buffers are freed when no tensor refers to them (counted by tgrad.device.Stats)."""

import gc

from tgrad import Tensor
from tgrad.device import Stats


def live() -> int:
    gc.collect()
    return Stats.live_buffers


def test_temporaries_are_freed(device):
    before = live()
    x = Tensor.rand(64, 64)
    y = ((x * 2 + 1).relu() @ x).sum()
    y.item()
    del x, y
    assert live() == before


def test_training_loop_buffer_count_is_flat(device):
    w = Tensor.rand(16, 16, requires_grad=True)
    counts = []
    for _ in range(12):
        loss = (Tensor.rand(4, 16) @ w).relu().sum()
        w.grad = None
        loss.backward()
        with Tensor.no_grad:
            w.assign(w - w.grad * 0.01)
        Tensor.realize(loss, w)
        del loss
        counts.append(live())
    assert counts[-1] == counts[3], counts
