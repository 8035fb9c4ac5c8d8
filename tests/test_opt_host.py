"""The CPU's optimizer (opt/host.py): its choices are opts on the kernel (what emit_numba renders), read
their sizes from the device's properties (HostTuning, the cache size), and change with them; whichever it
picks, values are PyTorch's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tests.helpers import cpu_plan, cpu_render
from tgrad import Tensor, fuse
from tgrad.device import get_runtime
from tgrad.opt import Contract, HostTuning, OptOps, find, host
from tgrad.opt.contraction import find_dot
from tgrad.runtime.cpu.memory import cache_bytes

F32 = np.float32


def _last_kernel(t: Tensor):
    return fuse.schedule([t.node])[-1].kernel


def _contract(t: Tensor) -> Contract:
    return Contract(find(get_runtime("CPU").optimize(_last_kernel(t)).opts, OptOps.CONTRACT))


@pytest.mark.parametrize("make,want", [
    (lambda r: Tensor(r((256, 512)), device="CPU") @ Tensor(r((512, 128)), device="CPU"), Contract.BLAS),
    (lambda r: Tensor(r((16, 16)), device="CPU") @ Tensor(r((16, 16)), device="CPU"), Contract.LOOP),
    (lambda r: Tensor(r((1024, 64)), device="CPU") @ Tensor(r((64,)), device="CPU"), Contract.LOOP),
    (lambda r: Tensor(r((4, 8, 64, 32)), device="CPU") @ Tensor(r((4, 8, 32, 64)), device="CPU"),
     Contract.BATCHED),
    (lambda r: Tensor(r((16, 32, 24, 24)), device="CPU").conv2d(Tensor(r((32, 32, 5, 5)), device="CPU")),
     Contract.DIRECT),
    (lambda r: Tensor(r((64, 1, 28, 28)), device="CPU").conv2d(Tensor(r((32, 1, 5, 5)), device="CPU")),
     Contract.LOOP),  # K = 25 and 32 output channels: the windows read in place
])
def test_each_kind_of_contraction_gets_its_opt(make, want):
    """The heuristic's CONTRACT for a big matmul, a small one, a matrix times a vector, attention's batch of
    small matmuls, a conv big enough for the direct loop and a first conv layer; the rendered Program is
    the one the opt names, and the values are PyTorch's."""
    rng = np.random.default_rng(0)
    inputs: list[np.ndarray] = []

    def r(shape):
        inputs.append(rng.standard_normal(shape).astype(F32))
        return inputs[-1]

    out = make(r)
    assert _contract(out) == want
    program = cpu_render(_last_kernel(out))
    assert ("blas" in program.launch) == (want in (Contract.BLAS, Contract.DIRECT))
    assert ("direct" in program.launch) == (want == Contract.DIRECT)
    a, b = map(torch.from_numpy, inputs)
    ref = torch.nn.functional.conv2d(a, b) if a.ndim == 4 and b.ndim == 4 and b.shape[-1] == 5 else a @ b
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)


def test_tuning_changes_the_choice_not_the_values(cpu_tuning):
    """The same matmul and conv with HostTuning sizes that rule BLAS and the direct loop out run as the
    generated loop; with sizes that let everything in, as BLAS; PyTorch's values both ways."""
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((8, 16, 12, 12)).astype(F32), rng.standard_normal((16, 16, 3, 3)).astype(F32)
    a, b = rng.standard_normal((96, 80)).astype(F32), rng.standard_normal((80, 64)).astype(F32)
    want_conv = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w)).numpy()
    for tuning, kinds in (({"blas_min_work": 1 << 40}, {Contract.LOOP}),
                          ({"blas_min_work": 1, "windows_max_k": 0, "direct_min_work": 1 << 40},
                           {Contract.BLAS})):
        cpu_tuning(**tuning)
        conv = Tensor(x, device="CPU").conv2d(Tensor(w, device="CPU"))
        mm = Tensor(a, device="CPU") @ Tensor(b, device="CPU")
        assert {_contract(conv), _contract(mm)} == kinds, tuning
        np.testing.assert_allclose(conv.numpy(), want_conv, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(mm.numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_threads_opt_follows_parallel_min_work(cpu_tuning):
    """An elementwise kernel gets THREADS from parallel_min_work iterations; its source then loops over a
    range [lo, hi) the runtime's threads split."""
    x = np.arange(1 << 12, dtype=F32)
    for least, threaded in ((1 << 20, False), (1 << 10, True)):
        cpu_tuning(parallel_min_work=least)
        out = Tensor(x, device="CPU") * 3 + 1
        kernel = get_runtime("CPU").optimize(_last_kernel(out))
        assert (find(kernel.opts, OptOps.THREADS) == 1) == threaded
        assert ("lo, hi" in cpu_render(_last_kernel(out)).source) == threaded
        np.testing.assert_array_equal(out.numpy(), x * 3 + 1)


@pytest.mark.parametrize("sa,sb,transpose", [
    ((32, 128, 32), (32, 32, 128), False),  # attention's scores: a batch of small matmuls
    ((8, 4, 128, 32), (8, 4, 128, 32), True),  # q @ k^T with k read transposed, two batch axes
    ((7, 64, 96), (7, 96, 80), False),  # a batch no piece count divides evenly
])
def test_a_batch_of_small_matmuls_is_split_over_the_cores(cpu_tuning, sa, sb, transpose):
    """A batch of small BLAS matmuls runs in pieces of the batch (CHUNK on axis 0), a one-thread BLAS call
    each, where each matrix is at most split_batch_max_work multiply-adds (not where bigger, or on one
    core); PyTorch's values every way."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(sa).astype(F32), rng.standard_normal(sb).astype(F32)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    want = (ta @ tb.transpose(-1, -2) if transpose else ta @ tb).numpy()
    rt = get_runtime("CPU")
    for most, cores, split in ((1 << 22, 2, True), (1 << 10, 2, False), (1 << 22, 1, False)):
        cpu_tuning(batched_max_work=0, split_batch_max_work=most)  # (its fixture puts the props back)
        rt.set_props(dataclasses.replace(rt.props, compute_units=cores))
        x, y = Tensor(a, device="CPU"), Tensor(b, device="CPU")
        out = x @ y.transpose(-1, -2) if transpose else x @ y
        kernel = rt.optimize(_last_kernel(out))
        assert Contract(find(kernel.opts, OptOps.CONTRACT)) == Contract.BLAS
        chunk = [o for o in kernel.opts if o.op is OptOps.CHUNK]
        assert bool(chunk and chunk[0].axis == 0) == (split and sa[0] > 1), (most, cores, kernel.opts)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)


def test_pieces_are_sized_to_the_cache(cpu_tuning):
    """A conv whose windows are copied in pieces: on a device with half the cache each piece copies half
    as many images (chunk_elems), without compiled pieces (which take one image a piece); values as
    PyTorch's."""
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((64, 8, 20, 20)).astype(F32), rng.standard_normal((8, 8, 3, 3)).astype(F32)
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w)).numpy()
    rt, sizes = get_runtime("CPU"), []
    base = rt.props
    try:
        for cache in (1 << 21, 1 << 20):
            rt.set_props(dataclasses.replace(base, cache_bytes=cache, native_pieces=False,
                                             host=dataclasses.replace(base.host, direct_min_work=1 << 40)))
            out = Tensor(x, device="CPU").conv2d(Tensor(w, device="CPU"))
            plan = cpu_plan(_last_kernel(out))
            per_image = 8 * 9 * 18 * 18  # window elements of one image
            assert plan.chunk.axis == 0 and plan.chunk.size * per_image <= host.chunk_elems(rt.props)
            sizes.append(plan.chunk.size)
            np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)
    finally:
        rt.set_props(base)
    assert sizes[1] < sizes[0], sizes


def test_generated_code_sizes_follow_the_tuning(cpu_tuning):
    """A threaded full sum splits into `reduce_shares` partials and adds blocks of `sum_block` elements; a
    direct convolution's register tile holds `tile_registers` accumulators: the source changes with the
    device's tuning, the values stay numpy's / PyTorch's (float64 references)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1 << 20).astype(F32)
    sources = []
    for shares, block in ((64, 4096), (3, 128)):
        cpu_tuning(reduce_shares=shares, sum_block=block, parallel_min_work=1 << 10)
        total = Tensor(x, device="CPU").sum()
        program = cpu_render(_last_kernel(total))
        assert program.scratch[0][0] == shares and f", {block}):" in program.source, program.source
        sources.append(program.source)
        np.testing.assert_allclose(total.numpy(), x.astype(np.float64).sum(), rtol=1e-5)
    assert sources[0] != sources[1]
    xc, w = rng.standard_normal((4, 32, 14, 14)).astype(F32), rng.standard_normal((32, 32, 3, 3)).astype(F32)
    want = torch.nn.functional.conv2d(torch.from_numpy(xc).double(), torch.from_numpy(w).double()).numpy()
    directs = []
    for registers in (24, 8):
        cpu_tuning(direct_min_work=1, direct_min_depth=1, direct_min_channels=1, tile_registers=registers,
                   windows_max_k=0)
        out = Tensor(xc, device="CPU").conv2d(Tensor(w, device="CPU"))
        kernel = _last_kernel(out)
        assert _contract(out) == Contract.DIRECT
        directs.append(cpu_render(kernel).launch["direct"].source)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)
    assert directs[0] != directs[1]


def test_thread_hand_off_follows_the_tuning():
    """A threaded kernel's range count is `chunks_per_thread` per thread (at most the iterations); the
    native workers spin the `spin_cycles` they were last given."""
    from tgrad.runtime.cpu import batch as cpu_batch
    from tgrad.runtime.cpu import threads as cpu_threads

    assert cpu_batch.chunks(1000, 2, HostTuning(chunks_per_thread=4)) == 8
    assert cpu_batch.chunks(1000, 2, HostTuning(chunks_per_thread=1)) == 2
    assert cpu_batch.chunks(3, 2, HostTuning(chunks_per_thread=4)) == 3
    assert cpu_batch.chunks(1000, 1, HostTuning()) == 0
    pool = cpu_threads.pool(1, 1 << 10)
    if pool is None:
        pytest.skip("no native worker threads here (not Linux x86-64, or TGRAD_NATIVE_THREADS=0)")
    try:
        assert pool.ctx[cpu_threads.SPIN] == 1 << 10
    finally:
        assert cpu_threads.pool(1, HostTuning().spin_cycles).ctx[cpu_threads.SPIN] == HostTuning().spin_cycles


def test_only_what_conv2d_built_runs_as_a_direct_convolution(cpu_tuning):
    """The same product written as an einsum over the input's windows (marked CONTRACT, a matmul) never
    becomes a direct convolution, which conv2d's (marked CONV) does under the same tuning; its input
    gradient's matmul is marked COL2IM. Values as PyTorch's both ways."""
    from tgrad.graph import COL2IM, CONTRACT, CONV

    cpu_tuning(direct_min_work=1, direct_min_depth=1, direct_min_channels=1, windows_max_k=0)
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((2, 16, 12, 12)).astype(F32), rng.standard_normal((16, 16, 3, 3)).astype(F32)
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w)).numpy()
    tx, tw = Tensor(x, device="CPU"), Tensor(w, device="CPU")
    conv = tx.conv2d(tw)
    windows = tx.unfold(2, 3, 1).unfold(3, 3, 1)  # (n, c, y, x, i, j)
    by_einsum = Tensor.einsum("ncyxij,ocij->noyx", windows, tw)
    assert _last_kernel(conv).contraction == CONV and _contract(conv) == Contract.DIRECT
    assert _last_kernel(by_einsum).contraction == CONTRACT and _contract(by_einsum) != Contract.DIRECT
    np.testing.assert_allclose(conv.numpy(), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(by_einsum.numpy(), want, rtol=1e-4, atol=1e-4)
    tx, tw = Tensor(x, device="CPU", requires_grad=True), Tensor(w, device="CPU", requires_grad=True)
    grads = tx.conv2d(tw).sum().gradient(tx, tw)
    kinds = {it.kernel.contraction for it in fuse.schedule([t.node for t in grads])}
    assert {CONV, COL2IM} <= kinds, kinds  # (the weight gradient's product keeps conv2d's mark)


def test_cache_size_from_sysfs(tmp_path):
    """cache_bytes reads the level-2 cache's size from Linux's sysfs, 2 MiB where it cannot."""
    for index, level, size in (("index0", "1", "48K"), ("index2", "2", "1280K"), ("index3", "3", "30M")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "level").write_text(level + "\n")
        (tmp_path / index / "size").write_text(size + "\n")
    assert cache_bytes(str(tmp_path)) == 1280 << 10
    assert cache_bytes(str(tmp_path / "missing")) == 1 << 21


def test_host_tuning_is_one_place():
    """Every threshold the CPU's choices use is a HostTuning field with a default (a device or a search
    may replace it); the CPU runtime's properties carry them."""
    props = get_runtime("CPU").props
    assert props.kind == "cpu" and isinstance(props.host, HostTuning)
    assert all(isinstance(getattr(props.host, f.name), int) for f in dataclasses.fields(HostTuning))


@pytest.mark.usefixtures("lazy_backward")  # (reads the gradients' kernels)
def test_contractions_are_marked_by_the_op_not_recovered():
    """matmul marks its reduce as a contraction (graph.CONTRACT on its product), and so do the reduces of
    its gradients (the MUL's gradient rule keeps the mark); the same sum of products written out
    elementwise is a plain reduce: the generated loop on the CPU, no tl.dot in Triton. Values as numpy's
    both ways."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((128, 256)).astype(F32), rng.standard_normal((256, 64)).astype(F32)
    ta = Tensor(a, device="CPU", requires_grad=True)
    tb = Tensor(b, device="CPU", requires_grad=True)
    by_op = ta @ tb
    by_hand = (ta.reshape(128, 256, 1) * tb.reshape(1, 256, 64)).sum(1)
    assert _last_kernel(by_op).contraction and not _last_kernel(by_hand).contraction
    assert _contract(by_op) == Contract.BLAS and _contract(by_hand) == Contract.LOOP
    assert find_dot(_last_kernel(by_op)) is not None and find_dot(_last_kernel(by_hand)) is None
    np.testing.assert_allclose(by_op.numpy(), a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(by_hand.numpy(), a @ b, rtol=1e-4, atol=1e-4)
    (by_op * by_op).sum().backward()
    for grad in (ta.grad, tb.grad):
        sums = [it.kernel for it in fuse.schedule([grad.node]) if it.kernel.reduce_op == "SUM"]
        assert sums and all(k.contraction for k in sums), [k.name for k in sums]
    g = 2 * (a @ b)
    np.testing.assert_allclose(ta.grad.numpy(), g @ b.T, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(tb.grad.numpy(), a.T @ g, rtol=1e-4, atol=1e-3)


@pytest.mark.usefixtures("lazy_backward")
@pytest.mark.parametrize("build", ["conv2d", "einsum"])
def test_conv_and_einsum_gradients_are_contractions(build):
    """conv2d's product, its weight gradient and its input gradient (col2im's matmul) are contractions, as
    are einsum's and its gradients'; values and gradients as PyTorch's."""
    rng = np.random.default_rng(4)
    if build == "conv2d":
        x = rng.standard_normal((8, 16, 12, 12)).astype(F32)
        w = rng.standard_normal((16, 16, 3, 3)).astype(F32)
        run = lambda p, q: p.conv2d(q)  # noqa: E731
        ref = torch.nn.functional.conv2d
    else:
        x, w = rng.standard_normal((4, 32, 48)).astype(F32), rng.standard_normal((48, 40)).astype(F32)
        run = lambda p, q: Tensor.einsum("bij,jk->bik", p, q)  # noqa: E731
        ref = lambda p, q: torch.einsum("bij,jk->bik", p, q)  # noqa: E731
    tx, tw = Tensor(x, device="CPU", requires_grad=True), Tensor(w, device="CPU", requires_grad=True)
    out = run(tx, tw)
    assert _last_kernel(out).contraction
    (out * out).sum().backward()
    for grad in (tx.grad, tw.grad):
        items = fuse.schedule([grad.node])
        assert any(it.kernel.contraction for it in items), [it.kernel.name for it in items]
    rx, rw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    r = ref(rx, rw)
    (r * r).sum().backward()
    np.testing.assert_allclose(out.numpy(), r.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(tx.grad.numpy(), rx.grad.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(tw.grad.numpy(), rw.grad.numpy(), rtol=1e-4, atol=1e-2)


def test_debug2_shows_the_cpus_opts(monkeypatch, capsys):
    """DEBUG=2's line for a CPU kernel names the opts it ran with: a matmul's CONTRACT, a big sum's
    THREADS; values as numpy's."""
    import tgrad.device as device_module

    monkeypatch.setattr(device_module, "DEBUG", 2)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((192, 320)).astype(F32), rng.standard_normal((320, 96)).astype(F32)
    np.testing.assert_allclose((Tensor(a, device="CPU") @ Tensor(b, device="CPU")).numpy(), a @ b,
                               rtol=1e-4, atol=1e-4)
    x = rng.standard_normal((64, 96, 48)).astype(F32)
    np.testing.assert_allclose(Tensor(x, device="CPU").sum(1).numpy(), x.sum(1), rtol=1e-4, atol=1e-4)
    err = capsys.readouterr().err
    assert "CONTRACT(BLAS)" in err and "THREADS(1)" in err, err


def _shift_sum(x: Tensor, taps: int = 3) -> Tensor:
    """A col2im's shape: taps x taps shifted copies of x added into an image taps - 1 wider and taller (the
    loads gated on the innermost index)."""
    out = None
    for kh in range(taps):
        for kw in range(taps):
            part = x.pad((kw, taps - 1 - kw, kh, taps - 1 - kh))
            out = part if out is None else out + part
    return out


def _shift_sum_numpy(x: np.ndarray, taps: int = 3) -> np.ndarray:
    n, c, h, w = x.shape
    out = np.zeros((n, c, h + taps - 1, w + taps - 1), F32)
    for kh in range(taps):
        for kw in range(taps):
            out[:, :, kh:kh + h, kw:kw + w] += x
    return out


def test_short_gated_loops_compile_at_o3(cpu_tuning, monkeypatch):
    """An elementwise kernel whose innermost loop has at most short_loop_max iterations and gates loads on
    its index (a col2im over 8x8 images) gets LEVEL(3): its source asks for LLVM O3 and compiles so; a
    wider innermost loop, one without gated loads, or short_loop_max below the loop keep the default level.
    Values as numpy's either way."""
    from tgrad.runtime.cpu import compile as cpu_compile

    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 16, 6, 6)).astype(F32)
    wide = rng.standard_normal((2, 4, 22, 22)).astype(F32)
    rt = get_runtime("CPU")
    short = _shift_sum(Tensor(x, device="CPU"))
    kernel = rt.optimize(_last_kernel(short))
    assert find(kernel.opts, OptOps.LEVEL) == 3, kernel.opts
    program = cpu_render(_last_kernel(short))
    assert "\n@kernel(opt=3)\n" in program.source, program.source
    levels: list[int] = []
    real = cpu_compile._numba_opt_level

    def record(level):
        levels.append(level)
        return real(level)

    monkeypatch.setattr(cpu_compile, "_numba_opt_level", record)
    entry = cpu_compile.compile_native(program.source, program.name, "tgrad_kernel_level_test",
                                       program.launch["storage"], 0)
    assert levels == [3] and entry["address"]
    np.testing.assert_allclose(short.numpy(), _shift_sum_numpy(x), rtol=1e-6, atol=1e-6)

    for plain in (_shift_sum(Tensor(wide, device="CPU")), Tensor(x, device="CPU") * 2 + 1):
        assert not find(rt.optimize(_last_kernel(plain)).opts, OptOps.LEVEL)
        assert "\n@kernel()\n" in cpu_render(_last_kernel(plain)).source
    np.testing.assert_allclose(_shift_sum(Tensor(wide, device="CPU")).numpy(), _shift_sum_numpy(wide),
                               rtol=1e-6, atol=1e-6)
    cpu_tuning(short_loop_max=4)
    again = _shift_sum(Tensor(x, device="CPU"))
    assert not find(rt.optimize(_last_kernel(again)).opts, OptOps.LEVEL)
    np.testing.assert_allclose(again.numpy(), _shift_sum_numpy(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("size", [10, 12, 18])
def test_conv_input_gradients_with_short_rows_match_pytorch(size):
    """A 3x3 conv's input gradient over images whose rows are short (8, 10, 16 outputs: the col2im compiles
    at O3, LEVEL) after a ReLU, through TinyJit: PyTorch's gradients."""
    from tgrad.jit import TinyJit

    rng = np.random.default_rng(size)
    x = rng.standard_normal((4, 16, size, size)).astype(F32)
    w1, w2 = (rng.standard_normal((16, 16, 3, 3)).astype(F32) * 0.2 for _ in range(2))
    tx = Tensor(x, device="CPU", requires_grad=True)
    tw = [Tensor(w, device="CPU", requires_grad=True) for w in (w1, w2)]

    @TinyJit
    def step(a):
        a.conv2d(tw[0]).relu().conv2d(tw[1]).relu().sum().backward()
        return a.grad.realize()

    rx = torch.from_numpy(x).requires_grad_()
    r1, r2 = (torch.from_numpy(w) for w in (w1, w2))
    torch.nn.functional.conv2d(torch.nn.functional.conv2d(rx, r1).relu(), r2).relu().sum().backward()
    for _ in range(3):  # capture, then replays
        tx.grad = None
        np.testing.assert_allclose(step(tx).numpy(), rx.grad.numpy(), rtol=1e-4, atol=1e-4)
