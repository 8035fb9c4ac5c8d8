"""Special values follow PyTorch: 0, negatives, inf and nan through math, max/relu and division."""

import math
import operator

import numpy as np
import pytest
import torch

from tests.helpers import compare
from tgrad import Tensor, dtypes
from tgrad.device import get_runtime

SPECIAL = [0.0, -0.0, -1.0, 1.0, math.inf, -math.inf, math.nan, 1e-30, -2.5]


@pytest.mark.parametrize(
    "name",
    [
        "exp",
        "log",
        "sqrt",
        "reciprocal",
        "relu",
        "sigmoid",
        "tanh",
        "abs",
        "neg",
        "sin",
        "log2",
        "exp2",
        "trunc",
        "floor",
        "ceil",
        "sign",
    ],
)
def test_unary_special_values(device, name):
    out = getattr(Tensor(SPECIAL), name)().numpy()
    ref = getattr(torch.tensor(SPECIAL), name)().numpy()
    atol = 1e-6 if name != "sin" else 1e-5
    compare(name, out, ref, atol, 1e-5)


def test_division_by_zero(device):
    a, b = [1.0, -1.0, 0.0, math.nan], [0.0, 0.0, 0.0, 1.0]
    compare("div", (Tensor(a) / Tensor(b)).numpy(), (torch.tensor(a) / torch.tensor(b)).numpy(), 0, 0)


def test_nan_propagates_through_max(device):
    v = [[1.0, math.nan, 3.0], [2.0, 1.0, 0.0]]
    compare("max", Tensor(v).max(1).numpy(), torch.tensor(v).amax(1).numpy(), 0, 0)
    compare(
        "maximum",
        Tensor(v).maximum(Tensor([[0.0, 0.0, math.nan], [math.nan, 5.0, 0.0]])).numpy(),
        torch.tensor(v).maximum(torch.tensor([[0.0, 0.0, math.nan], [math.nan, 5.0, 0.0]])).numpy(),
        0,
        0,
    )


def test_int_division_negative(device):
    a = torch.tensor([7, -7, 7, -7, -1, 0], dtype=torch.int32)
    b = torch.tensor([3, 3, -3, -3, 4, -5], dtype=torch.int32)
    ta, tb = Tensor(a.numpy()), Tensor(b.numpy())
    compare("floordiv", (ta // tb).numpy(), (a // b).numpy(), 0, 0)
    compare("mod", (ta % tb).numpy(), (a % b).numpy(), 0, 0)


def test_half_sum_accumulates_in_float32(device):
    x = np.full(4096, 0.1, dtype=np.float16)
    out = Tensor(x).sum().numpy()
    ref = torch.tensor(x).sum().numpy()
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float32), ref.astype(np.float32), rtol=2e-3)


EXTREME = [88.0, 89.0, 100.0, -100.0, -104.0, 1e38, -1e38, 1e-30, 3.0e38]


@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "reciprocal", "exp2", "log2", "sigmoid", "tanh"])
def test_unary_extreme_values(device, name):
    """Overflow to inf, underflow to 0, the largest floats: as PyTorch."""
    out = getattr(Tensor(EXTREME), name)().numpy()
    ref = getattr(torch.tensor(EXTREME), name)().numpy()
    compare(name, out, ref, 1e-6, 1e-5)


def test_division_special_values(device):
    """Every pair of 0, -0, ±1, ±inf, nan: x/y as PyTorch (inf/inf = nan, 1/-0 = -inf, ...)."""
    vals = [0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan]
    a = [x for x in vals for _ in vals]
    b = [y for _ in vals for y in vals]
    compare("div", (Tensor(a) / Tensor(b)).numpy(), (torch.tensor(a) / torch.tensor(b)).numpy(), 0, 0)
    compare("div by scalar 0", (Tensor(vals) / 0).numpy(), (torch.tensor(vals) / 0).numpy(), 0, 0)
    compare("scalar / x", (1.0 / Tensor(vals)).numpy(), (1.0 / torch.tensor(vals)).numpy(), 0, 0)


def test_signed_zero_survives(device):
    """-0.0 keeps its sign through neg, sqrt and multiplication (seen through 1/x = -inf)."""
    z = [0.0, -0.0]
    for name, fn in [("neg", lambda t: -t), ("sqrt", lambda t: t.sqrt()), ("mul", lambda t: t * 1.0)]:
        out = fn(Tensor(z)).reciprocal().numpy()
        ref = fn(torch.tensor(z)).reciprocal().numpy()
        compare(name, out, ref, 0, 0)


def test_nan_propagates_through_reductions_and_relu(device):
    v = [[1.0, math.nan, 3.0, -2.0], [2.0, 1.0, 0.0, -5.0]]
    t, r = Tensor(v), torch.tensor(v)
    compare("max()", t.max().numpy(), r.max().numpy(), 0, 0)
    compare("min(1)", t.min(1).numpy(), r.amin(1).numpy(), 0, 0)
    compare("max(0)", t.max(0).numpy(), r.amax(0).numpy(), 0, 0)
    compare("sum(1)", t.sum(1).numpy(), r.sum(1).numpy(), 0, 0)
    compare("relu", t.relu().numpy(), r.relu().numpy(), 0, 0)
    compare("relu max", t.relu().max(1).numpy(), r.relu().amax(1).numpy(), 0, 0)
    compare("minimum", t.minimum(0.5).numpy(), r.minimum(torch.tensor(0.5)).numpy(), 0, 0)
    compare("clip", t.clip(-1, 1).numpy(), r.clip(-1, 1).numpy(), 0, 0)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64"])
def test_int_division_and_modulo_by_negatives(device, dtype):
    """// and % floor like Python and PyTorch; div(rounding_mode='trunc') truncates; scalar divisors too."""
    a = torch.tensor([7, -7, 7, -7, -1, 0, 1, 100, -100, 6, -6], dtype=getattr(torch, dtype))
    b = torch.tensor([3, 3, -3, -3, 4, -5, -1, -7, 7, -3, 3], dtype=getattr(torch, dtype))
    ta, tb = Tensor(a.numpy()), Tensor(b.numpy())
    compare("floordiv", (ta // tb).numpy(), (a // b).numpy(), 0, 0)
    compare("mod", (ta % tb).numpy(), (a % b).numpy(), 0, 0)
    compare("trunc", ta.div(tb, rounding_mode="trunc").numpy(), a.div(b, rounding_mode="trunc").numpy(), 0, 0)
    for s in (-3, 3, -1):
        compare(f"// {s}", (ta // s).numpy(), (a // s).numpy(), 0, 0)
        compare(f"% {s}", (ta % s).numpy(), (a % s).numpy(), 0, 0)
    # Python's own ints agree
    assert (ta // tb).numpy().tolist() == [x // y for x, y in zip(a.tolist(), b.tolist())]
    assert (ta % tb).numpy().tolist() == [x % y for x, y in zip(a.tolist(), b.tolist())]


def test_float_floordiv_and_mod_by_negatives(device):
    a = torch.tensor([7.5, -7.5, 7.5, -7.5, 0.0, 1.0])
    b = torch.tensor([2.0, 2.0, -2.0, -2.0, -3.0, -0.5])
    ta, tb = Tensor(a.numpy()), Tensor(b.numpy())
    compare("floordiv", (ta // tb).numpy(), (a // b).numpy(), 0, 0)
    compare("mod", (ta % tb).numpy(), (a % b).numpy(), 1e-6, 0)


WRAPS = [
    # dtype, a, b: a+b, a-b, a*b overflow and wrap as numpy does
    ("int8", [127, -128, 100, -100], [1, -1, 100, 3]),
    ("uint8", [255, 0, 200, 16], [1, 1, 100, 16]),
    ("int16", [32767, -32768, 300, -300], [1, -1, 300, 300]),
    ("int32", [2**31 - 1, -(2**31), 65536, 46341], [1, -1, 65536, 46341]),
    ("int64", [2**63 - 1, -(2**63), 2**32, 2**62], [1, -1, 2**32, 4]),
]


@pytest.mark.parametrize("dtype,a,b", WRAPS, ids=[w[0] for w in WRAPS])
def test_int_overflow_wraps_as_numpy(device, dtype, a, b):
    if device == "WEBGPU" and dtype == "int64":
        pytest.skip("WEBGPU holds int64 as int32 and refuses values outside ±2**31 (documented)")
    na, nb = np.array(a, dtype=dtype), np.array(b, dtype=dtype)
    ta, tb = Tensor(na), Tensor(nb)
    with np.errstate(over="ignore"):
        for name, fn in [("add", operator.add), ("sub", operator.sub), ("mul", operator.mul)]:
            out, ref = fn(ta, tb).numpy(), fn(na, nb)
            assert out.dtype == ref.dtype, (name, out.dtype, ref.dtype)
            np.testing.assert_array_equal(out, ref, err_msg=name)
        if dtype != "uint8":
            np.testing.assert_array_equal((-ta).numpy(), -na, err_msg="neg")


def test_half_mean_and_matmul_accumulate_in_float32(device):
    """4096 halves of 0.1 summed in float16 would stop near 256; accumulated in float32 they reach 409.5."""
    x = np.full((2, 4096), 0.1, dtype=np.float16)
    w = np.ones((4096, 3), dtype=np.float16)
    want = (x.astype(np.float32) @ w.astype(np.float32)).astype(np.float16)
    out = (Tensor(x) @ Tensor(w)).numpy()
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float32), want.astype(np.float32), rtol=2e-3)
    mean = Tensor(x).mean(1).numpy()
    np.testing.assert_allclose(mean.astype(np.float32), torch.tensor(x).mean(1).float().numpy(), rtol=2e-3)
    total = Tensor(x).sum().numpy()
    np.testing.assert_allclose(float(total), float(torch.tensor(x).sum()), rtol=2e-3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_narrow_float_mean_var_std_past_the_dtypes_range_of_counts(device, dtype):
    """70000 elements: the count and 1 / count are not float16 numbers (inf, a subnormal), so mean, var and
    std of float16 / bfloat16 run in float32 and round once, as PyTorch's (tinygrad's
    test_var_half_precision_large_n: var gave 0.0 on NUMPY, TRITON and WEBGPU); prod too."""
    from tgrad import Device

    dt = getattr(dtypes, dtype)
    if not Device[device].supports(dt):
        pytest.skip(f"{device} has no {dtype}")
    rng = np.random.default_rng(5)
    x = rng.random((35000, 2)).astype(np.float32)
    x[:, 1] += 1
    tt = torch.tensor(x).to(getattr(torch, dtype))
    t = Tensor(tt.float().numpy(), dtype=dt)
    for name, got, ref in [
        ("mean", t.mean(), tt.mean()), ("var", t.var(), tt.var()), ("std", t.std(), tt.std()),
        ("mean(0)", t.mean(0), tt.mean(0)), ("var(0)", t.var(0), tt.var(0)),
        ("std(0, correction=0)", t.std(0, correction=0), tt.std(0, correction=0)),
        # PyTorch's CPU prod of float16 multiplies in float16 (1% off after these 300 factors): the
        # reference is the exact product of the same float16 factors, rounded once
        ("prod(0) of a slice", (t[:300] * 0.01 + 1).prod(0),
         (tt[:300] * 0.01 + 1).double().prod(0).to(tt.dtype)),
    ]:
        assert got.dtype == dt, name
        out = got.float().numpy()
        want = ref.float().numpy()
        np.testing.assert_allclose(out, want, rtol=1e-2 if dtype == "bfloat16" else 2e-3, err_msg=name)


def _f16_steps(got: np.ndarray, want: np.ndarray) -> int:
    """The most float16 steps between two arrays of float16 values (the bit patterns in order)."""
    g, w = (np.asarray(v, np.float16).view(np.int16).astype(np.int64) for v in (got, want))
    g, w = (np.where(v < 0, -(v & 0x7FFF), v) for v in (g, w))
    return int(np.abs(g - w).max())


def test_float16_chains_round_per_op_and_formulas_once(device):
    """float16 as PyTorch computes it: each op's result a float16 value (on CPU and CL, which compute
    float16 in float32, a fused chain kept float32 precision, and `.float()` of it gave values no float16
    holds), and a formula of several steps (exp, tanh, gelu, division, pow...) computed in float32 and
    rounded once: exactly PyTorch's for chains of exact constants, within one float16 step for formulas."""
    x = np.linspace(-6, 6, 2001).astype(np.float16)
    t, tt = Tensor(x), torch.tensor(x)
    for name, f in [("chain", lambda v: (v * v - v * 3) * 0.5 + 2), ("mul-sub", lambda v: v * 1.5 - v * v)]:
        got, want = f(t).float().numpy(), f(tt).float().numpy()
        np.testing.assert_array_equal(got, want, err_msg=name)
        np.testing.assert_array_equal(got, got.astype(np.float16).astype(np.float32), err_msg=name)
    F = torch.nn.functional
    for name, mine, ref in [
        ("exp", t.exp(), tt.exp()), ("tanh", t.tanh(), tt.tanh()), ("sigmoid", t.sigmoid(), tt.sigmoid()),
        ("gelu", t.gelu(), F.gelu(tt)), ("silu", t.silu(), F.silu(tt)),
        ("softplus", t.softplus(), F.softplus(tt)), ("erf", t.erf(), tt.erf()), ("div", t / 3, tt / 3),
        ("tensor div", t / (t.abs() + 3), tt / (tt.abs() + 3)),
        ("log", (t.abs() + 0.5).log(), (tt.abs() + 0.5).log()),
        ("pow", (t.abs() + 0.5) ** 1.7, (tt.abs() + 0.5) ** 1.7),
        ("rsqrt", (t.abs() + 0.5).rsqrt(), (tt.abs() + 0.5).rsqrt()), ("cos", t.cos(), tt.cos()),
    ]:
        assert mine.dtype == dtypes.float16, name
        assert _f16_steps(mine.numpy(), ref.numpy()) <= 1, name


def _full_half(like, value):
    if isinstance(like, Tensor):
        return Tensor.full(like.shape, value, dtype=dtypes.float16)
    return torch.full(like.shape, value, dtype=torch.float16)


def test_float16_python_numbers_as_pytorch_takes_them(device):
    """A Python number with a float16 tensor, as PyTorch (CPU) takes it: add, sub and comparisons read it as
    a float16 (60000 - 70000 is -inf: 70000 is inf there; 0 == 1e-8 holds: 1e-8 is 0), multiplication and
    division in float32 with the number as it is (60000 * 1e-10 is 6e-06, not 0); a float16 constant made
    by full() holds a float16 value. Before, CPU and CL computed 60000 - 70000 = -10000 and 0 < 1e-8, and
    NUMPY and WEBGPU rounded 1e-10 to 0 before multiplying."""
    x = np.array([60000, 1, -3.5, 0.001, 0, 1e-7, 6e-8, -65504], np.float16)
    t, tt = Tensor(x), torch.tensor(x)
    cases = [("mul", lambda v: v * 1e-10), ("rmul", lambda v: 1e-5 * v), ("mul int", lambda v: v * 70000),
             ("div", lambda v: v / 1e10), ("sub", lambda v: v - 70000), ("rsub", lambda v: 70000 - v),
             ("add", lambda v: v + 1e-4), ("add int", lambda v: v + 70000), ("lt", lambda v: v < 1e-8),
             ("gt", lambda v: v > 65519.0), ("le", lambda v: v <= 3e-8), ("ge", lambda v: v >= -65519.0),
             ("eq", lambda v: v == 1e-8), ("ne", lambda v: v != 1e-8),
             ("full", lambda v: v * 0 + _full_half(v, 1e-10) * 1e5)]
    for name, f in cases:
        with np.errstate(all="ignore"):
            got, want = f(t), f(tt)
        assert got.dtype == (dtypes.bool if want.dtype == torch.bool else dtypes.float16), name
        np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=name)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_narrow_floats_divide_and_interpolate_as_pytorch(device, dtype):
    """float16 / bfloat16 floor division, remainder, lerp, number / tensor and products with a 0-d float
    tensor, as PyTorch computes them: in float32, rounded once, with a number or 0-d tensor as it is for
    t // c, t * z and t / z, and number / tensor as reciprocal times the number (1e-3 / 1e-7 is inf in
    float16). Per op in the narrow type they were off by up to a unit of the quotient (1 // 0.1 was 10)."""
    if dtype == "bfloat16" and device not in dtypes.HOST_DEVICES:
        pytest.skip(f"bfloat16 is held on {', '.join(dtypes.HOST_DEVICES)} only")
    x = np.array([60000, 1, -3.5, 0.001, 1e-7, 6e-8, -65504, 0.3, 7.25, -0.7], np.float32)
    tt = torch.tensor(x).to(getattr(torch, dtype))
    t = Tensor(tt.float().numpy()).cast(dtype)
    w = np.linspace(-1, 1, len(x)).astype(np.float32)
    cases = [("rdiv", lambda v, z: 1e-3 / v), ("rdiv 3", lambda v, z: 3 / v),
             ("lerp", lambda v, z: v.lerp(v * 0 + 1, 0.3)), ("lerp 0.8", lambda v, z: v.lerp(v * 0 - 2, 0.8)),
             ("lerp tensor", lambda v, z: v.lerp(v * 0 + 1, z[2])),
             ("mul 0-d", lambda v, z: v * z[0]), ("div 0-d", lambda v, z: v / z[1]),
             ("sub 0-d", lambda v, z: v - z[1]), ("rfloordiv", lambda v, z: 7.3 // v),
             ("rmod", lambda v, z: 7.3 % v)]
    gl = device == "WEBGPU" and get_runtime(device).adapter_info["backend_type"] == "OpenGL"
    if not gl:  # (not exact over OpenGL: test_webgpu.py's test_webgpu_float32_remainder_and_floor_division)
        cases += [("floordiv", lambda v, z: v // 0.1), ("mod", lambda v, z: v % 0.1),
                  ("floordiv t", lambda v, z: v // (v * 0 + 0.3)), ("mod t", lambda v, z: v % (v * 0 + 7.3))]
    zt = [torch.tensor(1e-10), torch.tensor(1e10), torch.tensor(w).to(getattr(torch, dtype))]
    zm = [Tensor(1e-10), Tensor(1e10), Tensor(w).cast(dtype)]
    for name, f in cases:
        with np.errstate(all="ignore"):
            got, want = f(t, zm), f(tt, zt)
        assert got.dtype.name == str(want.dtype).split(".")[-1], name
        np.testing.assert_array_equal(got.float().numpy(), want.float().numpy(), err_msg=name)


def test_special_results_of_constant_operands(device):
    """Ops whose operands are all constants give IEEE results too (WGSL rejected 1.0f / 0.0f, log2(-1.0f)
    and 3e38f * 10.0f when the shader was created: a regression test)."""
    x = [1.0, -2.0, 0.0]
    cases = [
        ("x / 0", lambda t, full: t / 0),
        ("x / -0.0", lambda t, full: t / -0.0),
        ("log(-1)", lambda t, full: t + full(-1.0).log()),
        ("log(0)", lambda t, full: t + full(0.0).log()),
        ("sqrt(-1)", lambda t, full: t + full(-1.0).sqrt()),
        ("3e38 * 10", lambda t, full: t + full(3e38) * 10),
        ("exp(100)", lambda t, full: t * full(100.0).exp()),
        ("exp2(200)", lambda t, full: t * full(200.0).exp2()),
    ]
    for name, fn in cases:
        out = fn(Tensor(x), lambda v: Tensor.full((3,), v)).numpy()
        ref = fn(torch.tensor(x), lambda v: torch.full((3,), v)).numpy()
        compare(name, out, ref, 0, 0)


def test_int_division_by_zero_follows_the_documented_rule(device):
    """PyTorch raises for an integer x/0; tgrad defines truncating x/0 = 0 and fmod(x, 0) = x on every
    device (README)."""
    a = Tensor(np.array([5, -5, 0, 7], np.int32))
    zero = Tensor(np.zeros(4, np.int32))
    assert a.div(zero, rounding_mode="trunc").numpy().tolist() == [0, 0, 0, 0]
    assert a.div(0, rounding_mode="trunc").numpy().tolist() == [0, 0, 0, 0]
    assert a.fmod(zero).numpy().tolist() == [5, -5, 0, 7]
    assert a.fmod(0).numpy().tolist() == [5, -5, 0, 7]


@pytest.mark.parametrize("dev", ["CPU", "NUMPY"])
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "int32", "int64"])
def test_float_to_int_casts_out_of_range_match_torch(dev, dtype):
    """inf, nan and values outside the type convert as PyTorch and numpy do on x86: through int32 (int64
    for int64), then wrapped, so they give INT_MIN. (WEBGPU saturates instead; see the README.)"""
    x = np.array([np.inf, -np.inf, np.nan, 3e9, -3e9, 300.7, -1.5, 255.9, 1e20, -7.9, 0.5], np.float32)
    want = torch.tensor(x).to(getattr(torch, dtype)).numpy()
    got = Tensor(x, device=dev).cast(dtype).numpy()
    np.testing.assert_array_equal(got, want)


def test_negated_negative_constants(device):
    """-(-0.3) and -(-7) as constants in a kernel: C-style emitters once wrote --0.3f (a decrement)."""
    x = Tensor(np.ones(3, np.float32))
    np.testing.assert_allclose((x * 0 + (-Tensor.full((3,), -0.3))).numpy(), np.full(3, 0.3, np.float32))
    np.testing.assert_array_equal((-Tensor.full((2,), -7, dtype="int32")).numpy(), [7, 7])


@pytest.mark.parametrize("name", ["tanh", "sinh", "asinh", "atanh", "erf"])
def test_odd_functions_keep_relative_accuracy_near_zero(device, name):
    """Their formulas cancel near 0 (tanh(1e-8) was 0, erf(1e-5) 1.7% off): a Taylor series takes over
    there. Values within a few roundings of PyTorch's over 1e-38 .. 10 (both signs, -0.0 keeps its sign),
    and gradients too, in float32, and in float64 where the device has it."""
    from tests.helpers import has_float64

    def points(low: float, dtype) -> np.ndarray:
        mags = np.logspace(low, 1, 400)
        x = np.concatenate([mags, -mags, [0.0, -0.0]]).astype(dtype)
        return x[np.abs(x) < 1] if name == "atanh" else x

    cases = [(points(-38, np.float32), 1e-6)]
    if has_float64(device) and name != "erf":  # (float64 erf is Abramowitz & Stegun's: float32-accurate)
        cases.append((points(-300, np.float64), 1e-13))
    for x, rtol in cases:
        t = Tensor(x, requires_grad=True)
        y = getattr(t, name)()
        y.sum().backward()
        tx = torch.tensor(x, requires_grad=True)
        ty = getattr(torch, name)(tx)
        ty.sum().backward()
        ref = ty.detach().numpy()
        np.testing.assert_allclose(y.numpy(), ref, rtol=rtol, atol=0, err_msg=f"{name} {x.dtype}")
        assert (np.signbit(y.numpy()) == np.signbit(ref)).all(), f"{name}: the sign of -0.0 or of tiny values"
        # (PyTorch's own gradients round where they are tiny: 1 - tanh^2 at large x)
        np.testing.assert_allclose(t.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_atanh_gradient_at_and_beyond_one_matches_torch(device):
    x = [-math.inf, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, math.inf]
    t = Tensor(x, requires_grad=True)
    t.atanh().sum().backward()
    tx = torch.tensor(x, requires_grad=True)
    tx.atanh().sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), tx.grad.numpy())  # inf at +-1, -0 at +-inf, not nan
    np.testing.assert_array_equal(np.isnan(t.detach().atanh().numpy()), np.isnan(tx.detach().atanh().numpy()))
