"""Buffers are freed when no tensor refers to them (counted by tgrad.device.Stats)."""

import gc

from tgrad import Tensor, replay
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


def test_buffers_are_freed_without_a_garbage_collection(device, monkeypatch):
    """Reference counting alone frees a dropped result's buffer (and an eager step's buffers: blocks are
    reused at once). The schedule cache's and backward()'s walks were recursive closures, a reference cycle
    that kept every graph they saw, buffers included, alive until the next collection. A replayed
    backward() (replay.py) keeps its capture's buffers, the same ones at every step, and frees
    them when it is dropped."""
    x = Tensor.rand(32, 32, requires_grad=True).realize()
    replay.reset()
    gc.collect()
    gc.disable()
    try:
        before = Stats.live_buffers
        for replays in (False, True):
            monkeypatch.setenv("TGRAD_BACKWARD_REPLAY", "1" if replays else "0")
            counts = []
            for _ in range(6):
                y = ((x * 2 + 1).relu() @ x).sum()
                y.backward()
                Tensor.realize(y, x.grad)
                del y
                x.grad = None
                counts.append(Stats.live_buffers)
            if replays:
                assert len(set(counts[3:])) == 1, counts  # (steps 2 and 3 run and capture; then replays)
                replay.reset()
            assert Stats.live_buffers == before, counts
    finally:
        gc.enable()


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
    for step in range(12):
        loss = (Tensor.rand(4, 16) @ w).relu().sum()
        w.grad = None
        loss.backward()
        with Tensor.no_grad:
            w.assign(w - w.grad * 0.01)
        Tensor.realize(loss, w)
        del loss
        if step in (3, 11):  # (live() runs a full garbage collection: only where the assertion looks)
            counts.append(live())
    assert counts[1] == counts[0], counts


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


def test_batchnorm_steps_without_its_statistics_in_the_optimizer_keep_memory_flat(device):
    # the running statistics' assign() reads the step's activations; when no optimizer realized it (the
    # user passed only the weights, as with PyTorch's model.parameters()) each step kept the one before
    # it alive: +1 step of activations per step (~200 MB per step for the MNIST CNN)
    import numpy as np
    import torch

    from tgrad.nn import BatchNorm2d, Conv2d
    from tgrad.nn.optim import SGD

    Tensor.manual_seed(0)
    conv, bn = Conv2d(2, 4, 3), BatchNorm2d(4)
    tconv, tbn = torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4)
    with torch.no_grad():
        tconv.weight.copy_(torch.from_numpy(conv.weight.numpy()))
        tconv.bias.copy_(torch.from_numpy(conv.bias.numpy()))
    opt = SGD([conv.weight, conv.bias, bn.weight, bn.bias], lr=0.1)
    topt = torch.optim.SGD([*tconv.parameters(), *tbn.parameters()], lr=0.1)
    xs = np.random.default_rng(0).random((8, 8, 2, 10, 10), dtype=np.float32)
    Tensor.training = True
    try:
        counts = []
        for step, x in enumerate(xs):
            opt.zero_grad()
            bn(conv(Tensor(x))).relu().mean().backward()
            opt.step()
            if step in (3, len(xs) - 1):  # (live() collects garbage: only where the assertion looks)
                counts.append((live(), Stats.live_bytes))
            topt.zero_grad()
            tbn(tconv(torch.from_numpy(x))).relu().mean().backward()
            topt.step()
    finally:
        Tensor.training = False
    assert counts[1] == counts[0], counts
    np.testing.assert_allclose(bn.running_mean.numpy(), tbn.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(), tbn.running_var.numpy(), rtol=1e-5, atol=1e-6)


CUSTOM_GRADIENT_OPS = {  # ops whose gradient is a custom rule (autodiff.custom_gradient; a weak table)
    "softmax": lambda x: x.softmax(1),  # its rule reads its own output
    "gelu_tanh": lambda x: x.gelu(approximate="tanh"),
    "layernorm": lambda x: x.layernorm(),  # its rule reads its own output too
    "acosh": lambda x: (x.abs() + 1).acosh(),
    "atanh": lambda x: (x * 0.5).atanh(),
    "pow": lambda x: x.abs() ** 2.5,
    "contiguous": lambda x: x.permute(1, 0).contiguous(),
    "conv2d": lambda x: x.reshape(1, 1, 16, 16).conv2d(Tensor.ones(2, 1, 3, 3)),
}


def test_outputs_of_custom_gradient_ops_are_freed(device):
    """A custom gradient rule must not keep its op's output alive (the table of rules is keyed weakly by
    the output node; a rule holding that node strongly leaked every softmax's buffer: 16 MB a call)."""
    for name, fn in CUSTOM_GRADIENT_OPS.items():
        before = live()
        for requires_grad in (False, True):
            x = Tensor.rand(16, 16, requires_grad=requires_grad)
            y = fn(x).realize()
            if requires_grad:
                y.sum().backward()
            del x, y
        assert live() == before, name


def test_a_dropped_optimizer_frees_its_state_without_a_garbage_collection(device):
    """An optimizer holds the TinyJit that replays its update (nn/optim.py), which holds the optimizer
    only weakly: dropping the optimizer frees its state and the capture's buffers at once."""
    from tgrad.nn.optim import Adam

    w = Tensor.rand(8, 8, requires_grad=True).realize()
    replay.reset()
    gc.collect()
    gc.disable()
    try:
        before = Stats.live_buffers
        opt = Adam([w])
        for _ in range(5):
            w.grad = None
            (w * w).sum().backward()
            opt.step()
        w.grad = None
        replay.reset()
        del opt
        assert Stats.live_buffers == before
    finally:
        gc.enable()
