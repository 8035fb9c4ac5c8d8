"""Python values a dtype cannot hold (issue 46 item 5): Tensor(), full, fill_, t[i] = v, masked_fill, where,
pad and clamp either raise as PyTorch does (ValueOverflowError) or give PyTorch's value (unsigned wrapping of
small negative ints, truncation of floats, inf for float16 construction). Each case runs in PyTorch too."""

import itertools

import numpy as np
import pytest
import torch

from tests.conftest import open_or_skip
from tests.helpers import has_float64
from tgrad import Tensor, dtypes
from tgrad.errors import ValueOverflowError

NAN, INF = float("nan"), float("inf")
INTS = ("int8", "uint8", "int16", "int32", "int64", "uint16", "uint32", "uint64")
FLOATS = ("float16", "bfloat16", "float32", "float64")


def _int_values(name: str) -> list:
    info = np.iinfo(name)
    lo, hi = int(info.min), int(info.max)
    edges = [hi, hi + 1, lo, lo - 1, -1, -hi, -hi - 1]
    return edges + [1.7, -1.7, -0.5, -0.0, 127.5, -128.5, 300.0, NAN, INF, True]


FLOAT_VALUES = [1e6, -1e6, 65504.0, 65519.0, 1e300, -1e300, 3.5e38, INF, -INF, NAN, 100000, 2.5, True]
BOOL_VALUES = [5, 0.5, NAN, -1, 0]


def _values(name: str) -> list:
    if name == "bool":
        return BOOL_VALUES
    return _int_values(name) if name in INTS else FLOAT_VALUES


# (op name, torch version, tgrad version): each takes (value, dtype name) and returns a tensor
def _t_setitem(index):
    def run(v, name):
        t = torch.zeros(3, dtype=getattr(torch, name))
        t[index if not isinstance(index, list) else torch.tensor(index)] = v
        return t

    return run


def _g_setitem(index, device):
    def run(v, name):
        t = Tensor.zeros(3, dtype=name, device=device)
        t[index if not isinstance(index, list) else Tensor(index, device=device)] = v
        return t

    return run


def _ops(device: str) -> list:
    td = lambda name: getattr(torch, name)  # noqa: E731
    mask_t, mask_g = torch.tensor([True, False, True]), Tensor([True, False, True], device=device)
    return [
        ("Tensor", lambda v, n: torch.tensor([0, v], dtype=td(n)),
         lambda v, n: Tensor([0, v], dtype=n, device=device)),
        ("Tensor scalar", lambda v, n: torch.tensor(v, dtype=td(n)),
         lambda v, n: Tensor(v, dtype=n, device=device)),
        ("full", lambda v, n: torch.full((2,), v, dtype=td(n)),
         lambda v, n: Tensor.full((2,), v, dtype=n, device=device)),
        ("full_like", lambda v, n: torch.full_like(torch.zeros(2, dtype=td(n)), v),
         lambda v, n: Tensor.zeros(2, dtype=n, device=device).full_like(v)),
        ("fill_", lambda v, n: torch.zeros(2, dtype=td(n)).fill_(v),
         lambda v, n: Tensor.zeros(2, dtype=n, device=device).fill_(v)),
        ("setitem int", _t_setitem(1), _g_setitem(1, device)),
        ("setitem slice", _t_setitem(slice(0, 2)), _g_setitem(slice(0, 2), device)),
        ("setitem indices", _t_setitem([0, 2]), _g_setitem([0, 2], device)),
        ("masked_fill", lambda v, n: torch.zeros(3, dtype=td(n)).masked_fill(mask_t, v),
         lambda v, n: Tensor.zeros(3, dtype=n, device=device).masked_fill(mask_g, v)),
        ("where", lambda v, n: torch.where(mask_t, torch.zeros(3, dtype=td(n)), v),
         lambda v, n: mask_g.where(Tensor.zeros(3, dtype=n, device=device), v)),
        ("pad", lambda v, n: torch.nn.functional.pad(torch.zeros(2, dtype=td(n)), (1, 1), value=v),
         lambda v, n: Tensor.zeros(2, dtype=n, device=device).pad(((1, 1),), value=v)),
        ("clamp min", lambda v, n: torch.full((2,), 7, dtype=td(n)).clamp(min=v),
         lambda v, n: Tensor.full((2,), 7, dtype=n, device=device).clamp(min=v)),
        ("clamp max", lambda v, n: torch.full((2,), 7, dtype=td(n)).clamp(max=v),
         lambda v, n: Tensor.full((2,), 7, dtype=n, device=device).clamp(max=v)),
    ]


# where PyTorch's answer is a bug, not a rule: tgrad raises (a clear error) instead of a wrong value
TORCH_BUGS = {
    ("Tensor", "int64", 1e300), ("Tensor scalar", "int64", 1e300),  # not raised by torch's own check
}


UINT64_LIMITS = ("an integer is required", "negative int to unsigned", "unpacking long long")
UNSUPPORTED = "unsupported"  # PyTorch has no kernel of this op for this dtype (uint16/32/64)


def _torch_outcome(fn, v, name):
    try:
        out = fn(v, name)
    except (RuntimeError, OverflowError, ValueError, TypeError) as e:
        # PyTorch's uint64 takes no floats or negative ints in tensor() and no value past int64 in t[i] = v
        limited = name == "uint64" and any(m in str(e) for m in UINT64_LIMITS)
        return UNSUPPORTED if "not implemented for" in str(e) or limited else None
    return (out.float() if out.dtype == torch.bfloat16 else out).numpy()


def _check(op, fn_t, fn_g, v, name):
    expected = _torch_outcome(fn_t, v, name)
    if expected is UNSUPPORTED:
        return
    if expected is None:
        with pytest.raises((ValueOverflowError, TypeError, ValueError)) as info:
            fn_g(v, name).numpy()
        if isinstance(info.value, ValueOverflowError):
            assert repr(v) in str(info.value) and name in str(info.value), str(info.value)
        return
    got = fn_g(v, name).numpy()
    assert got.dtype == expected.dtype or name == "bfloat16", (op, name, v, got.dtype, expected.dtype)
    np.testing.assert_array_equal(got, expected, err_msg=f"{op} {name} {v!r}")


def test_overflow_grid_like_torch():
    """Every op x dtype x edge value on the reference device: PyTorch raises and tgrad raises (naming the
    value and the dtype), or both give the same values."""
    open_or_skip("NUMPY")
    for (op, fn_t, fn_g), name in itertools.product(_ops("NUMPY"), ("bool",) + INTS + FLOATS):
        for v in _values(name):
            if (op, name, v) in TORCH_BUGS or op.startswith("clamp") and name == "bool":
                continue
            if op == "pad" and abs(v) > 2**53:  # PyTorch's pad value is a double: 2^63 - 1 becomes -2^63
                continue
            _check(op, fn_t, fn_g, v, name)


def test_torch_bug_cases():
    """A float past int64 into int64: tgrad raises instead of PyTorch's wrapped value; pad keeps an int64
    value exactly (PyTorch's goes through a double)."""
    with pytest.raises(ValueOverflowError, match="1e\\+300 does not fit in int64"):
        Tensor([1e300], dtype="int64")
    top = np.iinfo(np.int64).max
    got = Tensor.zeros(1, dtype="int64", device="NUMPY").pad(((1, 0),), value=top).numpy()
    np.testing.assert_array_equal(got, np.pad(np.zeros(1, np.int64), (1, 0), constant_values=top))


def test_error_names_op_value_range_and_line():
    with pytest.raises(ValueOverflowError) as info:
        Tensor([300], dtype="int8")
    msg = str(info.value)
    assert "300" in msg and "int8" in msg and "-128 to 127" in msg and "test_value_overflow.py" in msg, msg
    with pytest.raises(ValueOverflowError, match="full"):
        Tensor.full((2,), 1e6, dtype="float16")


def test_numpy_arrays_wrap_like_numpy():
    """A numpy array given to Tensor() is converted as numpy's astype (and PyTorch's torch.tensor) does."""
    a = np.array([300, -1, 127], np.int64)
    np.testing.assert_array_equal(Tensor(a, dtype="int8").numpy(), torch.tensor(a, dtype=torch.int8).numpy())


DEVICE_CASES = [  # the values a device computes (the raising is decided on the host, the same everywhere)
    ("Tensor", "uint8", -1), ("Tensor", "int8", -1.7), ("Tensor", "float16", 1e6), ("Tensor", "int8", 300),
    ("full", "uint8", -255), ("full", "int8", 1.7), ("full", "float16", 1e6), ("full", "int32", 2**31),
    ("fill_", "uint8", -1), ("fill_", "int8", 300), ("setitem int", "uint8", -1),
    ("setitem int", "int8", 300),
    ("setitem slice", "float16", 1e6), ("setitem indices", "int16", 40000), ("masked_fill", "uint8", -1),
    ("masked_fill", "int8", -129), ("where", "uint8", -1), ("where", "int8", 300), ("clamp min", "uint8", -1),
    ("clamp max", "uint8", -1), ("clamp max", "int8", 300), ("clamp max", "float32", 1e300),
    ("Tensor", "float64", 1e300), ("pad", "uint8", -1), ("pad", "int8", 1.7),
]


def test_overflow_values_on_device(device):
    ops = {op: (fn_t, fn_g) for op, fn_t, fn_g in _ops(device)}
    for op, name, v in DEVICE_CASES:
        if name == "float64" and not has_float64(device) or name == "float16" and device == "WEBGPU":
            continue
        _check(op, *ops[op], v, name)


def test_arithmetic_with_python_ints_still_wraps(device):
    """PyTorch wraps `int8_tensor + 300` (only conversions are checked): so does tgrad."""
    got = (Tensor([1, 2], dtype=dtypes.int8, device=device) + 300).numpy()
    np.testing.assert_array_equal(got, (torch.tensor([1, 2], dtype=torch.int8) + 300).numpy())
