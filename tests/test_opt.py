"""tgrad/opt/: opts are data on the Kernel, the heuristic picks them from a device's properties, and every
GPU emitter renders whatever opts it is given (checked against numpy with opts no default picks)."""
import dataclasses

import numpy as np
import pytest

from tests.conftest import open_or_skip
from tgrad import Tensor
from tgrad.device import get_runtime
from tgrad.dtype import dtypes
from tgrad.fuse import schedule
from tgrad.opt import DeviceProps, Opt, OptOps, find, optimize, upcasts
from tgrad.opt.heuristic import cstyle_opts, triton_opts

RNG = np.random.default_rng(0)


def kernel_of(t: Tensor):
    (it,) = [it for it in schedule([t.node])][-1:]
    return it.kernel


def numpy_tensor(shape) -> Tensor:
    return Tensor(RNG.standard_normal(shape).astype(np.float32), device="NUMPY")


def test_cstyle_opts_follow_the_device():
    row_sums = kernel_of(numpy_tensor((3, 1000)).sum(1))
    assert cstyle_opts(row_sums, DeviceProps("CL"), False) == (Opt(OptOps.GROUP, 128),)
    # a device whose work-groups hold 96 items gets groups of 64 (a fixed 128 used to raise DeviceError)
    assert cstyle_opts(row_sums, DeviceProps("CL", max_local=96), False) == (Opt(OptOps.GROUP, 64),)
    # more outputs than the device wants to cooperate on: one work-item each, within the device's limit
    few = DeviceProps("CL", group_max_outputs=2, preferred_local=128, max_local=32)
    assert cstyle_opts(row_sums, few, False) == (Opt(OptOps.LOCAL, 32),)

    matmul = kernel_of(numpy_tensor((8, 12)) @ numpy_tensor((12, 16)))
    tiled = cstyle_opts(matmul, DeviceProps("CL"), False)
    assert upcasts(tiled) == {1: 4, 0: 4} and find(tiled, OptOps.LOCAL) == 128
    assert upcasts(cstyle_opts(matmul, DeviceProps("CL", register_tiles=2), False)) == {1: 2, 0: 2}
    assert not upcasts(cstyle_opts(matmul, DeviceProps("WEBGPU", register_tiles=1), False))
    assert not upcasts(cstyle_opts(matmul, DeviceProps("CL"), True))  # NOOPT


def test_a_cpu_backed_device_cooperates_less():
    """A software adapter (lavapipe / llvmpipe: adapter type "CPU") runs a work-group's invocations as loops:
    float sums cooperate in groups sized for group_items invocations in all, other reductions only where
    the outputs are few; a GPU adapter keeps its groups of 256."""
    soft = DeviceProps("WEBGPU", group_size=256, group_max_outputs=8192, cpu_backed=True, group_items=4096)
    gpu = dataclasses.replace(soft, cpu_backed=False)
    rows = numpy_tensor((4096, 1024))
    assert cstyle_opts(kernel_of(rows.sum(1)), soft, False) == (Opt(OptOps.GROUP, 16),)
    assert cstyle_opts(kernel_of(rows[:64].sum(1)), soft, False) == (Opt(OptOps.GROUP, 64),)
    assert cstyle_opts(kernel_of(rows.sum()), soft, False) == (Opt(OptOps.GROUP, 256),)
    assert cstyle_opts(kernel_of(rows.max(1)), soft, False) == (Opt(OptOps.LOCAL, soft.preferred_local),)
    assert cstyle_opts(kernel_of(rows.max()), soft, False) == (Opt(OptOps.GROUP, 256),)
    for k in (rows.sum(1), rows.max(1), rows[:64].sum(1)):
        assert cstyle_opts(kernel_of(k), gpu, False) == (Opt(OptOps.GROUP, 256),)
    # short reductions never cooperate (a group over one element failed to render)
    assert cstyle_opts(kernel_of(numpy_tensor((3, 1)).max(1)), soft, False) == (Opt(OptOps.LOCAL, 128),)


def test_a_cpu_opencl_device_reduces_in_lanes():
    """An OpenCL device of type CPU (PoCL) runs a work-group's items one after another: a reduction gets
    one work-item per output with independent accumulators (LANES: 32 for a float sum, 8 for others, each
    on 8+ steps) in work-groups of at most outputs / compute units items, where a GPU-typed device
    cooperates in GROUPs or runs one accumulator per output; register tiles (a matmul) stay."""
    cpu = DeviceProps("CL", compute_units=2, max_local=4096, cpu_device=True)
    gpu = dataclasses.replace(cpu, cpu_device=False)
    rows = numpy_tensor((4096, 1024))
    lanes, eight = Opt(OptOps.LANES, 32), Opt(OptOps.LANES, 8)
    assert cstyle_opts(kernel_of(rows.sum()), cpu, False) == (lanes, Opt(OptOps.LOCAL, 1))
    assert cstyle_opts(kernel_of(rows.sum()), gpu, False) == (Opt(OptOps.GROUP, 128),)
    assert cstyle_opts(kernel_of(rows[:16].sum(1)), cpu, False) == (lanes, Opt(OptOps.LOCAL, 8))
    assert cstyle_opts(kernel_of(rows[:16].sum(1)), gpu, False) == (Opt(OptOps.GROUP, 128),)
    assert cstyle_opts(kernel_of(rows.max(1)), cpu, False) == (eight, Opt(OptOps.LOCAL, 128))
    assert cstyle_opts(kernel_of(rows.sum(1)), cpu, False) == (lanes, Opt(OptOps.LOCAL, 128))
    assert cstyle_opts(kernel_of(rows.max(1)), gpu, False) == (Opt(OptOps.LOCAL, 128),)
    # a lane per 8 steps of a short loop at most; none over one element
    four = (Opt(OptOps.LANES, 4), Opt(OptOps.LOCAL, 128))
    assert cstyle_opts(kernel_of(rows[:, :40].sum(1)), cpu, False) == four
    assert cstyle_opts(kernel_of(rows[:, :12].sum(1)), cpu, False) == (Opt(OptOps.LOCAL, 128),)
    assert cstyle_opts(kernel_of(rows[:, :1].sum(1)), cpu, False) == (Opt(OptOps.LOCAL, 128),)
    assert cstyle_opts(kernel_of(numpy_tensor((3, 0)).sum(1)), cpu, False) == (Opt(OptOps.LOCAL, 128),)
    # many outputs of a strided reduce (a column sum): one accumulator each; few: lanes
    assert cstyle_opts(kernel_of(numpy_tensor((256, 4096)).sum(0)), cpu, False) == (Opt(OptOps.LOCAL, 128),)
    assert cstyle_opts(kernel_of(rows[:, :16].sum(0)), cpu, False) == (lanes, Opt(OptOps.LOCAL, 8))
    matmul = kernel_of(numpy_tensor((64, 64)) @ numpy_tensor((64, 64)))
    assert cstyle_opts(matmul, cpu, False) == cstyle_opts(matmul, gpu, False)
    assert upcasts(cstyle_opts(matmul, cpu, False)) == {1: 4, 0: 4}
    # NOOPT: a float sum keeps a compensated form (LANES where a GPU groups), other reductions run plain
    assert cstyle_opts(kernel_of(rows.sum()), cpu, True) == (lanes, Opt(OptOps.LOCAL, 1))
    assert cstyle_opts(kernel_of(numpy_tensor((256, 4096)).max(0)), cpu, True) == (Opt(OptOps.LOCAL, 128),)


def test_opencl_props_say_cpu_device_from_the_device_type():
    open_or_skip("CL")
    rt = get_runtime("CL")
    assert rt.props.cpu_device == bool(rt.device.type & rt.cl.device_type.CPU)
    if "Portable Computing Language" in rt.device.platform.name:
        assert rt.props.cpu_device  # PoCL's devices here are CPUs


def test_webgpu_props_say_cpu_backed_from_the_adapter():
    from tgrad.runtime.webgpu import device_props

    limits = {"max-compute-invocations-per-workgroup": 1024, "max-compute-workgroups-per-dimension": 65535}
    soft = device_props(limits, {"adapter_type": "CPU", "device": "llvmpipe (LLVM 15.0.6, 256 bits)"})
    gpu = device_props(limits, {"adapter_type": "DiscreteGPU", "device": "NVIDIA H100"})
    assert soft.cpu_backed and soft.preferred_local == 256
    assert not gpu.cpu_backed and gpu.preferred_local == 64 and gpu.group_size == 256


def test_triton_split_follows_the_compute_units():
    channel_sums = kernel_of(numpy_tensor((32, 51200)).sum(1))  # 8 programs of 4 rows, 50 tiles each

    def split(units: int) -> int:
        return find(triton_opts(channel_sums, DeviceProps("CUDA", kind="triton", compute_units=units), False),
                    OptOps.SPLIT)

    # 4 programs per unit wanted: split in 8 shares (at most: each keeps 4+ tiles), 4, or not at all
    assert (split(128), split(8), split(2)) == (8, 4, 0)
    interpreted = DeviceProps("TRITON", kind="triton", compute_units=128, interpreted=True,
                              tile_elements=1 << 16)
    assert find(triton_opts(channel_sums, interpreted, False), OptOps.SPLIT) == 0


def test_opts_are_part_of_the_kernel():
    k = kernel_of(numpy_tensor((3, 1000)).sum(1))
    opt = optimize(k, DeviceProps("CL"))
    assert k.opts == () and opt.opts == (Opt(OptOps.GROUP, 128),)
    assert opt != k and hash(opt) != hash(k) and opt.with_opts(()) == k
    assert optimize(opt, DeviceProps("CL", max_local=64)) is opt  # a kernel with opts keeps them
    assert optimize(k, DeviceProps("CPU", kind="host")) is k  # host devices choose when they render


# what each device runs with, instead of its own properties: sizes no default picks
ODD = {
    "CL": dict(preferred_local=8, max_local=32, group_size=32, group_min_reduce=64, register_tiles=2,
               cpu_device=False),  # (PoCL's own: LANES, tested below)
    "WEBGPU": dict(preferred_local=16, max_local=32, group_size=32, group_min_reduce=64),
    # a GPU's block sizes run in the interpreter, and split reduces (the interpreter itself never splits)
    "TRITON": dict(interpreted=False, compute_units=4096, tile_elements=4096),
}
EXPECTED = {"CL": Opt(OptOps.GROUP, 32), "WEBGPU": Opt(OptOps.GROUP, 32), "TRITON": Opt(OptOps.SPLIT, 4)}


@pytest.mark.parametrize("device_name", list(ODD))
def test_emitters_render_the_opts_they_are_given(device_name, monkeypatch):
    open_or_skip(device_name)
    monkeypatch.setenv("DEVICE", device_name)
    device, rt = device_name, get_runtime(device_name)
    monkeypatch.setattr(rt, "props", dataclasses.replace(rt.props, **ODD[device]))
    monkeypatch.setattr(rt, "runners", {})  # compile again, with the new opts
    rendered, render = [], rt.render
    monkeypatch.setattr(rt, "render", lambda k: rendered.append(k.opts) or render(k))
    a = RNG.standard_normal((6, 300)).astype(np.float32)
    b = RNG.standard_normal((300, 12)).astype(np.float32)
    c = RNG.standard_normal((40, 24)).astype(np.float32)
    d = RNG.standard_normal((2, 20000)).astype(np.float32)
    x, y, z = Tensor(a), Tensor(b), Tensor(c)
    np.testing.assert_allclose(x.sum(1).numpy(), a.sum(1), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(Tensor(d).sum(1).numpy(), d.sum(1), rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose((x @ y).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    e = np.exp(c - c.max(1, keepdims=True))
    np.testing.assert_allclose(z.softmax(1).numpy(), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose((z * 2 + 1).relu().numpy(), np.maximum(c * 2 + 1, 0), rtol=1e-6)
    assert any(EXPECTED[device] in opts for opts in rendered), rendered  # the odd properties were used


def test_debug2_shows_the_opts(monkeypatch, capsys):
    open_or_skip("CL")
    import tgrad.device as device_module

    monkeypatch.setattr(device_module, "DEBUG", 2)
    a = RNG.standard_normal((5, 777)).astype(np.float32)
    np.testing.assert_allclose(Tensor(a, device="CL").sum(1).numpy(), a.sum(1), rtol=1e-5, atol=1e-4)
    want = "LANES(32) LOCAL(2)" if get_runtime("CL").props.cpu_device else "GROUP(128)"  # (PoCL: 2 units)
    assert want in capsys.readouterr().err


LANES_DEVICES = ["CL", "WEBGPU"]


@pytest.mark.parametrize("lanes", [32, 8, 4])
@pytest.mark.parametrize("device_name", LANES_DEVICES)
def test_lanes_reductions_match_numpy(device_name, lanes, monkeypatch):
    """The LANES form (forced on each C-style device that runs here, with an odd lane count too) against
    numpy: full and row sums with tails shorter than a step, several reduce axes, max, prod, bool and int
    reductions, a mean's epilogue, a float16 sum, and a long float32 sum as accurate as numpy's (within 2x
    its error in units of the result's last place, as test_launch_limits checks: a sum that cancels to a
    small result is measured in small units, where numpy's pairwise sum can be lucky and the GROUP form
    was measured 3x past it; WEBGPU's loop limit turns this sum's lanes into more lanes or a GROUP)."""
    open_or_skip(device_name)
    monkeypatch.setenv("DEVICE", device_name)
    rt = get_runtime(device_name)
    monkeypatch.setattr(rt, "props", dataclasses.replace(rt.props, cpu_device=True, sum_lanes=lanes,
                                                           reduce_lanes=lanes))
    monkeypatch.setattr(rt, "runners", {})  # compile again, with the new opts
    monkeypatch.setattr(rt, "optimized", {})
    rendered, render = [], rt.render
    monkeypatch.setattr(rt, "render", lambda k: rendered.append(k.opts) or render(k))
    a = RNG.standard_normal((5, 1003)).astype(np.float32)
    b = RNG.standard_normal((4, 30, 70)).astype(np.float32)
    c = RNG.standard_normal(2**20 + 3).astype(np.float32) + np.float32(1)  # (no cancellation: see below)
    x, y, z = Tensor(a), Tensor(b), Tensor(c)
    np.testing.assert_allclose(x.sum(1).numpy(), a.sum(1), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(x.sum().numpy(), a.sum(), rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(x.mean(1).numpy(), a.mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y.sum((1, 2)).numpy(), b.sum((1, 2)), rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(y.sum(1).numpy(), b.sum(1), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(x.max(1).numpy(), a.max(1))
    np.testing.assert_array_equal((-y).max((0, 2)).numpy(), (-b).max((0, 2)))
    np.testing.assert_allclose((x[:, :40] * 0.1 + 1).prod(1).numpy(), (a[:, :40] * 0.1 + 1).prod(1),
                               rtol=1e-5)
    np.testing.assert_array_equal((x > 3).any(1).numpy(), (a > 3).any(1))
    ints = (a * 100).astype(np.int32)
    np.testing.assert_array_equal(Tensor(ints).sum(1).numpy(), ints.sum(1))
    if rt.supports(dtypes.float16):
        h = a.astype(np.float16)
        np.testing.assert_allclose(Tensor(h).sum(1).numpy().astype(np.float32), h.astype(np.float32).sum(1),
                                   rtol=2e-3, atol=0.1)
    exact = c.astype(np.float64).sum()
    ulp = float(np.spacing(np.float32(abs(exact))))
    numpy_err = abs(float(c.sum()) - exact) / ulp
    assert abs(z.sum().item() - exact) / ulp <= 2 * max(numpy_err, 1.0)
    assert any(Opt(OptOps.LANES, lanes) in opts for opts in rendered), rendered


def test_lanes_render_for_metal(tmp_path):
    """Metal (nothing runs it here): a LANES reduction renders l accumulators, compensated for a long float
    sum, and passes clang's syntax check."""
    from tests.test_metal import syntax_check
    from tgrad.emit_opencl import METAL, render

    props = DeviceProps("METAL", cpu_device=True)
    k = optimize(kernel_of(numpy_tensor((6, 5000)).sum(1)), props)
    assert Opt(OptOps.LANES, 32) in k.opts
    src = render(k, METAL).source
    assert "acc_31" in src and "acc_31_c" in src and "acc_32" not in src
    m = optimize(kernel_of(numpy_tensor((6, 5000)).max(1)), props)
    proc = syntax_check([src, render(m, METAL, name="k1").source], tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_lanes_go_without_groups_and_tiles():
    k = kernel_of(numpy_tensor((6, 5000)).sum(1))
    from tgrad.emit_opencl import OPENCL, render
    from tgrad.errors import KernelError

    for other in (Opt(OptOps.GROUP, 16), Opt(OptOps.UNROLL, 2)):
        with pytest.raises(KernelError, match="LANES"):
            render(k.with_opts((Opt(OptOps.LANES, 4), other)), OPENCL)


def test_the_loop_limit_keeps_lanes_compensated():
    """On a device with a loop limit (Mesa's 65535 iterations) a lanes sum that passes it takes more lanes,
    then a GROUP: never a single uncompensated chain with an UNROLL."""
    from tests.test_launch_limits import LLVMPIPE
    from tgrad.opt import loop_iterations

    soft = dataclasses.replace(LLVMPIPE, cpu_device=True, sum_lanes=4)
    for n, want in [(2**20 + 3, (Opt(OptOps.LANES, 32), Opt(OptOps.LOCAL, 1))),
                    (2**26, (Opt(OptOps.GROUP, 1024), Opt(OptOps.UNROLL, 2)))]:
        k = optimize(kernel_of(Tensor.ones(n).sum()), soft, noopt=False)
        assert k.opts == want and loop_iterations(k) <= soft.max_loop
