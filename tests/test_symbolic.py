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
    with pytest.raises(ShapeError, match="variables 'i'"):
        x.shape[1] // 2


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
    with pytest.raises(ShapeError, match="flip of the axis 1"):
        x.flip(1)
    with pytest.raises(ShapeError, match="merges or splits"):
        Tensor.ones(2, v, device=device).reshape(v, 2)
    np.testing.assert_allclose(x.reshape(-1).numpy(), A[:, :4].reshape(-1))  # ints: cut to the value first
    with pytest.raises(ShapeError, match="axis 0 .* past the axis' size \\(by 7\\) for variables 'i'"):
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
    for op in (lambda: x.unfold(1, 2, 1), lambda: x.chunk(2, 1), lambda: x.topk(2, 1), lambda: x.repeat(1, 2),
               lambda: x.pad((None, (1, 1)), mode="reflect"), lambda: x.pad((None, (0, -1)))):
        with pytest.raises(ShapeError, match="variable 'i'|variables 'i'|extent is the variable <i"):
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


# ---------------------------------------------------------------------------------------------------
# expressions of variables (v + 2, 10 - v, v1 + v2): extents of slices, pads, cats, aranges, KV caches


def test_expression_arithmetic_and_values():
    v = Variable("i", 1, 10).bind(4)
    w = Variable("j", 2, 5).bind(3)
    for e, val, lo, hi in ((v + 2, 6, 3, 12), (2 + v, 6, 3, 12), (v - 1, 3, 0, 9), (10 - v, 6, 0, 9),
                           (v * 2, 8, 2, 20), (3 * v, 12, 3, 30), (v + w, 7, 3, 15), (v - w, 1, -4, 8),
                           (-v, -4, -10, -1), (2 * (v + 1) - w, 7, -1, 20)):
        assert (int(e), e.min, e.max) == (val, lo, hi)
        assert bool(e) == (val != 0) and e.val == val and float(e) == float(val)
    assert (v + 2) - v == 2 and isinstance((v + 2) - v, int) and v + 0 is v and (v + w) - w is v
    assert v + 2 == 2 + v and v + 2 != v + 3 and v + w == w + v and hash(v + 2) == hash(2 + v)
    assert v + 2 != Variable("i", 1, 10).bind(5) + 2  # (the same expression, another value)
    assert range(10)[v] == 4 and [0] * (v + 1) == [0] * 5
    # comparisons the ranges decide, else the values (outside TinyJit)
    assert (v + 1 > 1) is True and (v < 11) is True and (v >= 11) is False and (v < 5) is True
    assert (v < 4) is False and (v <= w + 1) is True and max(v, 7) == 7
    for bad in (lambda: v // 2, lambda: v % 3, lambda: v / 2, lambda: 8 // v, lambda: v * w, lambda: v + 0.5):
        with pytest.raises(ShapeError, match="'i'"):
            bad()
    with pytest.raises(ShapeError, match="variable 'i' is bound to two values \\(4 and 5\\)"):
        _ = v + Variable("i", 1, 10).bind(5)

    @TinyJit
    def reads(t, p):
        return (t + int(p + 1)).realize()

    @TinyJit
    def compares(t, p):
        return (t + 1).realize() if p + 1 < 6 else t.realize()

    @TinyJit
    def truth(t, p):  # (bool(p - 1): 0 is in its range, so its value decides)
        return (t + 1).realize() if p - 1 else t.realize()

    with pytest.raises(JitError, match="value of <i \\+ 1=5> \\(variables 'i'\\) was read inside a TinyJit"):
        reads(Tensor([1.0]), v)
    with pytest.raises(JitError, match="depends on the values of variables 'i'"):
        compares(Tensor([1.0]), v)
    with pytest.raises(JitError, match="value of <i - 1=3> \\(variables 'i'\\) was read"):
        truth(Tensor([1.0]), v)
    decided = TinyJit(lambda t, p: (t + 1).realize() if p and p + 1 > 1 else t)  # (the ranges decide)
    np.testing.assert_array_equal(decided(Tensor([1.0]), v).numpy(), [2.0])


@pytest.mark.parametrize("n", [1, 4, 8])
def test_expression_ops_match_numpy(device, n):
    v = Variable("i", 1, 8).bind(n)
    a = Tensor(A, device=device)
    x = a[:, :v]
    tol = dict(atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(a.shrink(((1, 3), (v, v + 2))).numpy(), A[1:3, n:n + 2])
    np.testing.assert_array_equal(a[1:3, v:v + 2].numpy(), A[1:3, n:n + 2])
    np.testing.assert_array_equal(a[:, v - 1:v + 1].numpy(), A[:, n - 1:n + 1])
    assert a[:, v:].shape == (3, 10 - v) and a[:, 2:v + 2].shape == (3, v)
    np.testing.assert_array_equal(a[:, v:].numpy(), A[:, n:])
    np.testing.assert_allclose(a[:, 2:v + 2].sum(1).numpy(), A[:, 2:n + 2].sum(1), **tol)
    np.testing.assert_array_equal(a.T[v:v + 2].numpy(), A.T[n:n + 2])
    padded = x.pad((None, (0, 10 - v)))
    assert padded.shape == (3, 10)
    np.testing.assert_array_equal(padded.numpy(), np.pad(A[:, :n], ((0, 0), (0, 10 - n))))
    np.testing.assert_array_equal(x.pad((0, 2, 1, 0), value=-1.5).numpy(),
                                  np.pad(A[:, :n], ((1, 0), (0, 2)), constant_values=-1.5))
    np.testing.assert_array_equal(x.pad((None, (v, 1))).numpy(), np.pad(A[:, :n], ((0, 0), (n, 1))))
    np.testing.assert_array_equal(Tensor.ones(2, device=device).pad(((v, 10 - v),)).numpy(),
                                  np.pad(np.ones(2), (n, 10 - n)))
    b = Tensor(A[:, :2] + 100, device=device)
    for got, want in ((x.cat(b, dim=1), np.concatenate([A[:, :n], A[:, :2] + 100], 1)),
                      (b.cat(x, dim=1), np.concatenate([A[:, :2] + 100, A[:, :n]], 1)),
                      (x.cat(x, x, dim=1), np.concatenate([A[:, :n]] * 3, 1)),
                      (a.T[:v].cat(b.T, dim=0), np.concatenate([A.T[:n], A[:, :2].T + 100], 0))):
        np.testing.assert_array_equal(got.numpy(), want)
    assert x.cat(b, dim=1).shape == (3, v + 2) and x.cat(x, x, dim=1).shape == (3, 3 * v)
    w = Variable("j", 2, 5).bind(3)
    two = x.cat(a[:, :w], dim=1)
    assert two.shape == (3, v + w)
    np.testing.assert_array_equal(two.numpy(), np.concatenate([A[:, :n], A[:, :3]], 1))
    np.testing.assert_allclose(two.sum(1).numpy(), A[:, :n].sum(1) + A[:, :3].sum(1), **tol)
    np.testing.assert_allclose(two.softmax(1).numpy()[:, :1], (np.exp(A[:, :1]) / np.concatenate(
        [np.exp(A[:, :n]), np.exp(A[:, :3])], 1).sum(1, keepdims=True)), **tol)
    bool_cat = (x > 0).cat(b > 100.5, dim=1)
    np.testing.assert_array_equal(bool_cat.numpy(), np.concatenate([A[:, :n] > 0, A[:, :2] > 0.5], 1))
    np.testing.assert_array_equal(Tensor.arange(v, v + 3, device=device).numpy(), np.arange(n, n + 3))
    np.testing.assert_array_equal(Tensor.arange(2, v + 2, device=device).numpy(), np.arange(2, n + 2))
    np.testing.assert_array_equal(Tensor.arange(v, 0, -1, device=device).numpy(), np.arange(n, 0, -1))
    np.testing.assert_array_equal(Tensor.arange(v + 1, dtype="float32", device=device).numpy(),
                                  np.arange(n + 1, dtype=np.float32))
    np.testing.assert_array_equal(x.argmax(1).numpy(), A[:, :n].argmax(1))
    np.testing.assert_allclose(x.cumsum(1).numpy(), A[:, :n].cumsum(1), **tol)
    np.testing.assert_array_equal(x.sort(1)[0].numpy(), np.sort(A[:, :n], 1))
    # the causal mask of a decode step at position v over v + 2 keys (LLaMA's / GPT-2's)
    mask = Tensor.full((1, 2, v + 2), float("-inf"), device=device).triu(v + 1)
    assert mask.shape == (1, 2, v + 2)
    np.testing.assert_array_equal(mask.numpy(), np.triu(np.full((1, 2, n + 2), -np.inf), n + 1))
    cols = Tensor.arange(v + 2, device=device).reshape(1, v + 2)
    keep = cols <= Tensor.arange(v, v + 2, device=device)[:, None]
    np.testing.assert_array_equal(keep.numpy(), np.arange(n + 2)[None] <= np.arange(n, n + 2)[:, None])
    np.testing.assert_array_equal(Tensor.ones(2, v * 2, device=device).reshape(1, 2, v * 2).sum(2).numpy(),
                                  np.full((1, 2), 2 * n))
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(a[:, v - 1:].mean(1).numpy(), A[:, n - 1:].mean(1), **tol)
        np.testing.assert_allclose(a[:, v - 1:].var(1).numpy(), A[:, n - 1:].var(1, ddof=1), **tol)
    np.testing.assert_array_equal(a.T[:v].bitcast("uint8").numpy(), A.T[:n].copy().view(np.uint8))
    np.testing.assert_array_equal(x.bitcast("int16").numpy(), A[:, :n].copy().view(np.int16))


@pytest.mark.parametrize("n", [1, 6])
def test_gradient_through_expressions_matches_torch(device, n):
    import torch

    v = Variable("i", 1, 8).bind(n)
    x = Tensor(A, device=device, requires_grad=True)
    y = x[:, v:v + 2].cat(x[:, :v], dim=1).pad((None, (1, 8 - v))).softmax(1)
    loss = (y * Tensor.arange(11, device=device).float()).sum()
    loss.backward()
    t = torch.tensor(A, requires_grad=True)
    ty = torch.nn.functional.pad(torch.cat([t[:, n:n + 2], t[:, :n]], 1), (1, 8 - n)).softmax(1)
    (ty * torch.arange(11).float()).sum().backward()
    assert y.shape == (3, 11)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), atol=1e-5, rtol=1e-5)


def test_expression_errors_name_the_variable(device):
    v = Variable("i", 1, 10).bind(4)
    a = Tensor(A, device=device)
    x = a[:, :v]
    with pytest.raises(ShapeError, match="axis 1 .* past the axis' size \\(by 2\\) for variables 'i'"):
        a[:, v:v + 2]  # (i = 9 would read past the 10 columns)
    with pytest.raises(ShapeError, match="shrink: axis 1 .* can be negative \\(-1\\) for variables 'i'"):
        a[:, v - 2:v]
    with pytest.raises(ShapeError, match="shrink: axis 1 .* end can be before the start .* 'i'"):
        a.shrink((None, (v, 5)))
    with pytest.raises(ShapeError, match="axis 1 .* past the axis' size \\(by 1\\) for variables 'i'"):
        x[:, 1:v + 1]
    with pytest.raises(ShapeError, match="a slice with a variable \\('i'\\) takes step 1"):
        a[:, v:v + 2:2]
    with pytest.raises(ShapeError, match="pad: the padding <-i \\+ 8=4> after axis 1 .*down to -2.*'i'"):
        x.pad((None, (0, 8 - v)))
    with pytest.raises(ShapeError, match="arange\\(<i.*>, 5\\): the stop can be below the start .* 'i'"):
        Tensor.arange(v, 5, device=device)
    with pytest.raises(ArgumentError, match="step must be 1 or -1"):
        Tensor.arange(0, v, 2, device=device)
    with pytest.raises(ShapeError, match="extent <i - 1=3> of axis 0 can be negative|can be negative"):
        Tensor.ones(v - 2, device=device)
    with pytest.raises(ShapeError, match="cannot broadcast"):
        _ = x.cat(a[:, :2], dim=1) + x.cat(a[:, :3], dim=1)
    with pytest.raises(ShapeError, match="differ outside dim"):
        x.cat(a[:2, :v], dim=1)


def test_kv_cache_window_writes_one_capture(device):
    """GPT-2's decode: `cache[:, start:start+n].assign(x)` and attention over `cache[:, :start+n]` with a
    causal mask built from the variable; one capture serves every start: the same kernels, nothing
    compiled after it, the cache matching numpy's after each call."""
    b, d, seq = 2, 4, 2
    cache = Tensor.zeros(b, MAX, d, device=device).contiguous().realize()
    want_cache = np.zeros((b, MAX, d), np.float32)

    @TinyJit
    def step(x, start):
        cache[:, start:start + seq].assign(x).realize()
        keys = cache[:, :start + seq]
        mask = Tensor.full((1, seq, start + seq), float("-inf"), device=device).triu(start + 1)
        return ((x @ keys.transpose(1, 2)) + mask).softmax(-1).realize()

    names, graphs = None, not get_runtime(device).evaluates_graphs
    for pos in [0, 1, 2, 5, MAX - seq, 3, 7]:
        x = RNG.standard_normal((b, seq, d)).astype(np.float32)
        start = Variable("start", 0, MAX - seq).bind(pos)
        xt = Tensor(x, device=device).realize()
        before = compiled(device)
        out = step(xt, start)
        if graphs and step.replays:  # (a replay: the captured kernels, none compiled; reading out, cut
            assert step.kernel_names == names and compiled(device) == before  # to the value, may compile)
        want_cache[:, pos:pos + seq] = x
        causal = np.triu(np.full((seq, pos + seq), -np.inf), pos + 1)
        s = x @ want_cache[:, :pos + seq].transpose(0, 2, 1) + causal
        e = np.exp(s - s.max(-1, keepdims=True))
        assert out.shape == (b, seq, start + seq)
        np.testing.assert_allclose(out.numpy(), e / e.sum(-1, keepdims=True), atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(cache.numpy(), want_cache)
        names = step.kernel_names
    late = Variable("start", 0, MAX - 1).bind(3)  # (start = MAX - 1 would write past the cache)
    with pytest.raises(ShapeError, match="past the axis' size \\(by 1\\) for variables 'start'"):
        cache[:, late:late + seq].assign(Tensor(x, device=device))
    assert not graphs or step.captures == 1 and step.replays >= 4


def test_expressions_one_capture(device):
    """pad to a number, cat along a variable axis (one variable and two), a window of variable start, an
    arange from a variable: one capture each, for every value."""
    a = Tensor(A, device=device).realize()
    b = Tensor(A[:, :2] + 100, device=device).realize()
    pad_to = TinyJit(lambda x: (x + 1).pad((None, (0, 10 - x.shape[1]))).realize())
    cat1 = TinyJit(lambda x, y: x.cat(y, dim=1).realize())
    cat2 = TinyJit(lambda x, y: (x.cat(y, dim=1) * 2).sum(1).realize())
    window = TinyJit(lambda x, p: (x[:, p:p + 2] + Tensor.arange(p, p + 2, device=device)).realize())
    fns = (pad_to, cat1, cat2, window)
    for i, j in [(1, 2), (4, 3), (10, 2), (2, 5), (7, 4)]:
        vi, vj = Variable("i", 1, 10).bind(i), Variable("j", 2, 5).bind(j)
        np.testing.assert_array_equal(pad_to(a[:, :vi]).numpy(), np.pad(A[:, :i] + 1, ((0, 0), (0, 10 - i))))
        out = cat1(a[:, :vi], b)
        assert out.shape == (3, vi + 2)
        np.testing.assert_array_equal(out.numpy(), np.hstack([A[:, :i], A[:, :2] + 100]))
        want = 2 * (A[:, :i].sum(1) + A[:, :j].sum(1))
        np.testing.assert_allclose(cat2(a[:, :vi], a[:, :vj]).numpy(), want, atol=1e-5, rtol=1e-5)
        k = min(i, 8)
        np.testing.assert_array_equal(window(a, Variable("p", 0, 8).bind(k)).numpy(),
                                      A[:, k:k + 2] + np.arange(k, k + 2, dtype=np.float32))
    if not get_runtime(device).evaluates_graphs:
        assert all(f.captures == 1 for f in fns)


def test_window_keeps_special_values_and_writes_through_views(device):
    """A window of variable start (a one-hot sum) gives each element as it is: NaN, infinities, -0.0,
    ints, bools; assign() into a view of a window, or a window of a view, writes the cache."""
    special = np.array([[np.nan, -0.0, np.inf, 1.5, -np.inf, 2.0]], np.float32)
    ints = np.arange(12, dtype=np.int32).reshape(2, 6) - 5
    for p in range(5):
        v = Variable("p", 0, 4).bind(p)
        got = Tensor(special, device=device)[:, v:v + 2].numpy()
        np.testing.assert_array_equal(got, special[:, p:p + 2])
        assert np.signbit(got).tolist() == np.signbit(special[:, p:p + 2]).tolist()
        np.testing.assert_array_equal(Tensor(ints, device=device)[:, v:v + 2].numpy(), ints[:, p:p + 2])
        positive = Tensor(ints > 0, device=device)
        np.testing.assert_array_equal(positive[:, v:v + 2].numpy(), ints[:, p:p + 2] > 0)
    v = Variable("p", 0, 6).bind(3)
    cache = Tensor.zeros(2, 8, 3, device=device).contiguous().realize()
    want = np.zeros((2, 8, 3), np.float32)
    cache[:, v:v + 2][0].assign(Tensor.ones(2, 3, device=device))
    want[0, 3:5] = 1
    np.testing.assert_array_equal(cache.numpy(), want)
    cache[1][v:v + 2].assign(Tensor.full((2, 3), 5.0, device=device))
    want[1, 3:5] = 5
    np.testing.assert_array_equal(cache.numpy(), want)
    with pytest.raises(ShapeError, match="assign: shape \\(2, 3, 3\\) does not match the window"):
        cache[:, v:v + 2].assign(Tensor.ones(2, 3, 3, device=device))
    with pytest.raises(ShapeError, match="variable start beside ints or None"):
        cache[1, v:v + 2]


def test_shrink_then_cat_cache_one_capture(device):
    """LLaMA's older decode: keys = cache.shrink(past).cat(new) (extent start + 1, start from 0), the
    cache rebuilt by a pad by MAX - start - 1 (a number again); one capture, nothing compiled after it."""
    d = 3
    cache = Tensor.zeros(1, MAX, d, device=device).contiguous().realize()
    want_cache = np.zeros((1, MAX, d), np.float32)

    @TinyJit
    def step(xk, start):
        keys = cache.shrink((None, (0, start), None)).cat(xk, dim=1)
        cache.assign(keys.pad((None, (0, MAX - start - 1), None)).contiguous())
        return (xk @ keys.transpose(1, 2)).softmax(-1).realize(), cache.realize()

    graphs = not get_runtime(device).evaluates_graphs
    for pos in [0, 1, 2, 9, MAX - 1, 4]:
        xk = RNG.standard_normal((1, 1, d)).astype(np.float32)
        start = Variable("start", 0, MAX - 1).bind(pos)
        xt = Tensor(xk, device=device).realize()
        before = compiled(device)
        out, _ = step(xt, start)
        if graphs and step.replays:
            assert compiled(device) == before
        keys = np.concatenate([want_cache[:, :pos], xk], 1)
        s = xk @ keys.transpose(0, 2, 1)
        e = np.exp(s - s.max(-1, keepdims=True))
        assert out.shape == (1, 1, start + 1)
        np.testing.assert_allclose(out.numpy(), e / e.sum(-1, keepdims=True), atol=1e-6, rtol=1e-5)
        want_cache[:] = 0
        want_cache[:, :pos + 1] = keys
        np.testing.assert_allclose(cache.numpy(), want_cache)
    assert not graphs or step.captures == 1 and step.replays >= 3
