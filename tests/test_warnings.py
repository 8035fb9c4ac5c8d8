"""Where PyTorch warns, tgrad warns the same way (issue 46 items 10 and 6): a loss target that broadcasts
against the input, and BatchNorm / Dropout left in eval mode while training."""

import warnings

import numpy as np
import pytest
import torch

from tgrad import Tensor

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
