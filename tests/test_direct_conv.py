"""A 2-d convolution's forward product runs on the CPU as a generated direct convolution
(tgrad/emit_numba_conv.py) instead of BLAS over copied windows. Values and gradients against PyTorch, for
strides, dilations, padding, kernel sizes, tile tails and dtypes; which path each conv takes is checked, so
a test cannot pass on the BLAS path alone."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tgrad import Tensor, fuse
from tgrad.runtime import cpu


def _paths(t: Tensor) -> list[bool]:
    """For each BLAS-planned kernel computing t: whether it runs as a direct convolution."""
    programs = [cpu._render(it.kernel) for it in fuse.schedule([t.node])]
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
])
def test_forward_matches_torch(n, cin, cout, h, w, k, stride, padding, dilation):
    x, wt, b = _conv_inputs(0, n, cin, cout, h, w, *k)
    out = Tensor(x).conv2d(Tensor(wt), Tensor(b), stride=stride, padding=padding, dilation=dilation).relu()
    assert _paths(out) == [True]
    tx, tw, tb = map(torch.from_numpy, (x, wt, b))
    ref = F.conv2d(tx, tw, tb, stride, padding, dilation).relu()
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype,special,tol", [(np.float64, False, 1e-12), (np.float32, True, 1e-4)])
def test_float64_and_nan_inf_match_torch(dtype, special, tol):
    x, wt, b = _conv_inputs(1, 8, 32, 16, 12, 12, 3, 3, dtype)
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
