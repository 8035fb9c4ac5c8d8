"""Convolutions with PyTorch's padding strings ('same', 'valid') and InstanceNorm against torch, forward
and gradients, on every device; 'same' with a stride > 1 and unknown strings raise an ArgumentError (PyTorch's
ValueError) from the functional op and from the layer's constructor."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tgrad import Tensor, nn
from tgrad.errors import ArgumentError, ShapeError

pytestmark = pytest.mark.filterwarnings("ignore:Using padding=.same. with even kernel")  # (torch's own)

CASES = [  # input shape, weight shape, dilation, padding
    ((2, 3, 11), (4, 3, 4), 1, "same"),
    ((2, 3, 11), (4, 3, 3), 2, "same"),
    ((1, 2, 9, 8), (3, 2, 3, 4), 1, "same"),
    ((1, 2, 9, 8), (3, 2, 5, 2), (2, 3), "same"),
    ((1, 2, 9, 8), (3, 2, 3, 4), 1, "valid"),
    ((1, 2, 5, 6, 4), (2, 2, 2, 3, 3), 1, "same"),
]


@pytest.mark.parametrize("xs,ws,dilation,padding", CASES)
def test_padding_strings_match_torch(device, xs, ws, dilation, padding):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    conv = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[len(xs)]
    ref = conv(tx, tw, padding=padding, dilation=dilation)
    ref.square().sum().backward()
    gx, gw = Tensor(x, device=device, requires_grad=True), Tensor(w, device=device, requires_grad=True)
    out = gx.conv2d(gw, padding=padding, dilation=dilation)
    out.square().sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gx.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(gw.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_same_padding_layers_match_torch(device):
    x = np.random.default_rng(1).standard_normal((2, 3, 10, 7)).astype(np.float32)
    layer = nn.Conv2d(3, 5, (4, 3), padding="same", dilation=(1, 2))
    ref = torch.nn.Conv2d(3, 5, (4, 3), padding="same", dilation=(1, 2))
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(layer.weight.numpy()))
        ref.bias.copy_(torch.tensor(layer.bias.numpy()))
    out = layer(Tensor(x, device=device))
    np.testing.assert_allclose(out.numpy(), ref(torch.tensor(x)).detach().numpy(), rtol=1e-4, atol=1e-4)


def test_bad_padding_strings_raise():
    with pytest.raises(ArgumentError, match="Conv2d: padding='same' is not supported for strided"):
        nn.Conv2d(16, 32, 2, stride=2, padding="same")
    with pytest.raises(ArgumentError, match="Conv2d: invalid padding string 'not_same'"):
        nn.Conv2d(16, 32, 2, padding="not_same")
    with pytest.raises(ArgumentError, match="conv2d: invalid padding string 'full'"):
        Tensor.ones(1, 1, 5, 5).conv2d(Tensor.ones(1, 1, 3, 3), padding="full")
    with pytest.raises(ValueError):  # PyTorch's exception type
        Tensor.ones(1, 1, 5, 5).conv2d(Tensor.ones(1, 1, 3, 3), stride=(1, 2), padding="same")


@pytest.mark.sweep  # (tests/conftest.py: whole on NUMPY and CPU, a diagonal elsewhere)
@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 3, 5, 6), (1, 3, 2, 3, 4)])
@pytest.mark.parametrize("affine", [True, False])
def test_instance_norm_matches_torch(device, shape, affine):
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32) * 3 + 1
    torch_cls = {3: torch.nn.InstanceNorm1d, 4: torch.nn.InstanceNorm2d,
                 5: torch.nn.InstanceNorm3d}[len(shape)]
    ref = torch_cls(3, affine=affine)
    ours = nn.InstanceNorm(3, affine=affine) if affine else nn.InstanceNorm2d(3)
    if affine:
        w, b = np.array([0.5, -1.0, 2.0], np.float32), np.array([0.1, 0.2, -0.3], np.float32)
        with torch.no_grad():
            ref.weight.copy_(torch.tensor(w))
            ref.bias.copy_(torch.tensor(b))
        ours.weight, ours.bias = Tensor(w, device=device, requires_grad=True), Tensor(b, device=device,
                                                                                        requires_grad=True)
    tx = torch.tensor(x, requires_grad=True)
    gx = Tensor(x, device=device, requires_grad=True)
    out, tout = ours(gx), ref(tx)
    (out * out).sum().backward()
    (tout * tout).sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gx.grad.numpy(), tx.grad.numpy(), rtol=1e-3, atol=1e-3)
    if affine:
        np.testing.assert_allclose(ours.weight.grad.numpy(), ref.weight.grad.numpy(), rtol=1e-3, atol=1e-3)


def test_instance_norm_refuses_unbatched_input():
    with pytest.raises(ShapeError, match=r"InstanceNorm2d: input \(3, 7\) needs \(N, 3, \*spatial\)"):
        nn.InstanceNorm2d(3)(Tensor.ones(3, 7))


@pytest.mark.parametrize("axis", [1, (0, 2), (1, 3, 4)])
def test_batchnorm_axes_match_torch(device, axis):
    """Tensor.batchnorm (tinygrad's) with statistics over one or several axes, against torch's
    F.batch_norm on the tensor with those axes moved to the channel axis and merged."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 3, 2, 2)).astype(np.float32)
    axes = (axis,) if isinstance(axis, int) else axis
    dims = tuple(x.shape[a] for a in axes)
    w, b, m = (rng.standard_normal(dims).astype(np.float32) for _ in range(3))
    invstd = rng.uniform(0.5, 2.0, dims).astype(np.float32)
    stats = (Tensor(v, device=device) for v in (w, b, m, invstd))
    out = Tensor(x, device=device).batchnorm(*stats, axis=axis)
    rest = [a for a in range(5) if a not in axes]
    tx = torch.tensor(x).permute(rest[0], *axes, *rest[1:])
    tx = tx.reshape(tx.shape[0], -1, *tx.shape[1 + len(axes):])
    ref = F.batch_norm(tx, torch.tensor(m).flatten(), 1.0 / torch.tensor(invstd).flatten() ** 2,
                       torch.tensor(w).flatten(), torch.tensor(b).flatten(), eps=0.0)
    ref = ref.reshape(x.shape[rest[0]], *dims, *(x.shape[a] for a in rest[1:]))
    ref = ref.permute(*np.argsort([rest[0], *axes, *rest[1:]]))
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)
    with pytest.raises(ShapeError, match="batchnorm: mean has shape"):
        Tensor(x).batchnorm(None, None, Tensor.ones(*(d + 1 for d in dims)), Tensor(invstd), axis=axis)
