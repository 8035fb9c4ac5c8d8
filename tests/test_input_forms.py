"""Input forms PyTorch (or tinygrad) takes: assign / setitem of a value that broadcasts to the target
(PyTorch's copy_ and x[...] = v), checked against torch; and device=(name,) (tinygrad's
one-device tuple), Tensor.empty_like, softmax / log_softmax with dtype= (PyTorch's). Shapes that do not
broadcast and tuples of several devices raise, naming them."""

import numpy as np
import pytest
import torch

from tgrad import Device, Tensor, dtypes
from tgrad.errors import DeviceError, ShapeError


@pytest.mark.parametrize("value_shape", [(5,), (1, 5), (3, 1), (1, 1), ()])
def test_assign_broadcasts_like_copy_(device, value_shape):
    v = np.arange(1, 1 + int(np.prod(value_shape)), dtype=np.float32).reshape(value_shape)
    ref = torch.zeros(3, 5)
    ref.copy_(torch.tensor(v))
    a = Tensor.zeros(3, 5, device=device).contiguous().realize()
    a.assign(Tensor(v, device=device))
    np.testing.assert_array_equal(a.numpy(), ref.numpy())
    if value_shape == (3, 1):  # (does not broadcast to the rows 1: of setitem below)
        return
    b = Tensor.zeros(3, 5, device=device).contiguous().realize()
    tb = torch.zeros(3, 5)
    b[1:] = Tensor(v, device=device)
    tb[1:] = torch.tensor(v)
    np.testing.assert_array_equal(b.numpy(), tb.numpy())


@pytest.mark.parametrize("value_shape", [(3,), (2, 3, 5), (4, 5)])
def test_assign_refuses_shapes_that_do_not_broadcast(value_shape):
    with pytest.raises(RuntimeError):
        torch.zeros(3, 5).copy_(torch.ones(value_shape))
    with pytest.raises(ShapeError, match=r"assign: shape .* does not match \(3, 5\) nor broadcasts to it"):
        Tensor.zeros(3, 5).contiguous().realize().assign(Tensor.ones(*value_shape))


def test_one_device_tuple(device):
    t = Tensor([1.0], device=(device,)) + Tensor([2.0], device=device)
    assert t.device == device and t.numpy().tolist() == [3.0]
    with pytest.raises(DeviceError, match=r"device=\('NUMPY', 'NUMPY'\): a tensor on several devices"):
        Tensor([1.0], device=("NUMPY", "NUMPY"))


def test_empty_like(device):
    x = Tensor.ones(2, 3, dtype="int16", device=device)
    ref = torch.empty_like(torch.ones(2, 3, dtype=torch.int16))
    e = Tensor.empty_like(x)
    assert e.shape == tuple(ref.shape) and e.dtype.name == str(ref.dtype).split(".")[1] and e.device == device
    assert x.empty_like(dtype="float32").dtype.name == "float32"
    e.assign(x + 1)  # an empty tensor is a buffer to write into (tinygrad's use under TinyJit)
    np.testing.assert_array_equal(e.numpy(), (torch.ones(2, 3, dtype=torch.int16) + 1).numpy())


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("src,dst", [("float16", "float32"), ("int64", "float32"), ("float32", "float64")])
def test_softmax_dtype_argument(device, name, src, dst):
    if not Device[device].supports(dtypes.from_any(dst)):
        pytest.skip(f"{device} has no {dst}")
    data = [[1, 2, 3], [0, -1, 4]]
    ref = getattr(torch.tensor(data, dtype=getattr(torch, src)), name)(1, dtype=getattr(torch, dst))
    out = getattr(Tensor(data, dtype=src, device=device), name)(1, dtype=dst)
    assert out.dtype.name == dst
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
