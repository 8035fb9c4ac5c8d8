"""TinyJit pitfalls (issue 11): each one is either correct under the jit or a named JitError.

Every test runs on every device (the `device` fixture). On NUMPY, which has no kernels, TinyJit runs the
function each time but keeps the same rules, so the numbers and the errors are the same there.
Numbers are compared with numpy or PyTorch, computed independently of tgrad.
"""

import gc
import weakref

import numpy as np
import pytest
import torch

from tgrad import Tensor
from tgrad import device as dev_mod
from tgrad.errors import JitError
from tgrad.jit import TinyJit
from tgrad.nn.optim import SGD, Adam

RNG = np.random.default_rng(11)
A = RNG.standard_normal((3, 4)).astype(np.float32)
B = RNG.standard_normal((3, 4)).astype(np.float32)


def close(t: Tensor, ref, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(t.numpy(), ref, rtol=rtol, atol=atol)


def jitted(device: str) -> bool:
    return device != "NUMPY"


# ---- returned tensors -----------------------------------------------------------------------------


def test_returned_tensors_stay_valid_after_later_calls(device):
    f = TinyJit(lambda a: (a * 2 + 1, a.sum(0)))
    inputs = [RNG.standard_normal((3, 4)).astype(np.float32) for _ in range(5)]
    outs = [f(Tensor(x)) for x in inputs]  # read only after every call ran
    for (full, col), x in zip(outs, inputs):
        close(full, x * 2 + 1)
        close(col, x.sum(0), rtol=1e-5)
    if jitted(device):
        assert f.replays == 3


def test_returning_an_argument_or_a_parameter_returns_its_value_at_that_call(device):
    w = Tensor(A.copy())

    @TinyJit
    def f(a):
        w.assign(w + a)  # state updated in place on every call
        return a, w  # the argument itself and the state itself

    seen, acc = [], A.copy()
    for i in range(5):
        x = np.full((3, 4), i, np.float32)
        a, state = f(Tensor(x))
        acc = acc + x
        seen.append((a, state, x, acc.copy()))
    for a, state, x, ref in seen:
        close(a, x)
        close(state, ref)
    close(w, acc)


# ---- non-Tensor arguments -------------------------------------------------------------------------


def test_changing_non_tensor_arguments_recapture(device):
    f = TinyJit(lambda a, k, mode=None: (a * k).sum() if mode == "sum" else a * k)
    for k in [2, 2, 2, 3, 3, 3, 2, 0.5, 0.5, 0.5]:
        close(f(Tensor(A), k), A * k)
    for _ in range(3):
        close(f(Tensor(A), 3, mode="sum"), (A * 3).sum(), rtol=1e-5)
    if jitted(device):
        assert f.captures == 4  # k=2, k=3, k=0.5, (3, "sum")


def test_a_numpy_argument_is_an_error_not_frozen(device):
    f = TinyJit(lambda arr: Tensor(arr) * 2)
    with pytest.raises(JitError, match=r"numpy array argument.*Tensor\(array\)"):
        f(A)


def test_a_value_that_changes_every_call_hits_the_bound(device):
    f = TinyJit(lambda a, step: a * step, max_captures=4)
    for step in range(4):
        close(f(Tensor(A), step), A * step)
    with pytest.raises(JitError, match=r"more than 4 different signatures.*as Tensors"):
        f(Tensor(A), 4)


# ---- Python control flow on tensor values ----------------------------------------------------------


def test_control_flow_on_tensor_values_is_an_error(device):
    @TinyJit
    def f(a):
        return a * 2 if a.sum() > 0 else a * 3

    with pytest.raises(JitError, match=r"control flow on tensor values.*Tensor.where"):
        f(Tensor(A))
    g = TinyJit(lambda a: a * a.max().item())
    with pytest.raises(JitError, match=r"\.item\(\)"):
        g(Tensor(A))
    # the data-dependent choice written with where works
    h = TinyJit(lambda a: (a.sum() > 0).where(a * 2, a * 3))
    for x in (A, -np.abs(A), np.abs(A), A):
        close(h(Tensor(x)), x * 2 if x.sum() > 0 else x * 3)


def test_host_data_that_changes_between_calls_is_an_error(device):
    counter = iter(range(100))
    f = TinyJit(lambda a: a * Tensor([float(next(counter))] * 4))
    if not jitted(device):  # NUMPY runs the function every time: nothing is frozen
        for i in range(5):
            close(f(Tensor(A)), A * i)
        return
    with pytest.raises(JitError, match=r"differed in the contents of a Tensor made from host data"):
        for i in range(5):
            close(f(Tensor(A)), A * i)  # right while it runs the function; an error instead of freezing


def test_host_data_that_stays_the_same_is_a_constant(device):
    f = TinyJit(lambda a: a * Tensor([1.0, 2.0, 3.0, 4.0]))
    for x in (A, B, A + B):
        close(f(Tensor(x)), x * np.array([1, 2, 3, 4], np.float32))


def test_state_kept_by_rebinding_a_python_attribute_is_an_error(device):
    class Ema:
        def __init__(self):
            self.h = Tensor.zeros(3, 4).realize()

        @TinyJit
        def update(self, x):
            self.h = self.h * 0.9 + x  # rebinding: a replay would read the first value forever
            return self.h

    e = Ema()
    if not jitted(device):
        for _ in range(4):
            e.update(Tensor(A))  # runs every time: rebinding works
        return
    with pytest.raises(JitError, match=r"Python kept .* assign\(\)"):
        for _ in range(4):
            e.update(Tensor(A))


def test_state_updated_with_assign_works(device):
    class Ema:
        def __init__(self):
            self.h = Tensor.zeros(3, 4).realize()

        @TinyJit
        def update(self, x):
            self.h.assign(self.h * 0.9 + x)
            return self.h

    e, ref = Ema(), np.zeros((3, 4), np.float32)
    for i in range(6):
        x = A * i
        ref = ref * 0.9 + x
        out = e.update(Tensor(x))
    close(out, ref, rtol=1e-5)
    close(e.h, ref, rtol=1e-5)


def test_a_python_value_that_changes_every_call_is_an_error(device):
    mult = 1.0

    @TinyJit
    def f(a):
        return a * mult  # a closure variable: frozen into the kernel at capture

    if not jitted(device):
        return
    with pytest.raises(JitError, match=r"differed in the kernels they ran .* closure variable"):
        for i in range(6):
            mult = float(i + 1)
            close(f(Tensor(A)), A * mult)  # right while it runs the function; an error instead of freezing


def test_lazy_initialization_in_the_first_call(device):
    class Counter:
        def __init__(self):
            self.total = None

        @TinyJit
        def add(self, x):
            if self.total is None:  # made on the first call, updated in place after
                self.total = (x * 0).realize()
            self.total.assign(self.total + x)
            return self.total.sum()

    c, ref = Counter(), np.zeros((3, 4), np.float32)
    for i in range(6):
        x = A + i
        ref = ref + x
        close(c.add(Tensor(x)), ref.sum(), rtol=1e-5)
    close(c.total, ref, rtol=1e-5)


def test_a_branch_on_a_non_tensor_argument(device):
    f = TinyJit(lambda x, square: x * x if square else x * 2)
    for square in [True, False] * 4:
        close(f(Tensor(A), square), A * A if square else A * 2)


def test_a_closure_tensor_assigned_outside(device):
    x = Tensor(np.zeros(4, np.float32))
    f = TinyJit(lambda a: a + x * 2)
    for i in range(5):
        x.assign(Tensor(np.full(4, i, np.float32)))  # not realized: the jit runs it first
        close(f(Tensor(np.ones(4, np.float32))), np.full(4, 1 + 2 * i, np.float32))


def test_keyword_and_positional_arguments_mix(device):
    f = TinyJit(lambda first, second: first / second)
    a, b = Tensor(A), Tensor(np.abs(B) + 1)
    ref = A / (np.abs(B) + 1)
    for _ in range(3):
        close(f(a, b), ref)
        close(f(second=b, first=a), ref)
        close(f(a, second=b), ref)
        close(f(first=a, second=b), ref)


def test_output_fed_back_as_the_next_input(device):
    @TinyJit
    def step(x):
        y = (x + 1).realize()
        return y * 2

    x = step(Tensor(np.array([10.0], np.float32)))
    x = step(Tensor(np.array([20.0], np.float32)))
    for ref in (86.0, 174.0, 350.0):
        x = step(x)
        close(x, [ref])
    y = Tensor(np.array([100.0], np.float32))  # a new "session" starts from a new tensor
    for ref in (202.0, 406.0, 814.0):
        y = step(y)
        close(y, [ref])


def test_views_with_different_offsets_and_constant_arguments(device):
    f = TinyJit(lambda a, k: a * k + 1)
    base = Tensor(RNG.standard_normal((6, 6)).astype(np.float32))
    b = base.numpy()
    for i in range(4):
        close(f(base[:, i : i + 2], Tensor(2.0)), b[:, i : i + 2] * 2 + 1)


# ---- aliasing between arguments ---------------------------------------------------------------------


def test_the_same_tensor_passed_twice(device):
    f = TinyJit(lambda a, b: a * 2 + b)
    x = Tensor(A)
    for _ in range(3):
        close(f(x, x), A * 3)
    for _ in range(3):  # distinct buffers after a capture with one: a capture of its own
        close(f(Tensor(A), Tensor(B)), A * 2 + B)
    close(f(Tensor(B), Tensor(B)), B * 3)


def test_an_argument_written_in_place(device):
    @TinyJit
    def f(a, b):
        a.assign(a + b)
        return (a * 2).sum()

    x, ref = Tensor(A.copy()), A.copy()
    for i in range(5):
        y = np.full((3, 4), i, np.float32)
        out = f(x, Tensor(y))
        ref = ref + y
        close(out, (ref * 2).sum(), rtol=1e-5)
        close(x, ref)
    z = Tensor(B.copy())  # the same jit writes into whichever tensor is passed
    f(z, Tensor(A))
    close(z, A + B)


def test_the_same_tensor_passed_twice_and_written(device):
    @TinyJit
    def f(a, b):
        a.assign(a + b)
        return a.sum()

    x, ref = Tensor(A.copy()), A.copy()
    for _ in range(4):
        f(x, x)
        ref = ref + ref
        close(x, ref)
    y, c = Tensor(B.copy()), Tensor(A)
    for _ in range(3):
        f(y, c)
    close(y, B + 3 * A, rtol=1e-5)


@pytest.mark.parametrize("view", [True, False])
def test_an_argument_that_is_a_view_of_another(device, view):
    @TinyJit
    def f(a, b):
        a.assign(a * 2)
        return a.sum(1) + b.sum(1)  # b: a view of a sees the write (as numpy's), a copy (flip) the old value

    for i in range(4):
        base = A + i
        x = Tensor(base.copy())
        out = f(x, x[:, ::-1] if view else x.flip(1))
        close(out, (base * 2).sum(1) + (base * 2 if view else base).sum(1), rtol=1e-5)
        close(x, base * 2)


def test_view_and_unrealized_arguments(device):
    f = TinyJit(lambda a, b: a @ b)
    x = Tensor(A)
    for i in range(4):
        y = Tensor(B + i)
        close(f(x[:, :3], (y.T * 2)[:3]), A[:, :3] @ ((B + i).T * 2)[:3], rtol=1e-5)


# ---- nesting and methods ----------------------------------------------------------------------------


def test_nested_jits(device):
    inner = TinyJit(lambda a: a * 2 + 1)
    outer = TinyJit(lambda a, b: inner(a) * b)
    for i in range(4):  # inner captured on its own first
        close(inner(Tensor(A + i)), (A + i) * 2 + 1)
    for i in range(5):
        close(outer(Tensor(A + i), Tensor(B)), ((A + i) * 2 + 1) * B, rtol=1e-5)
    for i in range(2):  # and still right on its own after
        close(inner(Tensor(B + i)), (B + i) * 2 + 1)
    if jitted(device):
        assert outer.replays == 3 and inner.replays == 4


def test_a_jitted_method_keeps_one_cache_per_instance(device):
    class Scale:
        def __init__(self, w):
            self.w = Tensor(w)

        @TinyJit
        def __call__(self, x):
            return x @ self.w

    w1, w2 = RNG.standard_normal((4, 2)).astype(np.float32), RNG.standard_normal((4, 2)).astype(np.float32)
    m1, m2 = Scale(w1), Scale(w2)
    for i in range(4):
        x = A + i
        close(m1(Tensor(x)), x @ w1, rtol=1e-5)
        close(m2(Tensor(x)), x @ w2, rtol=1e-5)
    if jitted(device):
        assert m1.__call__ is not m2.__call__ and m1.__call__.replays == 2
    gone = weakref.ref(m1)
    del m1
    gc.collect()
    assert gone() is None, "the per-instance jit cache keeps the instance alive"


# ---- gradients -----------------------------------------------------------------------------------------


def _torch_grads(w0, b0, batches):
    w, b = torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    for x in batches:
        ((torch.tensor(x) @ w + b) ** 2).mean().backward()
    return w, b


def test_gradients_accumulate_across_jitted_micro_steps(device):
    w0, b0 = RNG.standard_normal((4, 2)).astype(np.float32), RNG.standard_normal(2).astype(np.float32)
    w, b = Tensor(w0.copy(), requires_grad=True), Tensor(b0.copy(), requires_grad=True)
    opt = SGD([w, b], lr=0.1)

    @TinyJit
    def micro(x):
        loss = ((x @ w + b) ** 2).mean()
        loss.backward()  # adds onto the gradients of the previous micro-steps
        return loss

    tw, tb = torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    topt = torch.optim.SGD([tw, tb], lr=0.1)
    for _step in range(4):
        opt.zero_grad()
        topt.zero_grad()
        for _k in range(3):
            x = RNG.standard_normal((5, 4)).astype(np.float32)
            loss = micro(Tensor(x))
            tloss = ((torch.tensor(x) @ tw + tb) ** 2).mean()
            tloss.backward()
            close(loss, tloss.item(), rtol=1e-4, atol=1e-6)
            close(w.grad, tw.grad.numpy(), rtol=1e-4, atol=1e-5)
        opt.step()
        topt.step()
        close(w, tw.detach().numpy(), rtol=1e-4, atol=1e-5)
        close(b, tb.detach().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("where", ["inside", "outside"])
def test_zero_grad_inside_or_outside_the_jit(device, where):
    w0 = RNG.standard_normal((4, 2)).astype(np.float32)
    w = Tensor(w0.copy(), requires_grad=True)
    opt = Adam([w], lr=0.05)

    @TinyJit
    def step(x):
        if where == "inside":
            opt.zero_grad()
        loss = (x @ w).square().mean()
        loss.backward()
        opt.step(loss)
        return loss

    tw = torch.tensor(w0, requires_grad=True)
    topt = torch.optim.Adam([tw], lr=0.05)
    for _i in range(6):
        x = RNG.standard_normal((5, 4)).astype(np.float32)
        if where == "outside":
            opt.zero_grad()
        loss = step(Tensor(x))
        topt.zero_grad()
        tloss = (torch.tensor(x) @ tw).square().mean()
        tloss.backward()
        topt.step()
        close(loss, tloss.item(), rtol=1e-4, atol=1e-6)
        close(w.grad, tw.grad.numpy(), rtol=1e-4, atol=2e-5)  # the gradient of this call, readable after
    close(w, tw.detach().numpy(), rtol=1e-4, atol=1e-5)


# ---- random numbers ----------------------------------------------------------------------------------


def test_random_numbers_are_drawn_again_on_every_replay(device):
    @TinyJit
    def f(x):
        noise = Tensor.rand(3, 4)
        return x + noise, x.dropout(0.5)

    old, Tensor.training = Tensor.training, True
    try:
        Tensor.manual_seed(7)
        outs = [f(Tensor(A)) for _ in range(5)]
        noises = [o.numpy() - A for o, _ in outs]
        for i in range(len(noises)):
            for j in range(i):
                assert not np.allclose(noises[i], noises[j]), "a replay reused the captured random numbers"
        # the same draws as numpy's generator with the same seed, in the same order
        rng = np.random.default_rng(7)
        for (_noisy, dropped), noise in zip(outs, noises):
            ref = rng.random((3, 4)).astype(np.float32)
            keep = rng.random((3, 4)).astype(np.float32) >= 0.5
            np.testing.assert_allclose(noise, ref, rtol=1e-5, atol=1e-6)
            close(dropped, np.where(keep, A * 2, 0))
        # and reproducible under manual_seed
        Tensor.manual_seed(7)
        again = [f(Tensor(A))[0].numpy() for _ in range(5)]
        np.testing.assert_array_equal(np.stack(again), np.stack([o.numpy() for o, _ in outs]))
    finally:
        Tensor.training = old


# ---- shapes ------------------------------------------------------------------------------------------


def test_a_smaller_last_batch_gets_its_own_capture(device):
    w0 = RNG.standard_normal((4, 3)).astype(np.float32)
    w = Tensor(w0.copy(), requires_grad=True)
    opt = SGD([w], lr=0.1)

    @TinyJit
    def step(x):
        opt.zero_grad()
        loss = (x @ w).relu().sum()
        loss.backward()
        opt.step(loss)
        return loss

    data = RNG.standard_normal((10, 4)).astype(np.float32)  # batches of 4, 4 and a last one of 2
    tw = torch.tensor(w0, requires_grad=True)
    topt = torch.optim.SGD([tw], lr=0.1)
    for _epoch in range(4):
        for lo in range(0, 10, 4):
            x = data[lo : lo + 4]
            loss = step(Tensor(x))
            topt.zero_grad()
            tloss = (torch.tensor(x) @ tw).relu().sum()
            tloss.backward()
            topt.step()
            close(loss, tloss.item(), rtol=1e-4, atol=1e-5)
    close(w, tw.detach().numpy(), rtol=1e-4, atol=1e-5)
    if jitted(device):
        assert step.captures == 2


# ---- switches --------------------------------------------------------------------------------------------


def test_jit_0_runs_the_function_every_time(device, monkeypatch):
    monkeypatch.setenv("JIT", "0")
    calls = []

    @TinyJit
    def f(a):
        calls.append(1)
        return a * 2

    for i in range(4):
        close(f(Tensor(A + i)), (A + i) * 2)
    assert len(calls) == 4 and f.captures == 0 and f.replays == 0


def test_debug_1_reports_captures_and_replays(device, monkeypatch, capsys):
    monkeypatch.setattr(dev_mod, "DEBUG", 1)
    f = TinyJit(lambda a: a * 2 + 1)
    for i in range(4):
        f(Tensor(A + i))
    err = capsys.readouterr().err
    if not jitted(device):
        return
    assert "TinyJit <lambda>: capture 1 (" in err
    assert "TinyJit <lambda>: replay 1 (" in err and "TinyJit <lambda>: replay 2 (" in err


def test_an_intermediate_the_function_keeps_in_python_is_not_shared(device):
    """Replays reuse the memory of dead intermediates (jit._plan); a tensor the function stored in Python
    without returning it is not planned: it shows the value the last call computed (on kernel devices the
    capture's tensor, which every replay overwrites; on NUMPY each call appends its own), never another
    intermediate's."""
    w = RNG.standard_normal((16, 16)).astype(np.float32) / 4
    kept = []

    @TinyJit
    def f(x, w):
        h = x
        for i in range(6):
            h = (h @ w).relu() + 0.5
            if i == 2:
                kept.append(h)
        return h.sum(0)

    for _ in range(4):
        x = RNG.standard_normal((16, 16)).astype(np.float32)
        f(Tensor(x), Tensor(w)).numpy()
    h = x.astype(np.float64)
    for _ in range(3):
        h = np.maximum(h @ w, 0) + 0.5
    assert len(kept) == (2 if jitted(device) else 4)
    close(kept[-1], h, rtol=1e-4, atol=1e-4)


# ---- fallback=True (tgrad's own uses: Optimizer.step's replayed update) --------------------------------


def test_a_fallback_jit_runs_plainly_where_a_capture_is_refused(device):
    """Where a TinyJit raises JitError, one made with fallback=True runs the function plainly from then on:
    the numbers of every call are the function's."""
    mult = 1.0

    def scaled(a):
        return a * mult  # a closure variable: the kernels differ at every call

    f = TinyJit(scaled, fallback=True)
    for i in range(7):
        mult = float(i + 1)
        close(f(Tensor(A)), A * mult)
    assert f.plain == jitted(device) and f.replays == 0
    g = TinyJit(lambda a, step: a * step, max_captures=2, fallback=True)
    for step in range(6):  # a new signature at every call: more than max_captures
        close(g(Tensor(A), step), A * step)
    assert g.plain and g.replays == 0
    g.reset()
    assert not g.plain
