"""nonzero / masked_select with a static size (torch.nonzero_static's semantics; tinygrad's size= forms):
no data-dependent shape, so they are computed by kernels with nothing read back and work inside TinyJit.
Compared with torch.nonzero_static, and with torch.masked_select cut or padded to the size, on every
test device."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tgrad import Tensor, dtypes
from tgrad.errors import ArgumentError, DTypeError, ValueOverflowError
from tgrad.jit import TinyJit

NAN, INF = math.nan, math.inf

# (name, array): ints, floats with nan / inf / -0.0 (nonzero: nan and inf are, -0.0 is not), bools, several
# dims, 0-d, empty
INPUTS = [
    ("int_1d", np.array([1, 0, 2, 0, 3], dtype=np.int64)),
    ("float_edges", np.array([[-0.0, 0.0, NAN], [INF, 0.0, -2.5]], dtype=np.float32)),
    ("bool_2d", np.array([[True, False], [False, True]])),
    ("int32_3d", np.arange(24, dtype=np.int32).reshape(2, 3, 4) % 3),
    ("all_zero", np.zeros((2, 3), dtype=np.float32)),
    ("scalar_nonzero", np.array(5, dtype=np.int64)),
    ("scalar_zero", np.array(0.0, dtype=np.float32)),
    ("empty", np.zeros((0, 3), dtype=np.float32)),
]


def _sizes(x: np.ndarray) -> list[int]:
    count = int(np.count_nonzero(x))
    return sorted({0, max(count - 1, 0), count + 2})  # none, fewer than the count (cut), more (padded)


@pytest.mark.parametrize("name,x", INPUTS, ids=[n for n, _ in INPUTS])
def test_nonzero_static_matches_torch(device, name, x):
    for size in _sizes(x):
        for fill in (-1, 7):
            want = torch.nonzero_static(torch.from_numpy(x), size=size, fill_value=fill)
            for got in (Tensor(x).nonzero_static(size=size, fill_value=fill),
                        Tensor(x).nonzero(size=size, fill_value=fill)):
                assert got.shape == tuple(want.shape), (name, size, fill)
                assert got.dtype == dtypes.int64
                np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=f"{name} size={size}")


def test_nonzero_static_default_fill_is_torchs(device):
    x = np.array([0, 3, 0], dtype=np.int64)
    want = torch.nonzero_static(torch.from_numpy(x), size=3)
    np.testing.assert_array_equal(Tensor(x).nonzero_static(size=3).numpy(), want.numpy())


@pytest.mark.parametrize("kwargs,names", [
    ({"size": -1}, ["size", "-1"]),
    ({"size": 2.0}, ["size", "float"]),
    ({"size": True}, ["size", "bool"]),
    ({"size": 2, "fill_value": 1.5}, ["fill_value", "float"]),
    ({"size": 2, "fill_value": True}, ["fill_value", "bool"]),
])
def test_nonzero_static_bad_arguments_raise_naming_them(kwargs, names):
    with pytest.raises((RuntimeError, TypeError)):
        torch.nonzero_static(torch.tensor([1, 0, 2]), **kwargs)
    with pytest.raises(ArgumentError) as err:
        Tensor([1, 0, 2]).nonzero_static(**kwargs)
    assert all(n in str(err.value) for n in ["nonzero_static", *names]), err.value


def test_nonzero_static_fill_past_int64_raises():
    with pytest.raises((RuntimeError, ValueError)):
        torch.nonzero_static(torch.tensor([1, 0, 2]), size=4, fill_value=2**63)
    with pytest.raises(ValueOverflowError, match="nonzero_static.*9223372036854775808"):
        Tensor([1, 0, 2]).nonzero_static(size=4, fill_value=2**63)


def _masked_select_ref(x: np.ndarray, m: np.ndarray, size: int, fill) -> np.ndarray:
    """torch.masked_select (which has no size=), cut to size or padded with fill_value."""
    picked = torch.masked_select(torch.from_numpy(x), torch.from_numpy(m))[:size]
    pad = torch.full((size - picked.shape[0],), fill, dtype=picked.dtype)
    return torch.cat([picked, pad]).numpy()


MASKED = [  # (name, x, mask): a mask of x's shape, one that broadcasts, a 0-d x, bools, nan, empty
    ("float", np.array([1.5, NAN, -INF, 4.0], dtype=np.float32), np.array([True, True, False, True])),
    ("broadcast_mask", np.arange(12, dtype=np.int32).reshape(3, 4), np.array([[True], [False], [True]])),
    ("scalar_x", np.array(3.0, dtype=np.float32), np.array([True, False, True])),
    ("bool_x", np.array([True, False, True]), np.array([False, True, True])),
    ("nothing_selected", np.array([1, 2], dtype=np.int64), np.array([False, False])),
    ("empty", np.zeros((0, 2), dtype=np.float32), np.zeros((0, 2), dtype=bool)),
]


@pytest.mark.parametrize("name,x,m", MASKED, ids=[n for n, _, _ in MASKED])
def test_masked_select_static_size_matches_torch(device, name, x, m):
    fill = True if x.dtype == bool else -1
    count = int(np.count_nonzero(np.broadcast_to(m, np.broadcast_shapes(x.shape, m.shape))))
    for size in sorted({0, max(count - 1, 0), count + 2}):
        got = Tensor(x).masked_select(Tensor(m), size=size, fill_value=fill)
        want = _masked_select_ref(x, m, size, fill)
        assert got.shape == (size,) and got.dtype.np == want.dtype, (name, size)
        np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{name} size={size}")


def test_masked_select_static_fill_value_takes_the_tensors_dtype(device):
    # as masked_fill's value (PyTorch): a float into an int tensor truncates; nan cannot be an int
    x, m = np.array([4, 5, 6], dtype=np.int64), np.array([False, True, False])
    want = torch.from_numpy(x).masked_fill(~torch.from_numpy(m), 2.7)[torch.tensor([1, 0, 2])].numpy()
    got = Tensor(x).masked_select(Tensor(m), size=3, fill_value=2.7)
    np.testing.assert_array_equal(got.numpy(), want)
    with pytest.raises(ValueOverflowError, match="masked_select.*nan.*int64"):
        Tensor(x).masked_select(Tensor(m), size=3, fill_value=NAN)


def test_masked_select_static_bad_arguments_raise():
    with pytest.raises(ArgumentError, match="masked_select: size must be an int >= 0, got int -2"):
        Tensor([1, 2]).masked_select(Tensor([True, False]), size=-2)
    with pytest.raises(DTypeError, match="masked_select: mask must be a bool tensor"):
        Tensor([1, 2]).masked_select(Tensor([1, 0]), size=2)


def test_masked_select_static_gradient_matches_torch(device):
    x = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]], dtype=np.float32)
    m = np.array([[True, False, True], [False, True, True]])
    w = np.array([1.0, 2.0, 3.0], dtype=np.float32)  # size 3 of 4 selected: the last one cut
    tx = torch.tensor(x, requires_grad=True)
    (torch.masked_select(tx, torch.from_numpy(m))[:3] * torch.from_numpy(w)).sum().backward()
    gx = Tensor(x, requires_grad=True)
    (gx.masked_select(Tensor(m), size=3) * Tensor(w)).sum().backward()
    np.testing.assert_allclose(gx.grad.numpy(), tx.grad.numpy())
    # padded past the count: the fill gets no gradient, the selected ones theirs
    tx.grad = None
    picked = torch.masked_select(tx, torch.from_numpy(m))
    (F.pad(picked, (0, 2), value=-1.0) * torch.arange(1.0, 7.0)).sum().backward()
    gx = Tensor(x, requires_grad=True)
    (gx.masked_select(Tensor(m), size=6, fill_value=-1.0) * Tensor(np.arange(1.0, 7.0, dtype=np.float32))
     ).sum().backward()
    np.testing.assert_allclose(gx.grad.numpy(), tx.grad.numpy())


def test_static_sizes_work_inside_tinyjit(device):
    """tinygrad's test_jit_footguns cases: each call's own data, never a value frozen at capture (a read
    inside TinyJit would raise JitError)."""
    select = TinyJit(lambda x, mask: x.masked_select(mask, size=4, fill_value=-1).realize())
    where = TinyJit(lambda x: x.nonzero(size=3, fill_value=-1).realize())
    rng = np.random.default_rng(3)
    for _ in range(4):
        x, m = rng.integers(1, 9, 4), rng.random(4) < 0.5
        np.testing.assert_array_equal(select(Tensor(x), Tensor(m)).numpy(), _masked_select_ref(x, m, 4, -1))
        z = rng.integers(0, 2, 5) * rng.integers(1, 9, 5)
        want = torch.nonzero_static(torch.from_numpy(z), size=3, fill_value=-1).numpy()
        np.testing.assert_array_equal(where(Tensor(z)).numpy(), want)
    if device != "NUMPY":  # (NUMPY has no kernels: TinyJit runs the function each call)
        assert select.captures == where.captures == 1 and select.replays == where.replays == 2


def test_static_sizes_inside_tinyjit_on_bigger_inputs(device):
    # 256 x 200 positions: on CPU / NUMPY the take is numpy's in a host step, which the replays run too
    def f(x):
        return x.masked_select(x > 0, size=200), (x.reshape(16, 16) > 0).nonzero_static(size=200)

    f = TinyJit(f)
    rng = np.random.default_rng(5)
    for _ in range(3):
        x = rng.standard_normal(256).astype(np.float32)
        vals, idx = f(Tensor(x))
        np.testing.assert_array_equal(vals.numpy(), _masked_select_ref(x, x > 0, 200, 0))
        want = torch.nonzero_static(torch.from_numpy(x.reshape(16, 16) > 0), size=200).numpy()
        np.testing.assert_array_equal(idx.numpy(), want)
