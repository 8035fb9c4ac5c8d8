"""bfloat16 against PyTorch, bit for bit: the rounding of casts (ties, NaN, inf, -0.0, subnormals, values
past the largest bfloat16), elementwise ops computed in float32 and rounded, reductions and matmul
accumulated in float32, promotion, gradients; and the DTypeError of devices without bfloat16.

Values are compared as bfloat16 bit patterns: exactly for single ops (what PyTorch computes is float32
arithmetic rounded once), within one bfloat16 step for composite transcendental ops (exp, gelu: float32
approximations of them differ in the last float32 bits, which moves a rounding now and then) and for long
sums (the float32 summation order differs). NaN is compared as NaN: PyTorch itself writes 0x7FC0 or 0xFFFF
depending on the kernel.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.helpers import has_float64
from tgrad import Device, Tensor, TinyJit, dtypes
from tgrad.dtype import promote
from tgrad.errors import AutogradError, DTypeError, ShapeError

BF = dtypes.bfloat16
F32_MAX = float(np.finfo(np.float32).max)
BF16_MAX = float(torch.finfo(torch.bfloat16).max)
SPECIAL = [0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, 3.14159265, -2.71828182, 65504.0, 1e20, 0.1]
TIES = [1.0 + 2**-8, 1.0 + 3 * 2**-8, -(1.0 + 2**-8), 1.0 + 2**-8 + 2**-20, 1.0 + 2**-8 - 2**-20]
PAST_MAX = [BF16_MAX, BF16_MAX * (1 + 2**-9), BF16_MAX * (1 + 2**-9 - 2**-20), F32_MAX, -F32_MAX]
SUBNORMAL = [2**-126, 2**-127, 2**-133, 2**-133 * 1.5, 2**-134 * 3, 1e-45, -1e-45, 1.1754942e-38, -1e-20]
EDGES = SPECIAL + TIES + PAST_MAX + SUBNORMAL


def needs_bf16(device: str) -> bool:
    """True where the device has bfloat16; elsewhere checks that making one raises a DTypeError."""
    if device in dtypes.HOST_DEVICES:
        assert Device[device].supports(BF)
        return True
    assert not Device[device].supports(BF)
    with pytest.raises(DTypeError, match=f"bfloat16 exists on CPU and NUMPY only, not on {device}"):
        Tensor([1.0, 2.0], dtype=BF)
    with pytest.raises(DTypeError, match="bfloat16"):
        Tensor([1.0, 2.0]).cast(BF)
    with pytest.raises(DTypeError, match="bfloat16"):
        Tensor([1.0, 2.0], device="NUMPY", dtype=BF).to(device)
    return False


def bits(a) -> np.ndarray:
    """bfloat16 values (float32 arrays or torch bfloat16 tensors) as their 16 bits, NaN as 0x7FC0."""
    if isinstance(a, torch.Tensor):
        a = a.float().numpy()
    a = np.asarray(a, np.float32)
    assert a.dtype == np.float32
    b = (a.view(np.uint32) >> 16).astype(np.int64)
    assert ((a.view(np.uint32) & 0xFFFF) == 0).all(), "not a bfloat16 value"
    return np.where(np.isnan(a), 0x7FC0, b)


def assert_bf16(name: str, tg: Tensor, tt: torch.Tensor, steps: int = 0) -> None:
    """tg (a bfloat16 Tensor) equals tt (a torch bfloat16 tensor) bit for bit, or within `steps` bfloat16
    steps (on the ordered line of bit patterns)."""
    assert tg.dtype == BF and tt.dtype == torch.bfloat16, name
    out = tg.numpy()
    assert out.dtype == np.float32 and out.shape == tuple(tt.shape), name
    a, b = bits(out), bits(tt)
    ordered = lambda x: np.where(x & 0x8000, 0x8000 - x, x)  # noqa: E731 - the sign-magnitude line
    dist = np.abs(ordered(a) - ordered(b))
    dist = np.where((a == 0x7FC0) & (b == 0x7FC0), 0, dist)
    bad = np.flatnonzero(dist > steps)
    assert not bad.size, (
        f"{name}: {bad.size} values differ, e.g. at {bad[:4]}: {out.reshape(-1)[bad[:4]]} "
        f"vs torch {tt.float().reshape(-1)[bad[:4]].tolist()}"
    )


def test_cast_rounding_matches_torch(device):
    if not needs_bf16(device):
        return
    rng = np.random.default_rng(0)
    rand = rng.standard_normal(2000).astype(np.float32) * np.float32(10.0) ** rng.integers(-40, 38, 2000)
    for values in (np.array(EDGES, np.float32), rand, rand.view(np.uint32).__xor__(0x8000).view(np.float32)):
        assert_bf16("cast from float32", Tensor(values).cast(BF), torch.from_numpy(values).bfloat16())
        assert_bf16("bfloat16()", Tensor(values).bfloat16(), torch.from_numpy(values).bfloat16())
        assert_bf16(
            "Tensor(dtype=)", Tensor(values, dtype="bfloat16"), torch.tensor(values, dtype=torch.bfloat16)
        )
    f64 = np.array(EDGES + [1.0 + 2**-8 + 2**-40, 1e300, -1e-300, 1.0 + 2**-9 + 2**-30], np.float64)
    assert_bf16("from float64", Tensor(f64).cast(BF), torch.from_numpy(f64).bfloat16())
    f16 = np.array(
        [0.0, -0.0, 65504.0, 6e-8, -6e-5, 1.0 + 2**-10, np.inf, np.nan, 1.0 + 3 * 2**-9], np.float16
    )
    assert_bf16("from float16", Tensor(f16).cast(BF), torch.from_numpy(f16).bfloat16())
    ints = np.array(
        [0, 1, -1, 255, 257, 2**24 + 1, 2**25 + 2**17 + 1, -(2**31), 2**31 - 1, 2**40 + 2**32], np.int64
    )
    assert_bf16("from int64", Tensor(ints).cast(BF), torch.from_numpy(ints).bfloat16())
    assert_bf16(
        "from int32",
        Tensor(ints[:-1].astype(np.int32)).cast(BF),
        torch.from_numpy(ints[:-1].astype(np.int32)).bfloat16(),
    )
    bools = np.array([True, False])
    assert_bf16("from bool", Tensor(bools).cast(BF), torch.from_numpy(bools).bfloat16())
    # a constant, a full() and Python floats are rounded the same way
    assert_bf16("full", Tensor.full((3,), 0.1, dtype=BF), torch.full((3,), 0.1, dtype=torch.bfloat16))
    assert_bf16(
        "list",
        Tensor([0.1, 1e39, 1.0 + 2**-8], dtype=BF),
        torch.tensor([0.1, 1e39, 1.0 + 2**-8], dtype=torch.bfloat16),
    )


def test_cast_out_and_data_out(device):
    if not needs_bf16(device):
        return
    values = np.array(EDGES, np.float32)
    t, tt = Tensor(values).cast(BF), torch.from_numpy(values).bfloat16()
    out = t.float().numpy()  # exact
    np.testing.assert_array_equal(
        out.view(np.uint32)[~np.isnan(out)], tt.float().numpy().view(np.uint32)[~np.isnan(out)]
    )
    assert t.numpy().dtype == np.float32 and t.float().dtype == dtypes.float32
    np.testing.assert_array_equal(t.double().numpy(), tt.double().numpy())
    np.testing.assert_array_equal(t.half().numpy(), tt.half().numpy())
    finite = Tensor([-300.5, -2.5, 2.5, 100.0, 1e9, 0.0], dtype=BF)
    finite_t = torch.tensor([-300.5, -2.5, 2.5, 100.0, 1e9, 0.0], dtype=torch.bfloat16)
    for dt, tdt in (
        (dtypes.int32, torch.int32),
        (dtypes.int64, torch.int64),
        (dtypes.int8, torch.int8),
        (dtypes.uint8, torch.uint8),
        (dtypes.bool, torch.bool),
        (dtypes.int16, torch.int16),
    ):
        np.testing.assert_array_equal(finite.cast(dt).numpy(), finite_t.to(tdt).numpy(), err_msg=dt.name)
    assert t.element_size() == tt.element_size() == 2
    assert Tensor([1.5], dtype=BF).item() == 1.5 and Tensor([[1.0, 2.0]], dtype=BF).tolist() == [[1.0, 2.0]]
    assert "bfloat16" in repr(Tensor([1.0], dtype=BF))


def _inputs(seed=0, n=3000, scale=10.0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(n, generator=g) * scale).bfloat16()
    b = torch.randn(n, generator=g).bfloat16()
    return a, b


EXACT_BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "maximum": lambda a, b: a.maximum(b),
    "minimum": lambda a, b: a.minimum(b),
    "where": lambda a, b: (a > b).where(a, b) if isinstance(a, Tensor) else torch.where(a > b, a, b),
    "chain": lambda a, b: a * b + a - b * b,  # every op rounds, however the kernel is fused
    "add_scalar": lambda a, b: a + 0.1,
    "rsub_scalar": lambda a, b: 1.3 - a,
    "mul_scalar": lambda a, b: a * 0.1,
    "mul_int": lambda a, b: a * 257,
    "div_scalar": lambda a, b: a / 0.3,
    "rdiv_scalar": lambda a, b: 0.3 / a,
    "add_int": lambda a, b: a + 257,
    "square": lambda a, b: a * a,
}
EXACT_UNARY = {
    "neg": lambda x: -x,
    "abs": lambda x: x.abs(),
    "relu": lambda x: x.relu(),
    "sqrt": lambda x: x.abs().sqrt(),
    "reciprocal": lambda x: x.reciprocal(),
    "floor": lambda x: x.floor(),
    "ceil": lambda x: x.ceil(),
    "trunc": lambda x: x.trunc(),
    "clamp": lambda x: x.clamp(-1.5, 2.25),
    "sigmoid": lambda x: x.sigmoid(),
    "tanh": lambda x: x.tanh(),
    "log": lambda x: x.abs().log(),
    "sign": lambda x: x.sign(),
    "pow_scalar": lambda x: x.abs() ** 1.7,
    "round": lambda x: x.round(),
}
NEAR_UNARY = {  # float32 approximations of these differ from PyTorch's in the last bits
    "exp": lambda x: x.exp(),
    "exp2": lambda x: x.exp2(),
    "sin": lambda x: x.sin(),
    "cos": lambda x: x.cos(),
    "gelu": lambda x: F.gelu(x) if isinstance(x, torch.Tensor) else x.gelu(),
    "silu": lambda x: x * x.sigmoid(),
    "log2": lambda x: x.abs().log2(),
    "erf": lambda x: x.erf(),
    "softplus": lambda x: F.softplus(x),
}


def test_elementwise_rounded_like_torch(device):
    if not needs_bf16(device):
        return
    a, b = _inputs()
    ta, tb = Tensor(a.float().numpy()).bfloat16(), Tensor(b.float().numpy()).bfloat16()
    for name, fn in EXACT_BINARY.items():
        assert_bf16(name, fn(ta, tb), fn(a, b))
    for name, fn in EXACT_UNARY.items():
        assert_bf16(name, fn(ta), fn(a))
    for name, fn in NEAR_UNARY.items():  # on values of about +-3 (gelu's float32 tail loses digits)
        assert_bf16(name, tb.softplus() if name == "softplus" else fn(tb), fn(b), steps=1)
    edges = torch.tensor(EDGES, dtype=torch.bfloat16)
    te = Tensor(np.array(EDGES, np.float32)).bfloat16()
    for name in ("add", "mul", "sub", "div", "maximum"):
        assert_bf16(
            f"{name} edges", EXACT_BINARY[name](te, te.flip(0)), EXACT_BINARY[name](edges, edges.flip(0))
        )
    for name in ("neg", "abs", "sqrt", "reciprocal", "floor", "relu"):
        assert_bf16(f"{name} edges", EXACT_UNARY[name](te), EXACT_UNARY[name](edges))
    # comparisons and isnan see the rounded values
    np.testing.assert_array_equal((te == 1.0).numpy(), (edges == 1.0).numpy())
    np.testing.assert_array_equal(te.isnan().numpy(), edges.isnan().numpy())
    np.testing.assert_array_equal(te.isinf().numpy(), edges.isinf().numpy())


def test_reductions_and_matmul_accumulate_in_float32(device):
    if not needs_bf16(device):
        return
    a, b = _inputs(1, 4096, 1.0)
    ta, tb = Tensor(a.float().numpy()).bfloat16(), Tensor(b.float().numpy()).bfloat16()
    # sums of 4096 values: bfloat16 accumulation would be far off; float32's order differs from PyTorch's
    for name, fn in {
        "sum": lambda x: x.sum(),
        "mean": lambda x: x.mean(),
        "sum0": lambda x: x.reshape(64, 64).sum(0),
        "sum1": lambda x: x.reshape(64, 64).sum(1),
        "mean1": lambda x: x.reshape(64, 64).mean(1),
        "var1": lambda x: x.reshape(64, 64).var(1),
        "softmax": lambda x: x.reshape(64, 64).softmax(1),
        "logsumexp": lambda x: x.reshape(64, 64).logsumexp(1),
    }.items():
        assert_bf16(name, fn(ta), fn(a), steps=1)
    ints = torch.arange(-50, 50).bfloat16()
    assert_bf16("exact sum", Tensor(ints.float().numpy()).bfloat16().sum(), ints.sum())  # no rounding at all
    for name, fn in {
        "max": lambda x: x.max(),
        "min": lambda x: x.min(),
        "amax1": lambda x: x.reshape(64, 64).amax(1),
        "cumsum": lambda x: x[:200].cumsum(0),
    }.items():
        assert_bf16(name, fn(ta), fn(a), steps=0 if "cum" not in name else 1)
    x, w = ta.reshape(64, 64), tb.reshape(64, 64)
    assert_bf16("matmul", x @ w, a.reshape(64, 64) @ b.reshape(64, 64), steps=1)
    assert_bf16("matmul small", x[:5, :7] @ w[:7, :3], a.reshape(64, 64)[:5, :7] @ b.reshape(64, 64)[:7, :3])
    wt = b.reshape(64, 64)
    assert_bf16("linear", x.linear(w[:8], w[0, :8]), F.linear(a.reshape(64, 64), wt[:8], wt[0, :8]), steps=1)
    assert_bf16(
        "sum of bfloat16 1s", Tensor.ones(1000, dtype=BF).sum(), torch.ones(1000, dtype=torch.bfloat16).sum()
    )


def test_promotion_like_torch(device):
    pairs = [
        (BF, dtypes.float16),
        (BF, dtypes.float32),
        (BF, dtypes.float64),
        (BF, dtypes.int64),
        (BF, dtypes.int8),
        (BF, dtypes.uint8),
        (BF, dtypes.bool),
        (BF, BF),
    ]
    torch_of = {d: getattr(torch, d.name) for d in dtypes.all}
    for a, b in pairs:
        want = torch.promote_types(torch_of[a], torch_of[b])
        assert torch_of[promote(a, b)] == want and torch_of[promote(b, a)] == want, (a, b)
    if not needs_bf16(device):
        return
    x, xt = Tensor([1.5, 2.0], dtype=BF), torch.tensor([1.5, 2.0], dtype=torch.bfloat16)
    for other in (1, 2.5, True, Tensor([1, 2]), Tensor([1.0, 2.0]), Tensor([1.0, 2.0], dtype=dtypes.float16)):
        ot = torch.tensor(other.numpy()) if isinstance(other, Tensor) else other
        assert torch_of[(x + other).dtype] == (xt + ot).dtype, other
        assert torch_of[(x * other).dtype] == (xt * ot).dtype, other
    assert (x + Tensor([1.0, 2.0], dtype=dtypes.float16)).tolist() == (
        xt + torch.tensor([1.0, 2.0]).half()
    ).tolist()
    assert x.exp().dtype == BF and (x > 1).dtype == dtypes.bool and x.argmax().dtype == dtypes.int64


def test_gradients_in_bfloat16(device):
    if not needs_bf16(device):
        return
    g = torch.Generator().manual_seed(3)
    x0, w0, b0 = torch.randn(8, 16, generator=g), torch.randn(16, 4, generator=g), torch.randn(4, generator=g)
    xt, wt, bt = (v.bfloat16().requires_grad_() for v in (x0, w0, b0))
    x, w, b = (Tensor(v.numpy(), dtype=BF, requires_grad=True) for v in (x0, w0, b0))
    (xt @ wt + bt).relu().mul(wt.sum(0)).sum().backward()
    (x @ w + b).relu().mul(w.sum(0)).sum().backward()
    for name, t, tt in (("x", x, xt), ("w", w, wt), ("b", b, bt)):
        assert t.grad.dtype == BF
        assert_bf16(f"grad {name}", t.grad, tt.grad, steps=1)
    # elementwise gradients round like PyTorch's bfloat16 kernels; where several gradients of one tensor
    # are added up, the order of the (rounded) additions may differ from PyTorch's
    x, xt = Tensor(x0.numpy(), dtype=BF, requires_grad=True), x0.bfloat16().requires_grad_()
    (x.exp() * 3.0).sum().backward()
    (xt.exp() * 3.0).sum().backward()
    assert_bf16("grad exp(x)*3", x.grad, xt.grad, steps=1)
    x, xt = Tensor(x0.numpy(), dtype=BF, requires_grad=True), x0.bfloat16().requires_grad_()
    (x * x * 3.0 - x).sum().backward()
    (xt * xt * 3.0 - xt).sum().backward()
    assert_bf16("grad x*x*3-x", x.grad, xt.grad, steps=1)


def test_random_and_constructors(device):
    if not needs_bf16(device):
        return
    r = Tensor.rand(20000, dtype=BF).numpy()
    assert r.dtype == np.float32 and r.min() >= 0 and r.max() < 1 and ((r * 256) % 1 == 0).all()
    bits(Tensor.randn(100, dtype=BF).numpy())  # bfloat16 values
    assert_bf16("arange", Tensor.arange(250, 270, dtype=BF), torch.arange(250, 270, dtype=torch.bfloat16))
    assert_bf16(
        "linspace", Tensor.linspace(0, 1, 11, dtype=BF), torch.linspace(0, 1, 11, dtype=torch.bfloat16)
    )
    z = Tensor.zeros(3, dtype=BF)
    z.assign(Tensor([0.1, 0.2, 1e39], dtype=dtypes.float32).cast(BF)).realize()
    assert_bf16("assign", z, torch.tensor([0.1, 0.2, 1e39]).bfloat16())


# ------------------------------------------------------------------------------------------------
# bitcast: PyTorch's view(dtype)

BITCASTS = [
    (np.float32, dtypes.int32, torch.int32),
    (np.float32, dtypes.uint32, torch.uint32),
    (np.int32, dtypes.float32, torch.float32),
    (np.float16, dtypes.int16, torch.int16),
    (np.float16, dtypes.uint16, torch.uint16),
    (np.int16, dtypes.float16, torch.float16),
    (np.float32, dtypes.uint8, torch.uint8),  # the last axis takes the bytes: (2, 3) -> (2, 12)
    (np.int8, dtypes.int16, torch.int16),  # (2, 4) -> (2, 2)
    (np.uint8, dtypes.bool, torch.bool),
    (np.float64, dtypes.int64, torch.int64),
]


def _source(np_dtype) -> np.ndarray:
    if np.dtype(np_dtype).kind == "f":
        values = [0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, 1e-40 if np_dtype != np.float16 else 6e-8, 0.1]
        return np.array(values, np_dtype).reshape(2, 4)
    if np_dtype == np.uint8:
        return np.array([[0, 1, 2, 255], [7, 0, 128, 1]], np.uint8)
    info = np.iinfo(np_dtype)
    return np.array([[0, 1, -1, info.min], [info.max, 0x3F80 % info.max, 12345 % info.max, -7]], np_dtype)


@pytest.mark.parametrize("src,dt,tdt", BITCASTS, ids=lambda v: getattr(v, "name", str(v)))
def test_bitcast_like_torch_view(device, src, dt, tdt):
    a = _source(src)
    on_device = (
        device in (dtypes.UINT32_DEVICES if dt == dtypes.uint32 else dtypes.UINT_DEVICES)
        or dt not in dtypes.HOST_ONLY and a.dtype.name not in ("uint16",)
    )
    if (dt == dtypes.float64 or a.dtype == np.float64) and not has_float64(device):
        return
    if device == "WEBGPU" and dt == dtypes.int64 and not Device[device].target.int64:
        with pytest.raises(DTypeError, match="int64"):  # held as int32 there (README)
            Tensor(a).bitcast(dt).numpy()
        return
    if not on_device:
        with pytest.raises(DTypeError, match=dt.name):
            Tensor(a).bitcast(dt)
        return
    want = torch.from_numpy(a).view(tdt)
    got = Tensor(a).bitcast(dt)
    assert got.dtype == dt and got.shape == tuple(want.shape)
    if dt.is_float:  # NaN-free here: compare the bits
        np.testing.assert_array_equal(
            got.numpy().view(f"u{dt.itemsize}"), want.numpy().view(f"u{dt.itemsize}")
        )
    else:
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    # a view (not a whole buffer) is bitcast too
    view, view_t = (
        (Tensor(a)[:, ::2], torch.from_numpy(a)[:, ::2])
        if dt.itemsize == a.itemsize
        else (Tensor(a)[1:], torch.from_numpy(a)[1:])
    )
    got, want = view.bitcast(dt).numpy(), np.ascontiguousarray(view_t.view(tdt).numpy())
    if dt == dtypes.bool:  # PyTorch keeps the byte (2 is a True holding 2); tgrad's True is 1
        got, want = got.view(np.uint8) != 0, want.view(np.uint8) != 0
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_bitcast_bfloat16(device):
    if not needs_bf16(device):
        return
    x = np.array([[1.0, -2.5, np.inf, 0.1], [-0.0, 3e38, 1e-40, -3.4e38]], np.float32)
    tb = torch.from_numpy(x).bfloat16()
    np.testing.assert_array_equal(
        Tensor(x).bfloat16().bitcast(dtypes.int16).numpy(), tb.view(torch.int16).numpy()
    )
    np.testing.assert_array_equal(
        Tensor(x).bfloat16().bitcast(dtypes.uint16).numpy(), tb.view(torch.uint16).numpy()
    )
    np.testing.assert_array_equal(
        Tensor(x).bfloat16().bitcast(dtypes.uint8).numpy(), tb.view(torch.uint8).numpy()
    )
    i = np.array([0x7F81, -1, 0x3F80, -32768, 0x7F80, 1, 0x0080, -0x7F80], np.int16)  # NaNs, -0.0, subnormal
    t, tt = Tensor(i).bitcast(BF), torch.from_numpy(i).view(torch.bfloat16)
    assert t.dtype == BF
    np.testing.assert_array_equal(np.isnan(t.numpy()), tt.float().isnan().numpy())
    np.testing.assert_array_equal(t.numpy()[2:], tt.float().numpy()[2:])
    np.testing.assert_array_equal(t.bitcast(dtypes.int16).numpy(), i)  # NaN payloads kept
    f16 = np.array([1.0, -2.0, 0.5], np.float16)
    assert_bf16(
        "float16 bits as bfloat16", Tensor(f16).bitcast(BF), torch.from_numpy(f16).view(torch.bfloat16)
    )


def test_bitcast_errors_and_jit(device):
    with pytest.raises(
        ShapeError, match=r"bitcast: int8 \(2, 3\) -> int32 needs a last axis whose size in bytes \(3\)"
    ):
        Tensor(np.zeros((2, 3), np.int8)).bitcast(dtypes.int32)
    with pytest.raises(ShapeError, match="0-d"):
        Tensor(np.float32(1.0)).bitcast(dtypes.int16)
    with pytest.raises(AutogradError, match="bitcast is not differentiable"):
        Tensor([1.0, 2.0], requires_grad=True).bitcast(dtypes.float16)
    assert Tensor([1.0, 2.0], requires_grad=True).detach().bitcast(dtypes.float16).shape == (4,)
    assert not Tensor([1.0], requires_grad=True).bitcast(dtypes.int32).requires_grad

    @TinyJit
    def step(x):
        return (x * 2).bitcast(dtypes.int32) + 1

    for k in range(4):
        v = np.array([1.5, -k, 3.0], np.float32)
        np.testing.assert_array_equal(
            step(Tensor(v)).numpy(), (torch.from_numpy(v) * 2).view(torch.int32).numpy() + 1
        )
