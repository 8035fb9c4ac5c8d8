"""Convolution and pooling gradients against PyTorch on every device.

conv2d gives its input a custom gradient (autodiff.custom_gradient: col2im, one matmul over the output
channels and a sum of shifted shares; a transposed convolution for kernels of more than COL2IM_MAX_TERMS
positions) instead of the composed gradient of its sliding-window view, and pools whose windows tile the
input (stride == kernel) are a reshape: these tests cover the shapes where either could go wrong (strides,
padding on one side or negative, dilation, groups, sizes the windows do not divide, 1-d and 3-d, transposed
convs, second derivatives).
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.helpers import helper_test_op
from tgrad import Tensor, autodiff

CONV2D = [
    dict(),
    dict(stride=2),
    dict(padding=1),
    dict(dilation=2),
    dict(stride=2, padding=2, dilation=2),
    dict(groups=2),
    dict(stride=3, padding=1, groups=4),
    dict(padding=(1, 2)),
    dict(stride=(2, 1), dilation=(1, 3)),
]


# (sweep: every option and size on NUMPY and CPU, each option once with a size on the other devices)
@pytest.mark.sweep
@pytest.mark.parametrize("kw", CONV2D, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain")
@pytest.mark.parametrize("size", [(9, 11, 3), (8, 8, 2), (7, 6, 1)], ids=lambda s: "x".join(map(str, s)))
def test_conv2d_gradients(device, kw, size):
    h, w, k = size
    g = kw.get("groups", 1)
    helper_test_op(
        [(2, 4, h, w), (8, 4 // g, k, k), (8,)],
        lambda x, wt, b: F.conv2d(x, wt, b, **kw),
        lambda x, wt, b: x.conv2d(wt, b, **kw),
        atol=1e-4,
        grad_atol=1e-3,
    )


@pytest.mark.parametrize("padding", [(1, 0, 2, 1), (-1, 0, 0, -1), (0, 3, 0, 0)])
def test_conv2d_gradients_padding_per_side(device, padding):
    """F.pad order (left, right, top, bottom); negative values crop, as PyTorch's F.pad."""
    helper_test_op(
        [(2, 3, 7, 8), (5, 3, 3, 2)],
        lambda x, wt: F.conv2d(F.pad(x, padding), wt),
        lambda x, wt: x.conv2d(wt, padding=padding),
        atol=1e-4,
        grad_atol=1e-3,
    )


def test_conv1d_conv3d_gradients(device):
    helper_test_op(
        [(2, 3, 13), (4, 3, 4)],
        lambda x, wt: F.conv1d(x, wt, stride=2, padding=1, dilation=2),
        lambda x, wt: x.conv2d(wt, stride=2, padding=1, dilation=2),
        atol=1e-4,
        grad_atol=1e-3,
    )
    helper_test_op(
        [(1, 2, 5, 6, 4), (3, 2, 2, 3, 2)],
        lambda x, wt: F.conv3d(x, wt, padding=1, stride=(1, 2, 1)),
        lambda x, wt: x.conv2d(wt, padding=1, stride=(1, 2, 1)),
        atol=1e-4,
        grad_atol=1e-3,
    )


@pytest.mark.parametrize(
    "kw", [dict(), dict(stride=2, padding=1, output_padding=1), dict(groups=2, dilation=2)]
)
def test_conv_transpose2d_gradients(device, kw):
    g = kw.get("groups", 1)
    helper_test_op(
        [(2, 4, 5, 6), (4, 6 // g, 3, 3)],
        lambda x, wt: F.conv_transpose2d(x, wt, **kw),
        lambda x, wt: x.conv_transpose2d(wt, **kw),
        atol=1e-4,
        grad_atol=1e-3,
    )


@pytest.mark.parametrize("k", [3, 9], ids=["col2im", "transposed"])
def test_conv2d_second_derivative(device, k):
    """d/dx of |d conv(x, w)/d w|^2, through the custom gradient (col2im's matmul and shifted sums; for a
    9x9 kernel the transposed conv, with its own custom gradient), against torch.autograd.grad with
    create_graph=True."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, k, k)).astype(np.float32)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    out = F.conv2d(tx, tw, stride=2, padding=k // 2)
    gx_t, gw_t = torch.autograd.grad(out.square().sum(), (tx, tw), create_graph=True)
    (gx_t.square().sum() + gw_t.square().sum()).backward()
    X, W = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    out = X.conv2d(W, stride=2, padding=k // 2)
    gx, gw = out.square().sum().gradient(X, W)
    np.testing.assert_allclose(gx.numpy(), gx_t.detach().numpy(), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(gw.numpy(), gw_t.detach().numpy(), atol=1e-4, rtol=1e-4)
    ggx, ggw = (gx.square().sum() + gw.square().sum()).gradient(X, W)
    np.testing.assert_allclose(ggx.numpy(), tx.grad.numpy(), atol=1e-3, rtol=1e-3)
    np.testing.assert_allclose(ggw.numpy(), tw.grad.numpy(), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=3, dilation=2), dict(groups=2, stride=(1, 3))])
def test_conv2d_gradients_of_a_large_kernel(device, kw):
    """A 9x9 kernel (81 positions, over COL2IM_MAX_TERMS): the input gradient is a transposed convolution."""
    g = kw.get("groups", 1)
    helper_test_op(
        [(2, 4, 13, 14), (4, 4 // g, 9, 9)],
        lambda x, wt: F.conv2d(x, wt, **kw),
        lambda x, wt: x.conv2d(wt, **kw),
        atol=1e-4,
        grad_atol=1e-3,
    )


def test_conv2d_gradient_is_a_convolution():
    """The input gradient is a custom rule (col2im after one matmul), not the composed gradient of the
    sliding-window view (a reduce over overlapping windows with div/mod indexes): the node conv2d returns
    carries it."""
    x, w = Tensor.randn(1, 2, 6, 6, requires_grad=True), Tensor.randn(3, 2, 3, 3, requires_grad=True)
    out = x.conv2d(w)
    assert out.node in autodiff.CUSTOM
    with Tensor.no_grad:
        assert x.conv2d(w).node not in autodiff.CUSTOM


@pytest.mark.parametrize("stride", [1, 2])
def test_conv2d_builds_only_the_gradients_wanted(stride, monkeypatch):
    """A first layer's data needs no gradient: the conv's rule does not build the input's (its col2im graph
    was a tenth of an eager conv step), and a frozen weight's is not built either; what is asked for
    matches PyTorch."""
    built = []
    real = Tensor._conv_input_gradient
    monkeypatch.setattr(Tensor, "_conv_input_gradient", lambda *a: built.append(1) or real(*a))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    for x_grad, w_grad in ((False, True), (True, False), (True, True)):
        built.clear()
        tx, tw = Tensor(x, requires_grad=x_grad), Tensor(w, requires_grad=w_grad)
        (tx.conv2d(tw, stride=stride).relu() ** 2).sum().backward()
        rx, rw = torch.tensor(x, requires_grad=x_grad), torch.tensor(w, requires_grad=w_grad)
        (F.conv2d(rx, rw, stride=stride).relu() ** 2).sum().backward()
        assert len(built) == int(x_grad)
        for mine, ref, wanted in ((tx, rx, x_grad), (tw, rw, w_grad)):
            if wanted:
                np.testing.assert_allclose(mine.grad.numpy(), ref.grad.numpy(), rtol=1e-4, atol=1e-4)
            else:
                assert mine.grad is None


@pytest.mark.sweep
@pytest.mark.parametrize("op", ["max_pool2d", "avg_pool2d"])
@pytest.mark.parametrize(
    "shape,kw",
    [
        ((2, 3, 20, 20), dict(kernel_size=2)),
        ((2, 3, 7, 9), dict(kernel_size=2)),  # the last row and column are in no window
        ((2, 3, 8, 12), dict(kernel_size=(2, 4))),
        ((2, 3, 7, 9), dict(kernel_size=3, stride=3, padding=1, ceil_mode=True)),
        ((2, 3, 7, 9), dict(kernel_size=2, padding=1, ceil_mode=True)),
        ((2, 3, 9), dict(kernel_size=(3,))),  # 1-d
    ],
)
def test_tiling_pool_gradients(device, op, shape, kw):
    """Windows that tile the input (stride == kernel) are a reshape of it; overlapping ones a strided view."""
    fn = getattr(F, op if len(shape) == 4 else op.replace("2d", "1d"))
    helper_test_op([shape], lambda x: fn(x, **kw), lambda x: getattr(x, op)(**kw), atol=1e-5)


def test_conv2d_weight_used_twice(device):
    """conv(relu(conv(x, w, b)), w, b): the weight's gradient is the sum over both convs, each counted once
    (tinygrad's test_biased_conv2d; the custom rule once added the first conv's share twice)."""
    helper_test_op(
        [(1, 8, 5, 5), (8, 8, 1, 1), (8,)],
        lambda x, w, b: F.conv2d(F.conv2d(x, w, b).relu(), w, b),
        lambda x, w, b: x.conv2d(w, b).relu().conv2d(w, b),
        atol=1e-4,
        grad_atol=1e-3,
    )
    helper_test_op(
        [(2, 3, 9, 9), (3, 3, 3, 3)],
        lambda x, w: F.conv2d(F.conv2d(x, w, padding=1).tanh(), w, stride=2),
        lambda x, w: x.conv2d(w, padding=1).tanh().conv2d(w, stride=2),
        atol=1e-4,
        grad_atol=1e-3,
    )


@pytest.mark.parametrize(
    "kw", [dict(kernel_size=2), dict(kernel_size=2, padding=1), dict(kernel_size=3, stride=1, padding=1),
           dict(kernel_size=2, stride=2, ceil_mode=True)], ids=["tile", "pad", "overlap", "ceil"]
)
def test_max_pool_ties_and_nan_pick_like_pytorch(device, kw):
    """Each window's pick is its first maximum (the last NaN if it has one), as PyTorch's: the gradient
    goes there alone (tinygrad shares ties), return_indices names it; an all -inf window picks its first
    element inside the input."""
    cases = [np.zeros((1, 2, 4, 4), np.float32),
             np.array([[[[1, 1, 0, 2], [1, 1, 2, 2], [np.nan, 1, 3, 3], [1, np.nan, 3, 3]]]], np.float32),
             np.full((1, 1, 3, 3), -np.inf, np.float32)]
    for x in cases:
        tx = torch.tensor(x, requires_grad=True)
        to, ti = F.max_pool2d(tx, return_indices=True, **kw)
        to.sum().backward()
        X = Tensor(x, requires_grad=True)
        o, i = X.max_pool2d(return_indices=True, **kw)
        o.sum().backward()
        np.testing.assert_array_equal(o.numpy(), to.detach().numpy())
        np.testing.assert_array_equal(i.numpy(), ti.numpy())
        np.testing.assert_array_equal(X.grad.numpy(), tx.grad.numpy())


@pytest.mark.parametrize("limit", [0, 1 << 26], ids=["windows-not-kept", "windows-kept"])
def test_conv2d_gradients_with_and_without_kept_windows(device, limit, monkeypatch):
    """A conv whose weight needs a gradient keeps its windows (made once for the forward and the weight's
    gradient) unless they exceed KEEP_WINDOWS_MAX elements; a buffer input and a computed one, both ways."""
    import tgrad.ops.nn as nn_ops

    monkeypatch.setattr(nn_ops, "KEEP_WINDOWS_MAX", limit)
    helper_test_op(
        [(2, 3, 9, 8), (4, 3, 3, 3)],
        lambda x, wt: F.conv2d(x, wt, padding=1, stride=(1, 2)),
        lambda x, wt: x.conv2d(wt, padding=1, stride=(1, 2)),
        atol=1e-4,
        grad_atol=1e-3,
    )
    helper_test_op(
        [(2, 3, 9, 8), (4, 3, 3, 3)],
        lambda x, wt: F.conv2d((x * 2).relu(), wt, dilation=2),
        lambda x, wt: (x * 2).relu().conv2d(wt, dilation=2),
        atol=1e-4,
        grad_atol=1e-3,
    )
