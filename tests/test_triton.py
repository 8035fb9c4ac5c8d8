"""The Triton emitter (tgrad/emit_triton.py): rendered source, block-size rule, errors, kernels run through
Triton (its interpreter when there is no GPU) compared with numpy, and ahead-of-time compilation for
real NVIDIA and AMD targets (no GPU needed)."""

import math
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from tgrad import Tensor, dtypes
from tgrad import emit_triton as et
from tgrad.errors import DeviceError, KernelError, TgradError
from tgrad.fuse import Expr, Kernel, const, schedule
from tgrad.opt import DeviceProps, Opt, OptOps, heuristic
from tgrad.opt.contraction import find_dot
from tgrad.runtime import triton as triton_rt
from tgrad.runtime import triton_aot


def T(array, dtype=None) -> Tensor:
    return Tensor(np.asarray(array), device="NUMPY", dtype=dtype)


def kernels(t: Tensor) -> list[Kernel]:
    return [it.kernel for it in schedule([t.node])]


GPU = DeviceProps("CUDA", kind="triton", compute_units=128)  # a data-centre GPU's multiprocessors
INTERPRETER = DeviceProps("TRITON", kind="triton", interpreted=True, tile_elements=1 << 16)


def choose_blocks(k: Kernel, interpret: bool | None = None, noopt: bool = False) -> et.Blocks:
    """The block sizes the optimizer picks for a GPU or Triton's interpreter (default: this process's)."""
    interpret = et.interpreting() if interpret is None else interpret
    return et.Blocks.from_opts(heuristic.triton_opts(k, INTERPRETER if interpret else GPU, noopt))


def gpu_render(k: Kernel):
    """The kernel rendered with the opts the optimizer picks for a GPU."""
    return et.render(k, choose_blocks(k, interpret=False))


RNG = np.random.default_rng(0)
A57 = RNG.uniform(-3, 3, (5, 7)).astype(np.float32)
A537 = RNG.uniform(-3, 3, (5, 37)).astype(np.float32)

# ---------------------------------------------------------------------------------------------------
# rendering (no triton needed)


def test_render_elementwise_masks_ragged_edge():
    k = kernels((T(A57) * 2 + 1).relu())[0]
    src = et.render(k, blocks=et.Blocks(16, 1)).source
    assert "tl.program_id(0)" in src and "tl.arange(0, 16)" in src
    assert "g_ok = g < 35" in src and "mask=g_ok" in src
    even = kernels(T(np.ones((4, 8), np.float32)) * 2)[0]
    assert "g_ok" not in et.render(even, blocks=et.Blocks(32, 1)).source


def test_render_reduce_loops_over_long_axis():
    k = kernels(T(np.ones((3, 100), np.float32)).sum(1))[0]
    looped = et.render(k, blocks=et.Blocks(4, 32)).source
    assert "for r0 in range(0, 100, 32):" in looped and "tl.sum(acc, axis=1" in looped and "r_ok" in looped
    assert "for r0" not in et.render(k, blocks=et.Blocks(4, 128)).source


def test_choose_blocks_rule():
    row_sum = kernels(T(np.ones((3, 100), np.float32)).sum(1))[0]
    assert choose_blocks(row_sum, interpret=False, noopt=False) == et.Blocks(4, 128, 4)
    assert choose_blocks(row_sum, interpret=False, noopt=True) == et.Blocks(1, 128, 4)
    big_rows = kernels(T(np.ones((64, 5000), np.float32)).sum(1))[0]
    assert choose_blocks(big_rows, interpret=False, noopt=False) == et.Blocks(4, 1024, 8)
    assert choose_blocks(big_rows, interpret=True, noopt=False) == et.Blocks(8, 8192, 8)
    total = kernels(T(np.ones(5000, np.float32)).sum())[0]
    assert choose_blocks(total, interpret=False, noopt=False) == et.Blocks(1, 4096, 8)
    # few programs over a long reduce: split in two passes on a GPU (never in the interpreter)
    channel_sums = kernels(T(np.ones((32, 51200), np.float32)).sum(1))[0]
    assert choose_blocks(channel_sums, interpret=False, noopt=False) == et.Blocks(4, 1024, 8, split=8)
    assert choose_blocks(channel_sums, interpret=True, noopt=False).split == 0
    huge_total = kernels(T(np.ones(1 << 20, np.float32)).sum())[0]
    assert choose_blocks(huge_total, interpret=False, noopt=False) == et.Blocks(1, 4096, 8, split=64)
    ew = kernels(T(np.ones(100_000, np.float32)) * 2)[0]
    assert choose_blocks(ew, interpret=False, noopt=False) == et.Blocks(1024, 1, 4)
    assert choose_blocks(ew, interpret=True, noopt=False) == et.Blocks(65536, 1, 8)


def test_implicit_gemm_with_few_programs_over_a_long_k_is_a_split_reduce(monkeypatch):
    monkeypatch.setenv("TGRAD_TRITON_IMPLICIT_GEMM", "1")
    for k, dot in ((64, True), (1 << 16, False)):  # 32 x 25 outputs: one 32 x 32 tile
        a, b = T(np.ones((32, k), np.float32)), T(np.ones((25, k), np.float32))
        blocks = choose_blocks(kernels(Tensor.einsum("ik,jk->ij", a, b))[0], interpret=False, noopt=False)
        assert (blocks.block_n > 0, blocks.split > 0) == (dot, not dot)


def test_int64_indexing_when_int32_overflows():
    huge = Tensor.ones(1, device="NUMPY").expand(65536, 65536) * 2  # 2**32 elements: only rendered
    k = kernels(huge)[0]
    # blocks of many outputs: one program per output would pass CUDA's grid limit (test_launch_limits.py)
    source = et.render(heuristic.optimize(k, DeviceProps("TRITON", kind="triton"))).source
    assert et.index_bits(k) == 64 and "tl.program_id(0).to(tl.int64)" in source
    assert et.index_bits(kernels(T(A57) * 2)[0]) == 32


def _load(n: int, dtype) -> Expr:
    return Expr("LOAD", (Expr("IDX", (), (0, n), dtypes.int64), const(True, dtypes.bool)), 0, dtype)


def test_unsupported_op_and_dtype_raise_named_error():
    x = _load(4, dtypes.int32)
    k = Kernel("E_4", (4,), 1, None, None, Expr("EXP2", (x,), None, dtypes.int32),
               Expr("IDX", (), (0, 4), dtypes.int64), dtypes.int32, (dtypes.int32,))
    with pytest.raises(KernelError, match="EXP2 of int32"):
        et.render(k)


# ---------------------------------------------------------------------------------------------------
# running kernels through Triton


@pytest.fixture(scope="module")
def tdev():
    torch = pytest.importorskip("torch")
    mp = pytest.MonkeyPatch()
    if not torch.cuda.is_available() and "triton" not in sys.modules:
        mp.setenv("TRITON_INTERPRET", "1")  # Triton reads it when it is first imported
    pytest.importorskip("triton")
    try:
        yield triton_rt.TritonRuntime()
    except DeviceError as e:
        pytest.skip(str(e))
    finally:
        mp.undo()


def run(dev, t: Tensor, blocks=None) -> np.ndarray:
    """Every kernel of t's schedule compiled and run on dev (optionally with forced block sizes)."""
    bufs = {}
    for it in schedule([t.node]):
        inputs = []
        for n in it.inputs:
            if n not in bufs:
                bufs[n] = dev.from_numpy(n.buffer.data)
            inputs.append(bufs[n])
        out = dev.alloc(math.prod(it.out.shape), it.out.dtype)
        program = et.render(it.kernel, blocks or choose_blocks(it.kernel, dev.interpret))
        dev.compile(program, it.kernel)(out, *inputs)
        bufs[it.out] = out
    return dev.to_numpy(bufs[t.node.base]).reshape(t.shape)


FLOAT_TOL = {np.float16: 2e-3, np.float32: 2e-6, np.float64: 1e-12}
UNARY = {
    "exp2": (lambda t: t.exp2(), np.exp2),
    "log2": (lambda t: t.abs().log2(), lambda x: np.log2(np.abs(x))),
    "sin": (lambda t: t.sin(), np.sin),
    "sqrt": (lambda t: t.abs().sqrt(), lambda x: np.sqrt(np.abs(x))),
    "recip": (lambda t: t.reciprocal(), lambda x: 1 / x),
    "neg": (lambda t: -t, np.negative),
    "trunc": (lambda t: t.trunc(), np.trunc),
}


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_unary_float_ops(tdev, dtype):
    x = A57.astype(dtype)
    for name, (tg, ref) in UNARY.items():
        got = run(tdev, tg(T(x)))
        assert got.dtype == dtype, name
        np.testing.assert_allclose(got, ref(x), rtol=FLOAT_TOL[dtype], atol=FLOAT_TOL[dtype], err_msg=name)


def _c_div(a: int, b: int) -> int:
    return 0 if b == 0 else abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8])
def test_integer_division_is_c_like(tdev, dtype):
    lo = 0 if dtype == np.uint8 else -9
    a = np.arange(lo, lo + 20).astype(dtype)
    b = np.resize(np.array([3, -4, 0, 7] if lo else [3, 4, 0, 7]), 20).astype(dtype)
    q = [_c_div(int(x), int(y)) for x, y in zip(a, b)]
    r = [int(x) if y == 0 else int(x) - int(y) * _c_div(int(x), int(y)) for x, y in zip(a, b)]
    quotient = T(a).div(T(b), rounding_mode="trunc")
    np.testing.assert_array_equal(run(tdev, quotient), np.array(q, dtype))
    np.testing.assert_array_equal(run(tdev, T(a).fmod(T(b))), np.array(r, dtype))
    np.testing.assert_array_equal(run(tdev, quotient + 1), np.array(q, dtype) + 1)


def test_compare_logic_and_max(tdev):
    a, b = np.array([1, -5, 7, 0, 3], np.int32), np.array([2, -5, -7, 1, 3], np.int32)
    np.testing.assert_array_equal(run(tdev, T(a) < T(b)), a < b)
    np.testing.assert_array_equal(run(tdev, T(a) != T(b)), a != b)
    np.testing.assert_array_equal(run(tdev, (T(a) & T(b)) ^ (T(a) | 6)), (a & b) ^ (a | 6))
    np.testing.assert_array_equal(run(tdev, T(a).maximum(T(b))), np.maximum(a, b))
    p, q = a > 0, b > 0
    np.testing.assert_array_equal(run(tdev, (T(p) & T(q)) | (T(p) ^ T(q))), (p & q) | (p ^ q))
    x = np.array([1.0, np.nan, -2.0, 5.0], np.float32)
    y = np.array([np.nan, 0.0, -3.0, 6.0], np.float32)
    np.testing.assert_array_equal(run(tdev, T(x).maximum(T(y))), np.maximum(x, y))  # nan propagates


def test_casts(tdev):
    x = np.array([200.7, -3.9, 300.5, 0.0, -129.2, 1e-3], np.float32)
    wide = np.trunc(x).astype(np.int64)
    np.testing.assert_array_equal(run(tdev, T(x).cast(dtypes.int8)), wide.astype(np.int8))
    np.testing.assert_array_equal(run(tdev, T(x).cast(dtypes.uint8)), wide.astype(np.uint8))
    np.testing.assert_array_equal(run(tdev, T(x).cast(dtypes.bool)), x != 0)
    np.testing.assert_array_equal(run(tdev, T(x != 0).cast(dtypes.float32)), (x != 0).astype(np.float32))
    big = np.array([70000, -3, 2**40], np.int64)
    np.testing.assert_array_equal(run(tdev, T(big).cast(dtypes.float16)), big.astype(np.float16))


SMALL = et.Blocks(2, 8)  # forces a ragged 2-D tile and a loop over the reduce axis
# a split reduce in 4 shares of 16 (two loop steps) of which the last ones overrun 37, or hold nothing
SPLIT = et.Blocks(2, 8, split=4)


@pytest.mark.parametrize("blocks", [None, SMALL, SPLIT])
def test_reductions(tdev, blocks):
    a = A537
    np.testing.assert_allclose(run(tdev, T(a).sum(1), blocks), a.sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run(tdev, T(a).max(0), blocks), a.max(0))
    near_one = (1 + a / 30).astype(np.float32)
    np.testing.assert_allclose(run(tdev, T(near_one).prod(1), blocks), near_one.prod(1), rtol=1e-5)
    np.testing.assert_allclose(run(tdev, T(a).sum(), blocks), a.sum(), rtol=1e-5)
    ints = (a * 30).astype(np.int8)
    wrapped = ints.astype(np.int64).sum(1).astype(np.int8)
    np.testing.assert_array_equal(run(tdev, T(ints).sum(1, dtype=dtypes.int8), blocks), wrapped)
    half = a.astype(np.float16)
    np.testing.assert_allclose(run(tdev, T(half).sum(1), blocks), half.astype(np.float32).sum(1), rtol=2e-3)
    np.testing.assert_array_equal(run(tdev, (T(a) > 2.5).any(1), blocks), (a > 2.5).any(1))
    np.testing.assert_array_equal(run(tdev, (T(a) > -2.9).all(1), blocks), (a > -2.9).all(1))
    with_nan = a.copy()
    with_nan[2, 30] = np.nan
    np.testing.assert_array_equal(run(tdev, T(with_nan).max(1), blocks), with_nan.max(1))
    # loads before the loop (per output) and after it (the epilogue reads another input)
    col = a[:, :1]
    np.testing.assert_allclose(run(tdev, (T(a) * T(col)).sum(1) + T(a[:, 3]), blocks),
                               (a * col).sum(1) + a[:, 3], rtol=1e-5, atol=1e-5)


def test_interpreter_launches_leave_triton_language_as_it_was(tdev):
    """tgrad lists the builtins Triton's interpreter replaces around each launch once (runtime/triton.py):
    launches (with jitted tl.max and tl.sum inside, which replace builtins again) give numpy's values and
    leave the builtins of triton.language, tl.tensor and tl.math as they were before, as Triton's own
    search does. (tl.core's stay replaced after a launch with either: Triton's jitted functions replace
    them without undoing it.)"""
    if not tdev.interpret:
        pytest.skip("Triton's interpreter only (TRITON_INTERPRET=1)")
    import triton.language as tl
    from triton.runtime import interpreter

    assert getattr(interpreter._patch_builtin, "tgrad_cached", False)
    packages = (tl, tl.tensor, tl.math)
    before = [{n: m for n, m in vars(p).items() if tl.core.is_builtin(m)} for p in packages]
    assert all(before)
    a = A537
    e = np.exp(a - a.max(1, keepdims=True))
    for _ in range(2):  # the second launch runs on the names listed in the first
        np.testing.assert_allclose(run(tdev, T(a).softmax(1)), e / e.sum(1, keepdims=True), rtol=1e-5)
    assert [{n: m for n, m in vars(p).items() if tl.core.is_builtin(m)} for p in packages] == before


def test_empty_reduce_and_scalars(tdev):
    empty = np.zeros((3, 0), np.float32)
    np.testing.assert_array_equal(run(tdev, T(empty).sum(1)), np.zeros(3, np.float32))
    np.testing.assert_array_equal(run(tdev, T(empty).prod(1)), np.ones(3, np.float32))
    np.testing.assert_allclose(run(tdev, T(np.float32(2.5)) * 3 + 1), np.float32(8.5))


def test_padded_loads(tdev):
    padded = np.pad(A57, ((1, 2), (0, 1))) * 2
    np.testing.assert_array_equal(run(tdev, T(A57).pad(((1, 2), (0, 1))) * 2), padded)
    one = np.array([3.0], np.float32)  # a constant index under a mask that depends on the position
    got = run(tdev, T(one).expand(4).pad(((1, 1),)) + 1)
    np.testing.assert_array_equal(got, np.pad(np.full(4, 3.0, np.float32), (1, 1)) + 1)


def test_ragged_elementwise_small_blocks(tdev):
    x = RNG.uniform(-1, 1, 1000).astype(np.float32)
    np.testing.assert_allclose(run(tdev, (T(x) * 3).relu() + 1, et.Blocks(64, 1)), np.maximum(x * 3, 0) + 1)


def test_matmul(tdev):
    a, b = A537[:, :20], RNG.uniform(-1, 1, (20, 9)).astype(np.float32)
    k = kernels(T(a) @ T(b))[0]
    assert "tl.dot(" in et.render(k, blocks=choose_blocks(k, noopt=False)).source
    assert "tl.dot(" not in et.render(k, blocks=choose_blocks(k, noopt=True)).source
    np.testing.assert_allclose(run(tdev, T(a) @ T(b)), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run(tdev, T(a) @ T(b), SMALL), a @ b, rtol=1e-5, atol=1e-5)
    dot = et.Blocks(16, 16, 4, 16)  # tiles smaller than the matrices: several programs, a K loop
    x = RNG.uniform(-1, 1, (2, 37, 40)).astype(np.float32)
    y = RNG.uniform(-1, 1, (40, 19)).astype(np.float32)
    got = run(tdev, (T(x) @ T(y)).relu(), dot)
    np.testing.assert_allclose(got, np.maximum(x @ y, 0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run(tdev, T(y).T @ T(x[0]).T, dot), y.T @ x[0].T, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------
# errors


def test_no_gpu_without_interpreter_names_the_fix(monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(DeviceError) as err:
        triton_rt.CUDARuntime()
    assert str(err.value).startswith(
        "CUDA device: no GPU found; set TRITON_INTERPRET=1 to run Triton kernels on the CPU"
    )


def test_missing_triton_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)
    with pytest.raises(DeviceError, match=r"pip install -e \.\[triton\]"):
        triton_rt.AMDRuntime()


def test_triton_opens_after_webgpu_loaded_llvm():
    """Mesa's lavapipe (WEBGPU) loads a shared libLLVM; importing triton after it used to segfault."""
    pytest.importorskip("wgpu")
    pytest.importorskip("triton")
    script = (
        "import numpy as np\n"
        "from tgrad import Tensor\n"
        "from tgrad.device import get_runtime\n"
        "try:\n"
        "    get_runtime('WEBGPU')\n"
        "except Exception:\n"
        "    raise SystemExit(3)\n"
        "print((Tensor(np.arange(4.0, dtype=np.float32), device='WEBGPU') * 2).numpy().tolist())\n"
        "print((Tensor(np.arange(4.0, dtype=np.float32), device='TRITON') * 3).numpy().tolist())\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-c", script]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    if done.returncode == 3:
        pytest.skip("no WebGPU adapter")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["[0.0, 2.0, 4.0, 6.0]", "[0.0, 3.0, 6.0, 9.0]"]


def test_bad_target_names_the_format():
    pytest.importorskip("triton")
    with pytest.raises(TgradError, match="cuda:<sm number> or hip:<gfx arch>"):
        triton_aot.parse_target("sm_90")


# ---------------------------------------------------------------------------------------------------
# ahead-of-time compilation for real GPUs (issue 10): no GPU needed


def _conv_and_grads() -> list[Tensor]:
    x = Tensor(RNG.standard_normal((2, 4, 9, 7)).astype(np.float32), device="NUMPY", requires_grad=True)
    w = Tensor(RNG.standard_normal((6, 2, 3, 2)).astype(np.float32), device="NUMPY", requires_grad=True)
    y = x.conv2d(w, padding=(2, 1), stride=2, dilation=(1, 2), groups=2)
    (y.relu() * T(RNG.standard_normal(y.shape).astype(np.float32))).sum().backward()
    return [y, x.grad, w.grad]


@pytest.mark.parametrize("small", [False, True])
def test_convolutions_are_implicit_gemms(tdev, small, monkeypatch, lazy_backward):
    """By default convolutions and their weight gradients (strided, padded, dilated, grouped) run as tl.dot
    kernels whose operand tiles gather the windows; against PyTorch, also with small blocks (ragged M, N
    and K tiles). With TGRAD_TRITON_IMPLICIT_GEMM=0 they stay reductions. The input's gradient (col2im) is
    a plain matmul: a dot either way."""
    torch = pytest.importorskip("torch")
    monkeypatch.delenv("TGRAD_TRITON_IMPLICIT_GEMM", raising=False)
    if small:
        default = heuristic.triton_opts
        small_dot = (Opt(OptOps.LOCAL, 16), Opt(OptOps.REDUCE, 16), Opt(OptOps.WARPS, 4), Opt(OptOps.DOT, 16))

        def opts(k, props, noopt):
            return small_dot if find_dot(k) else default(k, props, noopt)

        monkeypatch.setattr(heuristic, "triton_opts", opts)
    batch = 3 if small else 2  # other kernels than the other case's, which the device has compiled
    xa = RNG.standard_normal((batch, 4, 9, 7)).astype(np.float32)
    wa = RNG.standard_normal((6, 2, 3, 2)).astype(np.float32)
    ga = RNG.standard_normal((batch, 6, 6, 4)).astype(np.float32)
    x, w = (Tensor(a, device="TRITON", requires_grad=True) for a in (xa, wa))
    y = x.conv2d(w, padding=(2, 1), stride=2, dilation=(1, 2), groups=2)
    (y.relu() * Tensor(ga, device="TRITON")).sum().backward()
    tx, tw = (torch.tensor(a, requires_grad=True) for a in (xa, wa))
    ty = torch.nn.functional.conv2d(tx, tw, padding=(2, 1), stride=2, dilation=(1, 2), groups=2)
    (ty.relu() * torch.tensor(ga)).sum().backward()
    outs = ((y, ty), (x.grad, tx.grad), (w.grad, tw.grad))
    assert all("tl.dot(" in gpu_render(kernels(t)[-1]).source for t in (y, w.grad))
    # the input's gradient is col2im: a plain matmul (a dot with or without the option), then a sum of
    # shifted shares
    col2im = [k for k in kernels(x.grad) if k.reduce_op]
    assert col2im and "tl.dot(" in gpu_render(col2im[-1]).source
    with monkeypatch.context() as off:
        off.setenv("TGRAD_TRITON_IMPLICIT_GEMM", "0")
        assert not any(find_dot(kernels(t)[-1]) for t in (y, w.grad))
        assert find_dot(col2im[-1])
    for t, ref in outs:
        np.testing.assert_allclose(t.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-4)


def test_gathering_dots_run_with_one_pipeline_stage():
    """A dot whose operand tile gathers with masks (a padded conv) is launched with num_stages=1 and its
    masked-out lanes load offset 0 (Triton's pipelining of such loads summed wrongly on an H200); an
    unpadded conv and a plain matmul keep Triton's default stages."""
    x, w = (T(RNG.standard_normal(s).astype(np.float32)) for s in ((2, 4, 7, 7), (6, 4, 3, 3)))
    padded = gpu_render(kernels(x.conv2d(w, padding=(1, 2), dilation=2))[-1])
    assert padded.launch["num_stages"] == 1 and "tl.load(in0 + tl.where(" in padded.source
    for t in (x.conv2d(w), T(A57) @ T(A57.T)):
        program = gpu_render(kernels(t)[-1])
        assert "tl.dot(" in program.source and "num_stages" not in program.launch


def test_kernels_compile_for_nvidia_and_amd_targets(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TGRAD_TRITON_IMPLICIT_GEMM", raising=False)  # the convolutions below are dots
    half = T(A537.astype(np.float16))
    ints = T((A537 * 10).astype(np.int32))
    outs = [
        (half.exp2() * 2).sum(1),  # fp16 math through fp32, fp16 sum in an fp32 tile
        ints.div(ints + 1, rounding_mode="trunc").fmod(T(np.int32(3))),  # guarded C division
        T(A537).pad(((1, 0), (2, 2))).max(1),  # masked loads, nan-propagating max
        (T(A537) > 0).any(1),  # bool reduce
        T(A537[:, :16] + 1).prod(1),  # the halving tree
        (T(A537) @ T(A537.T)).relu(),  # tl.dot with an epilogue
        T(A537.astype(np.float16)) @ T(A537.T.astype(np.float16)),  # float16 tl.dot
        T(np.ones((4, 1 << 16), np.float16)).sum(1) + 1,  # a split reduce (float32 partials) with a tail
        (T(np.ones((4, 1 << 16), np.float32)) > 0).any(1),  # split: bool partials
        T(np.ones((4, 1 << 16), np.int8)).sum(1, dtype=dtypes.int8),  # split: int8 partials, wrapping
        T(np.ones((4, 1 << 16), np.float32)).max(1),  # split: nan-propagating max of partials
        *_conv_and_grads(),  # implicit GEMMs: gathered, masked operand tiles
    ]
    for t in outs:
        for k in kernels(t):
            for target in ("cuda:80", "cuda:90", "hip:gfx942"):
                info = triton_aot.compile_for_target(k, target)
                assert info.binary_bytes > 0 and info.asm_bytes > 0, (k.name, target)
                assert info.registers is not None and info.registers > 0, (k.name, target)


def test_gpu_launch_skips_dispatch_only_for_a_seen_alignment(monkeypatch):
    """On a GPU the compiled kernel is launched directly after the first launch for a pattern of pointer
    alignments (no GPU here: a stand-in for a @triton.jit function records what was called)."""
    calls = []

    class Compiled:
        def __getitem__(self, grid):
            return lambda *args: calls.append(("direct", grid, args))

    class Jit:
        def __getitem__(self, grid):
            def dispatch(*args, num_warps):
                calls.append(("dispatch", grid, args, num_warps))
                return Compiled()

            return dispatch

    class Ptr:
        def __init__(self, at):
            self.at = at

        def data_ptr(self):
            return self.at

    on = [0]
    cuda = types.SimpleNamespace(current_device=lambda: on[0])
    gpu = types.SimpleNamespace(interpret=False, torch=types.SimpleNamespace(cuda=cuda))
    launch = triton_rt.TritonRuntime._launcher(gpu, Jit(), (7,), {"num_warps": 4})
    aligned, odd = (Ptr(64), Ptr(128)), (Ptr(64), Ptr(132))
    launch(*aligned)
    launch(*aligned)
    launch(*odd)  # another specialization: Triton's dispatch compiles or finds it
    launch(*odd)
    on[0] = 1  # another GPU: dispatch again
    launch(*odd)
    assert [c[0] for c in calls] == ["dispatch", "direct", "dispatch", "direct", "dispatch"]
    assert calls[0][1:] == ((7,), aligned, 4) and calls[1][1:] == ((7, 1, 1), aligned)
    monkeypatch.setenv("TGRAD_TRITON_DIRECT", "0")
    calls.clear()
    launch = triton_rt.TritonRuntime._launcher(gpu, Jit(), (7, 2), {"num_warps": 8})
    launch(*aligned)
    launch(*aligned)
    assert [c[0] for c in calls] == ["dispatch", "dispatch"]


def test_interpreter_runs_the_rewrite_tgrad_made_and_kept(tdev, tmp_path, monkeypatch):
    """Under Triton's interpreter tgrad rewrites each kernel's jitted functions itself, with Triton's AST
    transformer (runtime/triton_source.py), into the interpreter's cache, and keeps the compiled code beside
    the kernel's source: a kernel loaded again uses that code, and neither way lets the interpreter read
    the source back. Values as numpy's, the first load and the second."""
    if not tdev.interpret:
        pytest.skip("Triton's interpreter only (TRITON_INTERPRET=1)")
    from triton.runtime import interpreter

    from tgrad.runtime import triton_source

    monkeypatch.setattr(triton_source, "_source_dir", lambda: tmp_path)
    rewrote: list[str] = []  # (Triton's own jitted functions, tl.sum..., it still rewrites itself)
    real = interpreter.FunctionRewriter.rewrite_ast

    def rewrite_ast(self):
        rewrote.append(self.fn.__module__)
        return real(self)

    monkeypatch.setattr(interpreter.FunctionRewriter, "rewrite_ast", rewrite_ast)
    # a kernel of its own (a constant no other test uses): not loaded in this process before
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    program = et.render(kernels((T(a) * 3.25 + 0.125).sum(1))[-1])
    for load in range(2):
        if load:  # a new process would find the code on disk: forget what this one loaded
            for name in [n for n in sys.modules if n.startswith("tgrad_triton_")]:
                monkeypatch.delitem(sys.modules, name)
        fn = triton_source.load_source(program.source, program.name, True)
        assert fn.fn in interpreter.InterpretedFunction.rewritten_fn
        assert len(list(tmp_path.glob("*.marshal"))) == 1
    np.testing.assert_allclose(run(tdev, (T(a) * 3.25 + 0.125).sum(1)), (a * 3.25 + 0.125).sum(1), rtol=1e-6)
    assert not [m for m in rewrote if m.startswith("tgrad_triton_")], rewrote
