"""Tensor.to(device): the copy is part of the graph (gradients flow back to the source device, as in
PyTorch) and TinyJit replays it."""

import numpy as np
import pytest
import torch

from tgrad import Tensor, dtypes
from tgrad.errors import DTypeError
from tgrad.jit import TinyJit


def test_to_keeps_autograd(device):
    """A model on one device, a loss on another: gradients as PyTorch's (one device), on the source."""
    other = "NUMPY" if device != "NUMPY" else "CPU"
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ((tx @ tw).relu().square().mean() + tw.sum()).backward()
    X = Tensor(x, device=device, requires_grad=True)
    W = Tensor(w, device=other, requires_grad=True)
    h = (X.to(other) @ W).relu()
    loss = h.to(device).square().mean() + W.to(device).sum()
    assert loss.device == device
    loss.backward()
    assert X.grad.device == device and W.grad.device == other
    np.testing.assert_allclose(loss.item(), ((tx @ tw).relu().square().mean() + tw.sum()).item(), rtol=1e-5)
    np.testing.assert_allclose(X.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(W.grad.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-6)
    # the functional form too, and a second derivative through the copy
    (gx,) = (X.to(other).square().sum()).gradient(X)
    assert gx.device == device
    np.testing.assert_allclose(gx.numpy(), 2 * x, rtol=1e-6)


def test_to_values_and_dtypes(device):
    cases = ((dtypes.int32, [-3, 0, 7]), (dtypes.bool, [True, False, True]),
             (dtypes.float16, [0.5, -2.0, 1e4]))
    for dt, vals in cases:
        t = Tensor(vals, dtype=dt, device="CPU").to(device)
        assert t.device == device and t.dtype == dt and t.tolist() == vals
        assert t.requires_grad is not True
    x = Tensor.arange(12, device=device).reshape(3, 4).float()
    view = x.T[1:]  # a view: the copy takes its values, not the buffer underneath
    np.testing.assert_array_equal(view.to("NUMPY").numpy(), np.arange(12).reshape(3, 4).T[1:])


def test_to_refuses_a_dtype_the_device_lacks():
    with pytest.raises(DTypeError, match="bfloat16"):
        Tensor([1.0], device="NUMPY", dtype=dtypes.bfloat16).to("CL")


def test_to_under_tinyjit(device):
    """The copy is a host step TinyJit records: replays copy each call's values, and gradients that
    flow through it come back."""
    other = "NUMPY" if device != "NUMPY" else "CPU"
    w = Tensor([[1.0, -2.0], [0.5, 3.0]], device=other, requires_grad=True)

    @TinyJit
    def step(x: Tensor) -> Tensor:
        w.grad = None
        loss = (x.to(other) @ w).tanh().sum()
        loss.backward()
        return loss.to(device).realize(), w.grad.realize()

    for i in range(4):
        x = np.random.default_rng(i).standard_normal((3, 2)).astype(np.float32)
        loss, grad = step(Tensor(x, device=device))
        tw = torch.tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)
        tl = (torch.tensor(x) @ tw).tanh().sum()
        tl.backward()
        assert loss.device == device
        np.testing.assert_allclose(loss.item(), tl.item(), rtol=1e-5)
        np.testing.assert_allclose(grad.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_to_of_a_computed_tensor_keeps_its_graph(device):
    """gradient() of a target that does not require grad, through .to() of a value computed from it (the
    copy realizes that value first; the gradient still reaches the target)."""
    other = "NUMPY" if device != "NUMPY" else "CPU"
    x = Tensor([1.0, -2.0, 0.5], device=device)
    (gx,) = ((x * 3).to(other).square().sum()).gradient(x)
    np.testing.assert_allclose(gx.numpy(), 18 * np.array([1.0, -2.0, 0.5]), rtol=1e-6)
