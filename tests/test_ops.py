"""The op suite: every Tensor op forward and backward against PyTorch (CPU), on every test device.

Shapes are small and repeated on purpose: kernels are compiled once per distinct kernel.
"""

import math

import numpy as np
import pytest
import torch

from tests.helpers import compare, float64_or_raises, has_float64, helper_test_op
from tgrad import Tensor, dtypes
from tgrad.errors import AutogradError, DeviceError, DTypeError, ShapeError, TgradError
from tgrad.graph import Op

S = (3, 4)
S3 = (2, 3, 4)


# ------------------------------------------------------------------------------------------------
# construction


def test_from_list_scalar_numpy(device):
    assert Tensor([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
    assert Tensor([[1, 2], [3, 4]]).dtype == dtypes.int64
    assert Tensor([1.5, 2.5]).dtype == dtypes.float32
    assert Tensor([True, False]).dtype == dtypes.bool
    assert Tensor(3.5).item() == 3.5
    assert Tensor(3.5).shape == ()
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    t = Tensor(a)
    assert t.dtype == dtypes.int32 and t.shape == (2, 3)
    np.testing.assert_array_equal(t.numpy(), a)
    assert Tensor([1, 2], dtype=dtypes.float16).dtype == dtypes.float16
    as_double = float64_or_raises(lambda: Tensor([1, 2], dtype="float64").numpy())
    assert as_double is None or as_double.dtype == np.float64


def test_full_zeros_ones(device):
    np.testing.assert_array_equal(Tensor.zeros(2, 3).numpy(), np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(Tensor.ones((2, 3)).numpy(), np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(Tensor.full((2, 2), 7).numpy(), np.full((2, 2), 7))
    assert Tensor.full((2, 2), 7).dtype == dtypes.int64
    assert Tensor.empty(2, 2).shape == (2, 2)
    x = Tensor.rand(2, 3)
    assert x.zeros_like().numpy().sum() == 0 and x.ones_like().shape == (2, 3)
    np.testing.assert_array_equal(x.full_like(3.0).numpy(), np.full((2, 3), 3.0, np.float32))
    assert x.rand_like().shape == (2, 3)


def test_arange_linspace_eye(device):
    np.testing.assert_array_equal(Tensor.arange(5).numpy(), np.arange(5))
    np.testing.assert_array_equal(Tensor.arange(2, 10, 3).numpy(), np.arange(2, 10, 3))
    np.testing.assert_allclose(Tensor.arange(0, 1, 0.25).numpy(), np.arange(0, 1, 0.25, dtype=np.float32))
    np.testing.assert_allclose(Tensor.linspace(0, 1, 5).numpy(), torch.linspace(0, 1, 5).numpy())
    np.testing.assert_array_equal(Tensor.eye(3).numpy(), np.eye(3, dtype=np.float32))
    np.testing.assert_array_equal(Tensor.eye(2, 3).numpy(), np.eye(2, 3, dtype=np.float32))


def test_random(device):
    Tensor.manual_seed(42)
    a = Tensor.rand(100).numpy()
    Tensor.manual_seed(42)
    b = Tensor.rand(100).numpy()
    np.testing.assert_array_equal(a, b)
    assert 0 <= a.min() and a.max() < 1
    n = Tensor.randn(2000).numpy()
    assert abs(n.mean()) < 0.1 and abs(n.std() - 1) < 0.1
    r = Tensor.randint(1000, low=3, high=7).numpy()
    assert r.min() >= 3 and r.max() <= 6
    u = Tensor.uniform(1000, low=-2, high=-1).numpy()
    assert u.min() >= -2 and u.max() <= -1
    w = Tensor.kaiming_uniform(64, 32, a=math.sqrt(5)).numpy()
    bound = math.sqrt(2 / 6) * math.sqrt(3 / 32)
    assert np.abs(w).max() <= bound and np.abs(w).max() > bound * 0.8
    gl = Tensor.glorot_uniform(8, 8).numpy()
    assert np.abs(gl).max() <= math.sqrt(6 / 16)
    nm = Tensor.normal(1000, mean=3.0, std=0.5).numpy()
    assert abs(nm.mean() - 3) < 0.1


# ------------------------------------------------------------------------------------------------
# elementwise


@pytest.mark.parametrize(
    "name,fn",
    [
        ("add", lambda a, b: a + b),
        ("sub", lambda a, b: a - b),
        ("mul", lambda a, b: a * b),
        ("div", lambda a, b: a / b),
        ("maximum", lambda a, b: a.maximum(b)),
        ("minimum", lambda a, b: a.minimum(b)),
    ],
)
def test_binary(device, name, fn):
    helper_test_op([S, S], fn)


def test_broadcast(device):
    helper_test_op([(3, 1), (1, 4)], lambda a, b: a * b + a)
    helper_test_op([S3, (4,)], lambda a, b: a - b)
    helper_test_op([(2, 1, 4), (3, 1)], lambda a, b: a / (b.abs() + 1))


def test_scalars_both_sides(device):
    helper_test_op([S], lambda a: 2 + a * 3 - 1)
    helper_test_op([S], lambda a: 1 - a)
    helper_test_op([S], lambda a: 2 / (a.abs() + 1))
    helper_test_op([S], lambda a: a / 4)


def test_pow(device):
    helper_test_op([S], lambda a: a**2)
    helper_test_op([S], lambda a: a**3)
    helper_test_op([S], lambda a: a.abs() ** 0.5, low=0.5)
    helper_test_op([S], lambda a: a**-1, low=0.5, high=2)
    helper_test_op([S, S], lambda a, b: a**b, low=0.5, high=2)
    helper_test_op([S], lambda a: 2**a)
    helper_test_op([S], lambda a: a**1.5, low=0.5, high=2)
    helper_test_op([S], lambda a: a**0, forward_only=True)


def test_pow_negative_base(device):
    helper_test_op([(5,)], lambda a: a**3, vals=[[-2.0, -1.5, 0.0, 1.0, 2.0]], forward_only=True)
    helper_test_op(
        [(4,), (4,)],
        lambda a, b: a**b,
        vals=[[-2.0, -2.0, 0.0, 3.0], [2.0, 3.0, 2.0, 0.0]],
        forward_only=True,
    )


def test_floordiv_mod_int(device):
    a = [7, -7, 7, -7, 0, 5, -1]
    b = [2, 2, -2, -2, 3, 5, 3]
    for fn in (lambda x, y: x // y, lambda x, y: x % y):
        out = fn(Tensor(a), Tensor(b))
        ref = fn(torch.tensor(a), torch.tensor(b))
        compare("intdiv", out.numpy(), ref.numpy(), 0, 0)
        assert out.dtype == dtypes.int64
    compare("scalar", (Tensor(a) // 3).numpy(), (torch.tensor(a) // 3).numpy(), 0, 0)
    compare("scalar", (Tensor(a) % -3).numpy(), (torch.tensor(a) % -3).numpy(), 0, 0)
    compare(
        "trunc",
        Tensor(a).div(Tensor(b), rounding_mode="trunc").numpy(),
        torch.div(torch.tensor(a), torch.tensor(b), rounding_mode="trunc").numpy(),
        0,
        0,
    )


def test_floordiv_mod_float(device):
    helper_test_op([S, S], lambda a, b: a // b, forward_only=True, low=0.5)
    helper_test_op([S, S], lambda a, b: a % b, forward_only=True)
    helper_test_op([S], lambda a: a % 0.7, forward_only=True)


def test_int_true_div_is_float(device):
    out = Tensor([1, 2, 3]) / Tensor([2, 2, 2])
    assert out.dtype == dtypes.float32
    np.testing.assert_allclose(out.numpy(), [0.5, 1.0, 1.5])


@pytest.mark.parametrize(
    "name,fn,low,high",
    [
        ("neg", lambda a: -a, -2, 2),
        ("exp", lambda a: a.exp(), -2, 2),
        ("exp2", lambda a: a.exp2(), -2, 2),
        ("log", lambda a: a.log(), 0.1, 3),
        ("log2", lambda a: a.log2(), 0.1, 3),
        ("sqrt", lambda a: a.sqrt(), 0.1, 3),
        ("rsqrt", lambda a: a.rsqrt(), 0.1, 3),
        ("sin", lambda a: a.sin(), -3, 3),
        ("cos", lambda a: a.cos(), -3, 3),
        ("tan", lambda a: a.tan(), -1, 1),
        ("abs", lambda a: a.abs(), -2, 2),
        ("reciprocal", lambda a: a.reciprocal(), 0.5, 2),
        ("relu", lambda a: a.relu(), -2, 2),
        ("sigmoid", lambda a: a.sigmoid(), -3, 3),
        ("tanh", lambda a: a.tanh(), -3, 3),
        ("silu", lambda a: torch.nn.functional.silu(a) if isinstance(a, torch.Tensor) else a.silu(), -3, 3),
        ("square", lambda a: a.square(), -2, 2),
    ],
)
def test_unary(device, name, fn, low, high):
    helper_test_op([S], fn, low=low, high=high)


def test_sign_trunc_floor_ceil_round(device):
    vals = [[-2.5, -1.5, -0.5, 0.0, 0.5, 1.5, 2.5, 1.2, -1.7]]
    for fn in (
        lambda a: a.sign(),
        lambda a: a.trunc(),
        lambda a: a.floor(),
        lambda a: a.ceil(),
        lambda a: a.round(),
    ):
        helper_test_op(None, fn, vals=vals, forward_only=True)
    helper_test_op([S], lambda a: a.sign() * a)


def test_activations(device):
    F = torch.nn.functional
    helper_test_op([S], lambda a: F.leaky_relu(a, 0.01), lambda a: a.leakyrelu(0.01))
    helper_test_op([S], lambda a: F.leaky_relu(a, 0.2), lambda a: a.leaky_relu(0.2))
    helper_test_op([S], lambda a: F.elu(a), lambda a: a.elu())
    helper_test_op([S], lambda a: F.gelu(a), lambda a: a.gelu(), atol=1e-5)
    helper_test_op([S], lambda a: F.gelu(a, approximate="tanh"), lambda a: a.gelu(approximate="tanh"))
    helper_test_op([S], lambda a: F.silu(a), lambda a: a.swish())
    helper_test_op([S], lambda a: F.softplus(a), lambda a: a.softplus())
    helper_test_op([S], lambda a: F.mish(a), lambda a: a.mish())
    helper_test_op([S], lambda a: F.hardtanh(a), lambda a: a.hardtanh())
    helper_test_op([S], lambda a: F.relu6(a * 4), lambda a: (a * 4).relu6())
    helper_test_op([S], lambda a: F.hardsigmoid(a * 3), lambda a: (a * 3).hardsigmoid())
    helper_test_op([S], lambda a: torch.erf(a), lambda a: a.erf(), atol=1e-6)


def test_clip(device):
    helper_test_op([S], lambda a: a.clip(-0.5, 0.7))
    helper_test_op([S], lambda a: a.clamp(min=-0.5))
    helper_test_op([S], lambda a: a.clamp(max=0.5))


def test_where(device):
    helper_test_op([S, S, S], lambda c, a, b: torch.where(c > 0, a, b), lambda c, a, b: (c > 0).where(a, b))
    helper_test_op([S, (4,)], lambda c, a: torch.where(c > 0, a, 2.0), lambda c, a: (c > 0).where(a, 2.0))
    helper_test_op([S, S], lambda c, b: torch.where(c > 0, 0.5, b), lambda c, b: (c > 0).where(0.5, b))


def test_comparisons(device):
    for fn in (
        lambda a, b: a < b,
        lambda a, b: a <= b,
        lambda a, b: a > b,
        lambda a, b: a >= b,
        lambda a, b: a == b,
        lambda a, b: a != b,
    ):
        helper_test_op(None, fn, vals=[[1.0, 2.0, 3.0, 4.0], [2.0, 2.0, 1.0, 5.0]])
    out = Tensor([1, 2, 3]) < 2.5
    assert out.dtype == dtypes.bool and out.tolist() == [True, True, False]
    assert (2 < Tensor([1, 2, 3])).tolist() == [False, False, True]


def test_logical_bitwise(device):
    a, b = [True, True, False, False], [True, False, True, False]
    ta, tb = torch.tensor(a), torch.tensor(b)
    for fn in (lambda x, y: x & y, lambda x, y: x | y, lambda x, y: x ^ y):
        compare("logic", fn(Tensor(a), Tensor(b)).numpy(), fn(ta, tb).numpy(), 0, 0)
    compare("not", Tensor(a).logical_not().numpy(), torch.logical_not(ta).numpy(), 0, 0)
    compare("invert", (~Tensor(a)).numpy(), (~ta).numpy(), 0, 0)
    i, j = [5, 3, -1, 12], [3, 6, 7, -8]
    ti, tj = torch.tensor(i, dtype=torch.int32), torch.tensor(j, dtype=torch.int32)
    for fn in (lambda x, y: x & y, lambda x, y: x | y, lambda x, y: x ^ y):
        compare(
            "bits",
            fn(Tensor(i, dtype=dtypes.int32), Tensor(j, dtype=dtypes.int32)).numpy(),
            fn(ti, tj).numpy(),
            0,
            0,
        )
    compare("~int", (~Tensor(i, dtype=dtypes.int32)).numpy(), (~ti).numpy(), 0, 0)


# ------------------------------------------------------------------------------------------------
# dtypes


def test_promotion(device):
    cases = [
        (dtypes.uint8, dtypes.int8, torch.uint8, torch.int8),
        (dtypes.int32, dtypes.float16, torch.int32, torch.float16),
        (dtypes.int32, dtypes.int64, torch.int32, torch.int64),
        (dtypes.float16, dtypes.float32, torch.float16, torch.float32),
        (dtypes.bool, dtypes.int32, torch.bool, torch.int32),
    ]
    for da, db, ta, tb in cases:
        out = Tensor([1, 0], dtype=da) + Tensor([1, 1], dtype=db)
        ref = torch.tensor([1, 0], dtype=ta) + torch.tensor([1, 1], dtype=tb)
        assert out.dtype.name == str(ref.dtype).split(".")[-1]
        compare("promote", out.numpy(), ref.numpy(), 0, 0)
    assert (Tensor([1, 2], dtype=dtypes.int32) * 2.5).dtype == dtypes.float32
    assert (Tensor([1, 2], dtype=dtypes.int32) * 2).dtype == dtypes.int32
    assert (Tensor([1.0], dtype=dtypes.float16) * 2.5).dtype == dtypes.float16


def test_promotion_with_a_0d_tensor_as_pytorch(device):
    """PyTorch's rule for a 0-d tensor beside a tensor with dimensions: its dtype counts only where its
    category (bool < integer < float) is higher (int32 + 0-d int64 is int32, float16 + 0-d float32 is
    float16); tgrad promoted as between two tensors (int64, float32: other dtypes and other values). Pairs
    of both orders, add / mul / comparison / where, values and dtypes against PyTorch."""
    pairs = [("int32", "int64"), ("uint8", "int8"), ("float16", "float32"), ("int32", "float32"),
             ("bool", "int64"), ("bool", "float32"), ("uint8", "float16"), ("int64", "float16")]
    for a, b in pairs + [(b, a) for a, b in pairs]:
        ta, tb = getattr(torch, a), getattr(torch, b)
        x, z = torch.tensor([1, 0, 1], dtype=ta), torch.tensor(1, dtype=tb)
        mx, mz = Tensor([1, 0, 1], dtype=dtypes.from_any(a)), Tensor(1, dtype=dtypes.from_any(b))
        for name, f in [("add", lambda u, v: u + v), ("mul", lambda u, v: v * u), ("lt", lambda u, v: u < v)]:
            ref, out = f(x, z), f(mx, mz)
            assert out.dtype.name == str(ref.dtype).split(".")[-1], (a, b, name)
            compare(f"{a} {name} 0-d {b}", out.numpy(), ref.numpy(), 0, 0)
        ref, out = torch.where(x > 0, x, z), (mx > 0).where(mx, mz)
        assert out.dtype.name == str(ref.dtype).split(".")[-1], (a, b, "where")
    with np.errstate(over="ignore"):  # the values follow: 60000 - 70000 in float16 is -inf
        got = (Tensor([60000.0], dtype=dtypes.float16) - Tensor(70000.0)).numpy()
    assert got.dtype == np.float16 and got[0] == -np.inf


def test_casts(device):
    v = [-2.7, -0.5, 0.0, 0.5, 2.7, 100.9]
    tv = torch.tensor(v)
    for dt, tdt in (
        (dtypes.int32, torch.int32),
        (dtypes.int64, torch.int64),
        (dtypes.bool, torch.bool),
        (dtypes.float16, torch.float16),
        (dtypes.float64, torch.float64),
        (dtypes.int8, torch.int8),
    ):
        if dt == dtypes.float64 and not has_float64(device):
            float64_or_raises(lambda: Tensor(v).double().numpy(), device)
            continue
        compare(dt.name, Tensor(v).cast(dt).numpy(), tv.to(tdt).numpy(), 1e-3, 1e-3)
    assert Tensor(v).int().dtype == dtypes.int32 and Tensor(v).half().dtype == dtypes.float16
    assert Tensor([1, 2]).float().dtype == dtypes.float32 and Tensor([0, 2]).bool().tolist() == [False, True]
    assert Tensor([1.0]).double().dtype == dtypes.float64 and Tensor([1.0]).long().dtype == dtypes.int64


def test_int_overflow_wraps(device):
    a = np.array([100, 120, -128], dtype=np.int8)
    out = Tensor(a) + Tensor(a)
    np.testing.assert_array_equal(out.numpy(), a + a)
    u = np.array([250, 3], dtype=np.uint8)
    np.testing.assert_array_equal((Tensor(u) + Tensor(u)).numpy(), u + u)


def test_half_compute(device):
    helper_test_op(
        [S, S],
        lambda a, b: (a * b + 1).sum(1),
        dtype=np.float16,
        atol=1e-2,
        rtol=1e-2,
        grad_atol=1e-2,
        grad_rtol=1e-2,
    )
    helper_test_op(
        [S], lambda a: a.exp(), dtype=np.float16, atol=1e-2, rtol=1e-2, grad_atol=1e-2, grad_rtol=1e-2
    )


def test_double(device):
    float64_or_raises(lambda: helper_test_op([S, S], lambda a, b: (a * b).exp().sum(0), dtype=np.float64,
                                             atol=1e-10, rtol=1e-10))


# ------------------------------------------------------------------------------------------------
# reductions


@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2)])
def test_sum(device, axis):
    helper_test_op([S3], lambda a: a.sum(axis) if axis is not None else a.sum())
    if axis is not None:
        helper_test_op([S3], lambda a: a.sum(axis, keepdim=True))


def test_sum_int_bool(device):
    out = Tensor([[1, 2], [3, 4]], dtype=dtypes.int32).sum(0)
    assert out.dtype == dtypes.int64 and out.tolist() == [4, 6]
    assert Tensor([True, True, False]).sum().item() == 2


@pytest.mark.parametrize("axis", [None, 0, 2])
def test_mean_max_min(device, axis):
    kw = {} if axis is None else {"dim": axis}
    helper_test_op([S3], lambda a: a.mean(**kw))
    helper_test_op([S3], lambda a: a.amax(**kw) if axis is not None else a.max(), lambda a: a.max(axis))
    helper_test_op([S3], lambda a: a.amin(**kw) if axis is not None else a.min(), lambda a: a.min(axis))


def test_max_ties_gradient(device):
    # ties share the gradient evenly, as torch.amax does
    helper_test_op(None, lambda a: a.amax(), lambda a: a.max(), vals=[[1.0, 3.0, 3.0, 2.0]])


def test_min_max_int(device):
    v = [[3, -128, 7], [-5, 2, 127]]
    t = torch.tensor(v, dtype=torch.int8)
    compare("max", Tensor(v, dtype=dtypes.int8).max(1).numpy(), t.amax(1).numpy(), 0, 0)
    compare("min", Tensor(v, dtype=dtypes.int8).min(1).numpy(), t.amin(1).numpy(), 0, 0)


def test_prod(device):
    helper_test_op([S], lambda a: a.prod(1), low=0.5, high=1.5)
    helper_test_op([S], lambda a: a.prod(), low=0.5, high=1.5)


def test_var_std(device):
    helper_test_op([S3], lambda a: a.var(1))
    helper_test_op([S3], lambda a: a.std(-1, keepdim=True))
    helper_test_op([S3], lambda a: a.var(1, correction=0), lambda a: a.var(1, correction=0))
    helper_test_op([S3], lambda a: a.std())


def test_argmax_argmin(device):
    for fn in (
        lambda a: a.argmax(),
        lambda a: a.argmax(1),
        lambda a: a.argmin(0),
        lambda a: a.argmax(-1, keepdim=True),
    ):
        helper_test_op([S3], fn, forward_only=True)
    # first index on ties, like PyTorch
    helper_test_op(None, lambda a: a.argmax(), vals=[[1.0, 5.0, 5.0, 2.0]], forward_only=True)


def test_softmax_family(device):
    helper_test_op([S3], lambda a: a.softmax(-1))
    helper_test_op([S3], lambda a: a.softmax(1))
    helper_test_op([S3], lambda a: a.log_softmax(-1))
    helper_test_op([S3], lambda a: torch.logsumexp(a, 1), lambda a: a.logsumexp(1))
    helper_test_op(
        [S3], lambda a: torch.logsumexp(a, 2, keepdim=True), lambda a: a.logsumexp(2, keepdim=True)
    )


def test_softmax_and_log_softmax_build_the_tensor_ops_graph(device):
    """softmax and log_softmax build their graphs from nodes (no tensor per step): the nodes the Tensor
    ops of their definitions build (hash-consed, so the same graph is the same node object)."""
    for dtype in ("float32", "float16", "int32"):
        x = Tensor((np.arange(24).reshape(2, 3, 4) % 5).tolist(), dtype=dtype)
        for axis in (-1, 0, 1):
            if dtype == "float16":  # computed in float32 and rounded once, as PyTorch's
                with Tensor.no_grad:
                    assert x.softmax(axis).node is x.float().softmax(axis).half().node
                    assert x.log_softmax(axis).node is x.float().log_softmax(axis).half().node
                continue
            f = x.float() if dtype == "int32" else x
            m = f - f.max(axis, keepdim=True).detach()
            e = m.exp()
            with Tensor.no_grad:
                assert x.softmax(axis).node is (e * e.sum(axis, keepdim=True).reciprocal()).node
            soft = x.softmax(axis)  # (with gradients: the same value under softmax's own gradient rule)
            p = e * e.sum(axis, keepdim=True).reciprocal()
            assert soft.node.op is Op.DETACH and soft.node.srcs[0] is p.node
            assert x.log_softmax(axis).node is (m - m.exp().sum(axis, keepdim=True).log()).node
    s = Tensor(1.5)  # a 0-d tensor: the same nodes, reduced over no axis
    with Tensor.no_grad:
        m = s - s.max(0, keepdim=True).detach()
        assert s.softmax(0).node is (m.exp() * m.exp().sum(0, keepdim=True).reciprocal()).node
        assert s.log_softmax(-1).node is (m - m.exp().sum(-1, keepdim=True).log()).node
    helper_test_op([()], lambda a: a.softmax(0))
    helper_test_op([()], lambda a: a.log_softmax(-1))
    helper_test_op([(3, 0)], lambda a: a.softmax(1), forward_only=True)


def test_cross_entropy_class_labels_int32_int64_and_ignored_rows(device):
    """cross_entropy's common case (float32 (N, C) logits, class labels, no smoothing, no weight): values and
    gradients as PyTorch's, for int64 and int32 labels, with and without rows labelled ignore_index (a
    label outside [0, C)), in each reduction."""
    F = torch.nn.functional
    for labels in ([0, 3, 1, -100, 2, 1], [1, 1, 0, 2, 3, 3], [-100] * 6):
        for dtype in ("int64", "int32"):
            for reduction in ("mean", "sum", "none"):
                helper_test_op(
                    [(6, 4)],
                    lambda x: F.cross_entropy(x, torch.tensor(labels), reduction=reduction),  # noqa: B023
                    lambda x: x.cross_entropy(Tensor(labels, dtype=dtype), reduction=reduction),  # noqa: B023
                )


def test_cumsum(device):
    helper_test_op([S3], lambda a: a.cumsum(1))
    helper_test_op([S3], lambda a: a.cumsum(-1))
    helper_test_op([(5,)], lambda a: a.cumsum(0))


def test_any_all(device):
    v = [[True, False, False], [False, False, False]]
    t = torch.tensor(v)
    compare("any", Tensor(v).any(1).numpy(), t.any(1).numpy(), 0, 0)
    compare("all", Tensor(v).all(0).numpy(), t.all(0).numpy(), 0, 0)
    assert Tensor(v).any().item() is True and Tensor(v).all().item() is False
    assert Tensor([1.0, 2.0]).all().item() is True


# ------------------------------------------------------------------------------------------------
# movement


def test_reshape_view_flatten(device):
    helper_test_op([S3], lambda a: a.reshape(6, 4))
    helper_test_op([S3], lambda a: a.reshape(-1, 2))
    helper_test_op([S3], lambda a: a.view(4, 6))
    helper_test_op([S3], lambda a: a.flatten())
    helper_test_op([S3], lambda a: a.flatten(1))
    helper_test_op([S3], lambda a: a.unflatten(2, (2, 2)))
    helper_test_op([(2, 1, 4, 1)], lambda a: a.squeeze())
    helper_test_op([(2, 1, 4, 1)], lambda a: a.squeeze(1))
    helper_test_op([S], lambda a: a.unsqueeze(1))
    helper_test_op([S], lambda a: a.unsqueeze(-1))


def test_permute_transpose(device):
    helper_test_op([S3], lambda a: a.permute(2, 0, 1))
    helper_test_op([S3], lambda a: a.transpose(0, 2))
    helper_test_op([S], lambda a: a.T)
    helper_test_op([S3], lambda a: a.permute(1, 2, 0).reshape(12, 2) * 2)
    helper_test_op([S3], lambda a: a.transpose(1, 2).reshape(2, 12).sum(0))


def test_expand_repeat(device):
    helper_test_op([(3, 1)], lambda a: a.expand(3, 4))
    helper_test_op([(3, 1)], lambda a: a.expand(2, -1, 4))
    helper_test_op([S], lambda a: a.repeat(2, 3))
    helper_test_op([(3,)], lambda a: a.repeat(2, 2))


def test_pad_shrink_flip(device):
    F = torch.nn.functional
    helper_test_op([S], lambda a: F.pad(a, (1, 2)), lambda a: a.pad((1, 2)))
    helper_test_op([S], lambda a: F.pad(a, (1, 2, 0, 1)), lambda a: a.pad(((0, 1), (1, 2))))
    helper_test_op([S], lambda a: F.pad(a, (1, 1), value=3.0), lambda a: a.pad((1, 1), value=3.0))
    helper_test_op([S], lambda a: F.pad(a, (-1, 1)), lambda a: a.pad((-1, 1)))
    helper_test_op([S], lambda a: a[1:3, 0:2], lambda a: a.shrink(((1, 3), (0, 2))))
    helper_test_op([S3], lambda a: a.flip(1))
    helper_test_op([S3], lambda a: a.flip((0, 2)))
    # pad of a computed value: the padding is 0, not f(0)
    helper_test_op([S], lambda a: F.pad(a.exp(), (1, 1)) + 1, lambda a: a.exp().pad((1, 1)) + 1)


def test_cat_stack_split_chunk(device):
    helper_test_op([S, (2, 4)], lambda a, b: torch.cat([a, b], 0), lambda a, b: a.cat(b, dim=0))
    helper_test_op(
        [S, (3, 2), (3, 1)], lambda a, b, c: torch.cat([a, b, c], 1), lambda a, b, c: a.cat(b, c, dim=1)
    )
    helper_test_op([S, S], lambda a, b: torch.stack([a, b], 1), lambda a, b: Tensor.stack([a, b], 1))
    helper_test_op([S], lambda a: a.split(2, 1)[1] * 2)
    helper_test_op([S], lambda a: a.split([1, 3], 1)[1].exp())
    helper_test_op([(4, 4)], lambda a: a.chunk(2, 0)[0] + a.chunk(2, 0)[1])


def test_narrow_select_unbind_swapaxes(device):
    """PyTorch's view functions (values and gradients here; that they are views: test_inplace.py), and
    their bad arguments raise as PyTorch's do."""
    from tgrad.errors import ArgumentError, IndexRangeError

    helper_test_op([S], lambda a: a.narrow(1, 1, 2))
    helper_test_op([S], lambda a: a.narrow(1, -2, 2) * 3)
    helper_test_op([S], lambda a: a.narrow(0, 3, 0).sum() + a.sum())
    helper_test_op([S3], lambda a: a.select(1, -1))
    helper_test_op([S3], lambda a: a.select(0, 1).exp())
    helper_test_op([S3], lambda a: a.unbind(2)[3] * a.unbind(2)[0])
    helper_test_op([S3], lambda a: a.swapaxes(0, 2) + 1)
    helper_test_op([S3], lambda a: a.swapdims(-1, 1))
    x, t = Tensor.ones(3, 4), torch.ones(3, 4)
    for call, error in [
        (lambda a: a.narrow(1, 3, 2), IndexRangeError),  # PyTorch: RuntimeError "exceeds dimension size"
        (lambda a: a.narrow(1, -5, 1), IndexRangeError),
        (lambda a: a.narrow(2, 0, 1), IndexRangeError),
        (lambda a: a.narrow(1, 1, -1), ArgumentError),
        (lambda a: a.select(0, 3), IndexRangeError),
        (lambda a: a.select(2, 0), IndexRangeError),
    ]:
        with pytest.raises((RuntimeError, IndexError)):
            call(t)
        with pytest.raises(error):
            call(x)
    for start, length in ((1.5, 1), (1, 2.0), (True, 1)):  # not ints (1.5 was read as 1)
        with pytest.raises(TypeError):
            t.narrow(1, start, length)
        with pytest.raises(ArgumentError, match="must be an int"):
            x.narrow(1, start, length)
    assert len(x.unbind(1)) == 4 and [u.shape for u in x.unbind(0)] == [(4,)] * 3


def test_getitem_basic(device):
    for fn in (
        lambda a: a[1],
        lambda a: a[-1],
        lambda a: a[:, 1:3],
        lambda a: a[..., 1],
        lambda a: a[None, 1],
        lambda a: a[0, :, None],
        lambda a: a[:, ::2],
        lambda a: a[1, 2, 3],
        lambda a: a[:, -2:, ::3],
        lambda a: a[1:, 1::2, 0:3:2],
        lambda a: a[:, 5:7],
        lambda a: a[-5:2],
    ):
        helper_test_op([S3], fn)


def test_getitem_negative_step(device):
    # PyTorch has no negative steps: compare with flip
    helper_test_op([S3], lambda a: a.flip(1), lambda a: a[:, ::-1])
    helper_test_op([S3], lambda a: a.flip(-1)[..., ::2], lambda a: a[..., ::-2])
    helper_test_op([S3], lambda a: a[1:, 1::2][..., torch.tensor([3, 1])], lambda a: a[1:, 1::2, 3:0:-2])


def test_getitem_tensor_index(device):
    idx = [2, 0, 1, 2]
    helper_test_op([S3], lambda a: a[:, torch.tensor(idx)], lambda a: a[:, Tensor(idx)])
    helper_test_op([S3], lambda a: a[torch.tensor([1, -1])], lambda a: a[Tensor([1, -1])])
    helper_test_op(
        [(5, 3)], lambda a: a[torch.tensor([[0, 4], [2, 2]])], lambda a: a[Tensor([[0, 4], [2, 2]])]
    )


def test_gather(device):
    index = [[0, 2, 1], [3, 3, 0], [1, 0, 2]]
    helper_test_op(
        [S], lambda a: torch.gather(a, 1, torch.tensor(index)), lambda a: a.gather(1, Tensor(index))
    )
    index0 = [[0, 2, 1, 1], [2, 0, 1, 0]]
    helper_test_op(
        [S], lambda a: torch.gather(a, 0, torch.tensor(index0)), lambda a: a.gather(0, Tensor(index0))
    )


# ------------------------------------------------------------------------------------------------
# linear algebra


def test_matmul_shapes(device):
    helper_test_op([(3, 4), (4, 5)], lambda a, b: a @ b)
    helper_test_op([(4,), (4, 5)], lambda a, b: a @ b)
    helper_test_op([(3, 4), (4,)], lambda a, b: a @ b)
    helper_test_op([(4,), (4,)], lambda a, b: a.dot(b) if isinstance(a, Tensor) else a @ b)
    helper_test_op([(2, 3, 4), (2, 4, 5)], lambda a, b: a @ b)
    helper_test_op([(2, 3, 4), (4, 5)], lambda a, b: a.matmul(b))
    helper_test_op([(2, 1, 3, 4), (3, 4, 2)], lambda a, b: a @ b)


def test_matmul_int(device):
    a, b = [[1, 2], [3, 4]], [[5, 6], [7, 8]]
    out = Tensor(a) @ Tensor(b)
    assert out.dtype == dtypes.int64
    compare("int matmul", out.numpy(), (torch.tensor(a) @ torch.tensor(b)).numpy(), 0, 0)


def test_linear(device):
    F = torch.nn.functional
    helper_test_op([(2, 4), (3, 4), (3,)], lambda x, w, b: F.linear(x, w, b), lambda x, w, b: x.linear(w, b))
    helper_test_op([(2, 4), (3, 4)], lambda x, w: F.linear(x, w), lambda x, w: x.linear(w))
    for shapes in ([(2, 3, 4), (5, 4), (5,)], [(2, 4), (3, 4), (1, 3)]):
        helper_test_op(shapes, lambda x, w, b: F.linear(x, w, b), lambda x, w, b: x.linear(w, b))


def test_matmul_and_linear_build_the_general_paths_graph(device):
    """matmul and linear build their common case (one float dtype, 2-d or more) as graph nodes directly:
    the same nodes as the general path (x (..., n, 1, k) times w transposed (..., 1, m, k) as a
    contraction's products, summed over k; then + bias). Nodes are hash-consed, so the same graph is the
    same node object; the same sum of products written elementwise differs only by the product's mark
    (graph.CONTRACT)."""
    x, w, b = Tensor.randn(2, 3, 4), Tensor.randn(5, 4), Tensor.randn(5)
    xb, wb = Tensor.randn(2, 1, 3, 4), Tensor.randn(3, 4, 2)
    for left, right in ((x, w.T), (xb, wb)):
        a, c = left.reshape(left.shape[:-1] + (1, 4)), right.transpose(-1, -2).unsqueeze(-3)
        general = a._contract_mul(c).sum(-1)
        fast = left @ right
        assert fast.node is general.node and fast.shape == general.shape
        written = (a * c).sum(-1)
        assert written.node is not fast.node and written.node.srcs[0].srcs[0].arg is None
        assert fast.node.srcs[0].srcs[0].arg == "contract"
    lin = x.linear(w, b)
    assert lin.node is (x.matmul(w.T) + b).node


def test_matmul_and_linear_outside_the_common_case(device):
    F = torch.nn.functional
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5))
    if has_float64():  # mixed float dtypes promote (as in tinygrad; PyTorch's matmul raises)
        out = Tensor(a, dtype="float32") @ Tensor(b, dtype="float64")
        ref = torch.tensor(a, dtype=torch.float32).double() @ torch.tensor(b, dtype=torch.float64)
        assert out.dtype == dtypes.float64
        compare("mixed matmul", out.numpy(), ref.numpy(), 1e-6, 1e-6)
    with pytest.raises(ShapeError, match=r"batch dimensions \(2,\) of \(2, 3, 4\) and \(3,\) of \(3, 4, 5\)"):
        Tensor.ones(2, 3, 4) @ Tensor.ones(3, 4, 5)
    with pytest.raises(ShapeError, match=r"input \(2, 3, 4\) has 4 features, weight \(5, 3\)"):
        Tensor.ones(2, 3, 4).linear(Tensor.ones(5, 3))
    x, w = Tensor(a, dtype="float32"), Tensor(b.T, dtype="float32")
    ref = F.linear(torch.tensor(a, dtype=torch.float32), torch.tensor(b.T, dtype=torch.float32),
                   torch.arange(5.0, dtype=torch.float32))
    out = x.linear(w, Tensor([0.0, 1, 2, 3, 4]))
    compare("linear of a 3-d input", out.numpy(), ref.numpy(), 1e-5, 1e-5)
    # a numpy weight and bias, a Python scalar bias: the general path, as before
    wn = b.T.astype(np.float32)
    out = x.linear(wn, np.arange(5.0, dtype=np.float32))
    compare("linear, numpy weight and bias", out.numpy(), ref.numpy(), 1e-5, 1e-5)
    ref = F.linear(torch.tensor(a, dtype=torch.float32), torch.tensor(wn)) + 0.5
    compare("linear, scalar bias", x.linear(w, 0.5).numpy(), ref.numpy(), 1e-5, 1e-5)


# ------------------------------------------------------------------------------------------------
# losses


def test_cross_entropy(device):
    F = torch.nn.functional
    y = [0, 2, 1]
    helper_test_op(
        [(3, 4)], lambda x: F.cross_entropy(x, torch.tensor(y)), lambda x: x.cross_entropy(Tensor(y))
    )
    helper_test_op(
        [(3, 4)],
        lambda x: F.cross_entropy(x, torch.tensor(y), reduction="sum"),
        lambda x: x.cross_entropy(Tensor(y), reduction="sum"),
    )
    helper_test_op(
        [(3, 4)],
        lambda x: F.cross_entropy(x, torch.tensor(y), label_smoothing=0.1),
        lambda x: x.cross_entropy(Tensor(y), label_smoothing=0.1),
    )
    helper_test_op(
        [(3, 4), (3, 4)],
        lambda x, p: F.cross_entropy(x, p.softmax(1)),
        lambda x, p: x.cross_entropy(p.softmax(1)),
    )
    yi = [0, -100, 1]
    helper_test_op(
        [(3, 4)], lambda x: F.cross_entropy(x, torch.tensor(yi)), lambda x: x.cross_entropy(Tensor(yi))
    )


def test_sparse_categorical_crossentropy(device):
    F = torch.nn.functional
    y = [3, 0, 1]
    helper_test_op(
        [(3, 4)],
        lambda x: F.cross_entropy(x, torch.tensor(y)),
        lambda x: x.sparse_categorical_crossentropy(Tensor(y)),
    )
    helper_test_op(
        [(3, 4)],
        lambda x: F.cross_entropy(x, torch.tensor([3, -1, 1]), ignore_index=-1),
        lambda x: x.sparse_categorical_crossentropy(Tensor([3, -1, 1])),
    )


def test_binary_crossentropy(device):
    F = torch.nn.functional
    t = [[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.5, 1.0], [0.0, 0.0, 1.0, 1.0]]
    helper_test_op(
        [S],
        lambda x: F.binary_cross_entropy(x.sigmoid(), torch.tensor(t)),
        lambda x: x.sigmoid().binary_crossentropy(Tensor(t)),
    )
    helper_test_op(
        [S],
        lambda x: F.binary_cross_entropy_with_logits(x, torch.tensor(t)),
        lambda x: x.binary_crossentropy_logits(Tensor(t)),
    )


# ------------------------------------------------------------------------------------------------
# data out, autograd behaviour


def test_data_out(device):
    t = Tensor([[1.0, 2.0], [3.0, 4.0]])
    assert t.shape == (2, 2) and t.ndim == 2 and t.numel() == 4 and t.dtype == dtypes.float32
    assert t.device == device
    assert t.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert t.sum().item() == 10.0
    assert t.realize() is t
    assert isinstance(t.numpy(), np.ndarray)
    assert t.to("NUMPY").device == "NUMPY" and t.to("NUMPY").tolist() == t.tolist()


def test_grad_accumulates(device):
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    (x * 2).sum().backward()
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 6.0, 8.0])


def test_shared_subgraph_gradient(device):
    helper_test_op([S], lambda a: (a * a + a.exp() * a).sum())
    helper_test_op([S, S], lambda a, b: ((a + b) * (a - b)).mean())


def test_detach_and_no_grad(device):
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = (x.detach() * x).sum()
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 2.0])
    with Tensor.no_grad:
        z = x * 2
    assert not z.requires_grad
    assert (x * 2).requires_grad


def test_backward_with_gradient(device):
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    (x * x).backward(Tensor([1.0, 0.0, 2.0]))
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 0.0, 12.0])


def test_requires_grad_leaf_from_constant(device):
    # leaves made from constants must not share a node with other constants
    w = Tensor.ones(3, requires_grad=True)
    (w * Tensor.ones(3)).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [1.0, 1.0, 1.0])


def test_item_then_backward(device):
    x = Tensor([1.0, 2.0], requires_grad=True)
    loss = (x * x).sum()
    assert loss.item() == 5.0
    loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0])


# ------------------------------------------------------------------------------------------------
# errors


def test_error_broadcast(device):
    with pytest.raises(ShapeError, match=r"cannot broadcast \(3, 4\) with \(5,\)"):
        Tensor.ones(3, 4) + Tensor.ones(5)


def test_error_matmul(device):
    with pytest.raises(ShapeError, match="inner dimensions"):
        Tensor.ones(3, 4) @ Tensor.ones(5, 2)


def test_error_axis(device):
    with pytest.raises(ShapeError, match="axis 3 is out of range"):
        Tensor.ones(3, 4).sum(3)


def test_error_dtype(device):
    with pytest.raises(DTypeError, match="unsupported dtype"):
        Tensor([1.0], dtype="complex64")
    with pytest.raises(DTypeError, match="only floating point"):
        Tensor([1, 2], requires_grad=True)
    with pytest.raises(DTypeError):
        Tensor([1.0]) & Tensor([1.0])


def test_error_device(device):
    with pytest.raises(DeviceError, match="known devices: CPU, NUMPY"):
        Tensor([1.0], device="TPU")
    if device != "NUMPY":
        with pytest.raises(DeviceError, match="different devices"):
            Tensor([1.0], device=device) + Tensor([1.0], device="NUMPY")


def test_error_backward(device):
    x = Tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(AutogradError, match="needs a scalar"):
        (x * 2).backward()
    with pytest.raises(AutogradError, match="nothing in this graph requires a gradient"):
        Tensor([1.0, 2.0]).sum().backward()


def test_error_reshape(device):
    with pytest.raises(ShapeError, match="cannot reshape"):
        Tensor.ones(3, 4).reshape(5, 3)


def test_error_names_user_line(device):
    with pytest.raises(ShapeError) as info:
        Tensor.ones(3, 4) + Tensor.ones(5)  # the line the error points at
    assert "test_ops.py" in str(info.value) and "the line the error points at" in str(info.value)


def test_assign_others_read_the_old_value(device):
    start = np.array([1.0, 2.0], np.float32)
    p = Tensor(start).realize()
    old = Tensor(p.node)  # a tensor still holding the value before the assign
    p.assign(p * 2)
    q = old + 1
    Tensor.realize(p, q)
    np.testing.assert_array_equal(p.numpy(), start * 2)
    np.testing.assert_array_equal(q.numpy(), start + 1)


def test_a_kernel_reading_an_assigned_value_runs_after_the_assign(device):
    """An update built on an update not yet realized: m += a; a -= m; y = sum(3a) (a reduce reading the
    new a); m += y; a -= m. The reduce must run after a's first assign (it was scheduled before it: its
    input had no buffer yet)."""
    a = Tensor(np.array([1.0, 2.0], np.float32)).realize()
    m = Tensor(np.zeros(2, np.float32)).realize()
    m.assign(m + a)
    a.assign(a - m)
    y = (a * 3).sum()
    m.assign(m + y)
    a.assign(a - m)
    Tensor.realize(a, m, y)
    np.testing.assert_array_equal(a.numpy(), [-1.0, -2.0])
    np.testing.assert_array_equal(m.numpy(), [1.0, 2.0])
    assert y.item() == 0.0


def test_a_kernel_reading_both_the_old_and_the_assigned_value_raises(device):
    """A fused kernel cannot read a buffer's value before and after an assign to it (it runs once): a
    clear error, not a wrong number; the NUMPY reference, node by node, gives old + new."""
    p = Tensor(np.array([1.0, 2.0], np.float32)).realize()
    old = Tensor(p.node)
    p.assign(p * 2)
    if device == "NUMPY":
        np.testing.assert_array_equal((old + p).numpy(), [3.0, 6.0])
        return
    with pytest.raises(TgradError, match="both the old and the assigned value"):
        (old + p).numpy()


# assign sequences (a random search's finds): a realize in between leaves a node realized on a buffer that
# a later assign() overwrites, read by a tensor built before (a row group read it through that other node
# while the assign wrote the buffer: wrong values on CPU); each step: (op, tensor, other, constant)
_ASSIGN_SEQUENCES = {
    "a_row_group_reading_an_alias_of_its_target": (65, [
        ("axpy", "b", "d", -0.083), ("sub_sum", "c", "d", 0.1), ("axpy", "d", "c", -0.606),
        ("flip_max", "a", "c", 0), ("flip_max", "b", "a", 0), ("sub_sum", "c", "b", 0.1),
        ("realize", "a", "c", 0), ("axpy", "a", "c", -0.499), ("sub_sum", "c", "a", 0.1)]),
}


@pytest.mark.parametrize("case", list(_ASSIGN_SEQUENCES))
def test_assign_sequences_match_an_eager_replay(device, case):
    """Every value as numpy computes it step by step (PyTorch's eager order): tensors built before an
    assign read the old value when realized with it, through whichever node holds the buffer."""
    seed, steps = _ASSIGN_SEQUENCES[case]
    rngs = [np.random.default_rng(seed + i) for i in range(4)]
    init = {k: r.standard_normal(6).astype(np.float32) for k, r in zip("abcd", rngs)}
    ts = {k: Tensor(v).realize() for k, v in init.items()}
    ref = {k: v.astype(np.float64) for k, v in init.items()}
    vals, refs = [], []
    for op, k, o, c in steps:
        if op == "axpy":
            ts[k].assign(ts[k] * c + ts[o])
            ref[k] = ref[k] * c + ref[o]
        elif op == "sub_sum":
            ts[k].assign(ts[k] - ts[o].sum() * c)
            ref[k] = ref[k] - ref[o].sum() * c
        elif op == "flip_max":
            ts[k].assign(ts[o].flip(0) + ts[k].max())
            ref[k] = ref[o][::-1] + ref[k].max()
        elif op == "mm":
            ts[k].assign((ts[k].reshape(2, 3) @ ts[o].reshape(3, 2)).reshape(-1)[:4].pad(((0, 2),)))
            ref[k] = np.pad((ref[k].reshape(2, 3) @ ref[o].reshape(3, 2)).reshape(-1)[:4], (0, 2))
        elif op == "val":
            vals.append(ts[k] * 2 + ts[o].max())
            refs.append(ref[k] * 2 + ref[o].max())
        elif op == "realize":
            Tensor.realize(*[vals[int(x[1:])] if x.startswith("v") else ts[x] for x in (k, o)])
    Tensor.realize(*ts.values(), *vals)
    for k in "abcd":
        np.testing.assert_allclose(ts[k].numpy(), ref[k], rtol=1e-4, atol=1e-4, err_msg=k)
    for i, (v, r) in enumerate(zip(vals, refs)):
        np.testing.assert_allclose(v.numpy(), r, rtol=1e-4, atol=1e-4, err_msg=f"v{i}")


@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
def test_two_optimizer_steps_before_one_realize_match_torch(device, opt_name):
    """schedule_step() builds an update without running it; a second forward, backward and step() on the
    updated (lazy) weights then runs both, as two PyTorch steps: loss and weights."""
    from tgrad.nn import optim

    rng = np.random.default_rng(12)
    w0 = rng.standard_normal((4, 3)).astype(np.float32)
    x0 = rng.standard_normal((5, 4)).astype(np.float32)
    w, x = Tensor(w0, requires_grad=True).realize(), Tensor(x0).realize()
    kw = {"lr": 0.1, "momentum": 0.9} if opt_name == "SGD" else {"lr": 0.1}
    opt = getattr(optim, opt_name)([w], **kw)
    tw = torch.tensor(w0, requires_grad=True)
    topt = getattr(torch.optim, opt_name)([tw], **kw)
    losses = []
    for last in (False, True):
        opt.zero_grad()
        loss = (x @ w).square().sum()
        loss.backward()
        if last:
            opt.step(loss)
        else:
            opt.schedule_step()
        losses.append(loss)
        topt.zero_grad()
        tloss = (torch.tensor(x0) @ tw).square().sum()
        tloss.backward()
        topt.step()
    # (WebGPU's sqrt and division are a few ulp off: the loss after one Adam step 1.5e-5 relative)
    np.testing.assert_allclose(losses[1].numpy(), tloss.detach().numpy(), rtol=1e-4)
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["flip", "first", "shift", "sum", "matmul", "rows"])
def test_assign_reading_its_target_elsewhere_reads_the_old_values(device, case):
    """x.assign(f(x)) where f reads other elements of x than the one written (reversed, x[0], shifted, a
    sum, a matmul, reversed rows): each element is computed from x's old values, as x.copy_(f(x)) in
    PyTorch; written in place, later elements read values already overwritten."""
    n = 1 << 12
    x0 = np.arange(n, dtype=np.float32).reshape(64, 64) / 100
    x = Tensor(x0).realize()
    fns = {
        "flip": (lambda t: t.flip(0) + 1, lambda a: a[::-1] + 1),
        "first": (lambda t: t + t[0, 0] + 10, lambda a: a + a[0, 0] + 10),
        "shift": (lambda t: t.roll(1, 1) * 2, lambda a: np.roll(a, 1, 1) * 2),
        "sum": (lambda t: t - t.sum(0, keepdim=True) / 64, lambda a: a - a.sum(0, keepdims=True) / 64),
        "matmul": (lambda t: (t @ t) * 0.01, lambda a: (a @ a) * 0.01),
        "rows": (lambda t: t.flip(1) * 3, lambda a: a[:, ::-1] * 3),
    }
    f, ref = fns[case]
    x.assign(f(x)).realize()
    np.testing.assert_allclose(x.numpy(), ref(x0.astype(np.float64)), rtol=1e-5, atol=1e-4)
    from tgrad import TinyJit  # and under TinyJit: the copy is a launch it replays

    y = Tensor(x0).realize()
    step = TinyJit(lambda: y.assign(f(y)).realize())
    expect = x0.astype(np.float64)
    for _ in range(3):
        step()
        expect = ref(expect)
    np.testing.assert_allclose(y.numpy(), expect, rtol=1e-4, atol=1e-3)
