"""Where PyTorch warns, tgrad warns the same way (issue 46 items 10 and 6): a loss target that broadcasts
against the input, and BatchNorm / Dropout left in eval mode while training."""

import warnings

import numpy as np
import pytest
import torch

from tgrad import Tensor, nn
from tgrad.ops import nn as tgrad_nn_ops

F = torch.nn.functional
LOSSES = ["mse_loss", "l1_loss", "smooth_l1_loss"]
SHAPES = [((4, 1), (4,)), ((4,), (1,)), ((4,), ()), ((3,), (2, 3))]


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_broadcast_target_warns_like_torch(device, loss, shapes):
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    with pytest.warns(UserWarning, match=r"Using a target size .* different to the input size") as got:
        expected = getattr(F, loss)(torch.tensor(x), torch.tensor(y))
    assert len(got) == 1
    with pytest.warns(UserWarning, match=r"Using a target size .* different to the input size") as got:
        value = getattr(Tensor(x, device=device), loss)(Tensor(y, device=device))
    assert len(got) == 1 and got[0].filename == __file__  # the user's line
    np.testing.assert_allclose(value.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("loss", LOSSES)
def test_same_shape_target_does_not_warn(loss):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = getattr(Tensor(x), loss)(Tensor(x[::-1].copy()))
        expected = getattr(F, loss)(torch.tensor(x), torch.tensor(x[::-1].copy()))
    np.testing.assert_allclose(value.numpy(), expected.numpy(), rtol=1e-6)


@pytest.fixture
def eval_warning_unshown(monkeypatch):
    """The eval-mode warning shows once a process: each test starts as a fresh process would."""
    monkeypatch.setattr(tgrad_nn_ops, "_EVAL_WARNED", [False])
    tgrad_nn_ops.EVAL_MODE_NODES.clear()
    monkeypatch.setattr(Tensor, "training", False)


def _model():
    return [nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Linear(2 * 4 * 4, 3), nn.Dropout(0.5)]


def _step(layers, x):
    conv, bn, lin, drop = layers
    return drop(lin(bn(conv(x)).relu().flatten(1))).square().mean()


EVAL = r"eval mode: Tensor.training is False.*Tensor.training = True.*with Tensor.train\(\):"


@pytest.mark.usefixtures("eval_warning_unshown")
def test_eval_mode_training_warns_once(device):
    layers = _model()
    x = Tensor.randn(2, 1, 6, 6, device=device)
    with pytest.warns(UserWarning, match=EVAL) as got:
        for _ in range(3):
            _step(layers, x).backward()
    assert len([w for w in got if "eval mode" in str(w.message)]) == 1
    assert got[0].filename == __file__  # the user's backward() line


@pytest.mark.usefixtures("eval_warning_unshown")
@pytest.mark.parametrize("layer", ["BatchNorm", "Dropout"])
def test_each_layer_alone_warns(layer):
    x = Tensor.randn(4, 3)
    w = Tensor.randn(3, 3, requires_grad=True)
    y = x @ w
    y = nn.BatchNorm1d(3)(y) if layer == "BatchNorm" else nn.Dropout(0.1)(y)
    with pytest.warns(UserWarning, match=f"through a {layer} in eval mode"):
        y.sum().backward()


@pytest.mark.usefixtures("eval_warning_unshown")
def test_no_eval_warning_in_training_or_inference(device):
    layers = _model()
    x = Tensor.randn(2, 1, 6, 6, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Tensor.train():  # training: no warning
            _step(layers, x).backward()
        Tensor.training = True
        _step(layers, x).backward()
        Tensor.training = False
        _step(layers, x).numpy()  # eval inference, no backward: no warning
        with Tensor.no_grad:
            _step(layers, x).numpy()
        w = Tensor.randn(3, requires_grad=True)  # a backward through other layers: no warning
        (x.flatten(1)[:, :3] * w).sum().backward()
