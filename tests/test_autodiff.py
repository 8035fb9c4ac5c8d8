"""The gradient table: every primitive op has a rule or is declared non-differentiable, an op with
neither raises AutogradError at backward() naming it, and the rules test_ops.py does not reach are
checked against PyTorch."""

import numpy as np
import pytest
import torch

from tests.helpers import float64_or_raises, helper_test_op
from tgrad import Tensor, autodiff
from tgrad.errors import AutogradError
from tgrad.graph import REDUCE_OPS, Op

S = (3, 4)


def test_every_op_has_a_rule_or_is_non_differentiable():
    ruled, none = set(autodiff.GRADIENTS), set(autodiff.NON_DIFFERENTIABLE)
    assert ruled | none == set(Op), f"no rule and not declared non-differentiable: {set(Op) - ruled - none}"
    assert not ruled & none, f"both a rule and declared non-differentiable: {ruled & none}"


def test_every_reduce_kind_has_a_rule():
    assert set(autodiff.REDUCE_GRADIENTS) == set(REDUCE_OPS)


def test_missing_rule_raises_naming_the_op(device, monkeypatch):
    monkeypatch.delitem(autodiff.GRADIENTS, Op.SQRT)
    x = Tensor([1.0, 4.0], requires_grad=True)
    y = x.sqrt().sum()
    with pytest.raises(AutogradError) as info:
        y.backward()
    message = str(info.value)
    assert "SQRT" in message and "GRADIENTS" in message, message
    assert "(in Tensor.backward, at " in message and "test_autodiff.py" in message, message


def test_missing_reduce_rule_raises_naming_the_kind(device, monkeypatch):
    monkeypatch.delitem(autodiff.REDUCE_GRADIENTS, "PROD")
    x = Tensor([1.0, 4.0], requires_grad=True)
    with pytest.raises(AutogradError, match="REDUCE PROD") as info:
        x.prod().backward()
    assert "test_autodiff.py" in str(info.value)


def test_op_off_the_gradient_path_needs_no_rule(device, monkeypatch):
    monkeypatch.delitem(autodiff.GRADIENTS, Op.SQRT)
    x = Tensor([1.0, 4.0], requires_grad=True)
    (x * Tensor([1.0, 4.0]).sqrt()).sum().backward()
    assert x.grad.tolist() == [1.0, 2.0]


# ---------------------------------------------------------------------------------------------------
# rules test_ops.py does not check backward: CAST, TRUNC, comparisons, and MAX/WHERE edge cases


@pytest.mark.parametrize(
    "name,fn",
    [
        ("cast half", lambda a: a.half().float() * a),
        ("cast double", lambda a: a.double() * 2),
        ("cast int", lambda a: a.int().float() + a * 3),  # no gradient through the int
        ("trunc floor ceil", lambda a: a.trunc() + a.floor() * a + a.ceil() * 2),
        ("compare", lambda a: (a < 0.5).float() * a + (a != a).float()),
    ],
)
def test_zero_and_cast_gradients(device, name, fn):
    if name == "cast double":
        float64_or_raises(lambda: helper_test_op([S], fn), device)
        return
    helper_test_op([S], fn)


def test_where_condition_from_the_input(device):
    helper_test_op([S], lambda a: torch.where(a > 0, a * 2, -a), lambda a: (a > 0).where(a * 2, -a))


def test_maximum_ties_split_evenly(device):
    vals = [[1.0, 2.0, -3.0, 0.5], [1.0, 0.0, -3.0, 0.5]]
    helper_test_op(None, torch.maximum, lambda a, b: a.maximum(b), vals=vals)


# ---------------------------------------------------------------------------------------------------
# gradients at edge inputs, against PyTorch on every device

NAN, INF = float("nan"), float("inf")
PROD_CASES = [[0.0, 2.0, 3.0], [0.0, 0.0, 3.0], [1.0, 2.0, 3.0], [0.0, -2.0, INF], [2.0, NAN, 0.0],
              [[0.0, 2.0], [3.0, 4.0]], [[0.0, 0.0], [1.0, -1.0]], [5.0], [-0.0, 3.0]]


def _grads(values, fn_torch, fn_tgrad):
    xt = torch.tensor(values, requires_grad=True)
    fn_torch(xt).sum().backward()
    xg = Tensor(values, requires_grad=True)
    fn_tgrad(xg).sum().backward()
    return xg.grad.numpy(), xt.grad.numpy()


@pytest.mark.parametrize("values", PROD_CASES)
def test_prod_gradient_with_zeros_and_specials(device, values):
    """The product of the others, not prod / x (which made a zero's gradient nan)."""
    for axis in range(np.ndim(values)):
        got, want = _grads(values, lambda t, a=axis: t.prod(a), lambda t, a=axis: t.prod(a))
        np.testing.assert_allclose(got, want, equal_nan=True, err_msg=f"prod over axis {axis}")
    got, want = _grads(values, lambda t: t.prod(), lambda t: t.prod())
    np.testing.assert_allclose(got, want, equal_nan=True)


def test_maximum_gradient_with_nan_and_ties(device):
    a, b = [1.0, NAN, 3.0, 2.0, NAN], [2.0, 1.0, NAN, 2.0, NAN]
    at, bt = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    torch.maximum(at, bt).sum().backward()
    ag, bg = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
    ag.maximum(bg).sum().backward()
    np.testing.assert_array_equal(ag.grad.numpy(), at.grad.numpy())
    np.testing.assert_array_equal(bg.grad.numpy(), bt.grad.numpy())


def test_max_reduce_gradient_goes_to_the_nan(device):
    """torch.max over all elements: a NaN maximum is the NaN's; ties share evenly."""
    for values in ([1.0, NAN, 3.0], [[1.0, 4.0, 4.0], [NAN, 2.0, 0.0]], [2.0, 2.0]):
        got, want = _grads(values, lambda t: t.max(), lambda t: t.max())
        np.testing.assert_array_equal(got, want)


def test_higher_derivatives_survive_realizing_the_gradient(device):
    """gradient()'s results keep their graph when realized (.numpy()) if a target requires grad, as
    PyTorch's create_graph=True: the second derivative was silently 0 after the first was printed."""
    xs = np.array([2.0, 0.7, -1.3], np.float32)
    x = Tensor(xs, requires_grad=True)
    g, = (x * x * x + (x * 3).sin()).sum().gradient(x)
    g.numpy()
    twice = g * 2
    twice.numpy()
    h, = twice.sum().gradient(x)
    tx = torch.tensor(xs, requires_grad=True)
    tg, = torch.autograd.grad((tx * tx * tx + (tx * 3).sin()).sum(), tx, create_graph=True)
    th, = torch.autograd.grad((tg * 2).sum(), tx)
    np.testing.assert_allclose(g.numpy(), tg.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h.numpy(), th.numpy(), rtol=1e-5, atol=1e-5)


def test_recursive_and_iterative_path_walks_agree_and_the_fallback_is_right(monkeypatch):
    """gradients() finds the nodes between the root and the targets recursively (twice as fast) and falls
    back to a loop over its own stack where the graph is deeper than the recursion limit allows: both give
    the same order (so the same gradient graph), and gradients through the fallback match PyTorch."""
    rng = np.random.default_rng(0)
    xs, ws = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)
    x, w = Tensor(xs, requires_grad=True), Tensor(ws, requires_grad=True)
    loss = (x.linear(w).relu() * x.sum(1, keepdim=True)).log_softmax(1).sum() + w.square().mean()
    for constants in (frozenset(), frozenset({w.node})):
        rec = autodiff._paths_recursive(loss.node, {x.node, w.node}, constants)
        it = autodiff._paths_iterative(loss.node, {x.node, w.node}, constants)
        assert rec[0] == it[0] and rec[1] == it[1] and rec[2] == it[2]

    def too_deep(*args):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(autodiff, "_paths_recursive", too_deep)
    loss.backward()
    tx, tw = torch.tensor(xs, requires_grad=True), torch.tensor(ws, requires_grad=True)
    tl = ((tx @ tw.T).relu() * tx.sum(1, keepdim=True)).log_softmax(1).sum() + tw.square().mean()
    tl.backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-5)
