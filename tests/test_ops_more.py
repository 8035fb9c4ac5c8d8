"""Ops added for API parity (tinygrad's op tests, a PyTorch user's habits): forward and backward against
PyTorch on every test device, and the errors for bad arguments. Shapes are small and repeated on purpose.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.helpers import compare, helper_test_op
from tgrad import Device, Tensor, dtypes
from tgrad.errors import (
    ArgumentError,
    AutogradError,
    DTypeError,
    IndexRangeError,
    ShapeError,
    ValueOverflowError,
)

S = (3, 4)

# ------------------------------------------------------------------------------------------------
# functional autograd


def test_gradient_functional(device):
    x = Tensor([[1.0, -2.0], [3.0, 0.5]])
    y = Tensor([2.0, 4.0])
    z = Tensor([7.0])
    dx, dy, dz = ((x * y).sum() + (x * x).sum()).gradient(x, y, z)
    np.testing.assert_allclose(dx.numpy(), [[4.0, 0.0], [8.0, 5.0]])
    np.testing.assert_allclose(dy.numpy(), [4.0, -1.5])
    np.testing.assert_array_equal(dz.numpy(), [0.0])  # not used: zeros
    assert x.grad is None and y.grad is None
    # second order: d/dx of (d/dx x**3) = 6x
    w = Tensor([2.0, -1.0])
    (g1,) = (w * w * w).sum().gradient(w)
    (g2,) = g1.sum().gradient(w)
    np.testing.assert_allclose(g2.numpy(), [12.0, -6.0])
    (gs,) = (w * 3).gradient(w, gradient=Tensor([1.0, 2.0]))
    np.testing.assert_allclose(gs.numpy(), [3.0, 6.0])
    with pytest.raises(AutogradError, match="scalar"):
        (w * 3).gradient(w)
    with pytest.raises(AutogradError, match="float"):
        Tensor([1, 2]).sum().gradient(Tensor([1, 2]))


# ------------------------------------------------------------------------------------------------
# elementwise


@pytest.mark.parametrize(
    "name,low,high",
    [
        ("asin", -0.95, 0.95),
        ("acos", -0.95, 0.95),
        ("atan", -3, 3),
        ("sinh", -3, 3),
        ("cosh", -3, 3),
        ("asinh", -3, 3),
        ("acosh", 1.1, 4),
        ("atanh", -0.9, 0.9),
        ("log10", 0.1, 4),
    ],
)
def test_trig_hyperbolic(device, name, low, high):
    helper_test_op([S], getattr(torch, name), lambda x: getattr(x, name)(), low=low, high=high, atol=1e-5)


def test_trig_edges(device):
    x = [-math.inf, -1.5, -1.0, 0.0, 1.0, 1.5, math.inf, math.nan]
    for name in ("asin", "acos", "atan", "asinh", "sinh", "cosh"):
        compare(
            name,
            getattr(Tensor(x), name)().numpy(),
            getattr(torch, name)(torch.tensor(x)).numpy(),
            1e-5,
            1e-5,
        )


@pytest.mark.parametrize(
    "tfn,gfn",
    [
        (lambda x: F.celu(x, 0.5), lambda x: x.celu(0.5)),
        (F.selu, lambda x: x.selu()),
        (F.hardswish, lambda x: x.hardswish()),
        (F.softsign, lambda x: x.softsign()),
        (F.logsigmoid, lambda x: x.logsigmoid()),
        (lambda x: F.softmin(x, 1), lambda x: x.softmin(1)),
        (lambda x: F.normalize(x, dim=1), lambda x: x.normalize(dim=1)),
        (lambda x: F.normalize(x, p=3, dim=0), lambda x: x.normalize(p=3, dim=0)),
    ],
)
def test_activations(device, tfn, gfn):
    helper_test_op([S], tfn, gfn, low=-4, high=4)


def test_logsigmoid_extremes(device):
    helper_test_op(None, F.logsigmoid, lambda x: x.logsigmoid(), vals=[[-200.0, -30.0, 0.0, 30.0, 200.0]])


def test_binary_ops(device):
    helper_test_op([S, S], torch.logaddexp, lambda x, y: x.logaddexp(y))
    helper_test_op(
        None,
        torch.logaddexp,
        lambda x, y: x.logaddexp(y),
        vals=[[-math.inf, math.inf, 0.0, -math.inf], [-math.inf, 1.0, -math.inf, 2.0]],
        forward_only=True,
    )
    sign = [-1.0, 0.0, -0.0, 2.0]
    helper_test_op(
        [(4,)], lambda x: torch.copysign(x, torch.tensor(sign)), lambda x: x.copysign(Tensor(sign))
    )
    helper_test_op(
        None,
        torch.copysign,
        lambda x, y: x.copysign(y),
        vals=[[1.0, 2.0, -3.0, 0.0], [-0.0, 0.0, math.inf, -1.0]],
        forward_only=True,
    )


def test_isclose_isfinite_isinf(device):
    a = [1.0, math.nan, math.inf, -math.inf, 1e-9, 1.0]
    b = [1.0 + 1e-6, math.nan, math.inf, math.inf, 0.0, 1.1]
    for kw in ({}, {"equal_nan": True}, {"rtol": 0.2, "atol": 0.0}):
        compare(
            str(kw),
            Tensor(a).isclose(Tensor(b), **kw).numpy(),
            torch.isclose(torch.tensor(a), torch.tensor(b), **kw).numpy(),
            0,
            0,
        )
    assert Tensor(a).allclose(Tensor(a), equal_nan=True) and not Tensor(a).allclose(Tensor(b))
    compare("isfinite", Tensor(a).isfinite().numpy(), torch.isfinite(torch.tensor(a)).numpy(), 0, 0)
    np.testing.assert_array_equal(
        Tensor(a).isinf(detect_negative=False).numpy(), torch.isposinf(torch.tensor(a))
    )
    np.testing.assert_array_equal(
        Tensor(a).isinf(detect_positive=False).numpy(), torch.isneginf(torch.tensor(a))
    )


def test_shifts_and_bitwise_not(device):
    v = [[-7, -1, 0, 3, 100]]
    helper_test_op(None, lambda x: x << 3, vals=v)
    helper_test_op(None, lambda x: x >> 2, vals=v)
    helper_test_op(None, torch.bitwise_not, lambda x: x.bitwise_not(), vals=v)
    with pytest.raises(DTypeError, match="integer"):
        Tensor([1.0]) << 1


def test_bad_string_arguments(device):
    with pytest.raises(ArgumentError, match="rounding_mode"):
        Tensor([1.0]).div(2, rounding_mode="typo")
    with pytest.raises(ArgumentError, match="approximate"):
        Tensor([1.0]).gelu(approximate="typo")
    with pytest.raises(ArgumentError, match="reduction"):
        Tensor([0.5]).binary_crossentropy(Tensor([1.0]), reduction="typo")
    with pytest.raises(ArgumentError, match="reduction"):
        Tensor([[0.5, 1.0]]).cross_entropy(Tensor([1]), reduction="typo")


# ------------------------------------------------------------------------------------------------
# reductions, scans, sorting


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumulative(device, axis):
    helper_test_op([S], lambda x: torch.cummax(x, axis).values, lambda x: x.cummax(axis)[0])
    helper_test_op([S], lambda x: torch.cummin(x, axis).values, lambda x: x.cummin(axis)[0])
    helper_test_op([S], lambda x: torch.logcumsumexp(x, axis), lambda x: x.logcumsumexp(axis))
    helper_test_op([S], lambda x: torch.cumprod(x, axis), lambda x: x.cumprod(axis))
    v = [[1.0, 3.0, 3.0, 2.0, 5.0, 5.0]]
    helper_test_op(None, lambda x: torch.cummax(x, -1).indices, lambda x: x.cummax(-1)[1], vals=v)
    helper_test_op(None, lambda x: torch.cummin(x, -1).indices, lambda x: x.cummin(-1)[1], vals=v)


def test_cumulative_edges(device):
    helper_test_op([()], lambda x: torch.cumsum(x, 0), lambda x: x.cumsum(0))
    helper_test_op([()], lambda x: torch.cumprod(x, 0), lambda x: x.cumprod(0))
    helper_test_op(
        None,
        lambda x: torch.logcumsumexp(x, 0),
        lambda x: x.logcumsumexp(0),
        vals=[[-1000.0, 0.0, 1000.0, -math.inf]],
        forward_only=True,
    )
    for fn in (lambda x: x.cumsum(1), lambda x: x.cummax(1), lambda x: x.cumprod(-2)):
        with pytest.raises(IndexRangeError):
            fn(Tensor([1.0, 2.0]))


def test_var_std_mean(device):
    helper_test_op([S], lambda x: torch.std_mean(x, 1)[0], lambda x: x.std_mean(1)[0])
    helper_test_op([S], lambda x: torch.std_mean(x, 1)[1], lambda x: x.std_mean(1)[1])
    helper_test_op(
        [S], lambda x: torch.var_mean(x, 0, correction=0)[0], lambda x: x.var_mean(0, correction=0)[0]
    )


@pytest.mark.parametrize("dim,descending", [(0, False), (-1, True)])
def test_sort_topk(device, dim, descending):
    helper_test_op(
        [S], lambda x: x.sort(dim=dim, descending=descending).values, lambda x: x.sort(dim, descending)[0]
    )
    helper_test_op(
        [S],
        lambda x: x.sort(dim=dim, descending=descending).indices,
        lambda x: x.sort(dim, descending)[1],
        forward_only=True,
    )
    helper_test_op(
        [S], lambda x: x.argsort(dim, descending), lambda x: x.argsort(dim, descending), forward_only=True
    )
    helper_test_op(
        [S],
        lambda x: x.topk(2, dim, largest=not descending).values,
        lambda x: x.topk(2, dim, largest=not descending)[0],
    )


def test_sort_ties_nan_empty(device):
    v = [[2.0, math.nan, 1.0, 2.0, -math.inf, 1.0, math.nan]]
    for desc in (False, True):
        helper_test_op(
            None,
            lambda x, desc=desc: x.sort(stable=True, descending=desc).values,
            lambda x, desc=desc: x.sort(descending=desc)[0],
            vals=v,
            forward_only=True,
        )
        helper_test_op(
            None,
            lambda x, desc=desc: x.sort(stable=True, descending=desc).indices,
            lambda x, desc=desc: x.sort(descending=desc)[1],
            vals=v,
            forward_only=True,
        )
    helper_test_op([(0,)], lambda x: x.sort().values, lambda x: x.sort()[0], forward_only=True)
    with pytest.raises(IndexRangeError, match="topk"):
        Tensor([1.0, 2.0]).topk(3)


# ------------------------------------------------------------------------------------------------
# indexing-like ops


def _index(shape, high, seed=0):
    return np.random.default_rng(seed).integers(0, high, shape)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter(device, dim):
    # no index repeats along dim: PyTorch's src gradient (grad.gather) assumes that; with repeats tgrad's
    # last write wins and only that source gets a gradient
    unique = np.argsort(np.random.default_rng(1).random((3, 4)), axis=dim)[:2, :3]
    ti, gi = torch.tensor(unique), Tensor(unique)
    helper_test_op([(3, 4), (2, 3)], lambda x, s: x.scatter(dim, ti, s), lambda x, s: x.scatter(dim, gi, s))
    idx = _index((2, 3), 3)  # repeats: the last write wins, as on PyTorch's CPU
    ti, gi = torch.tensor(idx), Tensor(idx)
    helper_test_op(
        [(3, 4), (2, 3)],
        lambda x, s: x.scatter(dim, ti, s),
        lambda x, s: x.scatter(dim, gi, s),
        forward_only=True,
    )
    helper_test_op([(3, 4)], lambda x: x.scatter(dim, ti, 2.5), lambda x: x.scatter(dim, gi, 2.5))
    helper_test_op(
        [(3, 4)],
        lambda x: x.scatter(dim, ti, 2.0, reduce="add"),
        lambda x: x.scatter(dim, gi, 2.0, reduce="add"),
        forward_only=True,
    )


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_scatter_reduce(device, reduce):
    idx = _index((2, 3), 3)
    ti, gi = torch.tensor(idx), Tensor(idx)
    for include_self in (True, False):
        helper_test_op(
            [(3, 4), (2, 3)],
            lambda x, s, inc=include_self: x.scatter_reduce(0, ti, s, reduce, include_self=inc),
            lambda x, s, inc=include_self: x.scatter_reduce(0, gi, s, reduce, include_self=inc),
            forward_only=reduce in ("amax", "amin"),
        )


def test_scatter_errors(device):
    x, idx = Tensor.ones(3, 4), Tensor([[0, 1]])
    with pytest.raises(ArgumentError, match="reduce"):
        x.scatter_reduce(0, idx, Tensor.ones(1, 2), "typo")
    with pytest.raises(ShapeError, match="scatter"):
        x.scatter(0, Tensor.zeros(5, 1, dtype=dtypes.int64), Tensor.ones(1, 1))
    with pytest.raises(DTypeError, match="src"):
        x.scatter(0, idx, Tensor([[1, 2]]))
    with pytest.raises(IndexRangeError):
        x.scatter(2, idx, Tensor.ones(1, 2))


def test_masked(device):
    helper_test_op(
        [S], lambda x: x.masked_fill(x > 0.5, -math.inf), lambda x: x.masked_fill(x > 0.5, -math.inf)
    )
    helper_test_op([S], lambda x: x.masked_select(x > 0), lambda x: x.masked_select(x > 0))
    helper_test_op([S], lambda x: (x > 0.5).nonzero(), lambda x: (x > 0.5).nonzero(), forward_only=True)
    np.testing.assert_array_equal(Tensor([1, 0, 2]).nonzero(size=3).numpy(), [[0], [2], [-1]])
    np.testing.assert_array_equal(
        Tensor([1, 0, 2]).masked_select(Tensor([True, False, True]), size=3).numpy(), [1, 2, 0]
    )


def test_one_hot(device):
    data = [[1, 0], [3, 2]]
    helper_test_op(
        [], lambda: F.one_hot(torch.tensor(data), 5), lambda: Tensor(data).one_hot(5), forward_only=True
    )
    with pytest.raises(ArgumentError, match="num_classes"):
        Tensor(data).one_hot(-1)


def test_triangles_and_diagonals(device):
    helper_test_op([S], lambda x: x.tril(), lambda x: x.tril())
    helper_test_op([S], lambda x: x.triu(1), lambda x: x.triu(1))
    helper_test_op([(2, 3, 4)], lambda x: x.tril(-1), lambda x: x.tril(-1))
    helper_test_op([S], lambda x: x.diagonal(1), lambda x: x.diagonal(1))
    helper_test_op([(2, 3, 4)], lambda x: x.diagonal(-1, 2, 1), lambda x: x.diagonal(-1, 2, 1))
    for shape in [(4, 6), (6, 4), (1, 5), (0, 3), (2, 3, 4)]:  # every offset, off the plane too
        for offset in (0, 1, -1, 3, -4, 7):
            for dims in ((0, 1), (-1, -2), (0, -1)):
                empty = shape[0] == 0
                helper_test_op([shape], lambda x, o=offset, d=dims: x.diagonal(o, *d), forward_only=empty)
    helper_test_op([(4,)], lambda x: x.diag(), lambda x: x.diag())
    helper_test_op([(3,)], lambda x: x.diag(-1), lambda x: x.diag(-1))
    helper_test_op([S], lambda x: x.diag(), lambda x: x.diag())
    with pytest.raises(ShapeError, match="2 dimensions"):
        Tensor([1.0]).tril()


def test_roll_repeat_unfold(device):
    helper_test_op([S], lambda x: x.roll(1), lambda x: x.roll(1))
    helper_test_op([S], lambda x: x.roll((1, -5), (0, 1)), lambda x: x.roll((1, -5), (0, 1)))
    helper_test_op([S], lambda x: x.repeat_interleave(2, 1), lambda x: x.repeat_interleave(2, 1))
    helper_test_op([S], lambda x: x.repeat_interleave(2), lambda x: x.repeat_interleave(2))
    helper_test_op([S], lambda x: x.unfold(1, 2, 1), lambda x: x.unfold(1, 2, 1))
    helper_test_op([S], lambda x: x.unfold(0, 2, 2), lambda x: x.unfold(0, 2, 2))
    helper_test_op([S], lambda x: x.movedim(0, 1), lambda x: x.movedim(0, 1))
    with pytest.raises(ShapeError, match="roll"):
        Tensor.ones(2, 4).roll((1, 2))
    with pytest.raises(ShapeError, match="unfold"):
        Tensor.ones(8).unfold(0, 9, 1)
    with pytest.raises(IndexRangeError):
        Tensor.ones(8).unfold(1, 2, 1)


def test_meshgrid_stack(device):
    a, b = [1.0, 2.0, 3.0], [4.0, 5.0]
    for indexing in ("ij", "xy"):
        for k in range(2):
            helper_test_op(
                [],
                lambda k=k, ix=indexing: torch.meshgrid(torch.tensor(a), torch.tensor(b), indexing=ix)[k],
                lambda k=k, ix=indexing: Tensor(a).meshgrid(Tensor(b), indexing=ix)[k],
            )
    with pytest.raises(ValueError, match="indexing"):
        Tensor(a).meshgrid(indexing="typo")
    helper_test_op([S, S], lambda x, y: torch.stack((x, y), 1), lambda x, y: Tensor.stack(x, y, dim=1))
    helper_test_op([S, S], lambda x, y: torch.stack([x, y], 2), lambda x, y: Tensor.stack([x, y], 2))
    helper_test_op([S, S], lambda x, y: torch.stack([x, y]), lambda x, y: x.stack(y))
    with pytest.raises(ShapeError, match="same shape"):
        Tensor.stack(Tensor.ones(2), Tensor.ones(3))


def test_flip_repeated_axis(device):
    with pytest.raises(ShapeError, match="repeats"):
        Tensor.ones(3, 4).flip((0, 0))


# ------------------------------------------------------------------------------------------------
# losses


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_losses(device, reduction):
    target = [1, 0, 3]
    tt, gt = torch.tensor(target), Tensor(target)
    w = [0.5, 1.0, 2.0, 0.25]
    helper_test_op(
        [S], lambda x: F.nll_loss(x, tt, reduction=reduction), lambda x: x.nll_loss(gt, reduction=reduction)
    )
    helper_test_op(
        [S],
        lambda x: F.nll_loss(x, tt, torch.tensor(w), reduction=reduction, ignore_index=0),
        lambda x: x.nll_loss(gt, Tensor(w), reduction=reduction, ignore_index=0),
    )
    helper_test_op(
        [S, S], lambda x, y: F.mse_loss(x, y, reduction=reduction), lambda x, y: x.mse_loss(y, reduction)
    )
    helper_test_op(
        [S, S], lambda x, y: F.l1_loss(x, y, reduction=reduction), lambda x, y: x.l1_loss(y, reduction)
    )
    helper_test_op(
        [S, S],
        lambda x, y: F.smooth_l1_loss(x, y, reduction=reduction, beta=0.5),
        lambda x, y: x.smooth_l1_loss(y, reduction, beta=0.5),
    )
    pw = torch.tensor([1.0, 2.0, 0.5, 3.0])
    helper_test_op(
        [S, S],
        lambda x, y: F.binary_cross_entropy_with_logits(x, y.sigmoid(), pos_weight=pw, reduction=reduction),
        lambda x, y: x.binary_crossentropy_logits(y.sigmoid(), reduction, pos_weight=Tensor(pw.numpy())),
    )


def test_loss_errors(device):
    with pytest.raises(ArgumentError, match="reduction"):
        Tensor.ones(2, 3).nll_loss(Tensor([0, 1]), reduction="typo")
    with pytest.raises(ShapeError, match="nll_loss"):
        Tensor.ones(2, 3).nll_loss(Tensor([0, 1, 2]))


# ------------------------------------------------------------------------------------------------
# convolution and pooling


def test_conv_1d_3d_asymmetric(device):
    helper_test_op(
        [(2, 4, 7), (4, 2, 3)],
        lambda x, w: F.conv1d(x, w, padding=1, stride=2, groups=2),
        lambda x, w: x.conv2d(w, padding=1, stride=2, groups=2),
        atol=1e-4,
    )
    helper_test_op(
        [(1, 2, 4, 4, 3), (2, 2, 2, 3, 2)],
        lambda x, w: F.conv3d(x, w, padding=1),
        lambda x, w: x.conv2d(w, padding=1),
        atol=1e-4,
    )
    helper_test_op(
        [(1, 2, 5, 6), (2, 2, 3, 2)],
        lambda x, w: F.conv2d(F.pad(x, (1, 2, 0, 1)), w),
        lambda x, w: x.conv2d(w, padding=(1, 2, 0, 1)),
        atol=1e-4,
    )
    with pytest.raises(ShapeError, match="padding"):
        Tensor.ones(1, 1, 4, 4).conv2d(Tensor.ones(1, 1, 2, 2), padding=(1, 2, 3))


@pytest.mark.parametrize(
    "stride,padding,output_padding,dilation,groups",
    [(1, 0, 0, 1, 1), (2, 1, 1, 1, 1), (3, (1, 0), (2, 0), (2, 1), 2)],
)
def test_conv_transpose2d(device, stride, padding, output_padding, dilation, groups):
    helper_test_op(
        [(1, 4, 5, 4), (4, 2, 3, 2), (2 * groups,)],
        lambda x, w, b: F.conv_transpose2d(x, w, b, stride, padding, output_padding, groups, dilation),
        lambda x, w, b: x.conv_transpose2d(w, b, stride, padding, output_padding, dilation, groups),
        atol=1e-4,
    )


def test_conv_transpose1d(device):
    helper_test_op(
        [(1, 2, 5), (2, 3, 3)],
        lambda x, w: F.conv_transpose1d(x, w, stride=2),
        lambda x, w: x.conv_transpose2d(w, stride=2),
        atol=1e-4,
    )


@pytest.mark.parametrize("kernel,stride,padding", [(2, None, 0), (3, 2, 1), ((3, 2), (2, 3), (1, 0))])
def test_pool_ceil_mode(device, kernel, stride, padding):
    shape = [(1, 2, 7, 8)]
    helper_test_op(
        shape,
        lambda x: F.max_pool2d(x, kernel, stride, padding, ceil_mode=True),
        lambda x: x.max_pool2d(kernel, stride, padding, ceil_mode=True),
    )
    for cip in (True, False):
        helper_test_op(
            shape,
            lambda x, cip=cip: F.avg_pool2d(
                x, kernel, stride, padding, ceil_mode=True, count_include_pad=cip
            ),
            lambda x, cip=cip: x.avg_pool2d(kernel, stride, padding, ceil_mode=True, count_include_pad=cip),
        )
    helper_test_op(
        shape,
        lambda x: F.max_pool2d(x, kernel, stride, padding, return_indices=True)[1],
        lambda x: x.max_pool2d(kernel, stride, padding, return_indices=True)[1],
        forward_only=True,
    )


def test_pool_1d_3d_unpool(device):
    helper_test_op([(1, 2, 9)], lambda x: F.max_pool1d(x, 3, 2), lambda x: x.max_pool2d((3,), 2))
    helper_test_op([(1, 1, 4, 4, 4)], lambda x: F.avg_pool3d(x, 2), lambda x: x.avg_pool2d((2, 2, 2)))
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 6)).astype(np.float32)
    tv, ti = F.max_pool2d(torch.tensor(x), 2, return_indices=True)
    gv, gi = Tensor(x).max_pool2d(2, return_indices=True)
    compare("unpool", gv.max_unpool2d(gi, 2).numpy(), F.max_unpool2d(tv, ti, 2).numpy(), 1e-6, 1e-6)


# ------------------------------------------------------------------------------------------------
# constructors and errors


def test_random_constructors(device):
    w = Tensor.kaiming_normal(256, 64, a=0.0).numpy()
    assert abs(w.std() - math.sqrt(2 / 64)) < 0.02
    u = Tensor.scaled_uniform(16, 16).numpy()
    assert np.abs(u).max() <= 1 / 16
    with pytest.raises(ValueError):
        Tensor.kaiming_normal(2, -3)


def test_index_errors_are_index_errors(device):
    with pytest.raises(IndexError, match="out of range"):
        Tensor.ones(2, 3).sum(5)
    with pytest.raises(IndexError, match="too many"):
        Tensor.ones(2, 3)[0, 0, 0]
    with pytest.raises(IndexError, match="single ellipsis"):
        Tensor.ones(2, 3)[..., ...]
    with pytest.raises(RuntimeError, match="inner dimensions"):  # PyTorch raises RuntimeError here too
        Tensor.ones(2, 4).matmul(Tensor.ones(3, 2))


def test_dtype_min_max(device):
    assert dtypes.int32.max == 2**31 - 1 and dtypes.int32.min == -(2**31)
    assert dtypes.uint8.max == 255 and dtypes.float32.min == -math.inf and dtypes.bool.max is True


# ------------------------------------------------------------------------------------------------
# padding modes, einsum, interpolate, advanced indexing


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_pad_modes(device, mode):
    for pad in [(0, 2, 3, 2), (-1, 2, 2, -1), (1, 0, 4, 4)]:
        helper_test_op(
            [(1, 2, 5, 5)], lambda x, p=pad: F.pad(x, p, mode=mode), lambda x, p=pad: x.pad(p, mode=mode)
        )
    with pytest.raises(RuntimeError):  # PyTorch raises RuntimeError for these too
        Tensor.ones(1, 1, 5, 5).pad((3, 6, 0, 0), mode=mode if mode != "replicate" else "reflect")


def test_pad_mode_typo(device):
    with pytest.raises(NotImplementedError, match="mode"):
        Tensor.ones(3, 3).pad((1, 1), mode="typo")


@pytest.mark.parametrize(
    "formula,shapes",
    [
        ("ij,jk->ik", [(3, 4), (4, 5)]),
        ("ij,jk", [(3, 4), (4, 5)]),
        ("ij->ji", [(3, 4)]),
        ("ijk->", [(2, 3, 4)]),
        ("...id,...jd->...ij", [(2, 3, 4), (2, 5, 4)]),
        ("i...j,ji...->...", [(2, 3, 4, 5), (5, 2, 4)]),
        ("ii->i", [(4, 4)]),
        ("...ii->...", [(3, 4, 4)]),
        ("bi,bj->bij", [(2, 3), (2, 4)]),
    ],
)
def test_einsum(device, formula, shapes):
    helper_test_op(
        shapes, lambda *xs: torch.einsum(formula, *xs), lambda *xs: Tensor.einsum(formula, *xs), atol=1e-4
    )


def test_einsum_errors(device):
    with pytest.raises(ArgumentError, match="operands"):
        Tensor.einsum("ij,jk->ik", Tensor.ones(2, 2))
    with pytest.raises(RuntimeError, match="subscript"):
        Tensor.einsum("ij,jk->ik", [Tensor.ones(2, 3), Tensor.ones(4, 2)])


@pytest.mark.parametrize(
    "mode,size,align",
    [
        ("nearest", (5, 9), False),
        ("nearest-exact", (9, 4), False),
        ("bilinear", (7, 9), False),
        ("bilinear", (3, 10), True),
    ],
)
def test_interpolate(device, mode, size, align):
    kw = {"align_corners": align} if mode == "bilinear" else {}
    helper_test_op(
        [(1, 2, 6, 5)],
        lambda x: F.interpolate(x, size, mode=mode, **kw),
        lambda x: x.interpolate(size, mode, **kw),
        atol=1e-5,
    )


@pytest.mark.parametrize("align", [False, True])
def test_interpolate_bilinear_uint8_is_pytorchs_fixed_point(device, align):
    """uint8 images resize as PyTorch resizes them (separable 16-bit fixed-point weights, each pass rounded
    to uint8): rounding the exact float result differed by 1 in ~18% of tinygrad's test_ops pixels."""
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, (2, 3, 13, 17)).astype(np.uint8)
    for size in [(10, 10), (31, 20), (13, 40), (5, 17), (1, 4), (3, 1), (26, 34)]:  # (1, 1) trips PyTorch
        ref = F.interpolate(torch.from_numpy(x), size, mode="bilinear", align_corners=align).numpy()
        out = Tensor(x).interpolate(size, mode="bilinear", align_corners=align).numpy()
        assert out.dtype == np.uint8
        np.testing.assert_array_equal(out, ref, err_msg=f"size {size}")


def test_interpolate_1d_3d(device):
    helper_test_op([(1, 2, 7)], lambda x: F.interpolate(x, 11, mode="linear"), lambda x: x.interpolate(11))
    helper_test_op(
        [(1, 1, 3, 4, 2)],
        lambda x: F.interpolate(x, (2, 5, 3), mode="trilinear", align_corners=True),
        lambda x: x.interpolate((2, 5, 3), align_corners=True),
        atol=1e-5,
    )
    with pytest.raises(ArgumentError, match="mode"):
        Tensor.ones(1, 1, 4).interpolate(8, mode="cubic")


def test_advanced_indexing(device):
    rng = np.random.default_rng(0)
    a, b, c = rng.integers(0, 2, (3, 1, 1)), rng.integers(-4, 4, (1, 4, 1)), rng.integers(0, 5, (1, 1, 2))
    ta, tb, tc = (torch.tensor(v) for v in (a, b, c))
    ga, gb, gc = (Tensor(v) for v in (a, b, c))
    shape = [(2, 4, 5, 3)]
    helper_test_op(shape, lambda x: x[ta, tb, tc], lambda x: x[ga, gb, gc])
    helper_test_op(shape, lambda x: x[:, tb, tc], lambda x: x[:, gb, gc])
    helper_test_op(shape, lambda x: x[ta, :, tc], lambda x: x[ga, :, gc])  # not adjacent: index dims first
    helper_test_op(shape, lambda x: x[1, tb, None, 2], lambda x: x[1, gb, None, 2])
    helper_test_op(shape, lambda x: x[[1, 0], (2, 2)], lambda x: x[[1, 0], (2, 2)])
    helper_test_op(shape, lambda x: x[x > 0.5], lambda x: x[x > 0.5])
    helper_test_op(shape, lambda x: x[0, x[0, :, :, 0] > 0], lambda x: x[0, x[0, :, :, 0] > 0])
    t = Tensor.ones(10, 11, 12)
    bad_ones = (
        lambda: t[Tensor(1.5)],
        lambda: t[[1.5]],
        lambda: t[Tensor([True, False])],
        lambda: t[[0, 10]],
        lambda: t[:, [-12]],
    )
    for bad in bad_ones:
        with pytest.raises(IndexError):
            bad()


def test_prod_gradient_with_zeros(device):
    for v in ([[0.0, 2.0, 3.0], [0.0, 0.0, 3.0]], [[1.0, -2.0, 3.0], [4.0, 0.5, 0.0]]):
        helper_test_op(None, lambda x: x.prod(1), lambda x: x.prod(1), vals=[v])
        helper_test_op(None, lambda x: x.prod(), lambda x: x.prod(), vals=[v])


@pytest.mark.parametrize("exponent", [0.0, 0.3, -0.3, 1.0, 2.0, -1.0, 5.5])
def test_pow_gradient_edges(device, exponent):
    vals = [[-2.0, -0.5, 0.0, 0.5, 2.0]]  # at inf bases the gradient is 0 (README), PyTorch's inf or 0
    helper_test_op(None, lambda x: x**exponent, lambda x: x**exponent, vals=vals)


def test_pow_tensor_exponent_edges(device):
    helper_test_op(
        None, lambda x, y: x**y, vals=[[-2.0, 0.0, 0.0, 3.0, 0.7, -1.5], [3.0, 0.5, -1.0, -1.5, 0.0, 2.0]]
    )
    helper_test_op(None, lambda x: 0.7**x, lambda x: 0.7**x, vals=[[-2.0, 0.0, 1.0, 3.0]])
    helper_test_op(None, lambda x: (-2.0) ** x, lambda x: (-2.0) ** x, vals=[[-2.0, 0.0, 1.0, 3.0]])


def test_pow_second_derivative(device):
    x, t = Tensor([1.5, 2.0, 0.7]), torch.tensor([1.5, 2.0, 0.7], requires_grad=True)
    (g,) = (x**1.7).sum().gradient(x)
    (h,) = g.sum().gradient(x)
    (gt,) = torch.autograd.grad((t**1.7).sum(), t, create_graph=True)
    (ht,) = torch.autograd.grad(gt.sum(), t)
    compare("second derivative", h.numpy(), ht.numpy(), 1e-5, 1e-4)


def test_int_pow_and_shift_by_tensor(device):
    if device != "WEBGPU":  # WEBGPU holds int64 as int32 (README): 3**29 wraps there
        helper_test_op(None, lambda x: x**29, lambda x: x**29, vals=[[-2, 0, 2, 3]])
    with pytest.raises(ArgumentError, match="negative"):
        Tensor([1, 2]) ** -2
    x, n = np.array([5, -3, 1, -7], np.int32), np.array([0, 2, 8, 31], np.int32)
    tx, tn, gx, gn = torch.tensor(x), torch.tensor(n), Tensor(x), Tensor(n)
    compare("<<", (gx << gn).numpy(), (tx << tn).numpy(), 0, 0)
    compare(">>", (gx >> gn).numpy(), (tx >> tn).numpy(), 0, 0)


def test_sigmoid_extremes_gradient(device):
    helper_test_op(None, torch.sigmoid, lambda x: x.sigmoid(), vals=[[-400.0, -100.0, 0.0, 100.0, 400.0]])
    helper_test_op(None, torch.tanh, lambda x: x.tanh(), vals=[[-400.0, -10.0, 0.0, 10.0, 400.0]])


def test_arange_overflow(device):
    with pytest.raises(OverflowError, match="arange"):
        Tensor.arange(129, dtype=dtypes.int8)
    if device != "WEBGPU":  # int64 values past int32 do not exist there (README)
        assert Tensor.arange(2**40, 2**40 + 2).dtype == dtypes.int64


@pytest.mark.parametrize("dt", [dtypes.uint16, dtypes.uint32, dtypes.uint64])
def test_unsigned_dtypes(device, dt):
    if device not in (dtypes.UINT32_DEVICES if dt == dtypes.uint32 else dtypes.UINT_DEVICES):
        # a list, a Python scalar (tinygrad's Tensor(2**64 - 1, dtype=dtypes.uint64) made an int32 on WEBGPU)
        # and a tensor converted on creation are all refused, naming the dtype
        for make in (lambda: Tensor([1, 2], dtype=dt), lambda: Tensor(int(dt.max), dtype=dt),
                     lambda: Tensor(Tensor([1, 2]), dtype=dt), lambda: Tensor.full((2,), 7, dtype=dt)):
            with pytest.raises(DTypeError, match=f"{dt.name} exists on CPU, NUMPY, CL, .* only, not on"):
                make()
        return
    big = int(dt.max) - 5
    a, b = np.array([3, 7, big], dt.np), np.array([2, 3, 4], dt.np)
    ta, tb = Tensor(a), Tensor(b)
    assert ta.dtype == dt and dt.min == 0
    np.testing.assert_array_equal((ta + tb).numpy(), a + b)  # wraps like numpy
    np.testing.assert_array_equal((ta * tb).numpy(), a * b)
    np.testing.assert_array_equal((ta // tb).numpy(), a // b)
    np.testing.assert_array_equal((ta % tb).numpy(), a % b)
    np.testing.assert_array_equal((ta & 6).numpy(), a & 6)
    np.testing.assert_array_equal((ta >> 1).numpy(), a >> 1)
    np.testing.assert_array_equal((ta << 3).numpy(), a << dt.np.type(3))
    np.testing.assert_array_equal((ta < tb).numpy(), a < b)
    np.testing.assert_array_equal(ta.max().numpy(), a.max())
    np.testing.assert_array_equal((ta | int(dt.max)).numpy(), a | dt.np.type(dt.max))  # uint64: past int64
    np.testing.assert_array_equal(Tensor(int(dt.max), dtype=dt).numpy(), np.array(dt.max, dt.np))
    np.testing.assert_array_equal(ta.cast(dtypes.float32).numpy(), a.astype(np.float32))
    np.testing.assert_array_equal(Tensor([1.7, 300.2]).cast(dt).numpy(), np.array([1.7, 300.2]).astype(dt.np))
    with pytest.raises(DTypeError, match="promot"):
        ta + Tensor([1, 2, 3], dtype=dtypes.int32)
    assert Tensor([1, 2], dtype=dt.name).dtype == dt


def test_uint32_values_past_int32_match_numpy(device):
    """uint32 values past int32 through casts, compares, where, shifts and wrapping arithmetic (WEBGPU
    computes them as WGSL u32); a sum or cumsum gives int64, which WEBGPU without shader-int64 holds as int32:
    there these values past it raise (tests/test_webgpu_int64_overflow.py)."""
    if device not in dtypes.UINT32_DEVICES:
        return
    a = np.array([3, 7, 4294967290, 2147483648, 0], np.uint32)
    i = np.array([-5, 7, 2**31 - 1, -(2**31), 0], np.int32)
    f = np.array([1.7, 3e9, 4e9, 0.0, 2.2e9], np.float32)
    ta, ti, tf = Tensor(a), Tensor(i), Tensor(f)
    shifts = np.array([1, 2, 3, 31, 0], np.uint32)
    u32 = dtypes.uint32
    for got, want in [(ta.max(), a.max()), (ta.min(), a.min()), (ta.argmax(), a.argmax()),
                      (ta < 2147483649, a < 2147483649), (ta.cast(dtypes.int32), a.astype(np.int32)),
                      (ti.cast(u32), i.astype(np.uint32)), (tf.cast(u32), f.astype(np.uint32)),
                      (ta.cast(dtypes.float32), a.astype(np.float32)),
                      ((ta > 5).where(ta, 4294967295), np.where(a > 5, a, np.uint32(4294967295))),
                      (ta >> Tensor(shifts), a >> shifts), (ta * 3, a * np.uint32(3)),
                      (ta - 10, a - np.uint32(10))]:
        assert got.dtype == dtypes.from_any(want.dtype)
        np.testing.assert_array_equal(got.numpy(), want)
    if device == "WEBGPU" and not Device[device].target.int64:
        with pytest.raises(ValueOverflowError, match="uint32 -> int64"):
            ta.sum().numpy()
    else:
        np.testing.assert_array_equal(ta.sum().numpy(), a.astype(np.int64).sum())
        np.testing.assert_array_equal(ta.cumsum(0).numpy(), a.astype(np.int64).cumsum())


def test_pow_overflowing_gradient(device):
    """Where the result overflows the gradient is inf, as in PyTorch (not nan)."""
    helper_test_op(None, lambda x: x**101.0, lambda x: x**101.0, vals=[[-3.0, 0.5, 2.5]], forward_only=False)
    helper_test_op(None, lambda x, y: x**y, vals=[[0.5, 2.5, 3.0], [101.0, 101.0, 3.0]])


def test_integer_division_of_constants_matches_pytorch(device):
    """Division and remainder of a constant by a constant (one kernel of literals: the Triton emitter wrote
    Python's flooring `-5 // 2` for a truncating division, tinygrad's test_idiv_shift_rewrite_negative)."""
    for a in (-7, -5, -1, 5, 7):
        for b in (2, -2, 4):
            for mode in ("trunc", "floor"):
                got = Tensor(a).div(b, rounding_mode=mode).item()
                assert got == torch.tensor(a).div(b, rounding_mode=mode).item(), (a, b, mode)
            assert (Tensor(a) % b).item() == (torch.tensor(a) % b).item(), (a, b)
            assert Tensor(a).contiguous().div(b, rounding_mode="trunc").item() == int(a / b), (a, b)


@pytest.mark.parametrize("op,sym", [(lambda t: t + 2**40, r"\+"), (lambda t: t * -(2**35), r"\*"),
                                    (lambda t: t < 2**33, "<")])
def test_int64_constants_past_int32(device, op, sym):
    """An int64 constant past int32: numpy's value, or on WEBGPU (int64 held as int32 without shader-int64)
    a DTypeError naming the op and the constant."""
    a = np.array([1, -3, 7], np.int64)
    t = Tensor(a)
    if device == "WEBGPU" and not Device[device].target.int64:
        with pytest.raises(DTypeError, match=f"`{sym}` with the int64 constant"):
            op(t).numpy()
        return
    np.testing.assert_array_equal(op(t).numpy(), op(a))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_huber_loss_matches_torch(device, reduction):
    """F.huber_loss for three deltas, inf / -inf / nan in input and target: values and gradients."""
    rng = np.random.default_rng(2)
    x, y = (rng.standard_normal((4, 5)).astype(np.float32) * 2 for _ in range(2))
    x[0, 0], y[1, 1], x[2, 2], y[2, 2] = np.inf, np.nan, -np.inf, -np.inf
    for delta in (1.0, 0.3, 5.0):
        helper_test_op([], lambda a, d=delta: F.huber_loss(a, torch.tensor(y), reduction=reduction, delta=d),
                       lambda a, d=delta: a.huber_loss(Tensor(y), reduction, d), vals=[x], atol=1e-5,
                       rtol=1e-5, grad_atol=1e-5, grad_rtol=1e-5)
    with pytest.raises(ArgumentError, match="delta"):
        Tensor(x).huber_loss(Tensor(y), delta=0.0)
    with pytest.raises(RuntimeError):
        F.huber_loss(torch.tensor(x), torch.tensor(y), delta=0.0)


@pytest.mark.parametrize("reduction", ["mean", "batchmean", "sum", "none"])
def test_kl_div_matches_torch(device, reduction):
    """F.kl_div with log-probability inputs (a -inf one), targets with zeros, and log targets: values and
    gradients; a bad reduction string is an ArgumentError."""
    rng = np.random.default_rng(3)
    lp = np.log(rng.dirichlet(np.ones(5), 4)).astype(np.float32)
    tg = rng.dirichlet(np.ones(5), 4).astype(np.float32)
    tg[0, :2], lp[0, 0] = 0, -np.inf
    for log_target in (False, True):
        t = np.log(tg + 1e-3).astype(np.float32) if log_target else tg
        helper_test_op([], lambda a, t=t, lt=log_target: F.kl_div(a, torch.tensor(t), reduction=reduction,
                                                                   log_target=lt),
                       lambda a, t=t, lt=log_target: a.kl_div(Tensor(t), reduction, log_target=lt), vals=[lp],
                       atol=1e-5, rtol=1e-5, grad_atol=1e-5, grad_rtol=1e-5)
    with pytest.raises(ArgumentError, match="batchmean"):
        Tensor(lp).kl_div(Tensor(tg), "average")


@pytest.mark.parametrize("alpha", [2, 0.5, -1.5])
def test_add_sub_alpha(device, alpha):
    """Tensor.add / sub with PyTorch's keyword alpha (self + alpha * other): values, dtypes and gradients
    against PyTorch; float16 in float32, rounded once; a float alpha for integer tensors and an int alpha
    for bool tensors raise as in PyTorch."""
    helper_test_op([(3, 4), (3, 4)], lambda a, b: a.add(b, alpha=alpha))
    helper_test_op([(3, 4), (4,)], lambda a, b: a.sub(b, alpha=alpha))
    helper_test_op([(3, 4)], lambda a: a.sub(2.5, alpha=alpha))
    h = np.array([60000, 1, 0.001, -3.5], np.float16)
    np.testing.assert_array_equal(Tensor(h).add(Tensor(h), alpha=alpha * 1e-5).numpy(),
                                  torch.tensor(h).add(torch.tensor(h), alpha=alpha * 1e-5).numpy())
    i = np.array([1, -2, 3], np.int32)
    if isinstance(alpha, int):
        np.testing.assert_array_equal(Tensor(i).sub(Tensor(i), alpha=alpha).numpy(),
                                      torch.tensor(i).sub(torch.tensor(i), alpha=alpha).numpy())
    else:
        with pytest.raises(DTypeError, match="alpha"):
            Tensor(i).add(Tensor(i), alpha=alpha)
    with pytest.raises(DTypeError, match="alpha"):
        Tensor([True, False]).add(Tensor([True, True]), alpha=2)
    with pytest.raises(DTypeError, match="alpha"):  # (a bool alpha only for bool results, as PyTorch)
        Tensor([1.0]).add(Tensor([1.0]), alpha=True)
    for bool_alpha in (True, False):
        b1, b2 = [True, False, False], [False, True, False]
        np.testing.assert_array_equal(Tensor(b1).add(Tensor(b2), alpha=bool_alpha).numpy(),
                                      torch.tensor(b1).add(torch.tensor(b2), alpha=bool_alpha).numpy())
    with pytest.raises(ArgumentError, match="alpha"):
        Tensor([1.0]).add(1, alpha="2")
