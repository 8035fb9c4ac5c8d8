"""A 2-d convolution's forward product runs on the CPU as a generated direct convolution
(tgrad/emit_numba_conv.py) instead of BLAS over copied windows. Values and gradients against PyTorch, for
strides, dilations, padding, kernel sizes, tile tails and dtypes; which path each conv takes is checked, so
a test cannot pass on the BLAS path alone."""

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.helpers import cpu_pair, cpu_render
from tgrad import Tensor, emit_numba_conv, fuse
from tgrad import graph as g
from tgrad.device import get_runtime
from tgrad.opt import host
from tgrad.runtime.cpu import runtime as cpu


@pytest.fixture(autouse=True)
def _lazy_gradients(monkeypatch):
    """These tests read which kernels a gradient's graph becomes (and change the settings that render
    them between graphs of one structure): backward() builds that graph every time, no replay."""
    monkeypatch.setenv("TGRAD_BACKWARD_REPLAY", "0")


def _paths(t: Tensor) -> list[bool]:
    """For each BLAS-planned kernel computing t: whether it runs as a direct convolution."""
    programs = [cpu_render(it.kernel) for it in fuse.schedule([t.node])]
    return ["direct" in p.launch for p in programs if "blas" in p.launch]


def _conv_inputs(seed, n, cin, cout, h, w, kh, kw, dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, cin, h, w)).astype(dtype)
    wt = (rng.standard_normal((cout, cin, kh, kw)) / np.sqrt(cin * kh * kw)).astype(dtype)
    b = rng.standard_normal(cout).astype(dtype)
    return x, wt, b


@pytest.mark.parametrize("n,cin,cout,h,w,k,stride,padding,dilation", [
    (16, 32, 32, 24, 24, (5, 5), 1, 0, 1),  # the MNIST CNN's conv2 (20 columns: tiles of 4)
    (16, 64, 64, 8, 8, (3, 3), 1, 0, 1),  # conv4 (6 columns: tiles of 3)
    (32, 32, 24, 13, 17, (3, 3), 1, 1, 1),  # padded, 17 columns: a tail of 1 after tiles of 4
    (32, 19, 16, 21, 21, (3, 5), 2, (1, 2), 1),  # stride 2, a 3x5 kernel, padding per axis, 19 channels
    (32, 32, 32, 20, 20, (3, 3), 1, 2, 2),  # dilation 2
    (8, 8, 16, 16, 16, (7, 7), 1, 3, 1),  # 49 taps, the most written out
    (128, 29, 16, 12, 11, (3, 3), 1, 0, 1),  # 16 output channels (the fewest), 9 columns, odd channels
    (16, 29, 96, 13, 13, (3, 3), 1, 0, 1),  # odd input channels, 96 outputs: two halves of 48, a tail of 3
    (4, 32, 128, 9, 14, (3, 3), 1, 0, 1),  # tiles: two blocks of 4 vectors of outputs, 12 columns in 6s
    (16, 32, 48, 9, 16, (3, 3), 1, (0, 3), 1),  # tiles: 3 vectors a block, 20 columns in tiles of 5
])
@pytest.mark.parametrize("tiles", [64, 32, 0])
def test_forward_matches_torch(n, cin, cout, h, w, k, stride, padding, dilation, tiles, monkeypatch):
    """Both ways of the direct loop: register tiles (numba_rt.conv_tile, where the output channels are
    whole vectors: 16 float32 with AVX-512's 64-byte registers, 8 with AVX2's 32, which run here too) and
    the loop over output channels (the others, and with tiles off: 0)."""
    monkeypatch.setattr(emit_numba_conv, "REGISTER_TILES", bool(tiles))
    monkeypatch.setattr(cpu, "vector_bytes", lambda: tiles or 64)
    x, wt, b = _conv_inputs(0, n, cin, cout, h, w, *k)
    out = Tensor(x).conv2d(Tensor(wt), Tensor(b), stride=stride, padding=padding, dilation=dilation).relu()
    assert _paths(out) == [True]
    sources = [cpu_render(it.kernel).launch["direct"].source for it in fuse.schedule([out.node])
               if "direct" in cpu_render(it.kernel).launch]
    assert ("conv_tile(" in sources[0]) == bool(tiles and cout % (tiles // 4) == 0)
    tx, tw, tb = map(torch.from_numpy, (x, wt, b))
    ref = F.conv2d(tx, tw, tb, stride, padding, dilation).relu()
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype,special,tol,cout,k", [
    (np.float64, False, 1e-12, 16, 3), (np.float32, True, 1e-4, 16, 3),
    (np.float64, False, 1e-12, 64, 5), (np.float32, True, 1e-4, 32, 5),  # output channels in two halves
])
def test_float64_and_nan_inf_match_torch(dtype, special, tol, cout, k):
    x, wt, b = _conv_inputs(1, 8, 32, cout, 12, 12, k, k, dtype)
    if special:  # as PyTorch propagates them; inf * 0 is nan
        x[0, 0, 0, 0], x[1, 3, 5, 5], x[2, :, 4, 4], wt[3, 0, 1, 1] = np.nan, np.inf, -np.inf, 0.0
    out = Tensor(x).conv2d(Tensor(wt), Tensor(b))
    assert _paths(out) == [True]
    ref = F.conv2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b))
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=tol, atol=tol)


def test_gradients_match_torch():
    x, wt, b = _conv_inputs(3, 8, 32, 32, 14, 14, 3, 3)
    tx, tw, tb = (Tensor(a, requires_grad=True) for a in (x, wt, b))
    out = tx.conv2d(tw, tb, padding=1)
    assert _paths(out) == [True]
    (out.relu() * out).sum().backward()
    rx, rw, rb = (torch.tensor(a, requires_grad=True) for a in (x, wt, b))
    ref = F.conv2d(rx, rw, rb, padding=1)
    (ref.relu() * ref).sum().backward()
    for got, want in ((tx, rx), (tw, rw), (tb, rb)):
        np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("groups,cout,k", [(2, 32, 3), (1, 8, 3), (1, 32, 3), (1, 32, 9)])
def test_grouped_few_channels_or_big_kernels_keep_blas(groups, cout, k):
    """Groups (batch axes), fewer than 16 output channels, fewer than 256 products per output value
    (16 channels x 3 x 3), more than 49 taps: BLAS, same values."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((16, 16, 20, 20)).astype(np.float32)
    wt = (rng.standard_normal((cout, 16 // groups, k, k)) * 0.1).astype(np.float32)
    out = Tensor(x).conv2d(Tensor(wt), groups=groups)
    assert True not in _paths(out)
    ref = F.conv2d(torch.from_numpy(x), torch.from_numpy(wt), groups=groups)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)


def _weight_grad_paths(t: Tensor) -> list[str]:
    """For each BLAS-planned kernel computing t: 'wgrad' (a direct weight gradient), 'direct' (a direct
    forward convolution) or 'blas'."""
    programs = [cpu_render(it.kernel) for it in fuse.schedule([t.node])]
    return [p.launch["direct"].name.endswith("_wgrad") and "wgrad" or "direct" if "direct" in p.launch
            else "blas" for p in programs if "blas" in p.launch]


def _weight_grads(x, wt, g, **conv):
    """The weight's gradient of sum(conv2d(x, wt) * g), from tgrad (with the paths its kernels take) and
    from PyTorch."""
    tw = Tensor(wt, requires_grad=True)
    (Tensor(x).conv2d(tw, **conv) * Tensor(g)).sum().backward()
    paths = _weight_grad_paths(tw.grad)
    rw = torch.tensor(wt, requires_grad=True)
    (F.conv2d(torch.from_numpy(x), rw, **conv) * torch.from_numpy(g)).sum().backward()
    return tw.grad.numpy(), rw.grad.numpy(), paths


@pytest.mark.parametrize("n,cin,cout,h,w,k,stride,padding,dilation", [
    (16, 32, 32, 24, 24, (5, 5), 1, 0, 1),  # the MNIST CNN's conv2 (tiles of 2 rows x 4 columns)
    (16, 64, 64, 8, 8, (3, 3), 1, 0, 1),  # conv4 (6 columns: a tail of 2)
    (32, 32, 24, 13, 17, (3, 3), 1, 1, 1),  # padded (13 rows: a tail row), 17 columns: a tail of 1
    (32, 19, 16, 21, 21, (3, 5), 2, (1, 2), 1),  # stride 2, a 3x5 kernel, padding per axis, 19 channels
    (32, 32, 32, 20, 20, (3, 3), 1, 2, 2),  # dilation 2
    (8, 8, 16, 16, 16, (7, 7), 1, 3, 1),  # 49 taps, the most written out
    (3, 32, 32, 30, 5, (3, 3), 1, 0, 1),  # 3 images (fewer than some thread counts), 3 columns
    (8, 32, 128, 10, 10, (3, 3), 1, 0, 1),  # tiles: two blocks of 4 vectors of outputs, taps in 5 + 4
    (8, 32, 48, 12, 12, (5, 5), 1, 0, 1),  # tiles: 3 vectors a block, 25 taps in passes of 7, 6, 6, 6
])
@pytest.mark.parametrize("tiles", [64, 32, 0])
def test_weight_gradient_matches_torch(n, cin, cout, h, w, k, stride, padding, dilation, tiles, monkeypatch):
    """Both ways: register tiles (numba_rt.wgrad_tile, output channels in whole vectors of AVX-512's or
    AVX2's registers) and the loop over output channels per tile of pixels (the others, and tiles off)."""
    monkeypatch.setattr(emit_numba_conv, "REGISTER_TILES", bool(tiles))
    monkeypatch.setattr(cpu, "vector_bytes", lambda: tiles or 64)
    x, wt, _ = _conv_inputs(5, n, cin, cout, h, w, *k)
    ph, pw = (padding, padding) if isinstance(padding, int) else padding
    oh = (h + 2 * ph - dilation * (k[0] - 1) - 1) // stride + 1
    ow = (w + 2 * pw - dilation * (k[1] - 1) - 1) // stride + 1
    g = np.random.default_rng(6).standard_normal((n, cout, oh, ow)).astype(np.float32)
    got, want, paths = _weight_grads(x, wt, g, stride=stride, padding=padding, dilation=dilation)
    assert "wgrad" in paths
    tw = Tensor(wt, requires_grad=True)
    (Tensor(x).conv2d(tw, stride=stride, padding=padding, dilation=dilation) * Tensor(g)).sum().backward()
    programs = [cpu_render(it.kernel) for it in fuse.schedule([tw.grad.node])]
    sources = [p.launch["direct"].source for p in programs
               if "direct" in p.launch and p.launch["direct"].name.endswith("_wgrad")]
    assert ("wgrad_tile(" in sources[0]) == bool(tiles and cout % (tiles // 4) == 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("dtype,special,tol", [(np.float64, False, 1e-12), (np.float32, True, 1e-4)])
def test_weight_gradient_float64_and_nan_inf_match_torch(dtype, special, tol):
    x, wt, _ = _conv_inputs(7, 8, 32, 16, 12, 12, 3, 3, dtype)
    g = np.random.default_rng(8).standard_normal((8, 16, 10, 10)).astype(dtype)
    if special:  # one nan, an inf in the input, a -inf in the output gradient, as PyTorch propagates them
        x[0, 0, 0, 0], x[1, 3, 5, 5], g[2, 4, 3, 3] = np.nan, np.inf, -np.inf
    got, want, paths = _weight_grads(x, wt, g)
    assert "wgrad" in paths
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.nanmax(np.abs(want[np.isfinite(want)])))


def test_weight_gradient_on_any_thread_count(monkeypatch):
    """The partial sums are one per thread (as many as TGRAD_THREADS says when the kernel is rendered):
    1 and 3 threads give PyTorch's gradient too."""
    for count, n in (("1", 6), ("3", 7)):  # (a batch size each: a kernel of its own, rendered anew)
        monkeypatch.setenv("TGRAD_THREADS", count)
        x, wt, _ = _conv_inputs(9, n, 32, 16, 12, 12, 3, 3)
        g = np.random.default_rng(10).standard_normal((n, 16, 10, 10)).astype(np.float32)
        got, want, paths = _weight_grads(x, wt, g)
        assert "wgrad" in paths
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_accumulated_weight_gradients_match_torch():
    """Two backward passes add into the weight's gradient, and an optimizer step reads it: the direct
    weight gradient under an epilogue (the sum with the old gradient) gives PyTorch's values."""
    x, wt, _ = _conv_inputs(11, 8, 32, 32, 12, 12, 3, 3)
    tw, rw = Tensor(wt, requires_grad=True), torch.tensor(wt, requires_grad=True)
    for scale in (1.0, -0.5):
        (Tensor(x * scale).conv2d(tw).relu().sum()).backward()
        F.conv2d(torch.from_numpy(x * scale), rw).relu().sum().backward()
    assert _weight_grad_paths(tw.grad).count("wgrad") == 2
    np.testing.assert_allclose(tw.grad.numpy(), rw.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_small_weight_gradients_keep_blas():
    """Fewer than 16 output channels, fewer than 256 products per weight (c x kh x kw), or one image (its
    axis is gone from the kernel): BLAS, same values."""
    for n, cout, cin in ((16, 8, 32), (16, 32, 16), (1, 32, 64)):
        x, wt, _ = _conv_inputs(12, n, cin, cout, 14, 14, 3, 3)
        g = np.random.default_rng(13).standard_normal((n, cout, 12, 12)).astype(np.float32)
        got, want, paths = _weight_grads(x, wt, g)
        assert "wgrad" not in paths
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def _input_grad_pairs(t: Tensor) -> list[bool]:
    """For each piece pair (blas.piece_pair: a col2im matmul and its sum) computing t: whether it runs as
    a direct input gradient (opt.host.scatter_input_grad)."""
    items = fuse.schedule([t.node])
    found = []
    for a, b in zip(items, items[1:]):
        reads = tuple(j for j, n in enumerate(b.inputs) if n is a.out)
        if reads and cpu_pair(a.kernel, b.kernel, reads) is not None:
            rt = get_runtime("CPU")
            grad = host.scatter_input_grad(rt.optimize(a.kernel), b.kernel, reads, rt.props)
            found.append(grad is not None)
    return found


def _input_grads(x, wt, relu_below=True, dtype=np.float32, **conv):
    """The input's gradient of sum(conv2d(relu(x) or x, wt)^2), from tgrad (with the paths of its pairs)
    and from PyTorch."""
    tx = Tensor(x, requires_grad=True)
    out = (tx.relu() if relu_below else tx).conv2d(Tensor(wt), **conv)
    (out * out).sum().backward()
    paths = _input_grad_pairs(tx.grad)
    rx = torch.tensor(x, requires_grad=True)
    ref = F.conv2d(rx.relu() if relu_below else rx, torch.from_numpy(wt), **conv)
    (ref * ref).sum().backward()
    return tx.grad.numpy(), rx.grad.numpy(), paths


@pytest.mark.parametrize("n,cin,cout,h,w,k,stride,padding,dilation,relu", [
    (16, 32, 32, 24, 24, (5, 5), 1, 0, 1, True),  # the MNIST CNN's conv2 (the relu below: an epilogue)
    (64, 32, 64, 10, 10, (3, 3), 1, 0, 1, False),  # conv3 (after a max_pool: the sum alone)
    (64, 64, 64, 8, 8, (3, 3), 1, 0, 1, True),  # conv4 (6 columns: one tile a row)
    (16, 32, 16, 23, 19, (3, 3), 2, 0, 1, True),  # stride 2 (spots not every column), odd sizes
    (16, 32, 32, 20, 20, (3, 3), 1, 0, 2, False),  # dilation 2
    (16, 16, 48, 15, 13, (3, 5), 1, 0, 1, True),  # 3x5 kernel, 16 input channels (the fewest), 9 columns
    (16, 32, 32, 14, 15, (1, 3), 1, 0, 1, True),  # 1x3 kernel (spots along a row only)
    (8, 32, 33, 12, 12, (3, 3), 1, 0, 1, True),  # an odd number of output channels (one a pass)
])
def test_input_gradient_matches_torch(n, cin, cout, h, w, k, stride, padding, dilation, relu, monkeypatch,
                                      cpu_tuning):
    # (pairs start at pair_min_result elements of window shares: lowered so that these small convs pair)
    cpu_tuning(pair_min_result=1 << 16)
    x, wt, _ = _conv_inputs(14, n, cin, cout, h, w, *k)
    got, want, paths = _input_grads(x, wt, relu, stride=stride, padding=padding, dilation=dilation)
    assert paths == [True]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("dtype,special,tol", [(np.float64, False, 1e-12), (np.float32, True, 1e-4)])
def test_input_gradient_float64_and_nan_inf_match_torch(dtype, special, tol, monkeypatch, cpu_tuning):
    cpu_tuning(pair_min_result=1 << 16)
    x, wt, _ = _conv_inputs(15, 16, 32, 32, 12, 12, 3, 3, dtype)
    if special:  # an inf and a nan in the input reach the output gradient (out * out) and spread back
        x[0, 0, 3, 3], x[1, 5, 6, 6], wt[2, 1, 1, 1] = np.inf, np.nan, 0.0
    got, want, paths = _input_grads(x, wt, False)
    assert paths == [True]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.nanmax(np.abs(want[np.isfinite(want)])))


def test_padded_grouped_or_few_channel_input_gradients_keep_the_pair(monkeypatch, cpu_tuning):
    """A padded conv (its sum leaves out the padding: not every share lands), groups (no image axis), fewer
    than 16 input channels: the pair as before (or no pair), same values."""
    cpu_tuning(pair_min_result=1 << 16)
    for cin, conv in ((32, {"padding": 1}), (32, {"groups": 2}), (8, {})):
        x, wt, _ = _conv_inputs(16, 16, cin, 32, 14, 14, 3, 3)
        wt = wt[:, : cin // conv.get("groups", 1)].copy()
        got, want, paths = _input_grads(x, wt, True, **conv)
        assert True not in paths
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("cin,cout,hw,k", [(16, 32, 40, 7), (32, 128, 18, 3), (32, 64, 18, 3)])
def test_input_gradients_where_the_pair_is_faster_keep_it(cin, cout, hw, k, monkeypatch, cpu_tuning):
    """Where BLAS's matmul and col2im beat the scatter (HostTuning.scatter_*): 7x7 kernels (49 weight
    vectors spill: 97 ms against 21), more than 64 output channels, or 64 on images over 144 output
    pixels; same values."""
    cpu_tuning(pair_min_result=1 << 16)
    x, wt, _ = _conv_inputs(17, 8, cin, cout, hw, hw, k, k)
    got, want, paths = _input_grads(x, wt, True)
    assert paths == [False]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def _scatter_calls(monkeypatch) -> list:
    """A list that gets an entry at each call of a compiled input-gradient scatter (the `_igrad` function)."""
    from tgrad.runtime.cpu import runtime as cpu_runtime

    calls, build = [], cpu_runtime.CPURuntime._build

    def counted(self, program, name, free=False):
        fn = build(self, program, name, free)
        return (lambda *a: calls.append(1) or fn(*a)) if program.name.endswith("_igrad") else fn

    monkeypatch.setattr(cpu_runtime.CPURuntime, "_build", counted)
    return calls


@pytest.mark.parametrize("other", ["second conv", "square", "second conv and relu"])
def test_input_gradient_with_more_terms_scatters_the_marked_sum_only(other, monkeypatch, cpu_tuning):
    """x used elsewhere too: its gradient's kernel adds other terms to the col2im sum the conv's rule built
    (and marked: graph.Col2ImSum), here a second conv's sum and x*x's 2x. The scatter computes the marked
    sum alone; the other terms run after it, in its epilogue: PyTorch's values."""
    cpu_tuning(pair_min_result=1 << 16)
    x, wt, _ = _conv_inputs(21, 16, 32, 32, 12, 12, 3, 3)
    w2 = _conv_inputs(22, 1, 32, 16, 1, 1, 5, 5)[1]
    calls = _scatter_calls(monkeypatch)

    def loss(x, w, w2, conv):
        h = x.relu() if other.endswith("relu") else x
        out = conv(h, w)
        more = (conv(h, w2) ** 2).sum() if other.startswith("second") else (h * h).sum()
        return (out * out).sum() + more

    tx = Tensor(x, requires_grad=True)
    loss(tx, Tensor(wt), Tensor(w2), Tensor.conv2d).backward()
    items = fuse.schedule([tx.grad.node])
    rt = get_runtime("CPU")
    scatters = []
    for a, b in zip(items, items[1:]):
        reads = tuple(j for j, n in enumerate(b.inputs) if n is a.out)
        if reads and cpu_pair(a.kernel, b.kernel, reads) is not None:
            scatters.append(host.scatter_input_grad(rt.optimize(a.kernel), b.kernel, reads, rt.props))
    assert scatters and scatters[-1] is not None and scatters[-1].epilogue is not None, scatters
    rx = torch.tensor(x, requires_grad=True)
    loss(rx, torch.from_numpy(wt), torch.from_numpy(w2), F.conv2d).backward()
    want = rx.grad.numpy()
    np.testing.assert_allclose(tx.grad.numpy(), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert calls


@pytest.mark.parametrize("move", ["flip", "transpose", "shrink"])
@pytest.mark.parametrize("relu", [False, True])
def test_input_gradient_of_a_moved_input_matches_torch(move, relu, monkeypatch, cpu_tuning):
    """The conv reads x through a flip, a transpose (of a square image, a 3x5 kernel) or a shrink. Alone,
    x's gradient is a view of the col2im sum, computed at its own points: scattered. Under relu's mask, the
    mask's kernel evaluates the sum moved back, not at its own point: fusion drops the sum's mark, the
    pair runs (no scatter). PyTorch's values both ways."""
    cpu_tuning(pair_min_result=1 << 16)
    x, wt, _ = _conv_inputs(23, 16, 32, 32, 13, 13, 3, 5)
    calls = _scatter_calls(monkeypatch)
    moved = {"flip": lambda t: t.flip(3), "transpose": lambda t: t.transpose(2, 3),
             "shrink": lambda t: t[:, :, 1:, :12]}[move]
    tx, rx = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out = moved(tx.relu() if relu else tx).conv2d(Tensor(wt))
    ref = F.conv2d(moved(rx.relu() if relu else rx), torch.from_numpy(wt))
    (out * out).sum().backward()
    (ref * ref).sum().backward()
    marks = [e for it in fuse.schedule([tx.grad.node]) for e in _exprs(it.kernel.expr)
             if isinstance(e.arg, g.Col2ImSum)]
    assert bool(marks) != relu and _input_grad_pairs(tx.grad) == [not relu]
    want = rx.grad.numpy()
    np.testing.assert_allclose(tx.grad.numpy(), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert bool(calls) != relu


def _exprs(e) -> list:
    seen, stack = {}, [e]
    while stack:
        x = stack.pop()
        if id(x) not in seen:
            seen[id(x)] = x
            stack.extend(x.srcs)
    return list(seen.values())


def test_a_col2im_sum_fusion_changed_is_not_scattered(monkeypatch, cpu_tuning):
    """blas.col2im takes the geometry from the sum's mark, so it checks that the marked sum is the one the
    conv's rule built: a pair whose sum lost a term, gained one, lost its mark, or whose k1 result is read
    outside the sum too, is no scatter (each made here from the real pair's kernels)."""
    from tgrad import blas
    from tgrad.fuse import Expr, const

    cpu_tuning(pair_min_result=1 << 16)
    x, wt, _ = _conv_inputs(24, 16, 32, 32, 12, 12, 3, 3)
    tx = Tensor(x, requires_grad=True)
    (tx.conv2d(Tensor(wt)) ** 2).sum().backward()
    (a, b), rt = fuse.schedule([tx.grad.node])[-2:], get_runtime("CPU")
    k1, k2, reads = rt.optimize(a.kernel), b.kernel, (b.inputs.index(a.out),)
    plan = host.plan_for(k1)
    got = blas.col2im(k1, k2, reads, plan)
    assert (got.kh, got.kw, got.oh, got.ow, got.ih, got.iw, got.epilogue) == (3, 3, 10, 10, 12, 12, None)
    total = k2.expr
    assert isinstance(total.arg, g.Col2ImSum)
    last, rest, one = total.srcs[1], total.srcs[0], const(1.0, total.dtype)

    def op(name, *srcs, arg=None):
        return Expr(name, srcs, arg, total.dtype)

    changed = {
        "a term lost": op("ADD", rest.srcs[0], last, arg=total.arg),
        "a term gained": op("ADD", rest, op("ADD", last, one), arg=total.arg),
        "a term scaled": op("ADD", rest, op("MUL", last, one), arg=total.arg),
        "the mark lost": op("ADD", *total.srcs),
        "another kernel size": op("ADD", *total.srcs, arg=dataclasses.replace(total.arg, kernel=(5, 5))),
        "read outside": op("MUL", total, last),
    }
    for why, expr in changed.items():
        assert blas.col2im(k1, dataclasses.replace(k2, expr=expr), reads, plan) is None, why
    # (around the sum, a term that does not read k1's result is the epilogue)
    around = dataclasses.replace(k2, expr=op("ADD", total, one))
    assert blas.col2im(k1, around, reads, plan).epilogue is not None


def test_input_gradient_of_more_shares_an_image_than_pair_max_points_keeps_the_pair(monkeypatch, cpu_tuning):
    """An image's window shares (32 channels x 9 taps x 100 pixels) past HostTuning.pair_max_points, its
    input gradient (32 x 144) within: the pair, no scatter; same values."""
    cpu_tuning(pair_min_result=1 << 16, pair_max_points=32 * 9 * 100 - 1)
    x, wt, _ = _conv_inputs(25, 16, 32, 32, 12, 12, 3, 3)
    got, want, paths = _input_grads(x, wt, True)
    assert paths == [False]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_input_gradient_whose_shares_are_written_keeps_the_pair(monkeypatch, cpu_tuning):
    """The scatter runs where nothing but the pair's sum needs the window shares (the group keeps them,
    runtime/cpu/groups.py _private_of); where the shares get a buffer, the pair computes them and their
    sum as before. Counted by calls of the scatter's compiled function; the same values either way."""
    from tgrad.runtime.cpu import groups as cpu_groups
    from tgrad.runtime.cpu import runtime as cpu_runtime

    cpu_tuning(pair_min_result=1 << 16)
    calls = []
    build = cpu_runtime.CPURuntime._build

    def counted(self, program, name, free=False):
        fn = build(self, program, name, free)
        if not program.name.endswith("_igrad"):
            return fn
        return lambda *a: calls.append(1) or fn(*a)

    monkeypatch.setattr(cpu_runtime.CPURuntime, "_build", counted)
    x, wt, _ = _conv_inputs(17, 16, 32, 32, 12, 12, 3, 3)
    got, want, paths = _input_grads(x, wt, True)
    assert paths == [True] and len(calls) == 1
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    monkeypatch.setattr(cpu_groups, "_private_of", lambda items, groups, requested: set())
    got, want, paths = _input_grads(x * 2, wt, True)
    assert paths == [True] and len(calls) == 1
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_jitted_cnn_step_with_direct_gradients_matches_torch():
    """A TinyJit training step through the MNIST CNN's second conv (direct forward, weight and input
    gradients: every path of this file in one step), three steps against PyTorch's SGD."""
    from tgrad import TinyJit

    rng = np.random.default_rng(18)
    x = rng.standard_normal((32, 1, 28, 28)).astype(np.float32)
    w1 = (rng.standard_normal((32, 1, 5, 5)) * 0.2).astype(np.float32)
    w2 = (rng.standard_normal((32, 32, 5, 5)) * 0.05).astype(np.float32)
    tw1, tw2 = Tensor(w1, requires_grad=True), Tensor(w2, requires_grad=True)

    @TinyJit
    def step(x):
        loss = (Tensor.conv2d(x.conv2d(tw1).relu(), tw2).relu() ** 2).mean()
        loss.backward()
        for p in (tw1, tw2):
            p.assign(p - p.grad * 0.1)
            p.grad = None
        return loss.realize(tw1, tw2)

    rw1, rw2 = torch.tensor(w1, requires_grad=True), torch.tensor(w2, requires_grad=True)
    for i in range(3):
        xi = x * (1 + i)
        got = step(Tensor(xi)).numpy()
        loss = (F.conv2d(F.conv2d(torch.from_numpy(xi), rw1).relu(), rw2).relu() ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for p in (rw1, rw2):
                p -= p.grad * 0.1
                p.grad = None
        np.testing.assert_allclose(got, loss.item(), rtol=1e-4)
    np.testing.assert_allclose(tw2.numpy(), rw2.detach().numpy(), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(tw1.numpy(), rw1.detach().numpy(), rtol=1e-3, atol=1e-4)


class _FakePool:
    """A compile pool whose worker has or has not compiled the optional jobs yet (`done`); claims find
    nothing, so the main process compiles what it loads."""

    live, done = 1, False

    def __init__(self):
        self.optional = []

    def submit(self, jobs, optional=False):
        self.optional += [key for key, _ in jobs] if optional else []

    def compiled(self, key):
        return self.done

    def claim(self, key):
        return None

    def start(self, workers):
        pass


def test_direct_gradients_run_blas_until_their_functions_are_compiled(tmp_path, monkeypatch, cpu_tuning):
    """With compile workers (cpu.TIERED), a direct convolution's function (here a weight gradient's and an
    input gradient's scatter) is compiled as an optional job while its BLAS path runs; once compiled, the
    next call (a TinyJit replay too) runs it. PyTorch's gradients at every call."""
    import collections

    from tgrad import TinyJit, schedule_cache
    from tgrad.runtime.cpu import pool as cpu_pool
    from tgrad.runtime.cpu import runtime as cpu_runtime

    monkeypatch.setenv("TGRAD_CACHE", str(tmp_path))  # (nothing on disk: the functions are not ready)
    monkeypatch.setattr(schedule_cache, "_cache", collections.OrderedDict())  # (no runners of other tests)
    monkeypatch.setattr(cpu_runtime, "TIERED", True)
    monkeypatch.setattr(cpu_pool, "default_workers", lambda: 1)
    cpu_tuning(pair_min_result=1 << 16)
    rt = cpu_runtime.CPURuntime()
    pool = _FakePool()
    rt.pool = pool
    monkeypatch.setattr(cpu_runtime, "get_runtime", lambda name: rt, raising=False)
    calls = {"direct": 0, "blas": 0}
    for cls, name in ((cpu_runtime.DirectConv, "direct"), (cpu_runtime.BlasCall, "blas")):
        real = cls.__call__
        monkeypatch.setattr(cls, "__call__", lambda self, *a, _r=real, _n=name, **k: calls.__setitem__(
            _n, calls[_n] + 1) or _r(self, *a, **k))
    x, wt, _ = _conv_inputs(19, 16, 32, 32, 12, 12, 3, 3)
    tw = Tensor(wt, device="CPU", requires_grad=True)
    from tgrad import device as tdevice

    monkeypatch.setitem(tdevice._runtimes, "CPU", rt)

    @TinyJit
    def step(x):
        tw.grad = None
        out = x.relu().conv2d(tw)
        (out * out).sum().backward()
        Tensor.realize(x.grad, tw.grad)
        return x.grad, tw.grad

    rx, rw = torch.tensor(x, requires_grad=True), torch.tensor(wt, requires_grad=True)
    ref = F.conv2d(rx.relu(), rw)
    (ref * ref).sum().backward()
    for i in range(4):
        pool.done = i >= 2
        tx = Tensor(x, device="CPU", requires_grad=True)
        gx, gw = step(tx)
        np.testing.assert_allclose(gw.numpy(), rw.grad.numpy(), rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(gx.numpy(), rx.grad.numpy(), rtol=1e-4, atol=1e-4)
        if i == 1:
            assert calls["direct"] == 0 and calls["blas"] > 0, calls
            assert len(pool.optional) >= 2, pool.optional  # the weight gradient's and the scatter's
    assert calls["direct"] >= 2, calls


def test_a_scatter_that_cannot_run_is_not_compiled(tmp_path, monkeypatch):
    """Where the pair's window shares get a buffer (the scatter then never runs), the scatter's function is
    not queued for the compile workers; where the pair keeps them, it is."""
    import collections
    import dataclasses

    from tgrad import device as tdevice
    from tgrad import schedule_cache
    from tgrad.runtime.cpu import groups as cpu_groups
    from tgrad.runtime.cpu import pool as cpu_pool
    from tgrad.runtime.cpu import runtime as cpu_runtime

    monkeypatch.setenv("TGRAD_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_runtime, "TIERED", True)
    monkeypatch.setattr(cpu_pool, "default_workers", lambda: 1)
    scatters = []
    real = emit_numba_conv.render_input_grad
    monkeypatch.setattr(emit_numba_conv, "render_input_grad",
                        lambda *a: scatters.append(real(*a)) or scatters[-1])
    private = cpu_groups._private_of
    monkeypatch.setattr(schedule_cache, "_cache", collections.OrderedDict())  # (no runners of other tests)
    for kept, size in ((True, 17), (False, 18)):  # (a size each: schedules of their own)
        keep = private if kept else lambda items, groups, requested: set()
        monkeypatch.setattr(cpu_groups, "_private_of", keep)
        rt = cpu_runtime.CPURuntime()
        tuned = dataclasses.replace(rt.props.host, pair_min_result=1 << 16)
        rt.set_props(dataclasses.replace(rt.props, host=tuned))
        rt.pool = pool = _FakePool()
        monkeypatch.setitem(tdevice._runtimes, "CPU", rt)
        x, wt, _ = _conv_inputs(20, 16, 32, 32, size, size, 3, 3)
        got, want, paths = _input_grads(x, wt, True)
        assert paths == [True]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        assert (cpu_runtime._native(scatters[-1]).key in pool.optional) == kept, pool.optional


def test_a_failing_scatter_names_both_kernels(monkeypatch, cpu_tuning):
    """An error inside the input gradient's scatter is a KernelError naming the pair and showing the
    scatter's source, as the pair's own errors are."""
    import collections

    from tgrad import schedule_cache
    from tgrad.errors import KernelError
    from tgrad.runtime.cpu import runtime as cpu_runtime

    cpu_tuning(pair_min_result=1 << 16)
    monkeypatch.setattr(schedule_cache, "_cache", collections.OrderedDict())
    build = cpu_runtime.CPURuntime._build

    def broken(self, program, name, free=False):
        fn = build(self, program, name, free)
        if not program.name.endswith("_igrad"):
            return fn

        def fail(*a):
            raise RuntimeError("the compiled function returned error status 1")

        return fail

    monkeypatch.setattr(cpu_runtime.CPURuntime, "_build", broken)
    x, wt, _ = _conv_inputs(21, 16, 32, 32, 19, 19, 3, 3)  # (a size no other test schedules)
    with pytest.raises(KernelError, match=r"kernels r_\w+ and E_\w+ \(as one scatter\) failed to run: "
                                          r"RuntimeError: the compiled function returned error status 1"):
        _input_grads(x, wt, True)
