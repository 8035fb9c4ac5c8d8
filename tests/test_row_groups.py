"""CPU row groups (emit_numba.render_rows, runtime/cpu/groups.py): consecutive kernels that each work row
by row (a softmax's max, its sum of exponentials, its normalisation) run as one function with one loop
over rows, and a reduce stores the values the last kernel would compute again (the exponentials). Values
against PyTorch; groups that would read another row's results must not form."""

import re

import numpy as np
import pytest
import torch

from tgrad import Tensor, TinyJit
from tgrad.device import get_runtime


def _group_sources() -> list[str]:
    return [r.source for r in get_runtime("CPU").row_runners.values() if r is not None]


@pytest.mark.parametrize("threads", ["1", "2", "3"])
@pytest.mark.parametrize("shape", [(4096, 1024), (7, 333), (3, 5000), (1, 5000)])
def test_softmax_is_one_row_group_and_matches_torch(shape, threads, monkeypatch):
    monkeypatch.setenv("TGRAD_THREADS", threads)
    x = (np.random.default_rng(0).standard_normal(shape) * 10).astype(np.float32)
    x[0, :3] = [np.inf, -np.inf, 1.0]  # a row with inf: nan, as PyTorch
    if shape[0] > 2:
        x[1, :] = -np.inf  # every element -inf: nan
        x[2, 5] = np.nan
    out = Tensor(x, device="CPU").softmax(1).numpy()
    ref = torch.softmax(torch.from_numpy(x), 1).numpy()
    np.testing.assert_allclose(out, ref, rtol=2e-6, atol=1e-7)
    sources = [s for s in _group_sources() if f"r_{shape[0]}_{shape[1]}_r_" in s]
    if shape[0] > 1:  # (one row has no loop over rows: reductions over everything)
        assert sources and sources[0].count("_exp2f(") == 1, sources  # each exponential computed once


@pytest.mark.parametrize("fn", ["log_softmax", "layer_norm", "softmax_backward", "logsumexp"])
def test_row_wise_ops_match_torch(fn):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((300, 257)).astype(np.float32) * 3
    g = rng.standard_normal((300, 257)).astype(np.float32)
    t, r = Tensor(x, device="CPU", requires_grad=True), torch.tensor(x, requires_grad=True)
    if fn == "log_softmax":
        a, b = t.log_softmax(1), torch.log_softmax(r, 1)
    elif fn == "layer_norm":
        a, b = t.layernorm(1), torch.nn.functional.layer_norm(r, (257,))
    elif fn == "logsumexp":
        a, b = t.logsumexp(1), torch.logsumexp(r, 1)
    else:
        a, b = t.softmax(1) * Tensor(g, device="CPU"), torch.softmax(r, 1) * torch.from_numpy(g)
    np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-5)
    a.sum().backward()
    b.sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_a_kernel_reading_another_row_is_not_grouped():
    """x - max(x)[flipped rows]: the second kernel reads the row the first computes last, so the two
    cannot share one loop over rows (a thread's rows would read rows not computed yet)."""
    x = np.random.default_rng(2).standard_normal((512, 2048)).astype(np.float32)
    t = Tensor(x, device="CPU")
    m = t.max(1, keepdim=True)
    out = ((t - m.flip(0)) * 2).exp().sum(1).numpy()
    ref = np.exp((x - x.max(1, keepdims=True)[::-1]) * 2).sum(1)
    np.testing.assert_allclose(out, ref, rtol=1e-5)
    s = m.flip(0) * t
    ref = (x.max(1, keepdims=True)[::-1] * x).sum(1)
    np.testing.assert_allclose(s.sum(1).numpy(), ref, rtol=1e-4, atol=1e-3)


def test_row_groups_replay_in_tinyjit():
    rng = np.random.default_rng(3)
    w = Tensor(rng.standard_normal((64, 64)).astype(np.float32), device="CPU")

    @TinyJit
    def step(x):
        return (x @ w).softmax(1).realize()

    for _ in range(4):
        x = rng.standard_normal((256, 64)).astype(np.float32)
        out = step(Tensor(x, device="CPU")).numpy()
        ref = torch.softmax(torch.from_numpy(x) @ torch.from_numpy(w.numpy()), 1).numpy()
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    # the group is one kernel; the kernels it computes are recorded as placeholders, which are not kernels
    names = step.kernel_names
    assert [n for n in names if n.startswith("rows_")] and "(in a row group)" not in names, names


def test_layernorm_over_leading_axes_is_one_row_group():
    """LayerNorm's mean and variance reduce over rows indexed by two axes (16, 64): their rows merge into
    the 1024 of the normalisation after them (merge_axes(rows=True)), so all three are one group."""
    from tgrad import nn

    x = np.random.default_rng(4).standard_normal((16, 64, 64)).astype(np.float32)
    ln = nn.LayerNorm(64)
    out = ln(Tensor(x, device="CPU")).numpy()
    ref = torch.nn.functional.layer_norm(torch.from_numpy(x), (64,)).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    assert any("rows_r_16_64_64_r_16_64_64_E_16_64_64" in s for s in _group_sources())


def test_two_reduces_whose_values_the_last_kernel_uses():
    """Two reduces of costly values (exp(x), exp(2x)) that the last kernel uses again: only one of them can
    keep its values in the output (the other's would overwrite them)."""
    x = np.random.default_rng(5).standard_normal((64, 300)).astype(np.float32)
    t = Tensor(x, device="CPU")
    s1 = t.exp().sum(1, keepdim=True)
    s2 = (t * 2).exp().sum(1, keepdim=True) * s1
    out = (t.exp() / s1 + (t * 2).exp() / s2).numpy()
    r = torch.from_numpy(x)
    r1 = r.exp().sum(1, keepdim=True)
    r2 = (r * 2).exp().sum(1, keepdim=True) * r1
    np.testing.assert_allclose(out, (r.exp() / r1 + (r * 2).exp() / r2).numpy(), rtol=1e-5, atol=1e-7)
    assert any("rows_r_64_300_r_64_300_E_64_300" in s for s in _group_sources())


def test_independent_neighbours_with_the_same_rows_share_a_loop():
    """Two reduces over the same rows that do not read each other (a BatchNorm backward's sums over a
    channel) run as one group: the second reads the row the first just read, from the cache."""
    x = np.random.default_rng(6).standard_normal((32, 128, 400)).astype(np.float32)
    t = Tensor(x, device="CPU")
    a = (t.relu() * 2).sum((1, 2))
    b = (t.relu() * t).sum((1, 2))
    Tensor.realize(a, b)
    r = torch.from_numpy(x)
    np.testing.assert_allclose(a.numpy(), (r.relu() * 2).sum((1, 2)).numpy(), rtol=1e-4)
    np.testing.assert_allclose(b.numpy(), (r.relu() * r).sum((1, 2)).numpy(), rtol=1e-4)
    assert any("rows_r_32_128_400_r_32_128_400" in s for s in _group_sources())


def test_a_one_element_per_row_kernel_joins_the_group():
    """A BatchNorm backward between two sums over channels: a kernel of one element per channel (1-D,
    flattened when it runs alone) joins the group with one element per row."""
    x = np.random.default_rng(7).standard_normal((32, 128, 400)).astype(np.float32)
    t = Tensor(x, device="CPU")
    s = ((t * t).sum((1, 2)) * 1e-3 + 1).sqrt().contiguous()  # (a kernel of its own)
    y = (t * s.reshape(32, 1, 1)).relu().sum((1, 2))
    r = torch.from_numpy(x)
    rs = ((r * r).sum((1, 2)) * 1e-3 + 1).sqrt()
    np.testing.assert_allclose(y.numpy(), (r * rs.reshape(32, 1, 1)).relu().sum((1, 2)).numpy(), rtol=1e-4)
    assert any("rows_r_32_128_400_E_32_r_32_128_400" in s for s in _group_sources()), _group_sources()


@pytest.mark.parametrize("threads", ["1", "2"])
def test_adam_updates_of_one_parameter_are_one_row_group_and_match_torch(threads, monkeypatch):
    """Adam's m, v and parameter updates (three assigns over the same elements) sit side by side in the
    schedule and run as one loop, eager and under TinyJit; values as torch.optim.Adam's after 4 steps."""
    from tgrad.nn.optim import Adam

    monkeypatch.setenv("TGRAD_THREADS", threads)
    rng = np.random.default_rng(4)
    w0 = rng.standard_normal((300, 700)).astype(np.float32)
    x0 = rng.standard_normal((8, 300)).astype(np.float32)
    # gradients away from 0 (c): Adam's first steps are lr * sign(g), which rounding would flip near 0
    c0 = (rng.uniform(0.5, 1.5, (300, 700)) * rng.choice([-1, 1], (300, 700))).astype(np.float32)
    for jit in (False, True):
        w = Tensor(w0, device="CPU", requires_grad=True)
        x, c = Tensor(x0, device="CPU"), Tensor(c0, device="CPU")
        opt = Adam([w], lr=0.01)

        def step(w=w, x=x, c=c, opt=opt):
            opt.zero_grad()
            loss = (w * c).sum() + (x @ w).square().mean() * 1e-3
            loss.backward()
            opt.step(loss)
            return loss

        run = TinyJit(step) if jit else step
        for _ in range(4):
            run()
        tw = torch.tensor(w0, requires_grad=True)
        topt = torch.optim.Adam([tw], lr=0.01)
        for _ in range(4):
            topt.zero_grad()
            tc, tx = torch.from_numpy(c0), torch.from_numpy(x0)
            ((tw * tc).sum() + (tx @ tw).square().mean() * 1e-3).backward()
            topt.step()
        np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)
    ours = [r for key, r in get_runtime("CPU").row_runners.items()
            if r is not None and [m[0].name for m in key[0]] == ["E_300_700"] * 3]
    assert ours, "m, v and the parameter did not run as one row group"
    for r in ours:
        # one source at every length (one compiled function for every parameter); m, v and the parameter
        # are each read and written through one name (LLVM vectorizes one pointer, not two for one buffer)
        assert "def rows_E_n_E_n_E_n(" in r.source
        read = set(re.findall(r"= (in\d+|out)\[i0\]", r.source))
        assert len(read) == 4, r.source  # the gradient, m, v and the parameter


def test_an_assign_does_not_join_a_kernel_reading_its_target_in_another_row():
    """y = a reversed * 2, then a = b + 1: one loop over rows would overwrite a[n-1-i] before row i reads
    it (as the old value), so these stay two kernels; both values as numpy's."""
    n = 4096
    a0, b0 = np.arange(n, dtype=np.float32), np.full(n, 5.0, np.float32)
    a, b = Tensor(a0, device="CPU").realize(), Tensor(b0, device="CPU").realize()
    y = a.flip(0) * 2
    a.assign(b + 1)
    Tensor.realize(y, a)
    np.testing.assert_array_equal(y.numpy(), a0[::-1] * 2)
    np.testing.assert_array_equal(a.numpy(), b0 + 1)
    z = a * 3  # a row-local reader of the old value may share the loop
    a.assign(b - 1)
    Tensor.realize(z, a)
    np.testing.assert_array_equal(z.numpy(), (b0 + 1) * 3)
    np.testing.assert_array_equal(a.numpy(), b0 - 1)


def test_an_assign_alone_reads_its_target_through_one_name_and_matches_torch():
    """SGD's update w = w - lr * g reads and writes w: in a row group (of one, or with the gradient's kernel
    here) it reads w through the name it writes (one pointer, which LLVM vectorizes); values as
    torch.optim.SGD's."""
    from tgrad.nn.optim import SGD

    rng = np.random.default_rng(8)
    w0, c0 = rng.standard_normal(50_000).astype(np.float32), rng.standard_normal(50_000).astype(np.float32)
    w, c = Tensor(w0, device="CPU", requires_grad=True), Tensor(c0, device="CPU")
    opt = SGD([w], lr=0.1)
    tw = torch.tensor(w0, requires_grad=True)
    topt = torch.optim.SGD([tw], lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        (w * w * c).sum().backward()
        opt.step()
        topt.zero_grad()
        (tw * tw * torch.from_numpy(c0)).sum().backward()
        topt.step()
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)
    # (the update joins the gradient's kernel, which reads w too: both read it as `out`, its written name)
    ours = [r for key, r in get_runtime("CPU").row_runners.items()
            if r is not None and {m[0].name for m in key[0]} == {"E_50000"} and key[0][-1][2] is None]
    assert ours and all("= out[i0]" in r.source for r in ours), [r.source for r in ours]
    x = Tensor(w0[:30_000], device="CPU").realize()  # an assign with no neighbour: a group of one
    x.assign(x * 0.5 + 1).realize()
    np.testing.assert_array_equal(x.numpy(), w0[:30_000] * np.float32(0.5) + 1)
    alone = [r for key, r in get_runtime("CPU").row_runners.items()
             if r is not None and [m[0].name for m in key[0]] == ["E_30000"]]
    assert alone and "= out[i0]" in alone[0].source, alone
