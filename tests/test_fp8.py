"""fp8 (e4m3fn, e5m2 and the fnuz formats) against PyTorch's float8 dtypes, bit for bit: the rounding
helpers over every float16 value and random float32 ones (ties, subnormals, saturation, inf, NaN), and fp8
tensors (NUMPY only: float32 storage rounded after every op, as bfloat16 is) for casts, bitcasts, arithmetic
among one fp8 dtype and the refused promotion; other devices raise a DTypeError naming the dtype. Also the
dtype predicates tinygrad has (dtypes.is_int / is_float / is_unsigned, finfo) against torch and numpy."""

import numpy as np
import pytest
import torch

from tgrad import Tensor, dtypes
from tgrad.dtype import float_to_fp8, fp8_to_float, round_fp8
from tgrad.errors import DTypeError

TORCH = {"fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2, "fp8e4m3fnuz": torch.float8_e4m3fnuz,
         "fp8e5m2fnuz": torch.float8_e5m2fnuz}
FP8 = [dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.fp8e4m3fnuz, dtypes.fp8e5m2fnuz]


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(0)
    every_half = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    scaled = rng.standard_normal(50000).astype(np.float32) * np.float32(10.0) ** rng.integers(-12, 8, 50000)
    special = [np.inf, -np.inf, np.nan, -np.nan, 1e30, -1e30, 0.0, -0.0, 448.0, 464.0, 480.0, 57344.0,
               61440.0, 240.0, 248.0, 2.0**-10, 2.0**-17, 2.0**-18, 3 * 2.0**-18, 2.0**-9 * 1.5]
    return np.concatenate([every_half, scaled.astype(np.float32), np.array(special, np.float32)])


@pytest.mark.parametrize("dt", FP8, ids=lambda d: d.name)
def test_float_to_fp8_matches_torch_casts(dt):
    x = _inputs()
    theirs = torch.from_numpy(x).to(TORCH[dt.name]).view(torch.uint8).numpy()
    np.testing.assert_array_equal(float_to_fp8(x, dt), theirs)
    back = torch.from_numpy(x).to(TORCH[dt.name]).float().numpy()
    np.testing.assert_array_equal(round_fp8(x, dt), back)  # (assert_array_equal: nan == nan)


@pytest.mark.parametrize("dt", FP8, ids=lambda d: d.name)
def test_fp8_to_float_every_code(dt):
    codes = np.arange(256, dtype=np.uint8)
    theirs = torch.from_numpy(codes).view(TORCH[dt.name]).float().numpy()
    np.testing.assert_array_equal(fp8_to_float(codes, dt), theirs)


@pytest.mark.parametrize("dt", [dtypes.fp8e4m3, dtypes.fp8e5m2], ids=lambda d: d.name)
def test_fp8_tensors(device, dt):
    x = np.array([1.3, 300.7, -0.01, 500.0, 1e-3, -7.77, 0.0, 2.5], np.float32)
    if device != "NUMPY":
        with pytest.raises(DTypeError, match=f"{dt.name} tensors exist on NUMPY only, not on {device}"):
            Tensor(x, device=device).cast(dt)
        return
    tx = torch.from_numpy(x).to(TORCH[dt.name])
    t = Tensor(x, device=device).cast(dt)
    assert t.dtype == dt and t.is_floating_point() and t.element_size() == 1
    np.testing.assert_array_equal(t.numpy(), tx.float().numpy())
    np.testing.assert_array_equal(Tensor(x, dtype=dt, device=device).numpy(), tx.float().numpy())
    np.testing.assert_array_equal(t.bitcast(dtypes.uint8).numpy(), tx.view(torch.uint8).numpy())
    codes = Tensor(tx.view(torch.uint8).numpy(), device=device)
    np.testing.assert_array_equal(codes.bitcast(dt).numpy(), tx.float().numpy())
    np.testing.assert_array_equal(t.cast(dtypes.int32).numpy(), tx.to(torch.int32).numpy())
    # PyTorch has no fp8 arithmetic: an op computes in float32 and rounds once, like bfloat16's
    f = tx.float()
    np.testing.assert_array_equal((t * 3 + t).numpy(), ((f * 3).to(TORCH[dt.name]).float() + f).to(
        TORCH[dt.name]).float().numpy())
    with pytest.raises(DTypeError, match="no promotion for float8"):
        t + Tensor(x, device=device)


@pytest.mark.parametrize("dt", FP8, ids=lambda d: d.name)
def test_fp8_random_draws_keep_the_dtype(dt):
    """rand/randn/uniform with an fp8 dtype make fp8 tensors (they made float32 ones: element_size 4) whose
    values are fp8 values (each a fixed point of PyTorch's cast); rand stays below 1. (PyTorch draws no fp8
    numbers; these are tinygrad's.)"""
    for t in (Tensor.randn(500, dtype=dt, device="NUMPY"), Tensor.rand(500, dtype=dt, device="NUMPY"),
              Tensor.uniform(500, low=-3, high=3, dtype=dt, device="NUMPY")):
        assert t.dtype == dt and t.element_size() == 1
        v = torch.from_numpy(t.numpy())
        np.testing.assert_array_equal(v.to(TORCH[dt.name]).float().numpy(), v.numpy())
    r = Tensor.rand(4000, dtype=dt, device="NUMPY").numpy()
    assert r.min() == 0 and r.max() < 1 and len(np.unique(r)) > 4


def test_dtype_predicates_match_torch():
    for dt in [*dtypes.all, *FP8]:
        theirs = TORCH.get(dt.name) or getattr(torch, dt.name)
        assert dtypes.is_float(dt) == theirs.is_floating_point
        assert dtypes.is_int(dt) == (not theirs.is_floating_point and theirs != torch.bool)
        assert dtypes.is_unsigned(dt) == (dtypes.is_int(dt) and torch.iinfo(theirs).min == 0)
        assert dtypes.is_int(dt.name) == dtypes.is_int(dt)
        if dt.is_float:  # (the fnuz formats' torch.finfo(...).eps is half of 2**-mantissa: skipped)
            exp, mant = dtypes.finfo(dt)
            assert exp == theirs.itemsize * 8 - 1 - mant
            if not dt.name.endswith("fnuz"):
                assert mant == -round(np.log2(torch.finfo(theirs).eps))
    with pytest.raises(DTypeError, match="finfo: int32 is not a floating-point dtype"):
        dtypes.finfo(dtypes.int32)
    assert dtypes.from_any("fp8e4m3") is dtypes.fp8e4m3 and dtypes.ulong is dtypes.uint64


def test_nn_exposes_state_and_optim():
    from tgrad import nn  # noqa: PLC0415 - the point: an attribute of the package, not a submodule import

    lin = nn.Linear(3, 2)
    assert nn.state.get_parameters(lin) == [lin.weight, lin.bias]
    assert isinstance(nn.optim.SGD(nn.state.get_parameters(lin), lr=0.1), nn.optim.Optimizer)
