"""int64 arithmetic whose result passes int32: PyTorch's value on every device, or on WEBGPU without
shader-int64 (int64 held as int32: emit_wgsl_int64) a ValueOverflowError naming the op, never a wrapped
number. Results that fit give PyTorch's exact values everywhere, WEBGPU included."""

import numpy as np
import pytest
import torch

from tests.conftest import open_or_skip
from tests.helpers import float64_or_raises, has_float64
from tgrad import Tensor, dtypes
from tgrad.device import get_runtime
from tgrad.emit_wgsl import Target, render
from tgrad.errors import ValueOverflowError
from tgrad.fuse import schedule
from tgrad.jit import TinyJit

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
_R = np.random.default_rng(0).integers(-I32_MAX, I32_MAX, 3000)
CANCELLING = np.random.default_rng(1).permutation(np.concatenate([_R, -_R, [7]]))  # sums to 7


def _trunc(x, y):
    return x.div(y, rounding_mode="trunc")


def _long(x):
    return x.long()


# (name, op over torch or tgrad tensors, inputs as numpy arrays, label the WEBGPU error names)
OVERFLOWS = [
    ("sum_int32", lambda x: x.sum(), [np.array([I32_MAX, 5], np.int32)], "a sum"),
    ("sum_int64", lambda x: x.sum(), [np.array([I32_MAX, 5, -3])], "a sum"),
    ("sum_long_axis", lambda x: x.sum(1), [np.full((2, 5000), 2**20)], "a sum"),
    ("cumsum", lambda x: x.cumsum(0), [np.array([I32_MAX - 1, 1, 1, -7])], "a sum"),
    ("prod", lambda x: x.prod(), [np.array([2**16, 3, 2**15])], "a prod"),
    ("add", lambda x, y: x + y, [np.array([I32_MAX, 1]), np.array([1, 2])], r"`\+`"),
    ("sub", lambda x, y: x - y, [np.array([I32_MIN, 1]), np.array([1, 2])], "`-`"),
    ("mul", lambda x, y: x * y, [np.array([2**16, 3]), np.array([2**15, 2])], r"`\*`"),
    ("mul_negative", lambda x, y: x * y, [np.array([-(2**16) - 1]), np.array([2**15])], r"`\*`"),
    ("mul_const", lambda x: x * 3, [np.array([1, 2**30])], r"`\*`"),
    ("neg", lambda x: -x, [np.array([I32_MIN, 3])], "negation"),
    ("abs", lambda x: x.abs(), [np.array([I32_MIN, 3])], r"negation|`\*`"),
    ("idiv", _trunc, [np.array([I32_MIN, 7]), np.array([-1, 2])], "`//`"),
    ("cast_float", _long, [np.array([3e9, 1.5], np.float32)], "float -> int64"),
    ("cast_float_negative", _long, [np.array([-3e9, 1.5], np.float32)], "float -> int64"),
    ("matmul", lambda x, y: x @ y, [np.array([[2**16, 2**16]]), np.array([[2**15], [2**15]])], "a sum"),
    ("sum_then_add", lambda x: x.sum() + 2**30, [np.array([2**30, 5])], r"`\+`"),
]

FITS = [
    ("sum_int32", lambda x: x.sum(), [np.array([2**30, 2**30 - 1], np.int32)]),
    ("sum_int64", lambda x: x.sum(), [np.array([I32_MAX, 5, -5])]),
    ("sum_long_axis", lambda x: x.sum(1), [np.full((2, 5000), 2**18)]),
    # partial sums past int32 (the first half of the row), a total inside it: PyTorch's total
    ("sum_partials_past_int32", lambda x: x.sum(1), [np.repeat([[2**28, -(2**28)]], 3000, axis=1)]),
    ("sum_cancelling_full_range", lambda x: x.sum(), [CANCELLING]),
    ("sum_partials_sequential", lambda x: x.sum(), [np.array([I32_MAX, I32_MAX, 5, -I32_MAX, -I32_MAX])]),
    ("sum_bool_count", lambda x: (x > 0).sum(), [np.array([1, -2, 3])]),
    ("cumsum", lambda x: x.cumsum(0), [np.array([I32_MAX - 1, 1, -7, 3])]),
    ("prod", lambda x: x.prod(), [np.array([2**15, -(2**16)])]),
    ("add", lambda x, y: x + y, [np.array([I32_MAX - 1, I32_MIN]), np.array([1, I32_MAX])]),
    ("sub", lambda x, y: x - y, [np.array([I32_MIN + 1, 5]), np.array([1, 2])]),
    ("mul", lambda x, y: x * y, [np.array([46341, -(2**16), 7]), np.array([46340, 2**15, -3])]),
    ("neg", lambda x: -x, [np.array([I32_MAX, -I32_MAX])]),
    ("abs", lambda x: x.abs(), [np.array([-I32_MAX, 3])]),
    ("idiv", _trunc, [np.array([I32_MIN, I32_MIN, 7]), np.array([1, -2, -1])]),
    ("cast_float", _long, [np.array([2147483520.0, -2147483648.0, -1.5, 2.5], np.float32)]),
    ("matmul", lambda x, y: x @ y, [np.array([[2**15, 2**15]]), np.array([[2**15], [2**15 - 1]])]),
    ("arange", lambda x: x + 0, [np.arange(3 * 10**6, dtype=np.int64)]),
]


def _torch(op, arrays):
    return op(*[torch.from_numpy(a) for a in arrays]).numpy()


def _held_as_int32(device: str) -> bool:
    return device == "WEBGPU" and not get_runtime(device).target.int64


@pytest.mark.parametrize("name,op,arrays,label", OVERFLOWS, ids=[c[0] for c in OVERFLOWS])
def test_results_past_int32(device, name, op, arrays, label):
    """PyTorch's int64 value; on WEBGPU holding int64 as int32, a ValueOverflowError naming the op and the
    user's line."""
    ts = [Tensor(a) for a in arrays]
    if _held_as_int32(device):
        with pytest.raises(ValueOverflowError, match=label) as err:
            op(*ts).numpy()
        assert "int64 as int32" in str(err.value) and "test_webgpu_int64_overflow.py" in str(err.value)
        return
    got, want = op(*ts).numpy(), _torch(op, arrays)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name,op,arrays", FITS, ids=[c[0] for c in FITS])
def test_results_inside_int32(device, name, op, arrays):
    got, want = op(*[Tensor(a) for a in arrays]).numpy(), _torch(op, arrays)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_uint32_to_int64(device):
    """uint32 values inside int32 sum and cast to int64 on every device that holds uint32 (numpy's values);
    past int32 WEBGPU (int64 held as int32) raises."""
    if device not in dtypes.UINT32_DEVICES:
        return
    small = np.array([I32_MAX - 10, 5, 3], np.uint32)
    big = np.array([2**31, 4294967290], np.uint32)
    np.testing.assert_array_equal(Tensor(small).cast(dtypes.int64).numpy(), small.astype(np.int64))
    np.testing.assert_array_equal(Tensor(small[1:]).sum().numpy(), small[1:].astype(np.int64).sum())
    for op, want in [(lambda t: t.cast(dtypes.int64), big.astype(np.int64)),
                     (lambda t: t.sum(), big.astype(np.int64).sum()),
                     (lambda t: t.cumsum(0), big.astype(np.int64).cumsum())]:
        if _held_as_int32(device):
            with pytest.raises(ValueOverflowError, match="uint32 -> int64|a sum"):
                op(Tensor(big)).numpy()
        else:
            np.testing.assert_array_equal(op(Tensor(big)).numpy(), want)


def test_float64_to_int64(device):
    """float64 -> int64 (WGSL f64 where the adapter has it): PyTorch's value, or past int32 the error."""
    fits, past = np.array([2147483647.0, -2147483648.0, -2.5]), np.array([2147483648.0, 1.0])
    if not has_float64(device):  # (then a DTypeError naming float64)
        float64_or_raises(lambda: Tensor(fits).long().numpy(), device)
        return
    np.testing.assert_array_equal(Tensor(fits).long().numpy(), torch.from_numpy(fits).long().numpy())
    if _held_as_int32(device):
        with pytest.raises(ValueOverflowError, match="float -> int64"):
            Tensor(past).long().numpy()
    else:
        np.testing.assert_array_equal(Tensor(past).long().numpy(), torch.from_numpy(past).long().numpy())


def test_nan_and_inf_to_int64_raise_where_held_as_int32():
    """PyTorch's int64 of nan / inf (int64's minimum on x86) is past int32: an error, not int32's bounds."""
    open_or_skip("WEBGPU")
    if not _held_as_int32("WEBGPU"):
        pytest.skip("this WEBGPU adapter computes int64 as i64 (WEBGPU_INT64=1)")
    for x in (np.nan, np.inf, -np.inf):
        with pytest.raises(ValueOverflowError, match="float -> int64"):
            Tensor(np.array([1.0, x], np.float32), device="WEBGPU").long().numpy()


def test_failed_assign_leaves_its_target_unchanged(device):
    """`t += 1` past int32 on WEBGPU raises and leaves t as it was (the kernel's output is put back)."""
    t = Tensor(np.array([I32_MAX, 4])).realize()
    if _held_as_int32(device):
        with pytest.raises(ValueOverflowError, match=r"`\+`"):
            t += 1
            t.realize()
        np.testing.assert_array_equal(t.numpy(), [I32_MAX, 4])
        t.assign(t - 5).realize()  # the device goes on working
        np.testing.assert_array_equal(t.numpy(), [I32_MAX - 5, -1])
        return
    t += 1
    np.testing.assert_array_equal(t.numpy(), (torch.tensor([I32_MAX, 4]) + 1).numpy())


def test_jit_replay_checks(device):
    """A replayed kernel checks as the captured one did: fitting calls give PyTorch's values, then one past
    int32 (a replay: the function body ran twice only) raises on WEBGPU (PyTorch's value elsewhere), and
    the next fitting call replays right."""
    calls = []

    @TinyJit
    def f(x):
        calls.append(1)
        return (x * 2).sum().realize()

    def want(a):
        return (torch.from_numpy(a) * 2).sum().item()

    for v in (1, 2, 3, 4):
        a = np.array([v, 2**29], np.int64)
        assert f(Tensor(a)).item() == want(a)
    a = np.array([2**30, 2**29], np.int64)
    if _held_as_int32(device):
        with pytest.raises(ValueOverflowError):
            f(Tensor(a)).item()
    else:
        assert f(Tensor(a)).item() == want(a)
    assert len(calls) == (5 if get_runtime(device).evaluates_graphs else 2)  # (NUMPY runs the function)
    a = np.array([5, -(2**29)], np.int64)
    assert f(Tensor(a)).item() == want(a)


def _source(t: Tensor) -> str:
    (item,) = schedule([t.node])
    return render(item.kernel, Target(int64=False)).source


def test_only_kernels_that_may_overflow_are_checked():
    """Float kernels, counts and int64 arithmetic of values known to stay inside int32 (from int16 here)
    get no overflow word; int64 sums, products and float casts do."""
    x = Tensor(np.array([1, 2, 3]), device="NUMPY")
    f = Tensor(np.array([1.0, 2.0], np.float32), device="NUMPY")
    small = x.cast(dtypes.int16).cast(dtypes.int64) * 1000 + 7
    for t in ((f * 2 + 1).sum(), (x > 1).sum(), small, x.max(), x % 5):
        assert "ovf" not in _source(t)
    assert "pair_i32_ck" in _source(x.sum()) and "mul_ck" in _source(x.prod())  # (a sum adds in 64 bits)
    assert "add_ck" in _source(x + x) and "mul_ck" in _source(x * x) and "f32_i32_ck" in _source(f.long())
