"""Buffers are freed when no tensor refers to them (counted by tgrad.device.Stats)."""

import gc

from tgrad import Tensor
from tgrad.device import Stats


def live() -> int:
    gc.collect()
    return Stats.live_buffers


def test_temporaries_are_freed(device):
    before, before_bytes = live(), Stats.live_bytes
    x = Tensor.rand(64, 64)
    y = ((x * 2 + 1).relu() @ x).sum()
    y.item()
    assert Stats.live_bytes >= before_bytes + 64 * 64 * 4
    del x, y
    assert live() == before
    assert Stats.live_bytes == before_bytes


def test_peak_live_bytes_is_a_high_water_mark(device):
    base = Stats.reset_peak()
    assert Stats.peak_live_bytes == base
    x = Tensor.rand(256, 256).realize()
    del x
    live()
    assert Stats.live_bytes == base
    assert Stats.peak_live_bytes >= base + 256 * 256 * 4


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


def test_thousand_jitted_steps_keep_live_buffers_flat():
    from tgrad.jit import TinyJit
    from tgrad.nn import Linear
    from tgrad.nn.optim import Adam

    Tensor.manual_seed(0)
    layer = Linear(8, 4)
    opt = Adam([layer.weight, layer.bias], lr=0.01)

    @TinyJit
    def step(x, y):
        opt.zero_grad()
        loss = layer(x).cross_entropy(y)
        loss.backward()
        opt.step(loss)
        return loss

    x, y = Tensor.rand(16, 8).realize(), Tensor([0, 1, 2, 3] * 4).realize()
    counts = []
    for i in range(1000):
        step(x, y)
        if i in (10, 999):
            counts.append(live())
    assert counts[0] == counts[1], counts
