"""Special values follow PyTorch: 0, negatives, inf and nan through math, max/relu and division."""

import math

import numpy as np
import pytest
import torch

from tests.helpers import compare
from tgrad import Tensor

SPECIAL = [0.0, -0.0, -1.0, 1.0, math.inf, -math.inf, math.nan, 1e-30, -2.5]


@pytest.mark.parametrize(
    "name",
    [
        "exp",
        "log",
        "sqrt",
        "reciprocal",
        "relu",
        "sigmoid",
        "tanh",
        "abs",
        "neg",
        "sin",
        "log2",
        "exp2",
        "trunc",
        "floor",
        "ceil",
        "sign",
    ],
)
def test_unary_special_values(device, name):
    out = getattr(Tensor(SPECIAL), name)().numpy()
    ref = getattr(torch.tensor(SPECIAL), name)().numpy()
    atol = 1e-6 if name != "sin" else 1e-5
    compare(name, out, ref, atol, 1e-5)


def test_division_by_zero(device):
    a, b = [1.0, -1.0, 0.0, math.nan], [0.0, 0.0, 0.0, 1.0]
    compare("div", (Tensor(a) / Tensor(b)).numpy(), (torch.tensor(a) / torch.tensor(b)).numpy(), 0, 0)


def test_nan_propagates_through_max(device):
    v = [[1.0, math.nan, 3.0], [2.0, 1.0, 0.0]]
    compare("max", Tensor(v).max(1).numpy(), torch.tensor(v).amax(1).numpy(), 0, 0)
    compare(
        "maximum",
        Tensor(v).maximum(Tensor([[0.0, 0.0, math.nan], [math.nan, 5.0, 0.0]])).numpy(),
        torch.tensor(v).maximum(torch.tensor([[0.0, 0.0, math.nan], [math.nan, 5.0, 0.0]])).numpy(),
        0,
        0,
    )


def test_int_division_negative(device):
    a = torch.tensor([7, -7, 7, -7, -1, 0], dtype=torch.int32)
    b = torch.tensor([3, 3, -3, -3, 4, -5], dtype=torch.int32)
    ta, tb = Tensor(a.numpy()), Tensor(b.numpy())
    compare("floordiv", (ta // tb).numpy(), (a // b).numpy(), 0, 0)
    compare("mod", (ta % tb).numpy(), (a % b).numpy(), 0, 0)


def test_half_sum_accumulates_in_float32(device):
    x = np.full(4096, 0.1, dtype=np.float16)
    out = Tensor(x).sum().numpy()
    ref = torch.tensor(x).sum().numpy()
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float32), ref.astype(np.float32), rtol=2e-3)
