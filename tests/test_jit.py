"""TinyJit: replays match PyTorch on a training step, outputs stay valid, misuse raises JitError."""

import numpy as np
import pytest
import torch
import torch._dynamo  # noqa: F401  (loads triton's LLVM before a WEBGPU test loads Mesa's; see report)

from tgrad import Tensor
from tgrad.device import Stats, get_runtime
from tgrad.dtype import dtypes
from tgrad.errors import JitError
from tgrad.jit import TinyJit
from tgrad.nn import Linear
from tgrad.nn.optim import SGD, Adam
from tgrad.opt.opts import HostTuning
from tgrad.realize import HostStep

RNG = np.random.default_rng(0)
X = RNG.standard_normal((64, 5)).astype(np.float32)
Y = RNG.integers(0, 3, 64).astype(np.int32)
A = RNG.standard_normal((3, 4)).astype(np.float32)


def test_training_step_matches_torch_for_50_steps():
    Tensor.manual_seed(0)
    l1, l2 = Linear(5, 7), Linear(7, 3)
    params = [l1.weight, l1.bias, l2.weight, l2.bias]
    t1, t2 = torch.nn.Linear(5, 7), torch.nn.Linear(7, 3)
    with torch.no_grad():
        for a, b in zip(params, [t1.weight, t1.bias, t2.weight, t2.bias]):
            b[...] = torch.tensor(a.numpy())
    opt = Adam(params, lr=0.01)
    topt = torch.optim.Adam([t1.weight, t1.bias, t2.weight, t2.bias], lr=0.01)
    calls = []

    @TinyJit
    def step(x, y):
        calls.append(1)
        opt.zero_grad()
        loss = l2(l1(x).relu()).cross_entropy(y)
        loss.backward()
        opt.step(loss)
        return loss

    xs, ys = Tensor(X), Tensor(Y)
    losses = []
    for i in range(50):
        lo = (i * 8) % 64
        losses.append(step(xs[lo : lo + 8], ys[lo : lo + 8]))  # view inputs are copied to buffers
        topt.zero_grad()
        tl = torch.nn.functional.cross_entropy(
            t2(t1(torch.tensor(X[lo : lo + 8])).relu()), torch.tensor(Y[lo : lo + 8]).long()
        )
        tl.backward()
        topt.step()
        np.testing.assert_allclose(losses[-1].item(), tl.item(), rtol=1e-4, atol=1e-5)
    assert len(calls) == 2  # the Python function ran for call 1 and the capture only
    # earlier returned losses still hold their own values
    assert len({round(float(v.item()), 7) for v in losses}) > 40
    np.testing.assert_allclose(l1.weight.numpy(), t1.weight.detach().numpy(), rtol=1e-3, atol=1e-5)


def test_cross_entropy_step_captures_on_the_second_call_whatever_ran_before():
    """cross_entropy's class positions are a buffer tgrad makes once (ops.losses._arange_buffer): made inside
    the first call, it was host data of that call only, the second call differed, and the capture waited
    for a third (a test passed or failed by what ran before it)."""
    from tgrad.ops import losses

    losses._ARANGES.clear()
    w = Tensor(RNG.standard_normal((5, 11)).astype(np.float32), requires_grad=True)
    opt = SGD([w], lr=0.1)
    calls = []

    @TinyJit
    def step(x, y):
        calls.append(1)
        opt.zero_grad()
        loss = (x @ w).cross_entropy(y)
        loss.backward()
        opt.step()
        return loss

    x, y = RNG.standard_normal((8, 5)).astype(np.float32), RNG.integers(0, 11, 8)
    tw = torch.tensor(w.numpy(), requires_grad=True)
    for _ in range(4):
        loss = step(Tensor(x), Tensor(y))
        tloss = torch.nn.functional.cross_entropy(torch.tensor(x) @ tw, torch.tensor(y))
        tloss.backward()
        with torch.no_grad():
            tw -= 0.1 * tw.grad
        tw.grad = None
        np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5, atol=1e-6)
    assert len(calls) == 2


def _chain(x, w):
    """Six matmuls in a row: each intermediate (16, 16) is dead after the next kernel reads it."""
    h = x
    for _ in range(6):
        h = (h @ w).relu() + 0.5  # (relu and + fuse into the matmul's epilogue or the next kernel)
    return h.sum(0)


def _buffers(jit: TinyJit) -> int:
    return len({id(out) for _, out, _ in jit.captured} | {id(b) for *_, ins in jit.captured for b in ins})


def test_replays_reuse_the_memory_of_dead_intermediates(device):
    """Memory planning (jit._plan, at the first replay): intermediates whose lives do not overlap share a
    buffer; every replay's values as numpy's."""
    if get_runtime(device).evaluates_graphs:
        pytest.skip("the NUMPY reference runs the function at every call: nothing is captured")
    w = RNG.standard_normal((16, 16)).astype(np.float32) / 4
    f = TinyJit(lambda x, w: _chain(x, w))
    ref = lambda x: _chain_numpy(x, w)  # noqa: E731
    for i in range(5):
        x = RNG.standard_normal((16, 16)).astype(np.float32)
        if i == 2:
            before = _buffers(f)
        np.testing.assert_allclose(f(Tensor(x, device=device), Tensor(w, device=device)).numpy(), ref(x),
                                   rtol=1e-4, atol=1e-4)
    assert _buffers(f) < before, (before, _buffers(f))


def _chain_numpy(x, w):
    h = x.astype(np.float64)
    for _ in range(6):
        h = np.maximum(h @ w, 0) + 0.5
    return h.sum(0)


def test_replay_uses_new_inputs_and_keeps_old_outputs():
    f = TinyJit(lambda a, b: (a @ b).relu() * 2)
    outs, refs = [], []
    for _ in range(4):
        b = RNG.standard_normal((4, 2)).astype(np.float32)
        outs.append(f(Tensor(A), Tensor(b)))
        refs.append(np.maximum(A @ b, 0) * 2)
    assert f.cnt == 2 and len(f.captured) >= 1
    for out, ref in zip(outs, refs):
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-6)


def test_replay_runs_the_captured_kernels_only():
    f = TinyJit(lambda a: (a + 1).sum())
    for _ in range(2):
        f(Tensor(A))
    before = Stats.kernels_run
    out = f(Tensor(A * 3))
    assert Stats.kernels_run - before == len(f.captured)
    np.testing.assert_allclose(out.item(), (A * 3 + 1).sum(), rtol=1e-5)


def test_nested_structures_and_constants_returned():
    f = TinyJit(lambda a: {"double": a * 2, "pair": (a + 1, "tag")})
    for i in range(3):
        out = f(Tensor(A + i))
        np.testing.assert_allclose(out["double"].numpy(), (A + i) * 2)
        np.testing.assert_allclose(out["pair"][0].numpy(), A + i + 1)
        assert out["pair"][1] == "tag"


def test_jit_on_every_device(device):
    f = TinyJit(lambda a, b: a * b + 1)
    for i in range(3):
        np.testing.assert_allclose(f(Tensor(A), Tensor(A + i)).numpy(), A * (A + i) + 1, rtol=1e-6)


def test_replays_return_empty_tensors(device):
    """A replay whose outputs are empty gives empty arrays as numpy does (the replay's fresh output of no
    elements was allocated with one and could not be read back as shape (0, 0))."""
    f = TinyJit(lambda a, b: ((a * 2 + b).exp().sum(0), a @ b.T))
    for _ in range(4):
        a, b = RNG.standard_normal((0, 5)).astype(np.float32), RNG.standard_normal((0, 5)).astype(np.float32)
        s, m = f(Tensor(a), Tensor(b))
        np.testing.assert_array_equal(s.numpy(), np.exp(a * 2 + b).sum(0))
        assert m.numpy().shape == (a @ b.T).shape == (0, 0)
    assert f.replays >= 2 or device == "NUMPY"  # (the NUMPY reference evaluates graphs: nothing to replay)


def test_a_returned_reshape_of_a_new_buffer_is_not_copied(device):
    """A matmul's result is a reshape of the buffer its kernel wrote: returned as that buffer (no copy
    kernel), a fresh one at every replay, so an earlier call's result keeps its value."""
    f = TinyJit(lambda a, b: a @ b.T)
    b = RNG.standard_normal((4, 5)).astype(np.float32)
    xs = [RNG.standard_normal((3, 5)).astype(np.float32) for _ in range(5)]
    outs = [f(Tensor(x), Tensor(b)) for x in xs]
    for x, out in zip(xs, outs):
        np.testing.assert_allclose(out.numpy(), x @ b.T, rtol=1e-5, atol=1e-6)
    if device != "NUMPY":  # (the NUMPY reference evaluates graphs: nothing captured)
        assert f.replays == 3 and len(f.kernel_names) == 1, f.kernel_names


def _captured(fn):
    f = TinyJit(fn)
    f(Tensor(A))
    f(Tensor(A))
    return f


def _host(name: str, fn, shape: tuple, key=None) -> HostStep:
    """A host step with one output of `shape` (float32) on the default device."""
    return HostStep(name, fn, [(shape, dtypes.float32)], Tensor([0.0]).device, key=key)


def test_host_steps_replay_in_order_between_kernels(device):
    calls = []

    def times10(ins, outs):
        calls.append(("times10", ins[0].copy()))
        outs[0][...] = ins[0] * 10

    def minus5(ins, outs):
        calls.append(("minus5", ins[0].copy()))
        outs[0][...] = ins[0] - 5

    @TinyJit
    def f(x):
        (y,) = Tensor.run_host(_host("times10", times10, x.shape), x + 1)
        (w,) = Tensor.run_host(_host("minus5", minus5, x.shape), y * 3)
        return w + 1, y

    outs = []
    for i in range(5):
        before = Stats.kernels_run
        outs.append(f(Tensor(A + i)))
        kernels = Stats.kernels_run - before
    if device != "NUMPY":  # the reference device has no kernels: there the function always runs
        assert f.replays == 3 and f.kernel_names and kernels == len(f.kernel_names)
    assert [name for name, _ in calls] == ["times10", "minus5"] * 5  # each call runs both, in order
    for i, (w, y) in enumerate(outs):  # a replay's host steps read that call's values
        np.testing.assert_allclose(calls[2 * i][1], A + i + 1, rtol=1e-6)
        np.testing.assert_allclose(y.numpy(), (A + i + 1) * 10, rtol=1e-6)
        np.testing.assert_allclose(w.numpy(), (A + i + 1) * 30 - 4, rtol=1e-5)


def test_host_step_output_kept_by_rebinding_is_an_error():
    def copy(ins, outs):
        outs[0][...] = ins[0]

    class Ema:
        def __init__(self):
            self.h = Tensor.zeros(3, 4).realize()

        @TinyJit
        def update(self, x):  # rebinding to a host step's output: a replay would read call 1's forever
            (self.h,) = Tensor.run_host(_host("copy", copy, (3, 4)), self.h * 0.9 + x)
            return self.h

    e = Ema()
    with pytest.raises(JitError, match=r"Python kept .* assign\(\)"):
        for _ in range(4):
            e.update(Tensor(A))


def test_host_step_with_a_changing_key_is_not_frozen():
    counter = iter(range(100))

    def copy(ins, outs):
        outs[0][...] = ins[0]

    f = TinyJit(lambda a: Tensor.run_host(_host("copy", copy, a.shape, key=next(counter)), a * 2)[0])
    with pytest.raises(JitError, match="host step copy"):
        for _ in range(5):
            f(Tensor(A))


def test_error_non_tensor_output_changes():
    counter = iter(range(10))
    f = TinyJit(lambda a: (a * 2, next(counter)))
    with pytest.raises(JitError, match=r"non-Tensor return values \(\[2\] -> \[3\]\)"):
        for _ in range(5):
            f(Tensor(A))


def test_error_no_kernels():
    f = TinyJit(lambda a: a)
    f(Tensor(A))
    with pytest.raises(JitError, match="captured no kernels"):
        f(Tensor(A))


def test_error_numpy_inside():
    f = TinyJit(lambda a: (a * 2).numpy())
    with pytest.raises(JitError, match=r"\.numpy\(\)"):
        f(Tensor(A))
    np.testing.assert_allclose(Tensor(A).numpy(), A)  # .numpy() works again outside


def test_lazy_tensor_returned_after_step_keeps_its_value():
    """A tensor built before opt.step() inside the function and returned (not what backward() ran from)
    has the value at the weights it was built on, as in PyTorch: the step computes it before it overwrites
    w, at capture and on every replay."""
    w = Tensor(np.ones((4, 2), np.float32), requires_grad=True)
    opt = Adam([w], lr=0.1)
    tw = torch.ones((4, 2), requires_grad=True)
    topt = torch.optim.Adam([tw], lr=0.1)

    def step(x, w, opt):
        opt.zero_grad()
        loss = (x @ w).sum()
        other = (w * w * 3).sum()  # not what backward() ran from
        loss.backward()
        opt.step()
        return other

    jitted = TinyJit(step)
    for i in range(5):
        got = jitted(Tensor(A + i), w, opt).item()
        np.testing.assert_allclose(got, step(torch.tensor(A + i), tw, topt).item(), rtol=1e-5)


def test_nested_jit_inner_is_captured_by_outer():
    inner = TinyJit(lambda a: a + 1)
    outer = TinyJit(lambda a: inner(a) * 3)
    for i in range(4):
        np.testing.assert_allclose(outer(Tensor(A + i)).numpy(), (A + i + 1) * 3, rtol=1e-6)


def test_reset_recaptures_for_new_shapes():
    f = _captured(lambda a: a.sum(0))
    f.reset()
    b = RNG.standard_normal((5, 2)).astype(np.float32)
    for _ in range(3):
        np.testing.assert_allclose(f(Tensor(b)).numpy(), b.sum(0), rtol=1e-5)


def test_jit_overhead_bench_runs():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "bench/jit_overhead.py", "--n", "16", "--calls", "3"],
        capture_output=True, text=True, cwd=root, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 6 and all(float(r.split("|")[2]) > 0 for r in rows), proc.stdout


def test_a_step_whose_gradient_does_not_change_is_captured(device):
    """loss = (p * g).sum() with g fixed: the gradient graph is the same each call. A node realized in one
    call must not be handed back by the next call's graph (hash-consing): its kernel would run in call 1 and
    not in call 2, and TinyJit refused the step ("calls ... differed in the kernels they ran"). Values as
    torch.optim.Adam's."""
    from tgrad.nn.optim import Adam

    rng = np.random.default_rng(11)
    p0, g0 = rng.standard_normal((2, 500)).astype(np.float32), rng.standard_normal(500).astype(np.float32)
    ps = [Tensor(p0[i], requires_grad=True).realize() for i in range(2)]
    g = Tensor(g0).realize()
    opt = Adam(ps, lr=1e-2)

    @TinyJit
    def step():
        opt.zero_grad()
        loss = (ps[0] * g).sum() + (ps[1] * g).sum()
        loss.backward()
        opt.step(loss)
        return loss

    for _ in range(6):
        step()
    tps = [torch.tensor(p0[i], requires_grad=True) for i in range(2)]
    topt = torch.optim.Adam(tps, lr=1e-2)
    for _ in range(6):
        topt.zero_grad()
        ((tps[0] * torch.from_numpy(g0)).sum() + (tps[1] * torch.from_numpy(g0)).sum()).backward()
        topt.step()
    for a, b in zip(ps, tps):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6)


def _batch_step(x, w, b, w2):
    """Serial and threaded kernels, a matmul with an epilogue (the bias: run from Python), a plain matmul
    (a gemm record), reduces, returned tensors."""
    h = (x * 2 + 1).relu()  # threaded elementwise (2**20 elements)
    s = h.sum(1, keepdim=True)  # a reduce over rows
    y = (h / (s + 1)) @ w + b
    z = y @ w2
    return (y.exp() * 0.5).sum(0), z.sum(0), s


def _batch_ref(x, w, b, w2):
    h = np.maximum(x.astype(np.float64) * 2 + 1, 0)
    s = h.sum(1, keepdims=True)
    y = (h / (s + 1)) @ w + b
    return (np.exp(y) * 0.5).sum(0), (y @ w2).sum(0), s


@pytest.mark.parametrize("workers_busy", [False, True])
def test_cpu_replay_runs_its_compiled_functions_in_one_native_call(monkeypatch, workers_busy):
    """On the CPU, a replay runs each run of compiled functions and plain matmuls as one native call
    (Runtime.batch, runtime/cpu/batch.py): new inputs, new outputs and a matmul with an epilogue run from
    Python between the runs are right on every call, as without batching; with the native workers busy
    (another thread holds them) the batch's launches run one by one, same values."""
    from tgrad import jit
    from tgrad.runtime.cpu import batch as cpu_batch
    from tgrad.runtime.cpu import pool as cpu_pool
    from tgrad.runtime.cpu import threads as cpu_threads

    if not cpu_threads.enabled():
        pytest.skip("native workers: Linux x86-64 only, not with TGRAD_NATIVE_THREADS=0")
    monkeypatch.setenv("TGRAD_THREADS", "2")
    f = TinyJit(_batch_step)
    rng = np.random.default_rng(5)
    params = [rng.standard_normal(s).astype(np.float32) * 0.01 for s in ((1024, 8), (8,), (8, 64))]
    tparams = [Tensor(p, device="CPU") for p in params]
    outs = []
    pool = cpu_threads.pool(cpu_pool.threads() - 1, HostTuning().spin_cycles)
    for i in range(5):
        x = rng.standard_normal((1024, 1024)).astype(np.float32)
        if workers_busy and i >= 2:
            pool.lock.acquire()
        try:
            outs.append((f(Tensor(x, device="CPU"), *tparams), _batch_ref(x, *params)))
        finally:
            if workers_busy and i >= 2:
                pool.lock.release()
    variant = f._last
    batches = [s for s in variant.steps if isinstance(s, cpu_batch.Batch)]
    parts = [p for b in batches for p in b.parts]
    assert any(p[0] == "call" for p in parts)  # (the matmul with the bias, from Python)
    runs = [p for p in parts if p[0] == "run"]
    assert any(launch[0].name.startswith("r_") and "blas" in launch[0].program.launch
               for p in runs for launch in p[3])  # (the plain matmul: a gemm record)
    assert sum(len(p[3]) for p in runs) + len(parts) - len(runs) == len(jit._kernels(variant.captured))
    for got, want in outs:
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-4, atol=1e-6)


def test_cpu_replay_leaves_matrix_vector_products_to_numpy():
    """A batch-1 decode step's x @ W (one row) and W @ v (one column) are not gemm records in a CPU
    replay's native call (numpy's matmul runs them as gemv, at memory speed; a gemm of one row did not),
    while a matrix times a matrix is; values numpy's on every call."""
    from tgrad.runtime.cpu import batch as cpu_batch

    rng = np.random.default_rng(6)
    w, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((512, 768), (512, 512)))
    tw, tw2 = Tensor(w, device="CPU"), Tensor(w2, device="CPU")

    def step(x, v, m):
        return ((x @ tw).relu() * 2).sum(), (tw @ v * 0.05).exp().sum(), (m @ tw2).sum()

    f = TinyJit(step)
    for _ in range(4):
        x, v, m = (rng.standard_normal(s).astype(np.float32) for s in ((1, 512), (768, 1), (64, 512)))
        got = f(*(Tensor(a, device="CPU") for a in (x, v, m)))
        want = (np.maximum(x @ w, 0) * 2).sum(), np.exp(w @ v * 0.05).sum(), (m @ w2).sum()
        for g, wv in zip(got, want):
            np.testing.assert_allclose(g.numpy(), wv, rtol=1e-4)
    batches = [s for s in f._last.steps if isinstance(s, cpu_batch.Batch)]
    records = [launch[0].name for b in batches for p in b.parts if p[0] == "run" for launch in p[3]
               if "blas" in launch[0].program.launch]
    assert records and all("_64_512_512" in name or "_512_64_512" in name for name in records), records


def test_a_failing_function_in_a_batch_names_its_kernel(monkeypatch):
    """A compiled function that returns an error status inside a batched replay raises KernelError
    naming its kernel, as a launch from Python does."""
    from tgrad.errors import KernelError
    from tgrad.runtime.cpu import batch as cpu_batch
    from tgrad.runtime.cpu import threads as cpu_threads

    numba = pytest.importorskip("numba")
    if not cpu_threads.enabled():
        pytest.skip("native workers: Linux x86-64 only, not with TGRAD_NATIVE_THREADS=0")
    monkeypatch.setenv("TGRAD_THREADS", "2")
    t = numba.types

    @numba.cfunc(t.int32(t.voidptr, t.voidptr, t.CPointer(t.float32), t.int64, t.int64))
    def fails(ret, exc, out, lo, hi):
        return -1 if out[0] > 0 else 0

    class Fn:
        def __call__(self, out, *inputs):
            raise AssertionError("runs in the batch")

        def bind(self, out, inputs):
            return fails.address, [out.ctypes.data], [-1], 0, False, False, []

    class Run:
        device, name, source, fn = "CPU", "k_bad", "def k_bad(): ...", Fn()

        def __call__(self, out, *inputs):
            self.fn(out.data, *inputs)

    class Buf:
        def __init__(self, v):
            self.data = np.full(4, v, np.float32)

    fixed, varying = Buf(0), Buf(0)
    batch = cpu_batch.Batch([(Run(), fixed, []), (Run(), varying, [])], {id(varying)}, 2, HostTuning())
    batch({})
    with pytest.raises(KernelError, match="kernel k_bad failed to run.*error status -1"):
        batch({id(varying): Buf(1)})  # (the slot is written per call: the new buffer's address)
    batch({id(varying): Buf(0)})


def test_state_made_by_zeros_contiguous_realize_is_assigned_in_place(device):
    """Tensor.zeros(...).contiguous().realize() (tinygrad's way to make a buffer) is a buffer: an assign()
    writes it, so a TinyJit function that updates it and reads it back captures (its graph grew with
    every call before, and the capture was refused)."""
    state = Tensor.zeros(4, device=device).contiguous().realize()
    assert state.node.realized

    @TinyJit
    def step(x):
        state.assign(state * 0.5 + x)
        return (state * 2).realize()

    want = np.zeros(4, np.float32)
    for i in range(5):
        x = np.full(4, i, np.float32)
        want = want * 0.5 + x
        np.testing.assert_allclose(step(Tensor(x, device=device)).numpy(), want * 2, rtol=1e-6)
        np.testing.assert_allclose(state.numpy(), want, rtol=1e-6)
    if not get_runtime(device).evaluates_graphs:
        assert step.captures == 1 and step.replays >= 2


def test_prune_leaves_out_kernels_that_do_not_read_the_arguments(device):
    """TinyJit(prune=True) (tinygrad's option): a kernel over weights only ran at the capture and replays
    leave it out, with the values numpy gives at every call; also as `@TinyJit(prune=True)`."""
    w_np = RNG.standard_normal(16).astype(np.float32)
    w = Tensor(w_np, device=device).realize()

    def f(x):
        return (w * 2).contiguous() + x

    plain, pruned = TinyJit(f), TinyJit(f, prune=True)

    @TinyJit(prune=True)
    def g(x):
        return (w.exp() * 3).contiguous() * x

    for _ in range(4):
        x_np = RNG.standard_normal(16).astype(np.float32)
        x = Tensor(x_np, device=device).realize()
        np.testing.assert_allclose(plain(x).numpy(), w_np * 2 + x_np, rtol=1e-6)
        np.testing.assert_allclose(pruned(x).numpy(), w_np * 2 + x_np, rtol=1e-6)
        np.testing.assert_allclose(g(x).numpy(), np.exp(w_np) * 3 * x_np, rtol=1e-5)
    @TinyJit(prune=True)
    def h(x):  # a new buffer made from weights only, then updated in place from the argument
        t = (w * 2).contiguous().realize()
        t.assign(t + x)
        return (t * 1).contiguous()

    for _ in range(3):
        x_np = RNG.standard_normal(16).astype(np.float32)
        np.testing.assert_allclose(h(Tensor(x_np, device=device)).numpy(), w_np * 2 + x_np, rtol=1e-6)
    if get_runtime(device).evaluates_graphs:
        return  # (the NUMPY reference has no kernels: the functions ran every time, same values)
    assert pruned.replays == plain.replays == g.replays == 2
    assert len(pruned.kernel_names) == 1 and len(g.kernel_names) == 1
    assert len(plain.kernel_names) in (1, 2)  # (the CPU runs both in one row group)


def test_prune_keeps_updates_state_and_what_reads_updated_state(device):
    """What a pruning replay still runs: assigns (state updated at every call, even from weights only),
    a kernel over a weight that the step's update overwrites (it runs before the update: its input
    changes every call), returned values made from weights alone (a new buffer each call), and random
    draws. A pruned training step (Adam) steps like PyTorch's for 6 steps."""
    Tensor.manual_seed(0)
    count = Tensor.zeros(1, device=device).contiguous().realize()
    lin = Linear(5, 3)
    lin.weight, lin.bias = lin.weight.to(device).realize(), lin.bias.to(device).realize()
    for t in (lin.weight, lin.bias):
        t.requires_grad = True
    tl = torch.nn.Linear(5, 3)
    with torch.no_grad():
        tl.weight[...] = torch.tensor(lin.weight.numpy())
        tl.bias[...] = torch.tensor(lin.bias.numpy())
    opt = Adam([lin.weight, lin.bias], lr=0.05)
    topt = torch.optim.Adam(tl.parameters(), lr=0.05)

    @TinyJit(prune=True)
    def step(x, y):
        count.assign(count + 1)
        norm = (lin.weight * lin.weight).sum()  # read before the update overwrites the weight
        opt.zero_grad()
        loss = lin(x).cross_entropy(y)
        loss.backward()
        opt.step()
        return loss.realize(), norm.realize(), (lin.bias * 0 + 1).contiguous(), Tensor.rand(4, device=device)

    draws = []
    rng = np.random.default_rng(6)  # (its own: the module's RNG is where earlier tests on the worker left it)
    for _ in range(6):
        x_np = rng.standard_normal((8, 5)).astype(np.float32)
        y_np = rng.integers(0, 3, 8).astype(np.int32)
        want_norm = float((tl.weight.detach() ** 2).sum())
        topt.zero_grad()
        want = torch.nn.functional.cross_entropy(tl(torch.tensor(x_np)), torch.tensor(y_np).long())
        want.backward()
        topt.step()
        loss, norm, ones, r = step(Tensor(x_np, device=device), Tensor(y_np, device=device))
        np.testing.assert_allclose(loss.numpy(), want.item(), rtol=1e-5, atol=1e-6)
        # (the weights after Adam steps: its division by sqrt(v) scales float32 rounding differences in a
        # small gradient up to the step size, so they agree with PyTorch's to ~1e-5, not to the last bit)
        np.testing.assert_allclose(norm.numpy(), want_norm, rtol=1e-4)
        np.testing.assert_array_equal(ones.numpy(), np.ones(3, np.float32))
        draws.append(r.numpy())
    np.testing.assert_allclose(lin.weight.numpy(), tl.weight.detach().numpy(), rtol=1e-3, atol=1e-5)
    assert count.numpy()[0] == 6 and step.replays == (0 if get_runtime(device).evaluates_graphs else 4)
    assert len({d.tobytes() for d in draws}) == 6  # a new draw at every call
