"""Laziness and in-place writes (tgrad/inplace.py): every sequence of assigns, views, copies and reads gives
what PyTorch's eager in-place ops give. Each scenario runs the same code on PyTorch (copy_ for assign) and
on tgrad, on every device, and compares every value it reads."""

import numpy as np
import pytest
import torch

from tgrad import Tensor
from tgrad.errors import ArgumentError
from tgrad.jit import TinyJit
from tgrad.nn.optim import SGD, Adam

P = np.array([1.0, -2.0, 3.5, 0.25], np.float32)
M = np.arange(12, dtype=np.float32).reshape(3, 4) - 5


class Torch:
    tensor = staticmethod(lambda a: torch.tensor(a))
    realize = staticmethod(lambda *ts: None)
    read = staticmethod(lambda t: t.detach().numpy().copy())
    # PyTorch keeps a transposed layout through elementwise ops and clone(), and then a reshape of the
    # result copies where tgrad's (contiguous) is a view; its docs say not to rely on either
    plus = staticmethod(lambda t, c: (t + c).contiguous())
    copy = staticmethod(lambda t: t.clone(memory_format=torch.contiguous_format))

    @staticmethod
    def assign(t, v):
        with torch.no_grad():
            t.copy_(v)
        return t

    @staticmethod
    def setitem(t, index, v):
        with torch.no_grad():
            t[index] = v


class Tgrad:
    tensor = staticmethod(lambda a: Tensor(a))
    realize = staticmethod(lambda *ts: Tensor.realize(*ts))
    read = staticmethod(lambda t: t.numpy())
    assign = staticmethod(lambda t, v: t.assign(v))
    plus = staticmethod(lambda t, c: t + c)
    copy = staticmethod(lambda t: t.clone())

    @staticmethod
    def setitem(t, index, v):
        t[index] = v


def computed_before_a_realized_assign(x):
    p = x.tensor(P)
    q, c, m = p + 1, p.clone(), p * 1
    x.realize(x.assign(p, p * 2))
    return [q, c, m, p]


def computed_before_a_pending_assign(x):
    p = x.tensor(P)
    q = p.exp()
    x.assign(p, p - 1)
    return [q, p, q]


def views_see_assigns(x):
    p = x.tensor(P)
    v, r, d, e = p[1:3], p.reshape(2, 2), p.detach(), p.reshape(1, 4).expand(3, 4)
    s, s2 = p[::2], p[1::3]  # step slices are views too
    n, sel, un = p.narrow(0, 1, 2), p.reshape(2, 2).select(1, 0), p.reshape(2, 2).unbind(0)[1]
    x.assign(p, p * 3)
    after = v + 1  # made from a view after the assign: the new value
    return [v, after, r, d, e, s, s2 + 1, n, sel, un, p]


def views_of_realized_assigns(x):
    p = x.tensor(P)
    v = p[::1].reshape(2, 2).permute(1, 0)
    x.realize(x.assign(p, p + 10))
    w = v * 2
    x.assign(p, p * -1)
    return [w, v, p]


def copies_made_by_view_ops_do_not(x):
    m = x.tensor(M)
    r = m.T.reshape(12)  # not strided: PyTorch copies
    rep = m[0].repeat(2)
    f = m.flip(0)
    x.realize(x.assign(m, m * 0 + 1))
    return [r, rep, f, m]


def assign_to_a_view_writes_its_base(x):
    m = x.tensor(M)
    col = m[:, 1]
    block = m[1:3, 2:]
    t = m.T
    x.assign(block, block * 0 + 7)
    x.assign(t[0], t[0] * 2)  # the first column, through a transposed view
    flat = m.reshape(12)
    x.assign(flat[3:5], flat[3:5] - 100)
    d = m.detach()
    x.assign(d[0, 0:1], d[0, 0:1] + 0.5)
    every = m[:, ::2]
    x.assign(every, every * -1)
    odd = m.T[1::2, 0:3:2]  # a step slice of a transposed view
    x.assign(odd, odd + 1000)
    diag, above = m.diagonal(), m.diagonal(1)
    x.assign(diag, diag * 0 + 0.25)
    return [m, col, block, t, flat, d, every, odd, diag, above]


def setitem_on_a_view_writes_its_base(x):
    m = x.tensor(M)
    row = m[1]
    x.setitem(row, slice(0, 2), 9.0)
    x.setitem(m, (2, 3), -1.0)
    top = m[0]
    top *= 2  # in-place operators on a view write its base
    col = m[:, 3]
    col += 100
    return [m, row, top, col]


def assigns_in_a_row(x):
    p = x.tensor(P)
    v = p[0:2]
    x.assign(p, p + 1)
    x.assign(p, p * 2)
    q = v * 1
    x.assign(p, p - 3)
    return [p, v, q]


def a_realized_tensor_then_assigned(x):
    a = x.tensor(P)
    y = a * 2
    x.realize(y)
    c, s = y.clone(), y[1:]
    x.assign(y, y + 1)
    return [c, s, y]


def alias_made_by_the_constructor(x):
    p = x.tensor(P)
    a = torch.Tensor(p) if x is Torch else Tensor(p)
    x.assign(p, p * 5)
    return [a, a + 1]


def equal_graphs_made_twice(x):
    """The graph is hash-consed: two zeros() (or two equal sums) are one node until computed. Realized
    together they were one buffer, and an assign to one wrote the other."""
    h, c = x.tensor(np.zeros(4, np.float32)) * 0, x.tensor(np.zeros(4, np.float32)) * 0
    a = x.tensor(P)
    p, q = a + 1, a + 1
    x.realize(h, c, p)
    x.assign(h, h + 1)
    x.assign(p, p * 10)
    return [h, c, p, q]


def a_pending_assign_reads_what_another_overwrites(x):
    a, b = x.tensor(P), x.tensor(P * 2)
    x.assign(b, a * 2 - 1)  # not run yet: reads a
    x.assign(a, a + 100)
    v = a[1:3] * 1
    x.realize(v)  # runs a's assign: b's runs first, from the old a
    return [v, b, a]


SCENARIOS = [
    computed_before_a_realized_assign,
    computed_before_a_pending_assign,
    views_see_assigns,
    views_of_realized_assigns,
    copies_made_by_view_ops_do_not,
    assign_to_a_view_writes_its_base,
    setitem_on_a_view_writes_its_base,
    assigns_in_a_row,
    a_realized_tensor_then_assigned,
    alias_made_by_the_constructor,
    equal_graphs_made_twice,
    a_pending_assign_reads_what_another_overwrites,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_matches_pytorch_in_place_ops(device, scenario):
    want = [Torch.read(t) for t in scenario(Torch)]
    got = [Tgrad.read(t) for t in scenario(Tgrad)]
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=f"value {i}")


def test_assign_to_a_view_keeps_the_base_buffer(device):
    m = Tensor(M).realize()
    buf = m.node.buffer
    m[1:3, 1:].assign(Tensor.ones(2, 3))
    m.realize()
    assert m.node.buffer is buf


def test_assign_to_an_expanded_view_raises(device):
    p = Tensor(P)
    e = p.reshape(1, 4).expand(3, 4)
    with pytest.raises(ArgumentError, match="an expanded axis"):
        e.assign(Tensor.zeros(3, 4))
    with pytest.raises(RuntimeError):  # PyTorch refuses too
        torch.tensor(P).reshape(1, 4).expand(3, 4).copy_(torch.zeros(3, 4))


def test_clone_passes_gradients(device):
    w = Tensor(P, requires_grad=True)
    (w.clone() * w).sum().backward()
    tw = torch.tensor(P, requires_grad=True)
    (tw.clone() * tw).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-6)


@pytest.mark.parametrize("jit", [False, True])
def test_values_made_before_an_optimizer_step(device, jit):
    """What users read around opt.step(): a fused activation, a copy of the weights, a product with them and
    the gradient, all made before the step and read after it, keep their values (PyTorch's); under TinyJit
    too, for values made inside the function (returned) and outside it (read after the replay)."""
    rng = np.random.default_rng(3)
    w0, x0 = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    w, x = Tensor(w0, requires_grad=True), Tensor(x0)
    opt = Adam([w], lr=0.1)
    tw, tx = torch.tensor(w0, requires_grad=True), torch.tensor(x0)
    topt = torch.optim.Adam([tw], lr=0.1)

    def step(x, w, opt):
        opt.zero_grad()
        act = (x @ w) * 0.5 + 1  # the elementwise part is fused into the loss's kernels
        loss = (act * act).sum()
        other = (w * w).sum() * 3
        loss.backward()
        opt.step()
        return act, other

    run = TinyJit(step) if jit else step
    for _ in range(4):
        before, times = w.clone(), w * 1
        act, other = run(x, w, opt)
        tbefore, ttimes = tw.detach().clone(), tw.detach() * 1
        tact, tother = step(tx, tw, topt)
        for a, b in [(before, tbefore), (times, ttimes), (act, tact), (other, tother), (w.grad, tw.grad),
                     (w, tw)]:
            np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_sgd_momentum_state_views(device):
    """A view of a parameter taken before training follows it through the optimizer's in-place steps, and
    a gradient taken through it afterwards reaches the parameter."""
    w = Tensor(M.copy(), requires_grad=True)
    tw = torch.tensor(M.copy(), requires_grad=True)
    row, trow = w[1], tw[1]
    opt, topt = SGD([w], lr=0.01, momentum=0.9), torch.optim.SGD([tw], lr=0.01, momentum=0.9)
    for _ in range(3):
        opt.zero_grad()
        (w * w).sum().backward()
        opt.step()
        topt.zero_grad()
        (tw * tw).sum().backward()
        topt.step()
        np.testing.assert_allclose(row.numpy(), trow.detach().numpy(), rtol=1e-6)
    opt.zero_grad()
    (row * row).sum().backward()
    topt.zero_grad()
    (trow * trow).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-6)


def random_program(x, seed: int, steps: int = 24) -> list:
    """A random sequence of computes, views, copies, assigns (to tensors and to views), reads and
    realizes over two 3x4 tensors; returns every value read and, at the end, every tensor's value."""
    rnd = np.random.default_rng(seed)
    ts = [x.tensor(M * (i + 1)) for i in range(2)]
    reads = []
    for _ in range(steps):
        k, t = rnd.integers(9), ts[rnd.integers(len(ts))]
        if k == 0:
            ts.append(x.plus(t, int(rnd.integers(1, 4))))
        elif k == 1 and t.shape == (3, 4):
            ts.append(t[1:3] if rnd.integers(2) else t[::2, 1::2])
        elif k == 2 and t.ndim == 2:
            ts.append(t.T)
        elif k == 3:
            ts.append(t.reshape(-1))
        elif k == 4:
            ts.append(x.copy(t))
        elif k == 5:
            target, source = ts[rnd.integers(len(ts))], ts[rnd.integers(len(ts))]
            if source.shape == target.shape:
                x.assign(target, source * 2 - 1)
        elif k == 6:
            reads.append(x.read(t))
        elif k == 7:
            x.realize(t)
        else:
            ts.append(t.detach())
    return reads + [x.read(t) for t in ts]


@pytest.mark.parametrize("seed", range(16))
def test_random_programs_match_pytorch(device, seed):
    want = random_program(Torch, seed)
    got = random_program(Tgrad, seed)
    for i, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=f"value {i}")
