"""The CPU emitter's fast paths keep the results of the plain ones (compared with numpy and PyTorch).

float32 exp2 is an inline polynomial (runtime/cpu/numba_rt.py `_exp2f`) instead of a libm call, float max is
LLVM's `maximum` so max-reductions vectorize, and kernels index raw pointers (no wraparound of negative
indexes) so `prange` bodies vectorize.
"""

import math

import numpy as np
import pytest
import torch

from tests.helpers import cpu_plan, cpu_render
from tgrad import Tensor

# (these tests read which kernels gradient graphs become: backward() leaves them lazy)
pytestmark = pytest.mark.usefixtures("lazy_backward")

F32 = np.float32
EDGES = np.array(
    [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 0.49999997, 0.50000006, 1e-30, -1e-30, 1e-45, -1e-45,  # tiny, denormal
     127.0, 127.5, 127.99999, 128.0, 128.00002, 129.0, 1e30, 3.4028235e38,  # to overflow
     -125.0, -126.0, -126.5, -127.0, -140.0, -148.9, -149.0, -149.5, -149.99998, -150.0, -150.5, -151.0,
     -1e30, -3.4028235e38, math.inf, -math.inf, math.nan],
    F32,
)


def _exp2_cpu(x: np.ndarray) -> np.ndarray:
    return Tensor(x, device="CPU").exp2().numpy()


def _ulps(out: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Distance from the exact 2**x in units of the float32 spacing of the correctly rounded result."""
    exact = np.exp2(x.astype(np.float64))
    rounded = exact.astype(F32)
    return np.abs(out.astype(np.float64) - exact) / np.spacing(np.abs(rounded)).astype(np.float64)


def test_exp2_edge_values_match_numpy():
    out = _exp2_cpu(EDGES)
    with np.errstate(over="ignore"):
        exact = np.exp2(EDGES.astype(np.float64)).astype(F32)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(EDGES))
    np.testing.assert_array_equal(np.isinf(out), np.isinf(exact))
    np.testing.assert_array_equal(out == 0, exact == 0)  # underflow to zero exactly where it should
    assert (_ulps(out, EDGES)[np.isfinite(exact)] <= 1.5).all()
    ref = torch.exp2(torch.from_numpy(EDGES)).numpy()
    np.testing.assert_allclose(out, ref, rtol=3e-7, atol=0)


def test_exp2_float32_range_within_two_ulp():
    # every 97th float32 of the range where exp2 is finite and nonzero (incl. denormal results), and a
    # random sample of all bit patterns
    lo, hi = np.array([-151.0, 128.5], F32).view(np.uint32)
    neg = np.arange(np.uint32(0x80000000), lo, 97, dtype=np.uint32)
    pos = np.arange(0, hi, 97, dtype=np.uint32)
    bits = np.random.default_rng(0).integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([neg, pos, bits]).view(F32)
    out = _exp2_cpu(x)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = np.exp2(x)
        finite = np.isfinite(ref) & (np.exp2(x.astype(np.float64)).astype(F32) != 0)
        assert _ulps(out, x)[finite].max() <= 2
    special = ~finite
    np.testing.assert_array_equal(out[special], np.exp2(x.astype(np.float64)).astype(F32)[special])


@pytest.mark.parametrize("shape", [(4, 1000), (300, 7), (1, 4097)])
def test_softmax_matches_torch(shape):
    x = (np.random.default_rng(1).random(shape, F32) - 0.5) * 40
    out = Tensor(x, device="CPU").softmax(1).numpy()
    ref = torch.softmax(torch.from_numpy(x), 1).numpy()
    np.testing.assert_allclose(out, ref, rtol=2e-6, atol=1e-7)


def test_row_max_vectorized_keeps_nan_and_signed_zero_rules():
    x = np.random.default_rng(2).standard_normal((64, 515)).astype(F32)
    x[3, 100] = np.nan
    x[5, :] = -np.inf
    x[7, :] = -0.0
    x[7, 9] = 0.0
    out = Tensor(x, device="CPU").max(1).numpy()
    ref = torch.from_numpy(x).amax(1).numpy()
    np.testing.assert_array_equal(out, ref)
    assert not np.signbit(out[7])


@pytest.mark.parametrize("op", ["amax", "amin"])
def test_masked_row_max_matches_torch(op):
    """A causal mask's where(c, -inf, x).max() (and min with +inf): the infinite constant is hidden from
    LLVM (numba_rt._opaque), which otherwise rewrites the reduce into a form it runs 18x slower; the values,
    fully masked rows, NaN and signed zeros must still be PyTorch's."""
    x = np.random.default_rng(3).standard_normal((8, 4, 64, 64)).astype(F32)
    x[0, 0, 5, 2] = np.nan
    x[1, 2, 9, :] = -0.0
    x[2, 1, 3, :] = np.inf
    mask = np.triu(np.ones((64, 64), bool), 1)
    mask[7, :] = True  # a row with every element masked
    fill = -math.inf if op == "amax" else math.inf
    a = Tensor.arange(64, device="CPU")
    m = a.reshape(64, 1) < a.reshape(1, 64)
    m = m | (a.reshape(64, 1) == 7)
    t = m.where(fill, Tensor(x, device="CPU") * 0.25)
    out = (t.max(-1) if op == "amax" else t.min(-1)).numpy()
    ref = getattr(torch.where(torch.from_numpy(mask), fill, torch.from_numpy(x) * 0.25), op)(-1).numpy()
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(np.signbit(out), np.signbit(ref))
    kernel_source = "\n".join(p.source for p in _cpu_programs(lambda: t.max(-1)))
    assert "_opaque(np.float32(" in kernel_source


def _cpu_programs(fn):
    from tgrad.fuse import schedule

    out = fn()
    return [cpu_render(item.kernel) for item in schedule([out.node]) if hasattr(item, "kernel")]


def test_column_sum_with_per_row_scalars_is_interchanged():
    """A LayerNorm weight's gradient: sum over rows of dy * (x - mean[row]) * rstd[row]. The per-row scalars
    have unit stride along the reduce axis but none along the kept one, so the reduce loops still go outside
    (a row of accumulators, unit-stride loads) instead of a stride-64 walk per output."""
    from tgrad import fuse

    rng = np.random.default_rng(4)
    dy, x = (rng.standard_normal((1024, 64)).astype(F32) for _ in range(2))
    mean, rstd = (rng.standard_normal((1024, 1)).astype(F32) for _ in range(2))
    dy_t, x_t, mean_t, rstd_t = (Tensor(a, device="CPU") for a in (dy, x, mean, rstd))
    t = dy_t * ((x_t - mean_t) * rstd_t)
    (item,) = fuse.schedule([t.sum(0).node])
    assert "accs[" in cpu_render(item.kernel).source
    ref = (dy.astype(np.float64) * (x - mean) * rstd).sum(0)
    np.testing.assert_allclose(t.sum(0).numpy(), ref, rtol=1e-4, atol=1e-4)


def test_relu_and_maximum_with_nan_and_inf():
    x = np.array([-1.0, 0.0, -0.0, 2.0, np.nan, np.inf, -np.inf] * 300, F32)
    np.testing.assert_array_equal(Tensor(x, device="CPU").relu().numpy(), torch.from_numpy(x).relu().numpy())
    y = np.roll(x, 3)
    out = Tensor(x, device="CPU").maximum(Tensor(y, device="CPU")).numpy()
    np.testing.assert_array_equal(out, torch.maximum(torch.from_numpy(x), torch.from_numpy(y)).numpy())


def test_same_elementwise_body_at_different_shapes_compiles_once():
    from tgrad.device import get_runtime

    dev = get_runtime("CPU")
    shapes = [(3, 5), (7,), (2, 3, 4)]
    before = len(dev.functions)
    for shape in shapes:
        a = np.random.default_rng(3).random(shape, F32)
        b = np.random.default_rng(4).random(shape, F32)
        out = (Tensor(a, device="CPU") * 0.25 + Tensor(b, device="CPU").sqrt()).numpy()
        np.testing.assert_allclose(out, a * 0.25 + np.sqrt(b), rtol=1e-6)
    assert len(dev.functions) - before <= 1


def test_flattening_keeps_views_and_slices():
    x = np.arange(24, dtype=F32).reshape(4, 6)
    t = Tensor(x, device="CPU")
    np.testing.assert_array_equal((t.permute(1, 0) + 1).numpy(), x.T + 1)
    np.testing.assert_array_equal((t[1:3, 2:5] * 2).numpy(), x[1:3, 2:5] * 2)
    np.testing.assert_array_equal((t + Tensor(x[0], device="CPU")).numpy(), x + x[0])


def test_inputs_a_kernel_does_not_read_are_left_out_of_its_source():
    from tgrad import dtypes, emit_numba
    from tgrad.device import Buffer, get_runtime
    from tgrad.fuse import Expr, Kernel, schedule

    a = Tensor(np.arange(6, dtype=F32), device="CPU").realize()
    kernel = schedule([(a * 2).node])[-1].kernel

    def shift(e: Expr) -> Expr:  # the same kernel, reading its buffer as input 2 of 3
        srcs = tuple(shift(s) for s in e.srcs)
        return Expr(e.op, srcs, e.arg + 2 if e.op == "LOAD" else e.arg, e.dtype)

    wider = Kernel(
        name=kernel.name, shape=kernel.shape, n_global=kernel.n_global, reduce_op=None, reduce_expr=None,
        expr=shift(kernel.expr), out_index=kernel.out_index, out_dtype=kernel.out_dtype,
        in_dtypes=(dtypes.int32, dtypes.float64, *kernel.in_dtypes),
    )
    assert emit_numba.used_inputs(wider) == (2,)
    assert cpu_render(wider).source == cpu_render(kernel).source
    dev = get_runtime("CPU")
    out = dev.alloc(6, dtypes.float32)
    unused = [dev.alloc(1, dtypes.int32), dev.alloc(1, dtypes.float64)]
    dev.runner(wider)(out, *unused, Buffer("CPU", 6, dtypes.float32, np.arange(6, dtype=F32)))
    np.testing.assert_array_equal(out.data, np.arange(6, dtype=F32) * 2)


def test_one_source_for_two_dtypes_compiles_for_each():
    for dtype in (np.float32, np.int32, np.float64):
        x = np.arange(7, dtype=dtype)
        out = Tensor(x, device="CPU").contiguous().numpy()  # a copy kernel: the same source for every dtype
        np.testing.assert_array_equal(out, x)
        assert out.dtype == dtype
    y = np.arange(12, dtype=np.int32).reshape(3, 4)
    np.testing.assert_array_equal((Tensor(y, device="CPU") * 3).numpy(), y * 3)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8"])
def test_integer_division_edges_on_cpu(dtype):
    """The CPU's division helper is LLVM IR (numba_rt._idiv): x // 0 = 0 and x % 0 = x (as on every tgrad
    device), and INT_MIN // -1 wraps to INT_MIN like numpy instead of trapping like a bare sdiv."""
    info = np.iinfo(dtype)
    a = np.array([info.min, info.max, 7, info.min, 0, 5], dtype)
    b = np.array([1, 3, 0, 2, 0, 2], dtype)
    if info.min < 0:
        b = np.array([-1, -3, 0, 2, 0, -2], dtype)
    ta, tb = Tensor(a, device="CPU"), Tensor(b, device="CPU")
    nonzero = b != 0
    with np.errstate(over="ignore", divide="ignore"):
        want_div, want_mod = a // np.where(nonzero, b, 1), a % np.where(nonzero, b, 1)
    np.testing.assert_array_equal((ta // tb).numpy(), np.where(nonzero, want_div, 0))
    np.testing.assert_array_equal((ta % tb).numpy(), np.where(nonzero, want_mod, a))


@pytest.mark.parametrize("axis", [0, 1, 2, None])
@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_threaded_reductions_over_each_axis(axis, threads, monkeypatch):
    """Reductions big enough for threads (each runs a range [lo, hi) of the outer loop; 3 threads split
    64 rows unevenly), including the interchanged ones whose row of accumulators is scratch memory: each
    thread needs rows of its own (a shared row raced), and full reductions (partials, then one combine)."""
    from tgrad import fuse

    monkeypatch.setenv("TGRAD_THREADS", threads)
    x = np.random.default_rng(axis or 3).standard_normal((64, 128, 256)).astype(F32)
    t = Tensor(x, device="CPU")
    (item,) = fuse.schedule([t.sum(axis).node])
    program = cpu_render(item.kernel)
    assert "range(lo, hi)" in program.source and program.launch["split"] > 1, program.source
    if axis is not None and axis < 2:
        assert "accs[i0 * " in program.source, program.source  # interchanged, a row of accumulators each
    ref = x.astype(np.float64).sum(axis)
    np.testing.assert_allclose(t.sum(axis).numpy(), ref, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose((t * 2 + 1).exp().numpy(), np.exp(x * 2 + 1), rtol=1e-5)  # elementwise
    np.testing.assert_array_equal((t > 1.5).any(axis).numpy(), (x > 1.5).any(axis))
    np.testing.assert_allclose(t.max(axis).numpy(), x.max(axis))


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 0, 1, 1), (2, 1, 1, 1), (1, 2, 2, 2)])
def test_convolutions_run_as_blas_matmuls(stride, padding, dilation, groups):
    """A conv's reduce over (channels, kh, kw) is one BLAS matmul: the input windows are copied out
    (im2col; padded ones through a generated prologue kernel). Forward and both gradients vs PyTorch."""
    from tgrad import fuse

    rng = np.random.default_rng(7)
    x = rng.standard_normal((8, 4, 20, 20)).astype(F32)
    w = (rng.standard_normal((16, 4 // groups, 3, 3)) * 0.3).astype(F32)
    tx, tw = Tensor(x, device="CPU", requires_grad=True), Tensor(w, device="CPU", requires_grad=True)
    out = tx.conv2d(tw, stride=stride, padding=padding, dilation=dilation, groups=groups)
    plans = [cpu_plan(it.kernel) for it in fuse.schedule([out.node])]
    assert any(p is not None for p in plans), "the forward conv did not become a BLAS matmul"
    (out.relu() * out).sum().backward()
    rx, rw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ref = torch.nn.functional.conv2d(rx, rw, stride=stride, padding=padding, dilation=dilation, groups=groups)
    (ref.relu() * ref).sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(tx.grad.numpy(), rx.grad.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(tw.grad.numpy(), rw.grad.numpy(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("cin,cout,k,stride,padding,dilation,size,blas", [
    (1, 32, 5, 1, 0, 1, 30, False), (3, 16, 3, 1, 1, 1, 30, False), (3, 32, 3, 2, 0, 1, 64, False),
    (4, 8, 3, 1, 2, 2, 30, False), (3, 128, 3, 1, 1, 1, 30, True), (2, 32, 5, 1, 0, 1, 30, True)])
def test_convs_with_few_taps_read_the_input_in_place(cin, cout, k, stride, padding, dilation, size, blas):
    """A conv forward whose windows would be copied (big: in pieces) with K = cin * k * k at most
    windows_max_k (HostTuning: a first layer over 1-4 channels) and at most windows_max_n output channels
    is the generated loop over the input (no im2col copy, no BLAS); bigger ones keep BLAS. Values and
    gradients as PyTorch's, nan and inf included."""
    from tgrad import fuse

    rng = np.random.default_rng(11)
    x = rng.standard_normal((64, cin, size, size)).astype(F32)
    x[0, 0, 3, 4], x[1, -1, 5, 6] = np.nan, np.inf
    w = (rng.standard_normal((cout, cin, k, k)) * 0.3).astype(F32)
    tx, tw = Tensor(x, device="CPU", requires_grad=True), Tensor(w, device="CPU", requires_grad=True)
    out = tx.conv2d(tw, stride=stride, padding=padding, dilation=dilation)
    plan = cpu_plan(fuse.schedule([out.node])[-1].kernel)
    assert (plan is not None) == blas, plan
    g = rng.standard_normal(out.shape).astype(F32)
    (out * Tensor(g, device="CPU")).sum().backward()
    rx, rw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ref = torch.nn.functional.conv2d(rx, rw, stride=stride, padding=padding, dilation=dilation)
    (ref * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-4)
    # the weight's gradient sums 50k-230k products of magnitude ~1 per entry (float32 in both)
    np.testing.assert_allclose(tw.grad.numpy(), rw.grad.numpy(), rtol=1e-3, atol=2e-2)
    np.testing.assert_allclose(tx.grad.numpy(), rx.grad.numpy(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("stride,dilation,groups", [(1, 1, 1), (2, 1, 1), (1, 2, 2), ((2, 1), (1, 2), 4)])
def test_conv_input_gradient_is_col2im_without_window_copies(stride, dilation, groups):
    """The input gradient of a conv is one matmul per image over the output channels, whose operands are
    read where they are stored (no prologue, no window copy) and whose result lands in its output's order
    (`blas.lead_axes`), then a sum of shifted shares; values against PyTorch."""
    from tgrad import fuse

    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, 16, 24, 23)).astype(F32)
    w = (rng.standard_normal((32, 16 // groups, 5, 5)) * 0.3).astype(F32)
    tx = Tensor(x, device="CPU", requires_grad=True)
    out = tx.conv2d(Tensor(w, device="CPU"), stride=stride, dilation=dilation, groups=groups)
    (out * out).sum().backward()
    plans = [cpu_plan(it.kernel) for it in fuse.schedule([tx.grad.node])]
    plans = [p for p in plans if p is not None]  # the forward conv's and the gradient's
    col2im = [p for p in plans if p.batch == ((0, 1) if groups > 1 else (0,)) and p.epilogue is None]
    assert len(col2im) == 1 and not any(p.prologues for p in plans), plans
    rx = torch.tensor(x, requires_grad=True)
    ref = torch.nn.functional.conv2d(rx, torch.tensor(w), stride=stride, dilation=dilation, groups=groups)
    (ref * ref).sum().backward()
    np.testing.assert_allclose(tx.grad.numpy(), rx.grad.numpy(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("a,b,batched", [((48, 96), (40, 96, 300), True), ((16, 8), (200, 8, 10), False)])
def test_broadcast_matmul_runs_per_batch_in_the_output_order(a, b, batched):
    """A (M, K) @ B (N, K, P): the result's rows (m) come out between N and P, so BLAS runs once per n with A
    broadcast (when each matmul is big enough) instead of once with the result copied back transposed."""
    from tgrad import fuse

    rng = np.random.default_rng(2)
    an, bn = rng.standard_normal(a).astype(F32), rng.standard_normal(b).astype(F32)
    out = Tensor(an, device="CPU") @ Tensor(bn, device="CPU")
    plan = cpu_plan(fuse.schedule([out.node])[-1].kernel)
    assert plan is not None and (plan.batch == (0,)) == batched, plan
    np.testing.assert_allclose(out.numpy(), (torch.from_numpy(an) @ torch.from_numpy(bn)).numpy(), rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose((out * 2).numpy(), 2 * np.matmul(an, bn), rtol=1e-4, atol=1e-3)  # an epilogue


@pytest.mark.parametrize("shapes", [((300, 64), (300, 8)), ((64, 40), (64, 300)), ((3, 90, 40), (3, 90, 9))])
def test_blas_with_an_operand_stored_column_by_column(shapes, monkeypatch):
    """a.T @ b, with a batch axis too: an operand read in place is handed to BLAS column by column as it
    is (not computed as (b.T @ a).T and put back in order, which ran slower: cpu_blas._Matmul), and the
    result lands in the kernel's row-major output, with and without an epilogue."""
    from tgrad.runtime.cpu import blas as cpu_blas

    made = []
    original = cpu_blas._Matmul.__init__

    def recording(self, *args):
        original(self, *args)
        made.append(self)

    monkeypatch.setattr(cpu_blas._Matmul, "__init__", recording)
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal(s).astype(F32) for s in shapes)
    out = Tensor(a, device="CPU").transpose(-1, -2) @ Tensor(b, device="CPU")
    ref = torch.from_numpy(a).transpose(-1, -2) @ torch.from_numpy(b)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose((out + 1).numpy(), ref.numpy() + 1, rtol=1e-4, atol=1e-4)  # with an epilogue
    assert made and not any(m.swap for m in made) and all(m.in_order for m in made)


@pytest.mark.parametrize("a,b,blas", [((1024, 64), (64,), False), ((2, 512, 64), (64,), False),
                                      ((64,), (64, 1024), True), ((1024, 1024), (1024,), True)])
def test_matrix_times_vector_below_a_million_is_the_generated_loop(a, b, blas):
    """A matrix times a vector whose rows lie along memory is the generated reduce loop (no BLAS plan)
    below HostTuning.blas_min_matvec_work; a vector times a matrix, and bigger ones, keep BLAS.
    Same values as PyTorch."""
    from tgrad import fuse

    rng = np.random.default_rng(4)
    an, bn = rng.standard_normal(a).astype(F32), rng.standard_normal(b).astype(F32)
    out = (Tensor(an, device="CPU") @ Tensor(bn, device="CPU")) * 2
    plan = cpu_plan(fuse.schedule([out.node])[-1].kernel)
    assert (plan is not None) == blas, plan
    ref = (torch.from_numpy(an) @ torch.from_numpy(bn)) * 2
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)


def test_blas_with_nan_and_inf_gives_torchs_values_without_numpy_warnings():
    """nan and inf through a BLAS matmul and a conv in pieces: PyTorch's values, and none of numpy's
    RuntimeWarnings (the generated kernels raise none either)."""
    import warnings

    rng = np.random.default_rng(13)
    a, b = rng.standard_normal((300, 200)).astype(F32), rng.standard_normal((200, 100)).astype(F32)
    a[3, 4], a[5, 6], b[7, 8], b[6, 0] = np.nan, np.inf, -np.inf, 0.0  # 0 * inf: numpy's "invalid value"
    x = rng.standard_normal((4, 16, 28, 28)).astype(F32)
    x[0, 0, 0, 0] = np.inf
    w = rng.standard_normal((8, 16, 5, 5)).astype(F32)
    w[:, 0, 0, 0] = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = (Tensor(a, device="CPU") @ Tensor(b, device="CPU")).numpy()
        conv = Tensor(x, device="CPU").conv2d(Tensor(w, device="CPU") * -1).numpy()
    np.testing.assert_allclose(got, (torch.from_numpy(a) @ torch.from_numpy(b)).numpy(), rtol=1e-4, atol=1e-3)
    ref = torch.nn.functional.conv2d(torch.from_numpy(x), -torch.from_numpy(w)).numpy()
    np.testing.assert_allclose(conv, ref, rtol=1e-4, atol=1e-3)


def test_threaded_kernels_run_in_a_forked_child():
    """A child forked after the parent ran threaded kernels has none of the parent's threads: it starts
    its own instead of waiting forever on the parent's."""
    import multiprocessing

    x = np.random.default_rng(5).random(1 << 21, dtype=F32)
    want = x.astype(np.float64).sum()
    np.testing.assert_allclose(Tensor(x, device="CPU").sum().item(), want, rtol=1e-5)  # threads started
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(_child_sum, (x,)).get(timeout=120)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def _child_sum(x):
    return Tensor(x * 1, device="CPU").sum().item()


@pytest.mark.parametrize("fn", ["sigmoid", "tanh", "silu"])
def test_sigmoid_family_takes_one_exp_forward_and_backward(fn):
    """sigmoid(x) is 1 / (1 + e) or e / (1 + e) with e = exp(-|x|): one exp per element in the forward
    kernel and one in the gradient's (the form with exp(x) and exp(-x) took two and a guarded division),
    with PyTorch's values and gradients over the whole range, inf and nan included."""
    from tgrad.fuse import schedule

    x = np.concatenate([np.linspace(-100, 100, 2001, dtype=F32), F32([-np.inf, np.inf, np.nan, -0.0, 1e-30])])
    t = Tensor(x, device="CPU", requires_grad=True)
    y = getattr(t, fn)()
    y.sum().backward()
    for node in (y.node, t.grad.node):
        sources = [cpu_render(it.kernel).source for it in schedule([node])]
        assert sum(src.count("_exp2f(") for src in sources) == 1, sources
    tx = torch.tensor(x, requires_grad=True)
    ty = getattr(torch, fn) if fn != "silu" else torch.nn.functional.silu
    ty(tx).sum().backward()
    np.testing.assert_allclose(y.numpy(), ty(torch.tensor(x)).numpy(), rtol=3e-6, atol=1e-7)
    # PyTorch's s * (1 - s) loses the gradient's low bits where s rounds near 1: compare at atol
    np.testing.assert_allclose(t.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=2e-7)


def test_attention_matmuls_read_heads_in_place(monkeypatch, cpu_tuning):
    """q @ k.T and att @ v over heads split out of one qkv buffer: batch axes (batch, head) that do not
    merge are handed to numpy's matmul with their own strides, not copied out; values and gradients as
    PyTorch's. (Matmuls this small run as generated code, tests/test_batched_matmul.py; BLAS takes them
    here, as it takes bigger ones.)"""
    from tgrad.runtime.cpu import blas as cpu

    cpu_tuning(batched_max_work=0)  # no generated batches
    copies = []
    original = cpu._Side.buffer

    def counting(side, memory):
        copies.append(side.copy is not None)
        return original(side, memory)

    monkeypatch.setattr(cpu._Side, "buffer", counting)
    rng = np.random.default_rng(5)
    qkv0 = rng.standard_normal((4, 32, 3 * 48)).astype(F32)
    qkv = Tensor(qkv0, device="CPU", requires_grad=True)
    q, k, v = (z.reshape(4, 32, 3, 16).transpose(1, 2) for z in qkv.split(48, 2))
    out = ((q @ k.transpose(-2, -1)) * 0.25).softmax(-1) @ v
    tqkv = torch.tensor(qkv0, requires_grad=True)
    tq, tk, tv = (z.reshape(4, 32, 3, 16).transpose(1, 2) for z in tqkv.split(48, 2))
    ref = ((tq @ tk.transpose(-2, -1)) * 0.25).softmax(-1) @ tv
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert copies and not any(copies), copies
    out.square().sum().backward()
    ref.square().sum().backward()
    np.testing.assert_allclose(qkv.grad.numpy(), tqkv.grad.numpy(), rtol=1e-4, atol=1e-4)


IDLE_PROBE = """
import json, os
import numpy as np
from tgrad import Tensor
from tgrad.runtime.cpu import blas as cpu
libs = cpu._openblas()
lib = libs[0] if libs else None
before = lib.openblas_thread_timeout() if lib else None
a = np.random.default_rng(0).standard_normal((300, 200)).astype(np.float32)
got = (Tensor(a) @ Tensor(a.T)).numpy()  # opens the CPU device; the matmul runs on the restarted threads
err = float(np.abs(got - a.astype(np.float64) @ a.T.astype(np.float64)).max())
print(json.dumps({"found": lib is not None, "before": before,
                  "after": lib.openblas_thread_timeout() if lib else None, "err": err,
                  "env": os.environ.get("OPENBLAS_THREAD_TIMEOUT")}))
"""


@pytest.mark.parametrize("user", [None, "26"])
def test_openblas_threads_sleep_soon_after_a_matmul(user):
    """Opening the CPU device sets numpy's OpenBLAS idle timeout to 2**21 cycles (its threads restarted),
    unless the user set OPENBLAS_THREAD_TIMEOUT; the environment is left as it was; matmuls stay right."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_THREAD_TIMEOUT", "TGRAD_OPENBLAS_IDLE")}
    if user:
        env["OPENBLAS_THREAD_TIMEOUT"] = user
    run = subprocess.run([sys.executable, "-c", IDLE_PROBE], env=env, capture_output=True, text=True,
                         check=True)
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["err"] < 1e-3 and out["env"] == user
    if not out["found"]:
        pytest.skip("numpy's BLAS here is not an OpenBLAS with the entry points tgrad calls")
    from tgrad.opt.opts import HostTuning

    assert out["before"] == (int(user) if user else 0)
    assert out["after"] == (int(user) if user else HostTuning().openblas_idle)


@pytest.mark.parametrize("case", ["merge_heads", "split_heads", "reduce", "threaded", "pool"])
def test_axes_divided_by_a_constant_become_two_loops(case, monkeypatch, cpu_tuning):
    """An axis that indices divide by a constant (attention's heads merged into one axis of 64 as i // 16
    and i % 16) is two loops in the CPU source (no division per element), for elementwise kernels, reduce
    axes and a threaded outer axis; the values are numpy's. A small divisor splits an outer axis only
    (max_pool's gradient reads rows as i // 2; its innermost axis keeps its loop of 8+)."""
    from tgrad import fuse

    rng = np.random.default_rng(5)
    if case == "pool":
        x = rng.standard_normal((2, 3, 8, 8)).astype(F32)
        t = Tensor(x, device="CPU", requires_grad=True)
        t.max_pool2d(2).sum().backward()
        ref = torch.tensor(x, requires_grad=True)
        torch.nn.functional.max_pool2d(ref, 2).sum().backward()
        np.testing.assert_array_equal(t.grad.numpy(), ref.grad.numpy())
        return
    x = rng.standard_normal((8, 4, 32, 16)).astype(F32)  # (batch, heads, time, head size)
    if case == "threaded":
        cpu_tuning(parallel_min_work=1024)
        x = rng.standard_normal((4, 64, 32, 16)).astype(F32)  # 64 heads: axis 0 is split (1024 = 64 x 16)
    t = Tensor(x, device="CPU")
    b, h, s, d = x.shape
    if case in ("merge_heads", "threaded"):
        out = t.permute(1, 3, 0, 2).reshape(h * d, b, s) * 2  # axis 0 of 64 (1024) read as i // 16, i % 16
        ref = x.transpose(1, 3, 0, 2).reshape(h * d, b, s) * 2
    elif case == "split_heads":
        out = t.permute(0, 2, 1, 3).reshape(b, s, h * d) + 1
        ref = x.transpose(0, 2, 1, 3).reshape(b, s, h * d) + 1
    else:
        out = t.permute(0, 2, 1, 3).reshape(b, s, h * d).sum(2)
        ref = x.transpose(0, 2, 1, 3).reshape(b, s, h * d).astype(np.float64).sum(2)
    (item,) = fuse.schedule([out.node])
    program = cpu_render(item.kernel)
    assert "_idiv(" not in program.source, program.source
    if case == "threaded":
        assert "range(lo, hi)" in program.source and program.launch["split"] == 64, program.source
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pieces", [(16, 16, 32), (32, 16, 16), (16, 48), (8, 24)])
def test_a_concatenation_along_a_split_axis_tests_the_outer_loop(pieces):
    """Pieces concatenated along an axis that is split in two loops (heads merged back, as attention's q,
    k, v gradients into one operand): where a piece's bounds are multiples of the inner loop, its test is
    on the outer loop counter alone (`i2 < 2`, not `i2 * 16 + i3 < 32`); elsewhere the full index. Values
    are numpy's either way."""
    from tgrad import fuse

    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((4, 8, w // 8, 8)).astype(F32) for w in pieces]  # (b, t, heads, head size)
    ts = [Tensor(x, device="CPU").permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3) for x in xs]
    out = Tensor.cat(*[t.reshape(4, 8, -1) for t in ts], dim=-1) * 2
    ref = np.concatenate([x.reshape(4, 8, -1) for x in xs], -1) * 2
    items = fuse.schedule([out.node])
    source = cpu_render(items[-1].kernel).source
    bounds = np.cumsum(pieces)[:-1]
    if all(b % 8 == 0 for b in bounds) and "_idiv(" not in source:
        assert not any(f"< {b})" in source or f"({b - 1} <" in source for b in bounds), source
    np.testing.assert_array_equal(out.numpy(), ref)
