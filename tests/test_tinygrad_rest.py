"""Smaller gaps tinygrad's user-facing tests found (issue 44, the shim README's "rest"), each checked against
PyTorch on every test device: a list index read as PyTorch reads it, index tensors that do not broadcast
(an IndexError), assign() through a bitcast (PyTorch's view(dtype))."""

import warnings

import numpy as np
import pytest
import torch

from tgrad import Tensor, dtypes
from tgrad.errors import ArgumentError

# A list holding a slice, None, ..., a sequence or a tensor indexes several axes (PyTorch's reading, with a
# deprecation warning; tinygrad's too); a list of ints or bools alone, or of 32 entries or more, is one
# index of data
LIST_INDICES = [
    [slice(None), [1, 3]],
    [[0, 2], slice(None)],
    [[-1], [0]],
    [[0, 2], [-1]],
    [slice(None), [[0, 1], [2, 3]]],
    [[0, 1], [2, 3]],
    [[0, 1]],
    [None, [1]],
    [Ellipsis, [1]],
    [0, slice(None)],
    [0, slice(1, 4, 2)],
    [np.array([0, 3]), 2],
    ["tensor", 1],
    [0, 1, 3],
    [True, False, True, False],
    [[1]] * 32,
]
IDS = [repr(i) if len(repr(i)) < 40 else f"long{len(i)}" for i in LIST_INDICES]


def _mine(index: list) -> list:
    return [Tensor([2, 0]) if isinstance(v, str) else v for v in index]


def _torchs(index: list) -> list:
    return [torch.tensor([2, 0]) if isinstance(v, str) else v for v in index]


def _several_axes(index: list) -> bool:
    entries = (v is None or v is Ellipsis or not isinstance(v, (int, bool)) for v in index)
    return len(index) < 32 and any(entries)


@pytest.mark.parametrize("index", LIST_INDICES, ids=IDS)
def test_list_index_reads_as_pytorch(device, index):
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        want = torch.from_numpy(x.copy())[_torchs(index)]
    with warnings.catch_warnings(record=True) as mine:
        warnings.simplefilter("always")
        got = Tensor(x)[_mine(index)]
    assert got.shape == tuple(want.shape)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    # the deprecation warning where PyTorch gives it, naming this line
    assert bool(theirs) == bool(mine) == _several_axes(index)
    assert all(w.filename == __file__ and "tuple(seq)" in str(w.message) for w in mine)


@pytest.mark.parametrize("index", LIST_INDICES, ids=IDS)
def test_list_index_writes_as_pytorch(device, index):
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    want, got = torch.from_numpy(x.copy()), Tensor(x.copy())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want[_torchs(index)] = -1.0
        got[_mine(index)] = -1.0
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_list_index_gradient_matches_torch(device):
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    tx = torch.tensor(x, requires_grad=True)
    gx = Tensor(x, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (tx[[slice(None), [0, 1, 1, 4]]] * 2).sum().backward()
        (gx[[slice(None), [0, 1, 1, 4]]] * 2).sum().backward()
    np.testing.assert_array_equal(gx.grad.numpy(), tx.grad.numpy())


def test_ragged_list_index_raises_as_in_torch():
    # a list of lists of different lengths without a slice: PyTorch reads it as several axes' indices,
    # which then do not broadcast; tgrad the same
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(IndexError):
            torch.arange(20.0).reshape(4, 5)[[[0, 1, 2], [0, 1]]]
        with pytest.raises(IndexError, match=r"shape mismatch: .*\(3,\), \(2,\) do not broadcast"):
            Tensor.arange(20.0).reshape(4, 5)[[[0, 1, 2], [0, 1]]]


@pytest.mark.parametrize("index", [([0, 1], [0, 1, 2]), ([[0], [1]], [0, 1], [0, 1, 2])], ids=str)
def test_index_tensors_that_do_not_broadcast_raise_index_error(device, index):
    # PyTorch: IndexError "shape mismatch: indexing tensors could not be broadcast together"
    n = len(index)
    with pytest.raises(IndexError, match="shape mismatch"):
        torch.zeros((5,) * n)[index]
    with pytest.raises(IndexError, match="shape mismatch"):
        torch.zeros((5,) * n)[index] = 0
    with pytest.raises(IndexError, match="index: shape mismatch"):
        Tensor.zeros(*(5,) * n)[index]
    with pytest.raises(IndexError, match="index: shape mismatch"):
        Tensor.zeros(*(5,) * n).contiguous()[index] = 0


# bitcast of the same item size is PyTorch's x.view(dtype): a view, so assign() through it writes its base
# and the base's later writes show in it (tinygrad's test_assign_bitcast)
def _bits(values, dtype=np.float32):
    return np.array(values, dtype=dtype)


def test_assign_through_a_bitcast_writes_the_base(device):
    x, new = _bits([1.0, 2.0, -3.0, 4.5]), _bits([4.0, -0.0, 2.0, 1e-40]).view(np.int32)
    want = torch.from_numpy(x.copy())
    want.view(torch.int32).copy_(torch.from_numpy(new))
    a = Tensor(x).realize()
    a.bitcast(dtypes.int32).assign(Tensor(new)).realize()
    np.testing.assert_array_equal(a.numpy().view(np.int32), want.numpy().view(np.int32))
    # not realized before the base is read
    b = Tensor(x).realize()
    b.bitcast(dtypes.int32).assign(Tensor(new))
    np.testing.assert_array_equal(b.numpy().view(np.int32), want.numpy().view(np.int32))


BITCAST_CASES = ["twice", "of_a_slice", "sliced", "float16", "bytes", "wider", "bytes_of_columns",
                 "setitem_bytes"]


@pytest.mark.parametrize("case", BITCAST_CASES)
def test_assign_through_bitcast_views_matches_torch(device, case):
    x = _bits([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    t, g = torch.from_numpy(x.copy()), Tensor(x).realize()
    if case == "twice":  # float32 -> uint32 -> int32
        new = _bits([7.0, 8.0, 9.0, 10.0, 11.0, 12.0]).view(np.int32)
        t.view(torch.int32).copy_(torch.from_numpy(new))
        g.bitcast(dtypes.uint32).bitcast(dtypes.int32).assign(Tensor(new)).realize()
    elif case == "of_a_slice":
        new = _bits([-1.0, -2.0]).view(np.int32)
        t[1:3].view(torch.int32).copy_(torch.from_numpy(new))
        g[1:3].bitcast(dtypes.int32).assign(Tensor(new)).realize()
    elif case == "sliced":  # a slice of the bitcast view
        new = _bits([-1.0, -2.0, -3.0]).view(np.int32)
        t.view(torch.int32)[::2].copy_(torch.from_numpy(new))
        g.bitcast(dtypes.int32)[::2].assign(Tensor(new)).realize()
    elif case == "float16":  # int16 written into float16
        t, g = torch.from_numpy(x.astype(np.float16)), Tensor(x.astype(np.float16)).realize()
        new = np.array([1, -1, 0x7C00, 0x3C00, 2, 3], dtype=np.int16)  # inf and 1.0 among the bits
        t.view(torch.int16).copy_(torch.from_numpy(new))
        g.bitcast(dtypes.int16).assign(Tensor(new)).realize()
    elif case == "bytes":  # another item size: the last axis holds the bytes
        new = (np.arange(24) * 11 % 256).astype(np.uint8)
        t.view(torch.uint8).copy_(torch.from_numpy(new))
        g.bitcast(dtypes.uint8).assign(Tensor(new)).realize()
    elif case == "wider":  # bytes written as int64 items
        t, g = torch.zeros(16, dtype=torch.uint8), Tensor.zeros(16, dtype=dtypes.uint8).contiguous().realize()
        t.view(torch.int64).copy_(torch.tensor([12345, -2]))
        g.bitcast(dtypes.int64).assign(Tensor([12345, -2], dtype=dtypes.int64)).realize()
    elif case == "bytes_of_columns":  # whole items of a strided view
        t, g = t.reshape(2, 3), Tensor(x.reshape(2, 3)).realize()
        new = (np.arange(16) * 13 % 256).astype(np.uint8).reshape(2, 8)
        t[:, 1:].view(torch.uint8).copy_(torch.from_numpy(new))
        g[:, 1:].bitcast(dtypes.uint8).assign(Tensor(new)).realize()
    else:  # t.view(uint8)[...] = v writes bytes of the floats
        t.view(torch.uint8)[4:12] = 0x41
        g.bitcast(dtypes.uint8)[4:12] = 0x41
    np.testing.assert_array_equal(g.numpy(), t.numpy())


def test_assign_to_part_of_the_items_of_a_bitcast_raises(device):
    # PyTorch writes those bytes; tgrad's undo of the view cannot merge parts of items (yet): an error
    # naming the dtypes, not a wrong value
    g = Tensor(_bits([1.0, 2.0])).realize()
    with pytest.raises(ArgumentError, match="part of the items of a float32 -> uint8 bitcast"):
        g.bitcast(dtypes.uint8)[1:3].assign(Tensor([7, 7], dtype=dtypes.uint8))
    np.testing.assert_array_equal(g.numpy(), [1.0, 2.0])


def test_a_bitcast_view_sees_its_bases_later_writes(device):
    x = _bits([1.0, 2.0, 3.0])
    t, g = torch.from_numpy(x.copy()), Tensor(x).realize()
    tv, gv = t.view(torch.int32), g.bitcast(dtypes.int32)
    t.copy_(torch.tensor([5.0, -6.0, 0.5]))
    g.assign(Tensor([5.0, -6.0, 0.5]))
    np.testing.assert_array_equal(gv.numpy(), tv.numpy())
    g[1:].assign(Tensor([7.0, 8.0]))  # through another view of the same base
    t[1:].copy_(torch.tensor([7.0, 8.0]))
    np.testing.assert_array_equal(gv.numpy(), tv.numpy())
    np.testing.assert_array_equal(g.numpy(), t.numpy())


# t[index tensors] = v on CPU / NUMPY writes with numpy's put in a host step once the one-hot scatter would
# be large (numel * values >= indexing.HOST_TAKE_MIN); other devices, and writes that need a gradient,
# keep the scatter. numpy's example of advanced indexing (tinygrad's test_setitem_advanced_indexing) made
# a (12M, 360k) one-hot mask
def test_big_setitem_with_index_tensors_matches_torch(device):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 64, 5)).astype(np.float32)
    rows = rng.permutation(64)[:40]
    v = rng.standard_normal((6, 40, 5)).astype(np.float32)
    want = torch.from_numpy(x.copy())
    want[:, torch.from_numpy(rows), :] = torch.from_numpy(v)
    got = Tensor(x).contiguous()
    got[:, Tensor(rows), :] = Tensor(v)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    # index tensors apart (result dims first), a value that broadcasts, and a view's base written through
    ind_1, ind_2 = np.array([5, 3, 7, 8]), np.array([[0], [1], [2]])
    big = np.zeros((4, 10, 3, 9, 8), dtype=np.int32)
    want = torch.from_numpy(big.copy())
    want[:, torch.from_numpy(ind_1), :, torch.from_numpy(ind_2), :] = torch.arange(8, dtype=torch.int32)
    got = Tensor(big).contiguous()
    got[:, Tensor(ind_1), :, Tensor(ind_2), :] = Tensor.arange(8, dtype=dtypes.int32)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    want = torch.from_numpy(big.copy())
    want[1][torch.from_numpy(ind_1), :, torch.from_numpy(ind_2)] = torch.arange(8, dtype=torch.int32) + 1
    base = Tensor(big).contiguous()
    view = base[1]
    view[Tensor(ind_1), :, Tensor(ind_2)] = Tensor.arange(8, dtype=dtypes.int32) + 1
    np.testing.assert_array_equal(base.numpy(), want.numpy())


def test_big_setitem_with_repeated_positions_takes_the_last_value(device):
    # PyTorch leaves which value wins undefined; numpy documents the last, as tgrad's scatter
    x = np.zeros(4096, dtype=np.float32)
    ids = np.array([7, 9, 7, 4000, 9, 7] * 3)
    v = np.arange(len(ids), dtype=np.float32)
    want = x.copy()
    want[ids] = v
    got = Tensor(x).contiguous()
    got[Tensor(ids)] = Tensor(v)
    np.testing.assert_array_equal(got.numpy(), want)


def test_big_setitem_with_a_gradient_matches_torch(device):
    rng = np.random.default_rng(6)
    x, v = rng.standard_normal((512, 8)).astype(np.float32), rng.standard_normal((30, 8)).astype(np.float32)
    rows = rng.permutation(512)[:30]
    tx, tv = torch.tensor(x, requires_grad=True), torch.tensor(v, requires_grad=True)
    y = tx * 2
    y[torch.from_numpy(rows)] = tv
    (y * torch.arange(8.0)).sum().backward()
    gx, gv = Tensor(x, requires_grad=True), Tensor(v, requires_grad=True)
    z = gx * 2
    z[Tensor(rows)] = gv
    (z * Tensor.arange(8.0)).sum().backward()
    np.testing.assert_allclose(z.numpy(), y.detach().numpy())
    np.testing.assert_allclose(gx.grad.numpy(), tx.grad.numpy())
    np.testing.assert_allclose(gv.grad.numpy(), tv.grad.numpy())


def test_setitem_whose_one_hot_scatter_would_not_fit_runs_on_host_devices(device):
    if device not in dtypes.HOST_DEVICES:
        pytest.skip("the host step is for host memory (CPU, NUMPY); other devices scatter by kernels")
    rng = np.random.default_rng(8)
    ids = rng.permutation(1 << 22)[: 1 << 17]  # a scatter's one-hot mask: 2**39 elements
    v = rng.standard_normal(1 << 17).astype(np.float32)
    want = torch.zeros(1 << 22)
    want[torch.from_numpy(ids)] = torch.from_numpy(v)
    got = Tensor.zeros(1 << 22).contiguous()
    got[Tensor(ids)] = Tensor(v)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
