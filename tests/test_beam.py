"""BEAM search over a kernel's opts (opt/search.py, tinygrad's BEAM=n): on every device the opts it picks
give numpy's values, a candidate with a wrong result is never picked however fast, the choice is read back
from disk, the time budget holds, BEAM=n reaches it through Runtime.optimize, and candidates stay within
the device's limits."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tgrad import Tensor
from tgrad.device import get_runtime
from tgrad.fuse import schedule
from tgrad.opt import DeviceProps, OptOps, find, loop_iterations, optimize, search
from tgrad.runtime.webgpu import MESA_MAX_LOOP, device_props

F32 = np.float32


def _kernel(t: Tensor):
    return schedule([t.node])[-1].kernel


def _run(rt, kernel, arrays: list[np.ndarray], size: int) -> np.ndarray:
    runner = rt.compile(rt.render(kernel), kernel)
    out = rt.alloc(size, kernel.out_dtype)
    runner(out, *[rt.from_numpy(a) for a in arrays])
    rt.synchronize()
    return rt.to_numpy(out)[:size]


CASES = {  # name: (inputs, graph, numpy's value)
    "matmul": ([(48, 40), (40, 24)], lambda a, b: a @ b, lambda a, b: a @ b),
    "row_sums": ([(16, 3000)], lambda x: x.sum(1), lambda x: x.sum(1)),
    "scale": ([(64, 100)], lambda x: x * 2 + 1, lambda x: x * 2 + 1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_searched_opts_give_numpys_values(device, case, tmp_path, monkeypatch):
    """The opts a 2-wide beam picks (within a 2 s budget) compute the kernel's numpy value on this device,
    and the choice is written to the cache folder."""
    if device == "NUMPY":
        pytest.skip("the NUMPY device evaluates graphs: no kernels, nothing to search")
    monkeypatch.setenv("BEAM_TIMEOUT_SEC", "2")
    rng = np.random.default_rng(0)
    shapes, graph, want = CASES[case]
    arrays = [rng.standard_normal(s).astype(F32) for s in shapes]
    kernel = _kernel(graph(*(Tensor(a, device=device) for a in arrays)))
    rt = get_runtime(device)
    searched = search.beam(optimize(kernel, rt.props), rt, 2, tmp_path)
    expected = want(*arrays).reshape(-1)
    got = _run(rt, searched, arrays, expected.size)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    (stored,) = (tmp_path / "beam").glob(f"{device}-*.json")
    assert [op for op, _, _ in json.loads(stored.read_text())] == [o.op.name for o in searched.opts]


def test_a_wrong_candidate_is_never_picked(monkeypatch, tmp_path):
    """Every candidate but the heuristic's is made to run instantly and write zeros: the search keeps the
    heuristic's opts (a wrong answer is never traded for speed)."""
    monkeypatch.setenv("BEAM_TIMEOUT_SEC", "5")
    rt = get_runtime("CPU")
    x = np.random.default_rng(1).standard_normal((64, 4096)).astype(F32)
    heuristic = optimize(_kernel(Tensor(x, device="CPU").sum(1)), rt.props)
    compile_ = type(rt).compile

    class Zeros:
        def __call__(self, out, *inputs):
            rt.to_numpy(out)[:] = 0

    def fake(self, program, kernel):
        return compile_(self, program, kernel) if kernel.opts == heuristic.opts else Zeros()

    # (on the class: undoing an instance attribute would leave the bound method on the instance, hiding
    # later patches of the class, as bench.kernel_capture's)
    monkeypatch.setattr(type(rt), "compile", fake)
    assert search.neighbours(heuristic, rt.props, heuristic.opts)  # there are others to try
    assert search.beam(heuristic, rt, 4, tmp_path).opts == heuristic.opts


def test_the_choice_is_read_back_from_disk(monkeypatch, tmp_path):
    """A kernel searched once is not timed again: its opts come from the cache folder (IGNORE_BEAM_CACHE=1
    searches again)."""
    monkeypatch.setenv("BEAM_TIMEOUT_SEC", "2")
    rt = get_runtime("CPU")
    x = np.random.default_rng(2).standard_normal((32, 2048)).astype(F32)
    heuristic = optimize(_kernel(Tensor(x, device="CPU").max(1)), rt.props)
    first = search.beam(heuristic, rt, 2, tmp_path)

    def no_timing(*args):
        raise AssertionError("timed again")

    monkeypatch.setattr(search._Bench, "time", no_timing)
    assert search.beam(heuristic, rt, 2, tmp_path).opts == first.opts
    monkeypatch.setenv("IGNORE_BEAM_CACHE", "1")
    with pytest.raises(AssertionError, match="timed again"):
        search.beam(heuristic, rt, 2, tmp_path)


def test_a_zero_budget_keeps_the_heuristic(monkeypatch, tmp_path):
    monkeypatch.setenv("BEAM_TIMEOUT_SEC", "0")
    rt = get_runtime("CPU")
    heuristic = optimize(_kernel(Tensor.ones(64, 64, device="CPU").sum(0)), rt.props)
    assert search.beam(heuristic, rt, 2, tmp_path).opts == heuristic.opts


def test_beam_env_goes_through_runtime_optimize(monkeypatch):
    """BEAM=n makes Runtime.optimize search (once per kernel); the values are numpy's."""
    calls = []
    real = search.beam

    def spy(kernel, runtime, width, cache):
        calls.append(width)
        return real(kernel, runtime, width, cache)

    monkeypatch.setattr(search, "beam", spy)
    monkeypatch.setenv("BEAM", "3")
    monkeypatch.setenv("BEAM_TIMEOUT_SEC", "1")
    x = np.random.default_rng(3).standard_normal((8, 515)).astype(F32)
    out = Tensor(x, device="CPU").exp().sum(1)
    np.testing.assert_allclose(out.numpy(), np.exp(x).sum(1), rtol=1e-5)
    assert calls and set(calls) == {3}


def test_candidates_stay_within_the_devices_limits():
    """C-style candidates on a device with a loop limit (Mesa's) all keep under it; Triton candidates keep
    their tile within the device's tile size; the CPU's are the HostTuning variants' opts."""
    llvmpipe = device_props({"max-compute-invocations-per-workgroup": 256,
                             "max-compute-workgroups-per-dimension": 65535}, {"device": "llvmpipe"})
    kernel = _kernel(Tensor.ones(4, 300000, device="CPU").sum(1))
    start = optimize(kernel, llvmpipe)
    cands = search.neighbours(kernel, llvmpipe, start.opts)
    assert cands and all(loop_iterations(kernel, c) <= MESA_MAX_LOOP for c in cands)
    assert all(find(c, OptOps.GROUP) <= 256 and find(c, OptOps.LOCAL) <= 256 for c in cands)
    triton = DeviceProps("T", kind="triton", tile_elements=4096)
    start = optimize(kernel, triton)
    for cand in search.neighbours(kernel, triton, start.opts):
        assert find(cand, OptOps.LOCAL, 1) * find(cand, OptOps.REDUCE, 1) <= 4096, cand
    cpu = get_runtime("CPU").props
    assert all(isinstance(c, tuple) for c in search.neighbours(kernel, cpu, optimize(kernel, cpu).opts))


def test_candidates_never_sum_less_accurately():
    """A float sum the heuristic gives a (Kahan-compensated) GROUP or LANES keeps a group or lanes in every
    candidate; a full float sum the CPU threads (in blocks) stays threaded; an int sum may drop its group."""
    cl = DeviceProps("C", max_local=1024)
    floats = _kernel(Tensor.ones(1 << 20, device="CPU").sum())
    start = optimize(floats, cl)
    assert find(start.opts, OptOps.GROUP)

    def compensated(opts) -> bool:
        return bool(find(opts, OptOps.GROUP) or find(opts, OptOps.LANES))

    cands = search.neighbours(floats, cl, start.opts)
    assert all(compensated(c) for c in cands) and any(find(c, OptOps.LANES) for c in cands)
    pocl = DeviceProps("CL", max_local=4096, cpu_device=True)
    lanes = optimize(floats, pocl).opts
    assert find(lanes, OptOps.LANES) == 32
    cands = search.neighbours(floats, pocl, lanes)
    assert all(compensated(c) for c in cands) and any(find(c, OptOps.GROUP) for c in cands)
    ints = _kernel(Tensor.ones(1 << 20, device="CPU", dtype="int32").sum())
    assert any(not find(c, OptOps.GROUP) for c in search.neighbours(ints, cl, optimize(ints, cl).opts))
    cpu = get_runtime("CPU").props
    assert find(optimize(floats, cpu).opts, OptOps.THREADS)
    assert all(find(c, OptOps.THREADS) for c in search.neighbours(floats, cpu, ()))
