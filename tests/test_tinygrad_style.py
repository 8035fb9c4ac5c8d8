"""tinygrad's way of training: tensors made without requires_grad, an optimizer that decides
(requires_grad is three-state: None = not decided, True, False = frozen), backward() returning the tensor.
The founding document's snippet runs verbatim and trains on real digits, step for step like PyTorch."""
import contextlib
import io

import numpy as np
import pytest
import torch

from tests.test_example import _load
from tgrad import Tensor
from tgrad.datasets import digits
from tgrad.errors import AutogradError
from tgrad.nn import BatchNorm
from tgrad.nn.optim import SGD, Adam
from tgrad.nn.state import get_parameters

SNIPPET = """
from tgrad import Tensor
from tgrad.nn.optim import Adam
class LinearNet:
  def __init__(self):
    self.l1 = Tensor.kaiming_uniform(784, 128)
    self.l2 = Tensor.kaiming_uniform(128, 10)
  def __call__(self, x):
    return x.flatten(1).dot(self.l1).relu().dot(self.l2)
model = LinearNet()
optim = Adam([model.l1, model.l2], lr=0.001)
for epoch in range(10):
  optim.zero_grad()
  loss = model(x).sparse_categorical_crossentropy(y).backward()
  optim.step()
  print(loss.item())
"""


def _digits_28(n: int = 256):
    """The first n training digits (real 8x8 scans, pixels 0..16) drawn as 28x28 images."""
    x, y, _, _ = digits()
    return _load("beautiful_mnist").to_28(x.numpy()[:n, 0]), y.numpy()[:n]


def test_the_seed_snippet_trains_like_pytorch():
    xs, ys = _digits_28()
    Tensor.manual_seed(1)
    namespace = {"x": Tensor(xs), "y": Tensor(ys)}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(SNIPPET, namespace)
    losses = [float(line) for line in out.getvalue().split()]
    assert len(losses) == 10
    assert losses[-1] < 0.5 * losses[0], losses  # it learns

    # the same initial weights (same seed) trained by torch.optim.Adam: the same losses
    Tensor.manual_seed(1)
    init = namespace["LinearNet"]()
    l1 = torch.tensor(init.l1.numpy(), requires_grad=True)
    l2 = torch.tensor(init.l2.numpy(), requires_grad=True)
    opt = torch.optim.Adam([l1, l2], lr=0.001)
    expected = []
    for _ in range(10):
        opt.zero_grad()
        logits = torch.tensor(xs).flatten(1) @ l1
        loss = torch.nn.functional.cross_entropy(logits.relu() @ l2, torch.tensor(ys).long())
        loss.backward()
        opt.step()
        expected.append(loss.item())
    np.testing.assert_allclose(losses, expected, rtol=2e-4)


def test_requires_grad_is_three_state():
    t = Tensor.kaiming_uniform(4, 3)
    assert t.requires_grad is None
    assert Tensor.zeros(2).requires_grad is None and Tensor([1.0]).requires_grad is None
    assert Tensor.ones(2, requires_grad=False).requires_grad is False
    assert Tensor.ones(2, requires_grad=True).requires_grad is True
    t.requires_grad = True
    t.requires_grad = None
    assert t.requires_grad is None
    with pytest.raises(AutogradError, match="requires_grad=True"):  # PyTorch's rule for backward() itself
        (t * 2).sum().backward()


def test_an_optimizer_decides_undecided_tensors_and_leaves_frozen_ones():
    rng = np.random.default_rng(0)
    w0, b0, x = (rng.standard_normal(s).astype(np.float32) for s in ((3, 2), (2,), (5, 3)))
    w, b = Tensor(w0), Tensor(b0, requires_grad=False)
    opt = SGD([w, b], lr=0.1)
    assert w.requires_grad is True and b.requires_grad is False
    assert opt.params == [w] and opt.buffers == [b]
    out = (Tensor(x) @ w + b).square().sum().backward()
    assert isinstance(out, Tensor) and b.grad is None
    opt.step()

    tw, tb = torch.tensor(w0, requires_grad=True), torch.tensor(b0)
    (torch.tensor(x) @ tw + tb).square().sum().backward()
    np.testing.assert_allclose(w.numpy(), (tw - 0.1 * tw.grad).detach().numpy(), rtol=1e-5)
    np.testing.assert_array_equal(b.numpy(), b0)  # frozen: never updated


def test_state_tensors_are_not_made_parameters():
    """BatchNorm's running statistics are frozen (get_parameters hands them to the optimizer), and an
    integer tensor is never promoted; a list of only frozen tensors is refused clearly."""
    bn = BatchNorm(3)
    opt = Adam(get_parameters(bn))
    assert {id(t) for t in opt.params} == {id(bn.weight), id(bn.bias)}
    assert bn.running_mean.requires_grad is False and bn.num_batches_tracked.requires_grad is False
    counter = Tensor([1, 2])
    with pytest.raises(AutogradError, match="requires_grad=False"):
        SGD([Tensor.ones(3, requires_grad=False), counter])
    assert counter.requires_grad is None
