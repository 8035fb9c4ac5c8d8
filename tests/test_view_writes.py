"""Writes through views reach their base (issue 46 item 7): negative step slices as numpy's views (PyTorch
has none), and every view PyTorch writes through (narrow, select, transpose, permute, reshape, expand where
the written elements do not overlap...) as in PyTorch; copies (flip(), pad, contiguous) keep the base."""

import numpy as np
import pytest
import torch

from tgrad import Tensor
from tgrad.errors import ArgumentError

BASE = np.arange(24.0, dtype=np.float32).reshape(2, 3, 4)


def _set(view_fn, index, value):
    def run(x):
        view_fn(x)[index] = value

    return run


# (name, what to do to the base: the same code in numpy or PyTorch and tgrad)
NUMPY_CASES = [
    ("[::-1][0] = 5", _set(lambda x: x[::-1], 0, 5.0)),
    ("[:, ::-1][0, 0] = 99", _set(lambda x: x[:, ::-1], (0, 0), 99.0)),
    ("[..., ::-2][1] = 7", _set(lambda x: x[..., ::-2], 1, 7.0)),
    ("[::-1, 1:, ::-3][1, 0, 1] = 3", _set(lambda x: x[::-1, 1:, ::-3], (1, 0, 1), 3.0)),
    ("[::-1][0][::-1][0] = 8", _set(lambda x: x[::-1][0][::-1], 0, 8.0)),
    ("[::-1] slice of a slice", _set(lambda x: x[:, 1:][:, ::-1], (0, 0, slice(None, None, -1)), -4.0)),
    ("reversed view reshaped", _set(lambda x: x[:, :, ::-1].reshape(6, 4), 5, 11.0)),
    ("t[::-1, 0, ::-2] = 9", lambda x: x.__setitem__((slice(None, None, -1), 0, slice(None, None, -2)), 9.0)),
]

TORCH_CASES = [
    ("narrow", _set(lambda x: x.narrow(1, 1, 2), 0, 9.0)),
    ("select", _set(lambda x: x.select(1, 1), (0, slice(1, 3)), 9.0)),
    ("chunk", _set(lambda x: x.chunk(2, dim=2)[1], (0, 0), 9.0)),
    ("transpose", _set(lambda x: x.transpose(0, 2), (1, 2), 9.0)),
    ("permute", _set(lambda x: x.permute(2, 0, 1), (1, 1), 9.0)),
    ("unsqueeze", _set(lambda x: x.unsqueeze(0), (0, 1), 9.0)),
    ("reshape (a view)", _set(lambda x: x.reshape(4, 6), 3, 9.0)),
    ("reshape of a transpose (a copy)", _set(lambda x: x.transpose(0, 2).reshape(-1), slice(3, 7), 9.0)),
    ("step slice of a transpose", _set(lambda x: x.transpose(1, 2)[:, 1:3, ::2], (1, 0), 9.0)),
    ("diagonal", _set(lambda x: x[0].diagonal(), 1, 9.0)),
    ("expand, one row written", _set(lambda x: x[:, :1].expand(2, 3, 4), (0, 0), 9.0)),
    ("expand, select then write", _set(lambda x: x[:, :1].expand(2, 3, 4)[1], 2, 9.0)),
    ("flip() is a copy", _set(lambda x: x.flip(0), 0, 9.0)),
    ("contiguous() of a contiguous view (the view)", _set(lambda x: x[0].contiguous(), 0, 9.0)),
    ("contiguous() of a transpose (a copy)", _set(lambda x: x.transpose(0, 1).contiguous(), 0, 9.0)),
    ("unfold, one window", _set(lambda x: x.unfold(2, 2, 1), (0, 1, 1), -2.0)),
    ("unfold, one element", _set(lambda x: x.unfold(1, 2, 1), (1, 0, 3, 1), -3.0)),
    ("unfold of unfold", _set(lambda x: x.unfold(2, 2, 2).unfold(1, 2, 1), (1, 0, 1, 1, 0), 5.0)),
    ("mul_ on windows that do not overlap", lambda x: x.unfold(2, 2, 2).mul_(2.0)),
    ("add_ on a transpose", lambda x: x.transpose(0, 1).add_(1.0)),
    ("mul_ on a narrow", lambda x: x.narrow(2, 1, 2).mul_(3.0)),
]


@pytest.mark.parametrize("name,fn", NUMPY_CASES, ids=[c[0] for c in NUMPY_CASES])
def test_negative_steps_write_like_numpy(device, name, fn):
    expected = BASE.copy()
    fn(expected)
    t = Tensor(BASE.copy(), device=device)
    fn(t)
    np.testing.assert_array_equal(t.numpy(), expected, err_msg=name)


def test_reversed_view_assign_and_reads(device):
    """X[::-1].assign(...) writes X; a reversed view made earlier reads the base's later writes (a view),
    flip() made earlier keeps the old values (a copy in PyTorch)."""
    a = np.arange(6.0, dtype=np.float32)
    t = Tensor(a.copy(), device=device)
    view, copy = t[::-1], t.flip(0)
    t[::-2].assign(Tensor([10.0, 20.0, 30.0], device=device))
    expected = a.copy()
    expected[::-2] = [10.0, 20.0, 30.0]
    np.testing.assert_array_equal(t.numpy(), expected)
    np.testing.assert_array_equal(view.numpy(), expected[::-1])
    np.testing.assert_array_equal(copy.numpy(), a[::-1])


@pytest.mark.parametrize("name,fn", TORCH_CASES, ids=[c[0] for c in TORCH_CASES])
def test_view_writes_like_torch(device, name, fn):
    expected = torch.tensor(BASE)
    fn(expected)
    t = Tensor(BASE.copy(), device=device)
    fn(t)
    np.testing.assert_array_equal(t.numpy(), expected.numpy(), err_msg=name)


def test_unfold_reads_later_writes(device):
    """unfold() is a view in PyTorch: windows made before a write to the base read the new values."""
    base = torch.tensor(BASE)
    windows = base.unfold(2, 3, 1)
    base[0, 0, 1] = 9.0
    t = Tensor(BASE.copy(), device=device)
    got = t.unfold(2, 3, 1)
    t[0, 0, 1] = 9.0
    np.testing.assert_array_equal(got.numpy(), windows.numpy())


def test_pad_result_is_a_copy(device):
    expected = torch.tensor(BASE)
    torch.nn.functional.pad(expected, (1, 1))[0] = 9.0
    t = Tensor(BASE.copy(), device=device)
    t.pad(((0, 0), (0, 0), (1, 1)))[0] = 9.0
    np.testing.assert_array_equal(t.numpy(), expected.numpy())


def test_overlapping_writes_raise_like_torch():
    """Writing several elements that are one element in memory: PyTorch raises, so does tgrad."""
    with pytest.raises(RuntimeError):
        torch.tensor(BASE)[:, :1].expand(2, 3, 4)[0] = 9.0
    t = Tensor(BASE.copy())
    with pytest.raises(ArgumentError, match="an expanded axis"):
        t[:, :1].expand(2, 3, 4)[0] = 9.0
    with pytest.raises(ArgumentError, match="an expanded axis"):
        t[:, :1].expand(2, 3, 4).assign(Tensor.zeros(2, 3, 4))
    with pytest.raises(ArgumentError, match="overlapping unfold"):  # (PyTorch writes some of the sums)
        t.unfold(2, 2, 1).add_(1.0)
    # an integer-tensor index into an expanded view (PyTorch writes the shared element): refused here
    with pytest.raises(ArgumentError, match="expanded view"):
        t[:, :1].expand(2, 3, 4)[0, Tensor([0, 1])] = 9.0
    np.testing.assert_array_equal(t.numpy(), BASE)
