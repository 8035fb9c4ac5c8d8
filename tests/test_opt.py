"""tgrad/opt/: opts are data on the Kernel, the heuristic picks them from a device's properties, and every
GPU emitter renders whatever opts it is given (checked against numpy with opts no default picks)."""
import dataclasses

import numpy as np
import pytest

from tests.conftest import open_or_skip
from tgrad import Tensor
from tgrad.device import get_runtime
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
    want = "LANES(8) LOCAL(2)" if get_runtime("CL").props.cpu_device else "GROUP(128)"  # (PoCL: 2 units)
    assert want in capsys.readouterr().err
