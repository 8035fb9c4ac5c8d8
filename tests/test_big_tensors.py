"""Tensors of 2**31 elements and more (uint8: about 2 GB each) give numpy's answers on the host devices, or
a clear error naming the limit (cumulative ops). At most two such tensors live at once; expected values
come from a few known elements set in a ones array, not from computing the whole result with numpy."""

import fcntl
import gc
import tempfile
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import open_or_skip
from tgrad import Tensor, dtypes
from tgrad.errors import DeviceError, KernelError, ShapeError
from tgrad.ops import reduce as reduce_ops

N = 2**31 + 1000
FIRST_MAX, LAST_MAX, ONLY_ZERO, THREE = 2**31 + 3, N - 7, 2**31 + 10, 5


# one pytest-xdist worker runs this file (conftest: loadgroup), so each big tensor is made once
pytestmark = pytest.mark.xdist_group("big_tensors")


@pytest.fixture(autouse=True)
def _one_at_a_time():
    """One big test at a time across pytest-xdist's workers (a lock file), where a run deals them to
    several (an explicit --dist load): two tests' temporaries at once would need ~22 GB."""
    with open(Path(tempfile.gettempdir()) / "tgrad_big_tensors.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="module", params=["CPU", "NUMPY"])
def big(request):
    """A uint8 tensor of N elements: ones, but 9 at FIRST_MAX and LAST_MAX, 0 at ONLY_ZERO, 3 at THREE.
    Made once per device for the file's tests, which only read it."""
    open_or_skip(request.param)
    a = np.ones(N, np.uint8)
    a[[FIRST_MAX, LAST_MAX]], a[ONLY_ZERO], a[THREE] = 9, 0, 3
    x = Tensor(a, device=request.param).realize()
    del a
    yield x
    del x
    gc.collect()


TOTAL = N - 4 + 9 + 9 + 0 + 3


def test_reduce_and_elementwise(big):
    assert big.sum().item() == TOTAL  # (uint8 sums in int64, as PyTorch's)
    assert big.max().item() == 9 and big.min().item() == 0
    assert (big + 1).sum().item() == TOTAL + N
    assert (big * 2 + 1)[LAST_MAX].item() == 19


def test_reduce_along_axes(big):
    half = N // 2  # (THREE in the first row; FIRST_MAX, LAST_MAX and ONLY_ZERO in the second)
    assert big.reshape(2, half).sum(axis=1).numpy().tolist() == [half - 1 + 3, half - 3 + 9 + 9 + 0]
    cols = np.ones(8, np.int64)
    cols[[FIRST_MAX % 8, LAST_MAX % 8, THREE % 8]] = [9, 9, 3]
    assert big.reshape(N // 8, 8).max(axis=0).numpy().tolist() == cols.tolist()


def test_matmul(big):
    """A contraction over N elements (int64: the sum passes 2**32); NUMPY would hold the int64 cast of the
    whole tensor (17 GB), so the CPU only."""
    if big.device != "CPU":
        pytest.skip("NUMPY computes the cast into an array of its own")
    w = Tensor.full((N, 2), 2, dtype=dtypes.uint8, device=big.device)
    got = big.reshape(1, N).cast(dtypes.int64) @ w.cast(dtypes.int64)
    assert got.numpy().tolist() == [[2 * TOTAL, 2 * TOTAL]]


def test_argmax_argmin(big):
    """The first maximum / minimum, as an int64 position past 2**31 (PyTorch's argmax is int64)."""
    am = big.argmax()
    assert am.dtype == dtypes.int64 and am.item() == FIRST_MAX
    assert big.argmin().item() == ONLY_ZERO
    assert big.reshape(1, N).argmax(axis=1, keepdim=True).numpy().tolist() == [[FIRST_MAX]]


def test_indexing(big):
    assert big[ONLY_ZERO].item() == 0 and big[LAST_MAX].item() == 9 and big[-7].item() == 9
    idx = Tensor([THREE, FIRST_MAX, LAST_MAX, ONLY_ZERO], device=big.device)
    assert big[idx].numpy().tolist() == [3, 9, 9, 0]
    assert big.gather(0, idx).numpy().tolist() == [3, 9, 9, 0]
    assert big.reshape(1, N).gather(1, idx.reshape(1, 4)).numpy().tolist() == [[3, 9, 9, 0]]
    assert big[2**31 : 2**31 + 12].numpy().tolist() == [1, 1, 1, 9, 1, 1, 1, 1, 1, 1, 0, 1]


def test_pairwise_ops_name_their_limit(big):
    """cumsum and sort compare every pair of positions: an axis this long raises, naming the limit."""
    with pytest.raises(ShapeError, match="2147484648 elements, more than cumsum takes"):
        big.cumsum()
    with pytest.raises(ShapeError, match="2147484648 elements, more than sort takes"):
        big.sort()
    with pytest.raises(ShapeError, match="more than sort takes"):
        big.topk(3)


M = 46341  # M * M = 2**31 + 4633: a reduce over more elements than an int32 counts, from two small buffers


def _rows_times_cols(device: str) -> tuple[Tensor, int]:
    col = (np.arange(M) % 7 == 0).astype(np.int32)  # (a sum within int32: WEBGPU holds int64 as int32)
    a = Tensor(col.reshape(M, 1), device=device)
    b = Tensor(np.ones((1, M), np.int32), device=device)
    return a * b, int(col.sum()) * M


def test_cl_reduces_past_int32():
    """OpenCL indexes with 64-bit integers where the bounds need them: a sum over 2**31 + 4633 elements
    and a uint8 tensor of N elements are right."""
    open_or_skip("CL")
    x, want = _rows_times_cols("CL")
    assert x.sum().item() == want
    a = np.ones(N, np.uint8)
    a[[FIRST_MAX, LAST_MAX]], a[ONLY_ZERO] = 9, 0
    big = Tensor(a, device="CL").realize()
    del a
    assert big.argmax().item() == FIRST_MAX and big[ONLY_ZERO].item() == 0
    assert (big * 2 + 1)[LAST_MAX].item() == 19


def test_webgpu_names_its_index_limit():
    """WGSL counts with 32-bit integers: a reduce over more elements raises a DeviceError naming the limit
    (it failed shader validation), or, on Mesa's software drivers, the KernelError of their loop limit,
    which is met first (opt/limits.py); reducing one axis at a time works."""
    open_or_skip("WEBGPU")
    x, want = _rows_times_cols("WEBGPU")
    with pytest.raises((DeviceError, KernelError), match=r"2147488281 elements"):
        x.sum().item()
    assert x.sum(axis=1).sum().item() == want


def test_blocked_argmax_matches_numpy(device, monkeypatch):
    """The blocked argmax / argmin that axes of 2**31+ elements take, run with blocks of 4 on small tensors
    (ties, an axis not a multiple of the block, NaN, keepdim) on every device, against numpy."""
    monkeypatch.setattr(reduce_ops, "ARG_BLOCK", 4)
    rng = np.random.default_rng(0)
    ints = rng.integers(0, 4, (3, 11, 2)).astype(np.int32)
    floats = rng.standard_normal((5, 9)).astype(np.float32)
    floats[2, [3, 6]] = np.nan
    for a in (ints, floats):
        t = Tensor(a, device=device)
        for axis in range(a.ndim):
            np.testing.assert_array_equal(t._arg_first_max_blocked(axis, False).numpy(), a.argmax(axis))
            np.testing.assert_array_equal(t._arg_first_max_blocked(axis, True).numpy(),
                                          np.expand_dims(a.argmax(axis), axis))
        np.testing.assert_array_equal(t.reshape(-1)._arg_first_max_blocked(0, False).numpy(), a.argmax())
