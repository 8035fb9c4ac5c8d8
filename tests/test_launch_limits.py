"""Launch limits (issue 46, items 1 and 3): sizes at and around each device limit give numpy's answers, a
launch that cannot fit raises a KernelError naming the limit, and float32 sums are as accurate as numpy's.

The limits: WebGPU's 65535 work-groups per dispatch dimension (one-per-output kernels of 64 invocations),
Mesa llvmpipe's 65535 loop iterations per invocation (a group reduction of 256 work-items passes it at
256 * 65524 elements), the 2^24 float32 boundary and WebGPU's 128 MiB storage binding (2^25 float32).
"""

import math

import numpy as np
import pytest

from tests.conftest import open_or_skip
from tgrad import Tensor, emit_triton
from tgrad.device import get_runtime
from tgrad.dtype import dtypes
from tgrad.emit_wgsl import dispatch_size
from tgrad.errors import DeviceError, KernelError
from tgrad.fuse import Expr, Kernel, const, schedule
from tgrad.opt import DeviceProps, Opt, OptOps, find, fit_loops, loop_iterations, optimize
from tgrad.runtime.webgpu import MESA_MAX_LOOP, device_props

LLVMPIPE = device_props({"max-compute-invocations-per-workgroup": 1024,
                         "max-compute-workgroups-per-dimension": 65535},
                        {"device": "llvmpipe (LLVM 15.0.6, 256 bits)"})
LOOP_EDGE = 256 * (MESA_MAX_LOOP - 1 - 9)  # the longest reduce a GROUP(256) runs within the loop limit
SIZES = [2**16 - 1, 2**16, 2**16 + 1, 65535 * 64 - 1, 65535 * 64 + 1, LOOP_EDGE, LOOP_EDGE + 1,
         65535 * 256 + 1, 2**24 + 1, 2**25]
# the sizes at WEBGPU's limits (65535 workgroups of 64 or 256, Mesa's loop limit, the 128 MiB binding of
# 2**25 float32): Triton's interpreter, which runs each program in Python, skips them (its own edges, a
# tile of 2**16 and float32's 2**24, stay)
WEBGPU_EDGES = {65535 * 64 - 1, 65535 * 64 + 1, LOOP_EDGE, LOOP_EDGE + 1, 65535 * 256 + 1, 2**25}


def _interpreted(device: str) -> bool:
    return device == "TRITON" and get_runtime(device).props.interpreted


def kernel_of(t: Tensor):
    (item,) = schedule([t.node])
    return item.kernel


@pytest.mark.parametrize("n", SIZES)
def test_full_reductions_at_the_limits(device, n):
    if n in WEBGPU_EDGES and _interpreted(device):
        pytest.skip("a WEBGPU limit, slow in Triton's interpreter; TRITON keeps its own edges")
    ones = Tensor(np.ones(n, np.float32), device=device)
    assert ones.sum().item() == np.ones(n, np.float32).sum()
    assert ones.mean().item() == pytest.approx(1.0, rel=1e-6)
    peak = np.zeros(n, np.float32)
    peak[n - 2] = 3.0  # the largest value near the end: a loop stopped early misses it
    peak[n // 3] = 2.0
    t = Tensor(peak, device=device)
    assert t.max().item() == 3.0
    assert t.argmax().item() == n - 2


@pytest.mark.parametrize("n", [65535 * 64 - 1, 65535 * 64 + 1, 2**24 + 1, 2**25])
def test_elementwise_at_the_limits(device, n):
    if n in WEBGPU_EDGES and _interpreted(device):
        pytest.skip("a WEBGPU limit, slow in Triton's interpreter; TRITON keeps its own edges")
    x = (np.arange(n) % 1000).astype(np.float32)
    got = (Tensor(x, device=device) * 2 + 1).numpy()
    np.testing.assert_array_equal(got, x * 2 + 1)


def test_row_reductions_long_rows_and_many_rows(device):
    rng = np.random.default_rng(1)
    long_rows = rng.integers(0, 4, size=(3, 2**23 + 5)).astype(np.float32)
    np.testing.assert_array_equal(Tensor(long_rows, device=device).sum(1).numpy(), long_rows.sum(1))
    np.testing.assert_array_equal(Tensor(long_rows, device=device).argmax(1).numpy(), long_rows.argmax(1))
    many = rng.integers(0, 4, size=(70000, 300)).astype(np.float32)
    np.testing.assert_array_equal(Tensor(many, device=device).sum(1).numpy(), many.sum(1))


def test_many_rows_each_past_the_loop_limit(device):
    if _interpreted(device):
        pytest.skip("6e8 elements take minutes in Triton's interpreter; the limit tested is WEBGPU's")
    # 9000 rows (one work-item each on WEBGPU) of 70000: more loop iterations than llvmpipe allows unrolled
    row = (np.arange(70000) % 7).astype(np.float32)
    scale = np.arange(9000, dtype=np.float32).reshape(9000, 1) % 5
    got = (Tensor(row, device=device).reshape(1, 70000).expand(9000, 70000) * Tensor(scale, device=device))
    np.testing.assert_array_equal(got.sum(1).numpy(), (row.sum() * scale[:, 0]).astype(np.float32))


def test_a_sum_past_the_biggest_work_group_unrolls(device):
    """3 * 2^26 elements (a broadcast view: little memory) in one sum: on llvmpipe even 1024 work-items
    would each loop past the limit, so their loop takes 4 steps an iteration (GROUP(1024), UNROLL(4))."""
    if _interpreted(device):
        pytest.skip("2e8 elements take most of a minute in Triton's interpreter (the limit is WEBGPU's)")
    half = Tensor(np.full(3, 0.5, np.float32), device=device)
    total = half.reshape(3, 1).expand(3, 2**26).reshape(3 * 2**26).sum()
    assert optimize(kernel_of(total), LLVMPIPE, noopt=False).opts == (Opt(OptOps.GROUP, 1024),
                                                                      Opt(OptOps.UNROLL, 4))
    assert total.item() == np.float32(3 * 2**26 * 0.5)


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_float32_sum_is_as_accurate_as_numpy(device, offset):
    """A full float32 sum of 2^24 values is within 2x numpy's (pairwise) error against a float64 sum, in
    units in the last place of the result (at least 1: numpy may round exactly)."""
    x = np.random.default_rng(0).standard_normal(1 << 24, dtype=np.float32) + np.float32(offset)
    exact = x.astype(np.float64).sum()
    ulp = float(np.spacing(np.float32(abs(exact))))
    numpy_err = abs(float(x.sum()) - exact) / ulp
    got = Tensor(x, device=device).sum().item()
    assert abs(got - exact) / ulp <= 2 * max(numpy_err, 1.0)


@pytest.mark.parametrize("specials", [(np.inf,), (-np.inf,), (np.inf, -np.inf), (np.nan,), (3e38, 3e38)])
def test_compensated_sums_keep_inf_and_nan(device, specials):
    """Long sums (compensated per work-item or lane) with an inf, a nan or an overflow are numpy's."""
    x = np.ones(2**17 + 3, np.float32)
    x[5 : 5 + 2 * len(specials) : 2] = specials
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.sum()
    got = Tensor(x, device=device).sum().item()
    assert got == want or (np.isnan(got) and np.isnan(want))


# --- the optimizer and the launch (no device needed) -------------------------------------------------


@pytest.mark.parametrize("n", [LOOP_EDGE, LOOP_EDGE + 1, 2**25, 2**29, 1024 * 16 * MESA_MAX_LOOP // 2])
def test_the_heuristic_keeps_reductions_within_the_loop_limit(n):
    k = optimize(kernel_of(Tensor.ones(n).sum()), LLVMPIPE, noopt=False)
    assert loop_iterations(k) <= MESA_MAX_LOOP
    group = next(o.arg for o in k.opts if o.op is OptOps.GROUP)
    assert group == 256 if n <= LOOP_EDGE else group > 256
    # a reduce over many rows (no GROUP) unrolls its loop
    rows = optimize(kernel_of(Tensor.ones(1, 70000).expand(9000, 70000).sum(1)), LLVMPIPE, noopt=False)
    assert rows.opts[-1] == Opt(OptOps.UNROLL, 2) and loop_iterations(rows) <= MESA_MAX_LOOP


def test_loop_iterations_counts_nested_loops_and_the_tree():
    k = kernel_of(Tensor.ones(5, 300, 400).sum((1, 2)))
    assert loop_iterations(k, ()) == 301 + 300 * 401
    assert loop_iterations(k, (Opt(OptOps.UNROLL, 4),)) == 301 + 300 * 101
    assert loop_iterations(k, (Opt(OptOps.GROUP, 256),)) == math.ceil(120000 / 256) + 1 + 9


def test_an_impossible_launch_raises_a_clear_error():
    tiny = DeviceProps("TINY", max_local=4, group_size=4, max_loop=100)
    k = kernel_of(Tensor.ones(10**6).sum())
    with pytest.raises(KernelError, match=r"at most 100 \(max_loop"):
        fit_loops(k, tiny, (Opt(OptOps.GROUP, 4),))
    with pytest.raises(KernelError, match="max_loop"):
        optimize(k, tiny, noopt=False)
    # within the limit the opts are kept; a bigger limit is met with bigger groups and unrolled loops
    assert fit_loops(k, DeviceProps("BIG"), (Opt(OptOps.GROUP, 4),)) == (Opt(OptOps.GROUP, 4),)
    fitted = fit_loops(k, DeviceProps("SMALL", max_local=64, max_loop=2000), (Opt(OptOps.GROUP, 4),))
    assert loop_iterations(k, fitted) <= 2000


def test_unrolls_stop_at_the_devices_max_unroll():
    """fit_loops unrolls a reduce loop by powers of two up to the device's `max_unroll`, then groups."""
    k = kernel_of(Tensor.ones(1, 70000).expand(9000, 70000).sum(1))
    for most in (16, 4):
        props = DeviceProps("SMALL", max_local=64, max_loop=10000, max_unroll=most)
        fitted = fit_loops(k, props, ())
        assert find(fitted, OptOps.UNROLL, 1) <= most and loop_iterations(k, fitted) <= 10000
    assert find(fit_loops(k, DeviceProps("A", max_loop=10000, max_unroll=4), ()), OptOps.GROUP)
    assert not find(fit_loops(k, DeviceProps("B", max_loop=10000, max_unroll=16), ()), OptOps.GROUP)


def test_webgpu_dispatch_and_binding_limits(device):
    assert dispatch_size(65535, 65535) == (65535, 1, 1)
    assert dispatch_size(65536, 65535) == (65535, 2, 1)
    with pytest.raises(KernelError, match="workgroups"):
        dispatch_size(65535**2 + 1, 65535)
    if device != "WEBGPU":
        return
    with pytest.raises(DeviceError, match="binds"):  # 2^25 + 1 float32: past the 128 MiB binding
        Tensor(np.ones(2**25 + 1, np.float32), device=device).sum().item()


def test_triton_grids_past_cuda_limits_raise():
    props = DeviceProps("TRITON", kind="triton")
    rows = kernel_of(Tensor.ones(2**31, 2).sum(1))  # one program per output: 2^31 programs
    with pytest.raises(KernelError, match="2147483647"):
        emit_triton.render(optimize(rows, props, noopt=True))
    assert emit_triton.render(optimize(rows, props, noopt=False)).global_size[0] <= emit_triton.GRID_X_MAX


def test_triton_casts_of_integer_constants_in_index_arithmetic():
    """out[i] = i + int64(1): the cast of the constant is rendered as a tensor cast (it was `1.to(...)`)."""
    open_or_skip("TRITON")
    i = Expr("IDX", (), (0, 8), dtypes.int64)
    one = Expr("CAST", (const(1, dtypes.int32),), dtypes.int64, dtypes.int64)
    k = Kernel("e_cast", (8,), 1, None, None, Expr("ADD", (i, one), None, dtypes.int64), i, dtypes.int64, ())
    rt = get_runtime("TRITON")
    out = rt.alloc(8, dtypes.int64)
    rt.runner(k)(out)
    np.testing.assert_array_equal(rt.to_numpy(out), np.arange(8) + 1)
