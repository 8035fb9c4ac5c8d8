"""Arguments PyTorch refuses, refused here too with an error naming the op and the value: optimizer
hyperparameters (negative learning rate, momentum, weight decay, epsilon; betas not below 1), randint with
float bounds, uniform with low > high. Each case checks that PyTorch raises the same exception type."""

import numpy as np
import pytest
import torch

from tgrad import Tensor
from tgrad.errors import ArgumentError, DTypeError
from tgrad.nn import optim

OPTIM_CASES = [  # tgrad optimizer and kwargs, torch optimizer and kwargs, the message
    (optim.SGD, {"lr": -0.1}, torch.optim.SGD, {"lr": -0.1}, "SGD: invalid learning rate -0.1"),
    (optim.SGD, {"lr": 0.1, "momentum": -0.1}, torch.optim.SGD, {"lr": 0.1, "momentum": -0.1},
     "SGD: invalid momentum -0.1"),
    (optim.SGD, {"lr": 0.1, "weight_decay": -1}, torch.optim.SGD, {"lr": 0.1, "weight_decay": -1},
     "SGD: invalid weight_decay -1"),
    (optim.AdamW, {"lr": 0.1, "weight_decay": -0.1}, torch.optim.AdamW, {"lr": 0.1, "weight_decay": -0.1},
     "AdamW: invalid weight_decay -0.1"),
    (optim.Adam, {"eps": -1e-8}, torch.optim.Adam, {"eps": -1e-8}, "Adam: invalid epsilon"),
    (optim.Adam, {"b1": 1.0}, torch.optim.Adam, {"betas": (1.0, 0.999)},
     r"Adam: invalid b1 1.0; .* in \[0, 1\)"),
    (optim.Adam, {"weight_decay": -1}, torch.optim.Adam, {"weight_decay": -1},
     "Adam: invalid weight_decay -1"),
    (optim.Adam, {"lr": -1.0}, torch.optim.Adam, {"lr": -1.0}, "Adam: invalid learning rate"),
]


@pytest.mark.parametrize("ours,kw,theirs,tkw,message", OPTIM_CASES)
def test_optimizer_hyperparameters_refused(ours, kw, theirs, tkw, message):
    with pytest.raises(ValueError):
        theirs([torch.tensor([1.0], requires_grad=True)], **tkw)
    with pytest.raises(ArgumentError, match=message):
        ours([Tensor([1.0])], **kw)
    assert issubclass(ArgumentError, ValueError)


def test_optimizer_hyperparameters_at_the_bounds_accepted():
    for make in (lambda p: optim.SGD(p, lr=0.0, momentum=0.0), lambda p: optim.Adam(p, b1=0.0, eps=0.0)):
        assert make([Tensor([1.0])]).params


def test_randint_float_bounds_raise_type_error(device):
    for low, high in ((0.1, 3), (0, 3.5)):
        with pytest.raises(TypeError):
            torch.randint(low, high, (3, 4))
        with pytest.raises(DTypeError, match="randint: low and high must be ints"):
            Tensor.randint(3, 4, low=low, high=high, device=device)
    assert Tensor.randint(3, low=-2, high=5, device=device).numpy().min() >= -2


def test_uniform_low_above_high_raises(device):
    with pytest.raises(RuntimeError):
        torch.empty(3).uniform_(5.0, 3.0)
    with pytest.raises(ArgumentError, match=r"uniform: low \(5.0\) must not be above high \(3.0\)"):
        Tensor.uniform(3, 4, low=5.0, high=3.0, device=device)
    same = Tensor.uniform(3, low=1.0, high=1.0, device=device).numpy()  # PyTorch: every value is low
    assert (same == torch.empty(3).uniform_(1.0, 1.0).numpy()).all()


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_int_learning_rate_is_a_float_rate(device, name):
    """lr=10 (an int) steps as lr=10.0 does in PyTorch, and a later opt.lr = 0.5 is 0.5 (an int lr tensor
    truncated it to 0; on NUMPY Adam's step was computed in int64)."""
    ours, theirs = getattr(optim, name), getattr(torch.optim, name)
    x, tx = Tensor([1.0, -2.0], device=device), torch.tensor([1.0, -2.0], requires_grad=True)
    opt, topt = ours([x], lr=10), theirs([tx], lr=10)
    for lr in (10, 0.5):
        opt.lr, topt.param_groups[0]["lr"] = lr, lr
        opt.zero_grad()
        topt.zero_grad()
        (x * Tensor([3.0, 5.0], device=device)).sum().backward()
        (tx * torch.tensor([3.0, 5.0])).sum().backward()
        opt.step()
        topt.step()
        np.testing.assert_allclose(x.numpy(), tx.detach().numpy(), rtol=1e-4, atol=1e-4)  # (WebGPU sqrt)
    assert opt.lr.dtype.is_float
