"""Symbolic shapes (tgrad/symbolic.py): a bound Variable as an axis extent matches numpy at each value,
eagerly and under TinyJit, where one capture (no new kernels, no compiles) serves every value."""

import numpy as np
import pytest

from tgrad import Tensor, TinyJit, Variable
from tgrad.device import get_runtime
from tgrad.errors import ArgumentError, JitError, ShapeError

RNG = np.random.default_rng(0)
B, H, MAX, D = 2, 3, 16, 8
K = RNG.standard_normal((B, H, MAX, D)).astype(np.float32)
V = RNG.standard_normal((B, H, MAX, D)).astype(np.float32)
Q = RNG.standard_normal((B, H, 1, D)).astype(np.float32)
A = RNG.standard_normal((3, 10)).astype(np.float32)
W = RNG.standard_normal((10, 5)).astype(np.float32)


def attention_np(q, k, v):
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p @ v, p


def attention(q, k, v):
    p = ((q @ k.transpose(-1, -2)) * (1 / np.sqrt(D))).softmax(-1)
    return p @ v, p


def compiled(device: str) -> int:
    return len(get_runtime(device).runners)


def test_bind_checks_the_range():
    pos = Variable("pos", 1, 1024)
    assert pos.bind(1024).unbind() == (pos, 1024)
    for bad in (0, 1025, -3):
        with pytest.raises(ArgumentError, match=rf"'pos'.bind\({bad}\): {bad} is outside its range \[1, 10"):
            pos.bind(bad)
    with pytest.raises(ArgumentError, match="must be an int"):
        pos.bind(2.0)
    with pytest.raises(ArgumentError, match="min_val <= max_val"):
        Variable("n", 5, 2)


def test_shape_shows_the_variable():
    v = Variable("i", 1, 10).bind(4)
    x = Tensor(A)[:, :v]
    assert x.shape == (3, v) and x.shape[1] is v
    assert x.sum(1).shape == (3,) and (x @ Tensor(W[:MAX])[:v]).shape == (3, 5)
    with pytest.raises(ShapeError, match="variable 'i'"):
        x.shape[1] * 2


@pytest.mark.parametrize("n", [1, 4, 10])
def test_eager_ops_match_numpy(device, n):
    v = Variable("i", 1, 10).bind(n)
    a, w = Tensor(A, device=device), Tensor(W, device=device)
    x = a[:, :v]
    tol = dict(atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(x.numpy(), A[:, :n])
    np.testing.assert_allclose((x * 2 + 1).exp().numpy(), np.exp(A[:, :n] * 2 + 1), **tol)
    np.testing.assert_allclose(x.sum(1).numpy(), A[:, :n].sum(1), **tol)
    np.testing.assert_allclose(x.max(1).numpy(), A[:, :n].max(1), **tol)
    np.testing.assert_allclose(x.mean().numpy(), A[:, :n].mean(), **tol)
    np.testing.assert_allclose(x.mean(1).numpy(), A[:, :n].mean(1), **tol)
    e = np.exp(A[:, :n] - A[:, :n].max(1, keepdims=True))
    np.testing.assert_allclose(x.softmax(1).numpy(), e / e.sum(1, keepdims=True), **tol)
    np.testing.assert_allclose((x @ w[:v]).numpy(), A[:, :n] @ W[:n], **tol)
    np.testing.assert_allclose(a.shrink((None, (0, v))).numpy(), A[:, :n])
    np.testing.assert_allclose(x.T.numpy(), A[:, :n].T)
    np.testing.assert_allclose(x.reshape(3, 1, v).sum(2).numpy(), A[:, :n].sum(1, keepdims=True), **tol)
    padded = np.pad(A[:, None, :n], ((1, 0), (0, 0), (0, 0)))
    np.testing.assert_allclose(x[:, None].pad(((1, 0), None, None)).numpy(), padded)
    np.testing.assert_array_equal(Tensor.arange(v, device=device).numpy(), np.arange(n))
    np.testing.assert_array_equal(Tensor.ones(v, 2, device=device).sum(0).numpy(), np.full(2, n))
    np.testing.assert_array_equal(Tensor.zeros(2, v, device=device).numpy(), np.zeros((2, n)))
    np.testing.assert_array_equal((Tensor.arange(10, device=device) < v).numpy(), np.arange(10) < n)
    np.testing.assert_allclose((v * a - Tensor(v, device=device)).numpy(), n * A - n, **tol)
    np.testing.assert_array_equal(Tensor.ones(1, device=device).expand(v).sum().numpy(), n)
    ls = np.log(np.exp(A[:, :n]).sum(1))
    np.testing.assert_allclose(x.logsumexp(1).numpy(), ls, **tol)
    np.testing.assert_allclose(x.log_softmax(1).numpy(), A[:, :n] - ls[:, None], **tol)
    with np.errstate(all="ignore"):  # (one element: var and std of nothing are nan, as in PyTorch)
        np.testing.assert_allclose(x.var(1).numpy(), A[:, :n].var(1, ddof=1), **tol)
        np.testing.assert_allclose(x.var().numpy(), A[:, :n].var(ddof=1), **tol)
        np.testing.assert_allclose(x.std(0).numpy(), A[:, :n].std(0, ddof=1), **tol)
    norm = (A[:, :n] - A[:, :n].mean(1, keepdims=True)) / np.sqrt(A[:, :n].var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(x.layernorm(1).numpy(), norm, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(x.max(0).numpy(), A[:, :n].max(0))
    np.testing.assert_allclose(x.cumsum(0).numpy(), A[:, :n].cumsum(0), **tol)
    np.testing.assert_allclose(x.detach().contiguous().numpy(), A[:, :n])
    np.testing.assert_array_equal(x.argmax().numpy(), A[:, :n].argmax())
    np.testing.assert_allclose(x[:, -1].numpy(), A[:, n - 1])  # an int index cuts to the value first
    np.testing.assert_allclose(x[:3, :n].numpy(), A[:, :n])
    np.testing.assert_allclose(a[1, None, :v].numpy(), A[1, None, :n])
    np.testing.assert_allclose(a[None, ..., 1:3, :v].numpy(), A[None, ..., 1:3, :n])


@pytest.mark.parametrize("pos", [1, 2, 7, MAX])
def test_kv_attention_eager(device, pos):
    p = Variable("pos", 1, MAX).bind(pos)
    kc, vc, q = (Tensor(a, device=device) for a in (K, V, Q))
    out, probs = attention(q, kc[:, :, :p], vc[:, :, :p])
    want, want_p = attention_np(Q, K[:, :, :pos], V[:, :, :pos])
    assert out.shape == (B, H, 1, D) and probs.shape == (B, H, 1, p)
    np.testing.assert_allclose(probs.numpy(), want_p, atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(out.numpy(), want, atol=1e-5, rtol=1e-5)


def test_kv_attention_one_capture(device):
    """A decode step over a fixed (B, H, MAX, D) cache: write position pos - 1 with assign(), attend over
    cache[:, :, :pos]. One capture serves every pos: the same kernels, nothing compiled after it."""
    kc = Tensor.zeros(B, H, MAX, D, device=device).contiguous().realize()  # (tinygrad's idiom)
    vc = Tensor(np.zeros((B, H, MAX, D), np.float32), device=device)
    slots = Tensor.arange(MAX, device=device).reshape(1, 1, MAX, 1)

    @TinyJit
    def step(q, k, v, p):
        at = slots == (Tensor(p, device=device) - 1)
        kc.assign(at.where(k, kc))
        vc.assign(at.where(v, vc))
        return attention(q, kc[:, :, :p], vc[:, :, :p])[0].realize()

    kn, vn = np.zeros((B, H, MAX, D), np.float32), np.zeros((B, H, MAX, D), np.float32)
    names, compiles = None, None
    for pos in [1, 2, 3, 7, 8, MAX - 1, MAX, 5]:
        k, v, q = (RNG.standard_normal((B, H, 1, D)).astype(np.float32) for _ in range(3))
        kn[:, :, pos - 1], vn[:, :, pos - 1] = k[:, :, 0], v[:, :, 0]
        p = Variable("pos", 1, MAX).bind(pos)
        out = step(Tensor(q, device=device), Tensor(k, device=device), Tensor(v, device=device), p)
        assert out.shape == (B, H, 1, D)
        np.testing.assert_allclose(out.numpy(), attention_np(q, kn[:, :, :pos], vn[:, :, :pos])[0],
                                   atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(kc.numpy(), kn)
        if step.cnt == 2 and names is None:
            names, compiles = step.kernel_names, compiled(device)
    if get_runtime(device).evaluates_graphs:
        return  # (NUMPY runs the function each call: nothing to capture)
    assert step.captures == 1 and step.replays >= 5
    assert step.kernel_names == names and compiled(device) == compiles


def test_jit_variables_in_argument_shapes(device):
    """tinygrad's style: the variable only in the Tensor arguments' shapes, outputs cut with ints."""
    a, w = Tensor(A, device=device).realize(), Tensor(W, device=device).realize()
    add1 = TinyJit(lambda x: (x + 1).realize())
    mm = TinyJit(lambda x, y: (x @ y).realize())
    mean1 = TinyJit(lambda x: x.mean(1).realize())
    var0 = TinyJit(lambda x: x.var(0).realize())
    for i in [1, 2, 3, 4, 9, 10, 2]:
        vi = Variable("i", 1, 10).bind(i)
        out = add1(a[:, :vi])
        assert out.shape == (3, vi)
        np.testing.assert_allclose(out[:3, :i].numpy(), A[:, :i] + 1, atol=1e-6)
        np.testing.assert_allclose(mm(a[:, :vi], w[:vi, :]).numpy(), A[:, :i] @ W[:i], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(mean1(a[:, :vi]).numpy(), A[:, :i].mean(1), atol=1e-6, rtol=1e-5)
        np.testing.assert_allclose(var0(a.T[:vi]).numpy(), A[:, :i].T.var(0, ddof=1) if i > 1 else
                                   np.full(3, np.nan), atol=1e-5, rtol=1e-5)
    if not get_runtime(device).evaluates_graphs:
        assert add1.captures == mm.captures == mean1.captures == var0.captures == 1


def test_unsupported_uses_raise(device):
    v = Variable("i", 1, 10).bind(4)
    a = Tensor(A, device=device)
    x = a[:, :v]
    with pytest.raises(ShapeError, match="pad of the axis 1"):
        x.pad((None, (0, 2)))
    with pytest.raises(ShapeError, match="flip of the axis 1"):
        x.flip(1)
    with pytest.raises(ShapeError, match="merges or splits"):
        Tensor.ones(2, v, device=device).reshape(v, 2)
    np.testing.assert_allclose(x.reshape(-1).numpy(), A[:, :4].reshape(-1))  # ints: cut to the value first
    with pytest.raises(ShapeError, match="variable start"):
        a.shrink((None, (v, 10)))
    with pytest.raises(ShapeError, match="past axis 0's size 3"):
        a[:v]
    with pytest.raises(ShapeError, match="cannot broadcast"):
        _ = x + a[:, :Variable("i", 1, 10).bind(5)]
    np.testing.assert_allclose((x + a[:, :Variable("i", 1, 10).bind(4)]).numpy(), 2 * A[:, :4], rtol=1e-6)
    with pytest.raises(ShapeError, match="cannot broadcast"):
        _ = x + Tensor(A, device=device)
    with pytest.raises(ShapeError, match="cannot broadcast"):
        (x > 0).where(Tensor(A, device=device), 0)
    with pytest.raises(ShapeError, match="matmul: inner dimensions differ"):
        x @ Tensor(W, device=device)  # (at the max the two would match as numbers)
    with pytest.raises(ShapeError, match="cannot broadcast"):
        Tensor.ones(10, 3, 2, device=device)[:v] @ Tensor.ones(10, 2, 2, device=device)
    for op in (lambda: x.cumsum(1), lambda: x.cat(x, dim=1), lambda: x.sort(1), lambda: x.argmax(1)):
        with pytest.raises(ShapeError, match="variable 'i'"):
            op()
    with pytest.raises(ShapeError, match="assign"):
        Tensor.zeros(3, 10, device=device).contiguous().realize()[:, :v].assign(x)

    @TinyJit
    def reads_value(t, p):
        return (t + p.val).realize()

    with pytest.raises(JitError, match="value of variable 'i' was read inside a TinyJit"):
        reads_value(a, v)


@pytest.mark.parametrize("n", [3, 10])
def test_gradient_through_a_symbolic_slice_matches_torch(device, n):
    import torch

    v = Variable("i", 1, 10).bind(n)
    x = Tensor(A, device=device, requires_grad=True)
    y = (x[:, :v].softmax(1) * Tensor.arange(v, device=device).float()).mean()
    y.backward()
    t = torch.tensor(A, requires_grad=True)
    ty = (t[:, :n].softmax(1) * torch.arange(n).float()).mean()
    ty.backward()
    assert x.grad.shape == (3, 10)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), atol=1e-6, rtol=1e-5)


def test_jit_with_repeated_values_and_kept_tensors(device):
    """A value repeated across calls while a tensor of an earlier call is alive: each call's kernels read
    that call's value (the graph is hash-consed; a node of call 1 must not carry call 1's value buffer
    into the capture)."""
    kc = Tensor(K[0, 0], device=device).realize()
    kept = []

    @TinyJit
    def f(q, p):
        k = kc[:p]
        kept.append(k)
        return (q @ k.T).softmax(-1).realize()

    q = Q[0, 0]
    for pos in [3, 3, 3, 5, 2, MAX, 3]:
        out = f(Tensor(q, device=device), Variable("pos", 1, MAX).bind(pos))
        s = q @ K[0, 0, :pos].T
        e = np.exp(s - s.max())
        np.testing.assert_allclose(out.numpy(), e / e.sum(), atol=1e-6, rtol=1e-5)
    assert kept[0].shape[0].val == 3 and kept[-1].shape[0].val == 3
    if not get_runtime(device).evaluates_graphs:
        assert f.captures == 1
