"""Convolutions whose windows (im2col) are big run on the CPU as matmuls over pieces of images
(blas.Chunk, runtime/cpu/blas.py `_run_pieces`): each piece copies only its own windows, on threads with a
one-thread BLAS each. Forward and both gradients against PyTorch, for the layouts the pieces meet."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers import cpu_pair, cpu_plan
from tgrad import Tensor, blas, fuse
from tgrad.device import get_runtime
from tgrad.opt import HostTuning, host
from tgrad.runtime.cpu import blas as cpu_blas
from tgrad.runtime.cpu import gemm as cpu_gemm

# (these tests read which kernels gradient graphs become: backward() leaves them lazy)
pytestmark = pytest.mark.usefixtures("lazy_backward")


@pytest.fixture(autouse=True, params=["1", "0"], ids=["native", "numpy"])
def native(request, monkeypatch, cpu_tuning):
    """Every test here runs both ways: pieces as cpu_gemm's compiled functions calling BLAS (where numpy's
    BLAS has the ILP64 gemm they call) and as numpy calls on Python threads."""
    monkeypatch.setenv("TGRAD_NATIVE_GEMM", request.param)
    cpu_tuning(native_pieces=request.param == "1" and cpu_gemm.available())
    return request.param


def _plans(nodes):
    return [p for p in (cpu_plan(it.kernel) for it in fuse.schedule(nodes)) if p is not None]


CASES = [  # (N, Cin, H, W), (Cout, k, k), stride, padding, dilation, groups: windows to cut in pieces
    ((8, 16, 24, 24), (8, 5, 5), 1, 0, 1, 1),
    ((5, 32, 64, 61), (8, 3, 3), 2, 1, 1, 1),  # odd batch: pieces of one image
    ((4, 32, 40, 40), (12, 3, 3), 1, 2, 2, 1),
    ((8, 32, 24, 24), (16, 3, 3), 1, 1, 1, 2),
    ((8, 16, 40, 40), (8, (5, 3)), (1, 2), (2, 1), (1, 2), 1),
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_conv_in_pieces_matches_torch(case, threads, native, monkeypatch):
    """As cpu_gemm's compiled function calling BLAS on the native workers (where numpy's BLAS has what it
    calls: pieces of rows in the output's order, put in order from a buffer, or pieces of K summed per
    slot) and as numpy calls on Python threads."""
    monkeypatch.setenv("TGRAD_THREADS", threads)
    ran = []
    for name in ("pieces_spec", "shifted_spec"):
        real = getattr(cpu_gemm, name)
        monkeypatch.setattr(cpu_gemm, name, lambda *a, real=real: ran.append(real(*a)) or ran[-1])
    shape, (cout, *ks), stride, padding, dilation, groups = case
    ks = tuple(ks[0]) if isinstance(ks[0], tuple) else tuple(ks)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    w = (rng.standard_normal((cout, shape[1] // groups, *ks)) * 0.2).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    tx, tw, tb = (Tensor(a, device="CPU", requires_grad=True) for a in (x, w, b))
    out = tx.conv2d(tw, tb, stride=stride, padding=padding, dilation=dilation, groups=groups)
    loss = (out.relu() * out).sum()
    loss.backward()
    plans = _plans([out.node, tw.grad.node, tx.grad.node])
    pieces = [p.chunk for p in plans if p.chunk is not None]
    # the forward (images, or channels for case1's 5 big images) and the weight's gradient (images in K)
    assert len(pieces) >= 2 and any(c.axis > 0 for c in pieces), plans
    rx, rw, rb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ref = torch.nn.functional.conv2d(rx, rw, rb, stride=stride, padding=padding, dilation=dilation,
                                     groups=groups)
    (ref.relu() * ref).sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(tw.grad.numpy(), rw.grad.numpy(), rtol=1e-4, atol=2e-3)
    np.testing.assert_allclose(tb.grad.numpy(), rb.grad.numpy(), rtol=1e-4, atol=2e-3)
    np.testing.assert_allclose(tx.grad.numpy(), rx.grad.numpy(), rtol=1e-4, atol=2e-3)
    native_ran = [r for r in ran if r is not None]
    if native == "1" and cpu_gemm.available():
        assert native_ran or case == CASES[3], ran  # (case 3's grouped windows are batched matmuls)
    else:
        assert not native_ran


def test_conv1d_and_conv3d_in_pieces_match_torch():
    rng = np.random.default_rng(4)
    for xs, ws, fn in [((8, 32, 4000), (16, 32, 9), torch.nn.functional.conv1d),
                       ((2, 8, 16, 16, 16), (8, 8, 3, 3, 3), torch.nn.functional.conv3d)]:
        x, w = rng.standard_normal(xs).astype(np.float32), (rng.standard_normal(ws) * 0.2).astype(np.float32)
        tx, tw = Tensor(x, device="CPU", requires_grad=True), Tensor(w, device="CPU", requires_grad=True)
        out = tx.conv2d(tw, padding=1)
        (out * out).sum().backward()
        assert any(p.chunk is not None for p in _plans([out.node])), xs
        rx, rw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
        ref = fn(rx, rw, padding=1)
        (ref * ref).sum().backward()
        np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(tw.grad.numpy(), rw.grad.numpy(), rtol=1e-3, atol=1e-2)
        np.testing.assert_allclose(tx.grad.numpy(), rx.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_float64_conv_in_pieces():
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((8, 16, 24, 24)), rng.standard_normal((8, 16, 5, 5))
    tx, tw = Tensor(x, device="CPU", requires_grad=True), Tensor(w, device="CPU", requires_grad=True)
    out = tx.conv2d(tw)
    out.sum().backward()
    assert out.dtype.name == "float64" and any(p.chunk is not None for p in _plans([out.node]))
    rx, rw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ref = torch.nn.functional.conv2d(rx, rw)
    ref.sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(tw.grad.numpy(), rw.grad.numpy(), rtol=1e-10, atol=1e-9)


def test_small_convs_keep_one_matmul():
    """Below opt.host.conv_pieces's size of windows nothing is cut (the windows are kept for the weight's
    gradient, as before)."""
    x = Tensor(np.ones((2, 4, 10, 10), np.float32), device="CPU")
    w = Tensor(np.ones((4, 4, 3, 3), np.float32), device="CPU", requires_grad=True)
    out = x.conv2d(w)
    out.sum().backward()
    assert all(p.chunk is None for p in _plans([out.node, w.grad.node]))
    assert np.all(out.numpy() == 36.0) and np.all(w.grad.numpy() == 2 * 64)


def test_chunk_choice(cpu_tuning):
    """The piece axis is one every copied operand indexes, and a piece's copies fit opt.host.chunk_elems
    (without compiled pieces, which take one image a piece: the next test)."""
    cpu_tuning(native_pieces=False)
    x = Tensor(np.zeros((128, 32, 24, 24), np.float32), device="CPU")
    w = Tensor(np.zeros((32, 32, 5, 5), np.float32), device="CPU", requires_grad=True)
    out = x.conv2d(w)
    (out * Tensor(np.ones(out.shape, np.float32), device="CPU")).sum().backward()
    fwd = _plans([out.node])[-1]
    # 800 x 400 windows per image: one image a piece; the kernel row (axis 5) and the output row (2) read
    # the same image row: each piece copies the rows once and shifts them (blas._shift_pair)
    assert fwd.chunk == blas.Chunk(0, 1, (5, 2))
    grad = [p for p in _plans([w.grad.node]) if p.chunk is not None and p.chunk.axis == 4]
    # (o, c, kh, kw | n, oh, ow): images are K
    assert grad and grad[0].chunk == blas.Chunk(4, 1, (2, 5)), grad
    x1 = Tensor(np.zeros((128, 2, 28, 28), np.float32), device="CPU")
    out1 = x1.conv2d(Tensor(np.zeros((32, 2, 5, 5), np.float32), device="CPU"))
    per_image = 50 * 24 * 24
    elems = host.chunk_elems(get_runtime("CPU").props)
    size = max(d for d in range(1, 129) if 128 % d == 0 and d * per_image <= elems)
    assert _plans([out1.node])[-1].chunk == blas.Chunk(0, size)


SHIFTED = [  # (N, Cin, H, W), (Cout, kh, kw), stride, padding, dilation, dtype: one image's windows a piece
    ((6, 16, 28, 28), (8, 5, 5), 1, 0, 1, np.float32),
    ((4, 16, 30, 26), (12, 5, 3), 1, 2, 1, np.float32),  # padded (a computed input), rectangular
    ((4, 16, 36, 40), (8, 3, 5), (1, 2), (1, 2), (1, 2), np.float32),  # strided and dilated along W only
    ((3, 8, 40, 40), (4, 7, 7), 1, 3, 1, np.float64),
]


@pytest.mark.parametrize("case", SHIFTED, ids=[f"case{i}" for i in range(len(SHIFTED))])
@pytest.mark.parametrize("threads", ["1", "3"])
def test_shifted_pieces_match_torch(case, threads, native, monkeypatch, cpu_tuning):
    """A stride-1 (along H) conv whose pieces copy each image row once and shift it per kernel row (forward:
    products summed; weight gradient: one slice of the result per kernel row): values and gradients as
    PyTorch's, nan and inf included, on 1 and 3 threads; as cpu_gemm's compiled function calling BLAS
    (where numpy's BLAS has the ILP64 gemm it calls) and as numpy calls. (Forwards like these run as
    direct convolutions, tests/test_direct_conv.py; BLAS takes them here, as it takes those that path
    does not.)"""
    # no direct convolutions; a core cache that holds one image's windows (<= 230K elements here), so the
    # pieces are single images (with the suite's 1 MiB, two input channels a piece: no shift)
    cpu_tuning(direct_min_channels=1 << 30, cache_bytes=2 << 20)
    monkeypatch.setenv("TGRAD_THREADS", threads)
    ran = []
    real = cpu_gemm.shifted_spec
    monkeypatch.setattr(cpu_gemm, "shifted_spec", lambda *a: ran.append(real(*a)) or ran[-1])
    shape, (cout, kh, kw), stride, padding, dilation, dt = case
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(dt)
    x[0, 0, 3, 4], x[1, -1, 7, 2], x[-1, 1, -1, -1] = np.nan, np.inf, -np.inf  # as PyTorch propagates them
    w = (rng.standard_normal((cout, shape[1], kh, kw)) * 0.2).astype(dt)
    tx, tw = (Tensor(a, device="CPU", requires_grad=True) for a in (x, w))
    out = tx.conv2d(tw, stride=stride, padding=padding, dilation=dilation)
    (out.relu() * out).sum().backward()
    shifts = [p.chunk.shift for p in _plans([out.node, tw.grad.node]) if p.chunk is not None]
    assert len([s for s in shifts if s is not None]) == 2, shifts  # the forward and the weight gradient
    rx, rw = (torch.tensor(a, requires_grad=True) for a in (x, w))
    ref = torch.nn.functional.conv2d(rx, rw, stride=stride, padding=padding, dilation=dilation)
    (ref.relu() * ref).sum().backward()
    tol = 1e-10 if dt == np.float64 else 1e-4
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(tw.grad.numpy(), rw.grad.numpy(), rtol=tol, atol=tol * 20)
    np.testing.assert_allclose(tx.grad.numpy(), rx.grad.numpy(), rtol=tol, atol=tol * 20)
    # the forward and the weight gradient each ran natively (only when asked to, and where it can)
    assert len([r for r in ran if r is not None]) == (2 if native == "1" and cpu_gemm.available() else 0), ran


@pytest.mark.parametrize("stride,dilation", [(2, 1), (1, 2), ((2, 1), 1)])
def test_no_shift_where_rows_advance_differently(stride, dilation):
    """A stride or dilation along H makes the kernel row and the output row advance by different strides:
    no shift (each piece copies every window), and the same values as PyTorch."""
    rng = np.random.default_rng(8)
    x, w = rng.standard_normal((3, 16, 48, 48)).astype(np.float32), rng.standard_normal((8, 16, 5, 5))
    w = (w * 0.2).astype(np.float32)
    tx, tw = (Tensor(a, device="CPU", requires_grad=True) for a in (x, w))
    out = tx.conv2d(tw, stride=stride, dilation=dilation)
    out.square().sum().backward()
    chunks = [p.chunk for p in _plans([out.node, tw.grad.node]) if p.chunk is not None]
    assert chunks and all(c.shift is None for c in chunks), chunks
    rx, rw = (torch.tensor(a, requires_grad=True) for a in (x, w))
    ref = torch.nn.functional.conv2d(rx, rw, stride=stride, dilation=dilation)
    ref.square().sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(tw.grad.numpy(), rw.grad.numpy(), rtol=1e-4, atol=2e-3)


def test_openblas_thread_count_is_restored_after_pieces():
    """openblas_set_num_threads_local also sets OpenBLAS's global count: the pieces' threads set it to 1,
    and without setting it back every later matmul of the main thread ran on one core."""
    blas_threads = cpu_blas._BlasThreads()
    if not blas_threads.local:
        pytest.skip("numpy's BLAS has no openblas_set_num_threads_local")
    saved = blas_threads.get()
    blas_threads.restore([2] * len(saved))  # a known count, whatever ran before
    try:
        x = Tensor(np.ones((16, 16, 24, 24), np.float32), device="CPU")
        w = Tensor(np.ones((8, 16, 5, 5), np.float32), device="CPU")
        assert any(p.chunk is not None for p in _plans([x.conv2d(w).node]))
        assert np.all(x.conv2d(w).numpy() == 400.0)
        assert blas_threads.get() == [2] * len(saved)
    finally:
        blas_threads.restore(saved)


def _pairs(nodes):
    """(k1, k2) names of consecutive scheduled kernels that the CPU runs as a piece pair."""
    items = fuse.schedule(nodes)
    found = []
    for a, b in zip(items, items[1:]):
        reads = tuple(j for j, n in enumerate(b.inputs) if n is a.out)
        if reads and cpu_pair(a.kernel, b.kernel, reads) is not None:
            found.append((a.kernel.name, b.kernel.name))
    return found


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
@pytest.mark.parametrize("threads", ["1", "2"])
def test_conv_input_gradient_as_a_piece_pair(case, threads, native, monkeypatch, cpu_tuning):
    """The col2im matmul and the sum that shifts its shares into place run image by image (a piece pair:
    the sum reads each image's shares while they are in cache); the input's gradient against PyTorch,
    with the relu of the layer below fused into the sum. (Pairs start at pair_min_result elements of
    window shares: lowered so that these small convs pair.) Natively: cpu_gemm's pair_pieces calls the
    sum's compiled function after each piece's gemm. (The direct input gradient that takes such pairs
    where it can is turned off here: tests/test_direct_conv.py tests it.)"""
    monkeypatch.setenv("TGRAD_THREADS", threads)
    cpu_tuning(scatter_max_taps=0, pair_min_result=1 << 16)  # no direct input gradients
    ran = []
    real = cpu_gemm.pair_words
    monkeypatch.setattr(cpu_gemm, "pair_words", lambda *a: ran.append(real(*a)) or ran[-1])
    cpu_tuning(pair_min_result=1 << 16)
    shape, (cout, *ks), stride, padding, dilation, groups = case
    ks = tuple(ks[0]) if isinstance(ks[0], tuple) else tuple(ks)
    rng = np.random.default_rng(8)
    x = rng.standard_normal(shape).astype(np.float32)
    w = (rng.standard_normal((cout, shape[1] // groups, *ks)) * 0.2).astype(np.float32)
    tx = Tensor(x, device="CPU", requires_grad=True)
    out = tx.relu().conv2d(Tensor(w, device="CPU"), stride=stride, padding=padding, dilation=dilation,
                           groups=groups)
    (out * out).sum().backward()
    # (a grouped conv's col2im matmul has the groups as its axis 0, not the images: not paired)
    names = [it.kernel.name for it in fuse.schedule([tx.grad.node])]
    assert bool(_pairs([tx.grad.node])) == (groups == 1), names
    rx = torch.tensor(x, requires_grad=True)
    ref = torch.nn.functional.conv2d(rx.relu(), torch.tensor(w), stride=stride, padding=padding,
                                     dilation=dilation, groups=groups)
    (ref * ref).sum().backward()
    np.testing.assert_allclose(tx.grad.numpy(), rx.grad.numpy(), rtol=1e-4, atol=2e-3)
    pairs_ran = [r for r in ran if r is not None]
    assert bool(pairs_ran) == (groups == 1 and native == "1" and cpu_gemm.available()), ran


def test_piece_pair_refuses_reads_of_other_images(monkeypatch, cpu_tuning):
    """A kernel after a batched matmul that reads the next image's result, or picks images by number,
    is not run piece by piece (its piece would read rows not computed yet); values as numpy's."""
    cpu_tuning(pair_min_result=1 << 16)
    rng = np.random.default_rng(9)
    a = rng.standard_normal((16, 200, 64)).astype(np.float32)
    b = rng.standard_normal((64, 300)).astype(np.float32)
    ref = a @ b
    ta, tb = Tensor(a, device="CPU"), Tensor(b, device="CPU")
    for make, want in [
        (lambda y: y[1:] + y[:-1], ref[1:] + ref[:-1]),
        (lambda y: y.flip(0) * 2, ref[::-1] * 2),
        (lambda y: (Tensor.arange(16, device="CPU").reshape(16, 1, 1) < 5).where(y, 0.0) + 1, None),
    ]:
        z = make(ta @ tb)
        assert not _pairs([z.node]), [it.kernel.name for it in fuse.schedule([z.node])]
        if want is None:
            want = np.where(np.arange(16).reshape(16, 1, 1) < 5, ref, 0.0) + 1
        np.testing.assert_allclose(z.numpy(), want, rtol=1e-4, atol=1e-3)
    z = (ta @ tb) * 3 + 1  # the same image: fused as the matmul's epilogue, not a pair
    np.testing.assert_allclose(z.numpy(), ref * 3 + 1, rtol=1e-4, atol=1e-3)


def test_index_range_under_a_mask():
    from tgrad.fuse import IDX_DT, Expr, const, iadd, iless, imul

    i1 = Expr("IDX", (), (1, 10), IDX_DT)
    index = iadd(imul(i1, 4), const(-8, IDX_DT))  # 4 * i1 - 8 where i1 >= 2: 0 .. 28
    mask = Expr("CMPLT", (const(1, IDX_DT), i1), None, blas.dtypes.bool)
    assert blas._index_range(index, mask, (5, 10)) == (0, 28)
    assert blas._index_range(index, iless(i1, 0), (5, 10)) == (0, 0)  # nothing read
    # the kernels' integer division truncates toward zero: (i1 - 5) // 2 >= -1 holds for i1 >= 2 there
    # (floor division would say i1 >= 3)
    from tgrad.fuse import idiv

    q = idiv(iadd(i1, const(-5, IDX_DT)), 2)
    trunc_mask = Expr("CMPLT", (const(-2, IDX_DT), q), None, blas.dtypes.bool)
    assert blas._index_range(index, trunc_mask, (5, 10)) == (0, 28)
    odd = Expr("SIN", (index,), None, IDX_DT)
    assert blas._index_range(odd, mask, (5, 10)) == (None, None)


def test_piece_pair_checks_every_read_stays_in_its_image(monkeypatch, cpu_tuning):
    """The conv's pair, with the sum's reads of the shares moved by one element either way (so that an
    image's first or last read falls in the neighbouring image): refused."""
    cpu_tuning(pair_min_result=1 << 16)
    from tgrad.fuse import IDX_DT, Expr, iadd

    x = Tensor(np.ones((8, 16, 24, 24), np.float32), device="CPU", requires_grad=True)
    (x.conv2d(Tensor(np.ones((8, 16, 5, 5), np.float32), device="CPU")) ** 2).sum().backward()
    items = fuse.schedule([x.grad.node])
    k1, k2, reads = next((a.kernel, b.kernel, r) for a, b in zip(items, items[1:])
                         for r in [tuple(j for j, n in enumerate(b.inputs) if n is a.out)]
                         if r and cpu_pair(a.kernel, b.kernel, r) is not None)

    def moved(e, by, memo):
        if e not in memo:
            if e.op == "LOAD" and e.arg in reads:
                memo[e] = Expr("LOAD", (iadd(e.srcs[0], fuse.const(by, IDX_DT)), e.srcs[1]), e.arg, e.dtype)
            elif not e.srcs:
                memo[e] = e
            else:
                memo[e] = Expr(e.op, tuple(moved(s, by, memo) for s in e.srcs), e.arg, e.dtype)
        return memo[e]

    import dataclasses

    for by in (1, -1):
        k2b = dataclasses.replace(k2, expr=moved(k2.expr, by, {}))
        assert cpu_pair(k1, k2b, reads) is None, by


def test_piece_pair_with_a_computed_operand_matches_torch():
    """The conv2d_fwd_bwd bench's graph (32 images: 10M window shares, a pair by default), the second
    weight frozen: the col2im matmul's gradient operand is computed (relu's gradient) by a prologue, made
    whole before the pieces (with the second weight's gradient too, that operand is read by two matmuls
    and computed once, fuse_roots.py); the first weight's gradient against PyTorch. The first conv's
    matmul and its relu (295K elements) are not paired."""
    rng = np.random.default_rng(10)
    x = rng.standard_normal((32, 1, 28, 28)).astype(np.float32)
    w1, w2 = (rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((32, 1, 5, 5), (32, 32, 5, 5)))
    tx = Tensor(x, device="CPU")
    tw1, tw2 = Tensor(w1, device="CPU", requires_grad=True), Tensor(w2, device="CPU")
    loss = tx.conv2d(tw1).relu().conv2d(tw2).relu().sum()
    loss.backward()
    items = fuse.schedule([loss.node, tw1.grad.node])
    paired = [a.kernel for a, b in zip(items, items[1:])
              for r in [tuple(j for j, n in enumerate(b.inputs) if n is a.out)]
              if r and cpu_pair(a.kernel, b.kernel, r) is not None]
    assert len(paired) == 1 and cpu_plan(paired[0]).prologues, [it.kernel.name for it in items]
    rw1 = torch.tensor(w1, requires_grad=True)
    conv = torch.nn.functional.conv2d
    ref = conv(conv(torch.tensor(x), rw1).relu(), torch.tensor(w2)).relu().sum()
    ref.backward()
    np.testing.assert_allclose(loss.numpy(), ref.detach().numpy(), rtol=1e-4)
    np.testing.assert_allclose(tw1.grad.numpy(), rw1.grad.numpy(), rtol=1e-4, atol=1e-2)


def test_a_small_matmul_and_the_kernel_after_it_are_not_a_pair(monkeypatch, cpu_tuning):
    """An MLP layer's matmul and a kernel after it that reads its rows (here flipped, so not an
    epilogue) stay one BLAS call and one kernel: under HostTuning.pair_min_result elements a pair only costs
    a thread hand-off. With the bound lowered they pair, with the same values."""
    rng = np.random.default_rng(12)
    a = rng.standard_normal((128, 784)).astype(np.float32)
    w = rng.standard_normal((784, 128)).astype(np.float32)
    want = a @ w
    want = want * 0.5 + want[:, ::-1]
    for bound, paired, rows in ((HostTuning.pair_min_result, False, 128), (1 << 10, True, 96)):
        # (other shapes with the bound lowered: the runtime remembers each pair of kernels it looked at)
        cpu_tuning(pair_min_result=bound)
        h = Tensor(a[:rows], device="CPU") @ Tensor(w, device="CPU")
        z = h * 0.5 + h.flip(1)
        assert bool(_pairs([z.node])) == paired, [it.kernel.name for it in fuse.schedule([z.node])]
        np.testing.assert_allclose(z.numpy(), want[:rows], rtol=1e-4, atol=1e-3)
        # a pair keeps h in its threads' caches: h is not realized, and reading it computes it again
        assert h.node.base.realized != paired
        np.testing.assert_allclose(h.numpy(), a[:rows] @ w, rtol=1e-4, atol=1e-3)


def test_a_pair_writes_a_result_that_is_read_elsewhere(monkeypatch, cpu_tuning):
    """The first kernel's result of a pair is written whole when the caller reads it too, or a later
    kernel of the schedule does."""
    cpu_tuning(pair_min_result=1 << 10)
    rng = np.random.default_rng(13)
    a = rng.standard_normal((64, 300)).astype(np.float32)
    w = rng.standard_normal((300, 96)).astype(np.float32)
    ref = a @ w
    h = Tensor(a, device="CPU") @ Tensor(w, device="CPU")
    z = h * 0.5 + h.flip(1)
    assert _pairs([z.node])
    Tensor.realize(z, h)
    assert h.node.base.realized
    np.testing.assert_allclose(h.numpy(), ref, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(z.numpy(), ref * 0.5 + ref[:, ::-1], rtol=1e-4, atol=1e-3)
    h = Tensor(a, device="CPU") @ Tensor(w, device="CPU")
    z = h * 0.5 + h.flip(1)
    y = (z + h.exp().sum(1, keepdim=True)).numpy()  # a later kernel reads h
    np.testing.assert_allclose(y, ref * 0.5 + ref[:, ::-1] + np.exp(ref).sum(1, keepdims=True), rtol=1e-4)


def test_jitted_conv_steps_with_pairs_match_torch():
    """TinyJit captures a conv training step whose col2im pair keeps its window shares (no buffer for
    them) and replays it with new inputs."""
    from tgrad import TinyJit

    rng = np.random.default_rng(14)
    w1, w2 = (rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((32, 1, 5, 5), (32, 32, 5, 5)))
    tw1, tw2 = (Tensor(w, device="CPU", requires_grad=True) for w in (w1, w2))

    @TinyJit
    def step(x):
        loss = x.conv2d(tw1).relu().conv2d(tw2).relu().sum()
        loss.backward()
        grads = [tw1.grad.realize(), tw2.grad.realize()]
        tw1.grad = tw2.grad = None
        return grads

    conv = torch.nn.functional.conv2d
    for _ in range(4):
        x = rng.standard_normal((32, 1, 28, 28)).astype(np.float32)
        g1, g2 = step(Tensor(x, device="CPU"))
        rw1, rw2 = (torch.tensor(w, requires_grad=True) for w in (w1, w2))
        conv(conv(torch.tensor(x), rw1).relu(), rw2).relu().sum().backward()
        np.testing.assert_allclose(g2.numpy(), rw2.grad.numpy(), rtol=1e-4, atol=1e-2)
        np.testing.assert_allclose(g1.numpy(), rw1.grad.numpy(), rtol=1e-4, atol=1e-2)


def test_pieces_over_a_flipped_input_match_torch():
    """Pieces copy windows of a flipped view (negative strides) too; forward and weight gradient against
    PyTorch."""
    rng = np.random.default_rng(15)
    x = rng.standard_normal((8, 16, 24, 24)).astype(np.float32)
    w = (rng.standard_normal((8, 16, 5, 5)) * 0.2).astype(np.float32)
    tw = Tensor(w, device="CPU", requires_grad=True)
    tx = Tensor(x, device="CPU").realize().flip(3)
    out = tx.conv2d(tw)
    assert any(p.chunk is not None for p in _plans([out.node]))
    (out * out).sum().backward()
    rw = torch.tensor(w, requires_grad=True)
    ref = torch.nn.functional.conv2d(torch.tensor(x).flip(3), rw)
    (ref * ref).sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(tw.grad.numpy(), rw.grad.numpy(), rtol=1e-4, atol=2e-3)


def test_convs_in_pieces_from_two_python_threads():
    """Two Python threads each running convs in pieces at once: right values, and OpenBLAS's thread count
    as it was before (each launch reads it and sets it back, one launch at a time)."""
    import threading

    blas_threads = cpu_blas._BlasThreads()
    before = blas_threads.get()
    rng = np.random.default_rng(16)
    w = (rng.standard_normal((8, 16, 5, 5)) * 0.2).astype(np.float32)
    errors = []

    def run(seed):
        try:
            x = np.random.default_rng(seed).standard_normal((8, 16, 24, 24)).astype(np.float32)
            for _ in range(3):
                got = Tensor(x, device="CPU").conv2d(Tensor(w, device="CPU")).numpy()
                want = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w)).numpy()
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    workers = [threading.Thread(target=run, args=(s,)) for s in (1, 2)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors, errors
    assert blas_threads.get() == before


def test_debug2_times_a_pair_whose_first_result_is_kept(monkeypatch, capsys):
    """DEBUG=2 prints a line per launch with its memory traffic: a pair's kept first result has no buffer
    (it crashed the report)."""
    from tgrad import device as device_module

    monkeypatch.setattr(device_module, "DEBUG", 2)
    rng = np.random.default_rng(17)
    x = rng.standard_normal((32, 16, 24, 24)).astype(np.float32)
    w = (rng.standard_normal((16, 16, 5, 5)) * 0.2).astype(np.float32)
    tx = Tensor(x, device="CPU", requires_grad=True)
    (tx.relu().conv2d(Tensor(w, device="CPU")) ** 2).sum().backward()
    got = tx.grad.numpy()
    assert "_piece" in capsys.readouterr().err
    rx = torch.tensor(x, requires_grad=True)
    (torch.nn.functional.conv2d(rx.relu(), torch.tensor(w)) ** 2).sum().backward()
    np.testing.assert_allclose(got, rx.grad.numpy(), rtol=1e-4, atol=2e-3)


def _conv_relu_sin_reference(x, w, stride, padding):
    """conv2d(relu(x), w) and the gradients of sum(out * sin(out)) in float64 numpy (sliding windows and
    einsum): exact to ~1e-12, and the same in every process. PyTorch's CPU convolutions were not: run beside
    other tests (pytest -n 2), its float32 weight gradient was sometimes 4e-3 off at 17.55 (exact 17.5516)
    and its float64 one 1e-7 off, in some runs and not others."""
    (sh, sw), (ph, pw) = (stride if isinstance(stride, tuple) else (stride, stride),
                          padding if isinstance(padding, tuple) else (padding, padding))
    x, w = x.astype(np.float64), w.astype(np.float64)
    kh, kw = w.shape[2:]
    xp = np.pad(np.maximum(x, 0), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw]
    out = np.einsum("ncyxij,ocij->noyx", win, w)
    g = np.sin(out) + out * np.cos(out)
    gw = np.einsum("noyx,ncyxij->ocij", g, win)
    dwin = np.einsum("noyx,ocij->ncyxij", g, w)
    gxp = np.zeros_like(xp)
    oh, ow = out.shape[2:]
    for i in range(kh):
        for j in range(kw):
            gxp[:, :, i : i + sh * oh : sh, j : j + sw * ow : sw] += dwin[..., i, j]
    gx = gxp[:, :, ph : ph + x.shape[2], pw : pw + x.shape[3]] * (x > 0)
    return out, gw, gx


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_float64_and_float32_pieces_and_pairs_match_torch(dtype, native, monkeypatch, cpu_tuning):
    """Pieces of rows and of K, and piece pairs (a batch of images per piece included), in float64 (the
    compiled pieces call dgemm) and float32, strided and padded, against a float64 numpy reference (whose
    strided-window reading is checked against PyTorch's float64 forward)."""
    cpu_tuning(pair_min_result=1 << 12)
    ran = []
    for name in ("pieces_spec", "pair_words"):
        real = getattr(cpu_gemm, name)
        monkeypatch.setattr(cpu_gemm, name, lambda *a, real=real: ran.append(real(*a)) or ran[-1])
    rng = np.random.default_rng(15)
    tol = 1e-10 if dtype == np.float64 else 1e-4
    for shape, w_shape, stride, padding in [((16, 8, 20, 20), (6, 8, 3, 3), 1, 1),
                                            ((4, 3, 33, 31), (5, 3, 4, 2), (2, 1), (1, 0)),
                                            ((64, 16, 12, 12), (16, 16, 3, 3), 1, 0)]:
        x, w = rng.standard_normal(shape).astype(dtype), (rng.standard_normal(w_shape) * 0.3).astype(dtype)
        tx, tw = Tensor(x, device="CPU", requires_grad=True), Tensor(w, device="CPU", requires_grad=True)
        out = tx.relu().conv2d(tw, stride=stride, padding=padding)
        (out * out.sin()).sum().backward()
        ref, gw, gx = _conv_relu_sin_reference(x, w, stride, padding)
        conv = torch.nn.functional.conv2d(torch.tensor(x, dtype=torch.float64).relu(),
                                          torch.tensor(w, dtype=torch.float64), stride=stride,
                                          padding=padding)
        np.testing.assert_allclose(ref, conv.numpy(), rtol=1e-6, atol=1e-6)  # the reference's windows
        np.testing.assert_allclose(out.numpy(), ref, rtol=tol, atol=tol)
        np.testing.assert_allclose(tw.grad.numpy(), gw, rtol=tol, atol=tol * 20)
        np.testing.assert_allclose(tx.grad.numpy(), gx, rtol=tol, atol=tol * 20)
    assert bool([r for r in ran if r is not None]) == (native == "1" and cpu_gemm.available()), ran


def test_single_pieces_cut_one_image_a_piece_where_each_has_the_work(cpu_tuning):
    """With compiled pieces (props.native_pieces) the optimizer cuts one image a piece, with the shift a
    stride-1 conv then allows, where a one-image piece keeps one_index_min_work; a plan whose one-image
    pieces would be too small keeps its pieces."""
    x = Tensor(np.zeros((128, 32, 10, 10), np.float32), device="CPU")
    w = Tensor(np.zeros((64, 32, 3, 3), np.float32), device="CPU")
    kernel = fuse.schedule([x.conv2d(w).node])[-1].kernel
    small = Tensor(np.zeros((128, 4, 6, 6), np.float32), device="CPU").conv2d(
        Tensor(np.zeros((4, 4, 3, 3), np.float32), device="CPU"))
    small_kernel = fuse.schedule([small.node])[-1].kernel
    cpu_tuning(native_pieces=False)
    plan, small_plan = cpu_plan(kernel), cpu_plan(small_kernel)
    assert plan.chunk.size > 1 and plan.chunk.shift is None, plan.chunk  # several images a piece
    cpu_tuning(native_pieces=True)
    one = cpu_plan(kernel)
    assert one.chunk.axis == plan.chunk.axis and one.chunk.size == 1 and one.chunk.shift is not None
    assert (one.a, one.b, one.m, one.n) == (plan.a, plan.b, plan.m, plan.n)
    assert cpu_plan(small_kernel) == small_plan
