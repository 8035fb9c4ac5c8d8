"""Fusion rules, pinned by kernel counts (CPU device: the scheduler is shared by every compiled device)."""

import numpy as np
import pytest
import torch

from tests.helpers import cpu_plan, cpu_render
from tgrad import Tensor
from tgrad.device import Stats
from tgrad.fuse import schedule


def kernels(*tensors: Tensor) -> list:
    return schedule([t.node for t in tensors])


def count_run(*tensors: Tensor) -> int:
    before = Stats.kernels_run
    Tensor.realize(*tensors)
    return Stats.kernels_run - before


@pytest.fixture
def cpu(monkeypatch):
    monkeypatch.setenv("DEVICE", "CPU")


def test_elementwise_reduce_is_one_kernel(cpu):
    a, b, c = (Tensor.rand(16, 16) for _ in range(3))
    out = (a * b + c).relu().sum()
    items = kernels(out)
    assert len(items) == 1 and items[0].kernel.reduce_op == "SUM"
    np.testing.assert_allclose(out.item(), np.maximum(a.numpy() * b.numpy() + c.numpy(), 0).sum(), rtol=1e-5)


def test_matmul_is_one_kernel(cpu):
    a, b = Tensor.rand(8, 16), Tensor.rand(16, 4)
    assert len(kernels(a @ b)) == 1
    assert len(kernels((a @ b).relu() + 1)) == 1  # epilogue fuses


def test_softmax_at_most_three_kernels(cpu):
    x = Tensor.rand(4, 32)
    assert len(kernels(x.softmax(-1))) <= 3
    np.testing.assert_allclose(x.softmax(-1).numpy().sum(-1), np.ones(4), rtol=1e-5)


def test_elementwise_chain_one_kernel(cpu):
    a, b = Tensor.rand(10), Tensor.rand(10)
    assert len(kernels(((a + b) * a).exp().sqrt() - b)) == 1
    w = Tensor.rand(10)
    assert len(kernels(a * (1 - w) + b * w)) == 1


def test_views_are_free(cpu):
    x = Tensor.rand(4, 6).realize()
    for view in (
        x.reshape(6, 4),
        x.permute(1, 0),
        x.reshape(4, 1, 6).expand(4, 3, 6),
        x[1:3],
        x.T.reshape(-1),
    ):
        assert count_run(view) == 0
    np.testing.assert_array_equal(x.T.numpy(), x.numpy().T)


def test_reduce_computed_once(cpu):
    x = Tensor.rand(8, 8)
    s = x.sum(1)
    items = kernels(s * 2, s + 1)
    assert sum(1 for it in items if it.kernel.reduce_op is not None) == 1


def test_expand_after_reduce_realizes(cpu):
    x = Tensor.rand(4, 8)
    out = x - x.mean(1, keepdim=True)
    assert len(kernels(out)) == 2
    np.testing.assert_allclose(out.numpy(), x.numpy() - x.numpy().mean(1, keepdims=True), atol=1e-6)


def test_training_step_kernel_count(cpu, lazy_backward):
    Tensor.manual_seed(0)
    w1 = Tensor.rand(8, 16, requires_grad=True)
    w2 = Tensor.rand(16, 4, requires_grad=True)
    x = Tensor.rand(5, 8)
    y = Tensor([0, 1, 2, 3, 0])
    loss = (x @ w1).relu().matmul(w2).cross_entropy(y)
    loss.backward()
    n = len(kernels(loss, w1.grad, w2.grad))
    # forward: 2 matmuls, max, sum(exp), loss sum over classes, sum of losses, count of targets;
    # backward: softmax-grad sum, 2 weight-grad matmuls, 1 input-grad matmul; the loss division
    assert n == 12, n
    Tensor.realize(loss, w1.grad, w2.grad)


def test_cpu_matmul_goes_to_blas_with_fused_epilogue(cpu):

    a, b = Tensor.rand(64, 48), Tensor.rand(48, 80)
    (item,) = kernels((a @ b).relu() * 2)
    plan = cpu_plan(item.kernel)
    assert plan is not None and plan.epilogue is not None
    np.testing.assert_allclose(
        ((a @ b).relu() * 2).numpy(), np.maximum(a.numpy() @ b.numpy(), 0) * 2, rtol=1e-5
    )
    # strided and flipped operands, batched
    x, y = Tensor.rand(3, 40, 64), Tensor.rand(64, 3, 50)
    out = x[:, ::-1] @ y.permute(1, 0, 2)
    assert cpu_plan(kernels(out)[0].kernel) is not None
    ref = x.numpy()[:, ::-1] @ y.numpy().transpose(1, 0, 2)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-5)


def test_large_full_reduction_is_split_across_threads(cpu):

    x = Tensor.rand(1 << 20)
    (item,) = kernels((x * 2).sum())
    program = cpu_render(item.kernel)  # threads each reduce chunks [lo, hi); one call combines
    assert "for p in range(lo, hi):" in program.source and program.launch["combine"]
    np.testing.assert_allclose((x * 2).sum().item(), (x.numpy().astype(np.float64) * 2).sum(), rtol=1e-4)
    np.testing.assert_allclose(x.max().item(), x.numpy().max())


def test_expensive_work_is_not_recomputed_under_a_big_expand(cpu):

    q, k, v = Tensor.rand(64, 32), Tensor.rand(64, 32), Tensor.rand(64, 64)
    att = (q @ k.T).softmax(-1) @ v
    items = kernels(att)
    # q@k, max, sum(exp), softmax (realized once), then a plain matmul that BLAS can take
    assert len(items) == 5
    assert cpu_plan(items[-1].kernel) is not None
    s = q.numpy() @ k.numpy().T
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(att.numpy(), (e / e.sum(-1, keepdims=True)) @ v.numpy(), rtol=1e-4, atol=1e-5)


def test_fusion_sizes_are_the_devices(device):
    """The sizes fusion decides by are the device's (DeviceProps.fuse): with `recompute_elements` past the
    expand's size the softmax is recomputed inside the matmul's kernel (one kernel fewer); the values are
    numpy's either way."""
    import dataclasses

    from tgrad.device import get_runtime
    from tgrad.fuse_roots import FuseTuning

    rng = np.random.default_rng(4)
    q, k, v = (rng.random(s, dtype=np.float32) for s in ((64, 32), (64, 32), (64, 64)))
    s = q @ k.T
    e = np.exp(s - s.max(-1, keepdims=True))
    want = (e / e.sum(-1, keepdims=True)) @ v
    rt = get_runtime(device)
    old = rt.props
    counts = []
    try:
        for tuning in (FuseTuning(), FuseTuning(recompute_elements=1 << 40)):
            rt.set_props(dataclasses.replace(old, fuse=tuning))
            tq, tk, tv = (Tensor(a, device=device) for a in (q, k, v))
            att = (tq @ tk.T).softmax(-1) @ tv
            counts.append(len(schedule([att.node], rt.props.fuse)))
            np.testing.assert_allclose(att.numpy(), want, rtol=1e-4, atol=1e-5)
    finally:
        rt.set_props(old)
    assert counts[1] == counts[0] - 1, counts


def test_softmax_backward_reads_the_realized_output(cpu):
    """Attention realizes softmax's output p for the BLAS matmul after it; its gradient p * (g - sum(g *
    p)) reads that buffer: no backward kernel computes exp again."""
    q, k, v = (Tensor.rand(64, n, requires_grad=True) for n in (32, 32, 64))  # the last matmul is BLAS's
    att = (q @ k.T).softmax(-1) @ v
    grads = att.sum().gradient(q, k)
    forward, step = kernels(att), kernels(att, *grads)  # a training step schedules both at once
    exps = [it.kernel.name for it in step if "EXP2" in repr(it.kernel)]
    assert len(step) > len(forward) and len(exps) == sum("EXP2" in repr(it.kernel) for it in forward), exps
    tq, tk, tv = (torch.tensor(t.numpy(), requires_grad=True) for t in (q, k, v))
    ((tq @ tk.T).softmax(-1) @ tv).sum().backward()
    np.testing.assert_allclose(grads[0].numpy(), tq.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads[1].numpy(), tk.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_cpu_reduce_over_leading_axis_interchanges_loops(cpu):
    from tgrad import emit_numba

    x = Tensor.rand(40, 30, 20)
    for axis in (0, 1):
        (item,) = kernels(x.sum(axis) * 2 + 1)
        assert emit_numba.want_interchange(item.kernel)
        np.testing.assert_allclose((x.sum(axis) * 2 + 1).numpy(), x.numpy().sum(axis) * 2 + 1, rtol=1e-5)
    assert not emit_numba.want_interchange(kernels(x.sum(2))[0].kernel)
    np.testing.assert_allclose(x.max(0).numpy(), x.numpy().max(0))


def test_empty_tensors_lower_without_index_math(cpu):
    # found by the fuzzer: a (0, 0) tensor, exp, then a mean over axis 0 divided by zero in index math
    x = Tensor.rand(0, 0, requires_grad=True)
    out = x.exp().mean(0)
    assert out.shape == (0,) and out.numpy().shape == (0,)
    out.sum().backward()
    assert x.grad.numpy().shape == (0, 0)
    assert (Tensor.rand(0, 3).pad(((1, 1), None)) + 2).numpy().tolist() == [[2.0] * 3] * 2


def test_cpu_matmul_with_computed_operand_uses_a_prologue_and_blas(cpu):

    x = Tensor.rand(64, 96) - 0.5
    w = Tensor.rand(96, 48)
    out = (x.relu() * 2) @ w.exp()  # both operands computed inside the reduce
    (item,) = kernels(out)
    plan = cpu_plan(item.kernel)
    assert plan is not None and len(plan.prologues) == 2
    np.testing.assert_allclose(out.numpy(), (np.maximum(x.numpy(), 0) * 2) @ np.exp(w.numpy()), rtol=1e-4)


def test_cpu_plain_matmul_writes_the_output_directly(cpu):

    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((64, 48)).astype(np.float32), rng.standard_normal((48, 48)).astype(np.float32)
    a, b = Tensor(A), Tensor(B)
    (item,) = kernels(a @ b)
    plan = cpu_plan(item.kernel)
    assert plan is not None and plan.epilogue is None  # BLAS writes the output, no copy kernel
    np.testing.assert_allclose((a @ b).numpy(), A @ B, rtol=1e-5, atol=1e-5)
    w = Tensor(A.copy()).realize()
    w.assign(w @ b).realize()  # the output buffer is also an input: BLAS must not read what it writes
    np.testing.assert_allclose(w.numpy(), A @ B, rtol=1e-5, atol=1e-5)


def _eval_index(e, env):
    """Evaluate an index Expr with C semantics (division truncating toward zero)."""
    if e.op == "IDX":
        return env[e.arg[0]]
    if e.op == "CONST":
        return e.arg
    a, b = (_eval_index(s, env) for s in e.srcs)
    if e.op == "ADD":
        return a + b
    if e.op == "MUL":
        return a * b
    q = abs(a) // abs(b) * (1 if (a >= 0) == (b > 0) else -1)
    return q if e.op == "IDIV" else a - q * b


def test_index_division_by_terms():
    """idiv/imod drop the multiples of the divisor from each coefficient (i + 29*j mod 28 is i + j when
    that stays below 28: what the sliding windows of a conv index), and stay exact everywhere else."""
    import itertools
    import random

    from tgrad.fuse import IDX_DT, Expr, const, iadd, idiv, imod, imul

    i2, i5 = Expr("IDX", (), (0, 24), IDX_DT), Expr("IDX", (), (1, 5), IDX_DT)
    window = iadd(i2, imul(i5, 29))
    assert "MOD" not in repr(imod(window, 28)) and "IDIV" not in repr(idiv(window, 28))
    rng = random.Random(0)
    for _ in range(300):
        sizes = [rng.randint(1, 7) for _ in range(3)]
        axes = [Expr("IDX", (), (n, s), IDX_DT) for n, s in enumerate(sizes)]
        e = const(rng.randint(-10, 40), IDX_DT)
        for ax in axes:
            e = iadd(e, imul(ax, rng.randint(-3, 40)))
        c = rng.randint(1, 30)
        for fn, op in ((idiv, "IDIV"), (imod, "MOD")):
            plain, simplified = Expr(op, (e, const(c, IDX_DT)), None, IDX_DT), fn(e, c)
            for env in itertools.product(*map(range, sizes)):
                assert _eval_index(simplified, env) == _eval_index(plain, env), (op, e, c, env, simplified)


def test_index_division_under_a_mask_uses_the_narrowed_range():
    """Inside view_index, under a pad's mask lo <= i < hi, the inner views' offsets may assume that range
    (the load happens only there): (i - 64) // 16 with 64 <= i < 128 is i // 16 - 4, no division by a flat
    index. Exact at every point of the narrowed range, for random linear indexes and nested div/mod."""
    import itertools
    import random

    from tgrad.fuse import IDX_DT, Expr, _narrowed, const, iadd, idiv, imod, imul

    i3 = Expr("IDX", (), (0, 192), IDX_DT)
    _narrowed.axes = {0: (64, 127)}
    try:
        assert repr(idiv(iadd(i3, const(-64, IDX_DT)), 64)) == "0"
        assert repr(imod(i3, 64)) == "ADD(i0, -64)"
    finally:
        _narrowed.axes = {}
    # 2 - 3*i can be negative, where // truncates toward zero: -1 // 3 is 0 (not -i's -1)
    i0 = Expr("IDX", (), (0, 5), IDX_DT)
    e = iadd(const(2, IDX_DT), imul(i0, -3))
    assert [_eval_index(idiv(e, 3), (v,)) for v in range(5)] == [0, 0, -1, -2, -3]
    rng = random.Random(1)
    for _ in range(300):
        sizes = [rng.randint(1, 9) for _ in range(3)]
        ranges = []
        for s in sizes:
            lo = rng.randint(0, s - 1)
            ranges.append((lo, rng.randint(lo, s - 1)))
        axes = [Expr("IDX", (), (n, s), IDX_DT) for n, s in enumerate(sizes)]
        e = const(rng.randint(-10, 40), IDX_DT)
        for ax in axes:
            e = iadd(e, imul(ax, rng.randint(-3, 40)))
        c, d = rng.randint(1, 30), rng.randint(1, 6)
        _narrowed.axes = dict(enumerate(ranges))
        try:
            simplified = [idiv(e, c), imod(e, c), imod(idiv(e, c), d), idiv(imod(e, c), d)]
        finally:
            _narrowed.axes = {}
        plain = [Expr(op, (e, const(c, IDX_DT)), None, IDX_DT) for op in ("IDIV", "MOD")]
        plain += [Expr("MOD", (plain[0], const(d, IDX_DT)), None, IDX_DT),
                  Expr("IDIV", (plain[1], const(d, IDX_DT)), None, IDX_DT)]
        for env in itertools.product(*(range(lo, hi + 1) for lo, hi in ranges)):
            for got, want in zip(simplified, plain):
                assert _eval_index(got, env) == _eval_index(want, env), (want, ranges, env, got)


@pytest.mark.parametrize("width, heads, c1, c2", [(64, 4, 64, 128), (30, 3, 7, 19)])
def test_split_and_concat_gradients_match_torch(device, width, heads, c1, c2):
    """q, k, v sliced from one projection and reshaped into heads (a transformer's attention): the
    gradient of the projection is the three gradients padded into place, whose loads are indexed under
    the pads' masks (the narrowed ranges above). Values against PyTorch, offsets that do and do not divide
    the head size."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 5, 3 * width)).astype(np.float32)
    g = rng.standard_normal((2, heads, 5, width // heads)).astype(np.float32)

    def loss(a, g):
        q, k, v = a[..., :c1], a[..., c1:c2], a[..., c2 : c2 + width]
        head = v.reshape(2, 5, heads, width // heads).transpose(1, 2)
        return (head * g).sum() + (q * 2).sum() + (k.exp() * k).sum()

    t = Tensor(x, device=device, requires_grad=True)
    r = torch.tensor(x, requires_grad=True)
    loss(t, Tensor(g, device=device)).backward()
    loss(r, torch.tensor(g)).backward()
    np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_cpu_reduce_axes_merge_into_one_loop(cpu):
    """Reduce axes that every load walks as one (a BatchNorm sum over (N, H, W) rows of an image) are one
    loop on the CPU, global axes of a reduce stay (threads, interchange); values match numpy."""
    from tgrad import emit_numba

    x = Tensor.rand(16, 8, 10, 12)
    for axes in ((0, 2, 3), (2, 3), (0,), (1, 3)):
        (item,) = kernels((x + 1).sum(axes))
        merged = emit_numba.merge_axes(emit_numba.compact(item.kernel))
        assert merged.n_global == item.kernel.n_global
        if axes == (2, 3):
            assert merged.shape == (16, 8, 120)
        np.testing.assert_allclose((x + 1).sum(axes).numpy(), (x.numpy() + 1).sum(axes), rtol=1e-5)
    y = Tensor.rand(40, 30, 20)
    np.testing.assert_allclose(y.max(0).numpy(), y.numpy().max(0))
    np.testing.assert_allclose(y.sum((0, 2)).numpy(), y.numpy().sum((0, 2)), rtol=1e-5)
    # a pooled window's index into the pooled output (y // 2, x // 2) keeps the axes apart but needs no
    # division by a flat index
    z = Tensor.rand(4, 3, 8, 8, requires_grad=True)
    z.max_pool2d(2).sum().backward()
    expect = torch.tensor(z.numpy(), requires_grad=True)
    torch.nn.functional.max_pool2d(expect, 2).sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), expect.grad.numpy())


def test_a_computed_input_read_through_conv_windows_is_computed_once(cpu):
    # a conv's windows read each input element k*k times: an input computed from several buffers (the
    # gradient arriving at a conv: relu mask, BatchNorm backward) is realized first instead of being
    # recomputed in the im2col copy for every window position (46 ms instead of 14 in the MNIST CNN)
    rng = np.random.default_rng(0)
    shapes = [(8, 4, 12, 12)] * 5 + [(6, 4, 3, 3)]
    a, b, c, d, e, w = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    ta, tb, tc, td, te, tw = (Tensor(v) for v in (a, b, c, d, e, w))
    x = ta * tb + tc * td + (te - te.mean((0, 2, 3), keepdim=True))
    out = x.conv2d(tw)
    items = kernels(out)
    assert any(it.out.shape == x.shape for it in items[:-1])  # x is a kernel of its own
    assert len(items[-1].inputs) == 2  # the conv reads x and the weight
    ta, tb, tc, td, te, tw = (torch.from_numpy(v) for v in (a, b, c, d, e, w))
    ref = torch.nn.functional.conv2d(ta * tb + tc * td + (te - te.mean((0, 2, 3), keepdim=True)), tw)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)


def test_a_constant_is_one_node_at_any_shape(device):
    """x * 2.0 builds one CONST node of x's shape (not a scalar, a reshape and an expand); movement ops of a
    constant fold into a constant of their shape, except PAD, whose border is 0. Values as numpy's, on
    every device, also for a constant realized on its own and then written into."""
    from tgrad import graph
    from tgrad.graph import Op

    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    c = (x * 2.0).node.srcs[1]
    assert c.op is Op.CONST and c.shape == (2, 3) and c.srcs == ()
    assert graph.move(graph.move(c, Op.PERMUTE, (1, 0)), Op.RESHAPE, (6,)).op is Op.CONST
    padded = Tensor.full((2, 2), 3.0).pad(((1, 0), (0, 1)))
    assert padded.node.op is Op.PAD
    np.testing.assert_array_equal(padded.numpy(), np.pad(np.full((2, 2), 3.0, np.float32), ((1, 0), (0, 1))))
    ref = (np.arange(6).reshape(2, 3) * 2.0).T[::-1]
    np.testing.assert_array_equal((x * 2.0).permute(1, 0).flip(0).numpy(), ref)
    z = Tensor.zeros(3, 4).contiguous().realize()
    z.assign(z + Tensor.ones(3, 4).expand(3, 4) * 5).realize()
    np.testing.assert_array_equal(z.numpy(), np.full((3, 4), 5.0, np.float32))
    np.testing.assert_array_equal(Tensor.full((2, 0, 3), 1.0).sum(1).numpy(), np.zeros((2, 3), np.float32))


def test_equal_kernels_hash_equal_and_a_changed_one_does_not(cpu):
    """Kernels are dict keys (compiled runners): the same graph built twice gives equal kernels with equal
    hashes (the hash is computed once and kept), a kernel changed by dataclasses.replace a new one."""
    import dataclasses

    x = Tensor.rand(4, 5).realize()
    (a,), (b,) = kernels((x * 3).sum(1)), kernels((x * 3).sum(1))
    assert a.kernel == b.kernel and hash(a.kernel) == hash(b.kernel) and hash(a.kernel) == hash(a.kernel)
    other = dataclasses.replace(a.kernel, name="other")
    assert other != a.kernel and hash(other) != hash(a.kernel)
    assert {a.kernel: 1}[b.kernel] == 1


def test_costly_shared_work_is_computed_once(cpu):
    """A value of a big shape two kernels would each recompute, with 8 or more ALU ops and loads per
    element and index arithmetic of its own (here a transpose; a max_pool's gradient read by BatchNorm's
    backward, 5 kernels), becomes a kernel both load; the users' side of it (scaled by a per-row value)
    stays fused into them. The same work without index arithmetic (it vectorizes) is recomputed."""
    rng = np.random.default_rng(1)
    a, b, c, d = (rng.standard_normal((256, 300)).astype(np.float32) for _ in range(4))
    s = rng.standard_normal((256, 1)).astype(np.float32)
    ta, tb, tc, td, ts = (Tensor(v) for v in (a, b, c, d, s))

    def value(moved):  # 11 ALU ops and loads per element
        x = tc.reshape(300, 256).T if moved else tc
        return ((ta * tb + x).relu() - td * ta + tb * x).maximum(td)

    for moved in (True, False):
        g = value(moved)
        outs = ((g * ts).sum(0), (g * g).sum(1), (g + 1).max(0))
        items = kernels(*outs)
        if moved:
            assert len(items) == 4 and items[0].out.shape == (256, 300) and items[0].kernel.reduce_op is None
            assert all(len(it.inputs) <= 2 for it in items[1:])  # each reduce loads g (and the scale)
        else:
            assert len(items) == 3 and all(it.kernel.reduce_op is not None for it in items)
        x = c.reshape(300, 256).T if moved else c
        ref_g = np.maximum(np.maximum(a * b + x, 0) - d * a + b * x, d)
        refs = ((ref_g * s).sum(0), (ref_g * ref_g).sum(1), (ref_g + 1).max(0))
        for got, want in zip(outs, refs):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)


def test_a_computed_matmul_operand_two_matmuls_read_is_computed_once(cpu):
    """A concatenation read by two matmuls (GPT's q/k/v gradient: the input's and the weight's gradient)
    is one kernel both matmuls load, not a prologue of each (0.6 ms instead of 0.3 in the GPT step)."""
    rng = np.random.default_rng(2)
    a, b, w = (rng.standard_normal(s).astype(np.float32) for s in ((512, 64), (512, 64), (128, 96)))
    ta, tb, tw = Tensor(a), Tensor(b), Tensor(w)
    cat = Tensor.cat(ta, tb, dim=1)  # (512, 128)
    x, y = cat @ tw, cat.T @ ta
    items = kernels(x, y)
    assert len(items) == 3 and items[0].out.shape == (512, 128) and items[0].kernel.reduce_op is None
    assert [len(it.inputs) for it in items[1:]] == [2, 2]
    ref = np.concatenate([a, b], 1)
    np.testing.assert_allclose(x.numpy(), ref @ w, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y.numpy(), ref.T @ a, rtol=1e-4, atol=1e-4)


def test_a_shared_value_read_through_a_reshape_is_one_kernel_not_a_copy(cpu):
    """GPT's q/k/v gradient: a concatenation that two matmuls (a Linear's input and weight gradients)
    read through one reshape and the bias gradient reads as it is. The concatenation is the kernel (the
    matmuls read its buffer through the reshape); taking the reshape made a kernel that only copied the
    concatenation, once the bias gradient's read made the concatenation a kernel too."""
    rng = np.random.default_rng(3)
    a, b, c, x = (rng.standard_normal((16, 64, 64)).astype(np.float32) for _ in range(4))
    w = rng.standard_normal((192, 64)).astype(np.float32)
    ta, tb, tc, tw, tx = (Tensor(v) for v in (a, b, c, w, x))
    cat = Tensor.cat(ta.permute(0, 2, 1), tb, tc.permute(0, 2, 1) * 2, dim=2)  # (16, 64, 192)
    col = cat.reshape(16, 64, 192, 1)
    outs = (cat.sum((0, 1)), (col * tw).sum(2), (col * tx.reshape(16, 64, 1, 64)).sum((0, 1)))
    items = kernels(*outs)
    copies = [it for it in items if it.kernel.reduce_op is None and it.kernel.expr.op == "LOAD"]
    assert not copies and len(items) == 4, [it.kernel.name for it in items]
    ref = np.concatenate([a.transpose(0, 2, 1), b, c.transpose(0, 2, 1) * 2], 2)
    wants = (ref.sum((0, 1)), ref @ w, np.einsum("btk,btj->kj", ref, x))
    for got, want in zip(outs, wants):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-3)


def test_a_conv_of_a_computed_input_copies_nothing(cpu):
    """relu(conv1) read by conv2 whose weight needs a gradient: conv2d realizes its computed input once
    (contiguous(), and again for the CPU's pieces of images); the relu is one kernel the forward and the
    weight gradient read, no kernel only copies it. Values and gradients as PyTorch's."""
    rng = np.random.default_rng(4)
    shapes = ((16, 1, 28, 28), (8, 1, 5, 5), (8, 8, 5, 5))
    x, w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    tx, t1, t2 = Tensor(x), Tensor(w1, requires_grad=True), Tensor(w2, requires_grad=True)
    out = tx.conv2d(t1).relu().conv2d(t2)
    (out * out).sum().backward()
    items = kernels(out, t1.grad, t2.grad)
    copies = [it.kernel.name for it in items if it.kernel.reduce_op is None and it.kernel.expr.op == "LOAD"]
    assert not copies, copies
    rx, r1, r2 = torch.from_numpy(x), *(torch.from_numpy(w).requires_grad_() for w in (w1, w2))
    ref = torch.nn.functional.conv2d(torch.nn.functional.conv2d(rx, r1).relu(), r2)
    (ref * ref).sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(t1.grad.numpy(), r1.grad.numpy(), rtol=1e-3, atol=1e-2)
    np.testing.assert_allclose(t2.grad.numpy(), r2.grad.numpy(), rtol=1e-3, atol=1e-2)
