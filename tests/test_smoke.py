import numpy as np

from tests.helpers import helper_test_op
from tgrad import Tensor


def test_seed_snippet(device):
    x = Tensor.eye(3, requires_grad=True)
    y = Tensor([[2.0, 0, -2.0]], requires_grad=True)
    z = y.matmul(x).sum()
    z.backward()
    assert x.grad.tolist() == [[2.0, 2.0, 2.0], [0.0, 0.0, 0.0], [-2.0, -2.0, -2.0]]
    assert y.grad.tolist() == [[1.0, 1.0, 1.0]]


def test_add_mul_relu_sum(device):
    helper_test_op([(4, 5), (4, 5), (5,)], lambda a, b, c: (a * b + c).relu().sum())


def test_matmul(device):
    helper_test_op([(3, 4), (4, 5)], lambda a, b: a @ b)


def test_numpy_roundtrip(device):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(Tensor(a).numpy(), a)
