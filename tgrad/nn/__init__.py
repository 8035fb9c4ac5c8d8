"""Layers (tgrad.nn.Module subclasses, PyTorch's methods; plain classes with __call__ work as well):
parameters are Tensor attributes, found by tgrad.nn.state.get_parameters or Module.parameters().
Initialisation follows PyTorch's defaults."""

from __future__ import annotations

import math

import numpy as np

from tgrad.dtype import dtypes
from tgrad.errors import ArgumentError, DTypeError, ModeError, ShapeError
from tgrad.nn import optim, state  # noqa: F401  (tinygrad's `from tgrad import nn; nn.state.get_parameters`)
from tgrad.nn.module import Module
from tgrad.ops.helpers import _tuple, conv_padding
from tgrad.ops.nn import note_eval_mode
from tgrad.tensor import Tensor


def _uniform(shape: tuple[int, ...], bound: float) -> Tensor:
    return Tensor.uniform(*shape, low=-bound, high=bound, requires_grad=True)


def _buffer(value: np.ndarray) -> Tensor:
    """A state tensor (running statistics) with a buffer of its own, so assign() writes in place; frozen
    (requires_grad=False), so an optimizer given it by get_parameters never trains it."""
    return Tensor(value, requires_grad=False)


class Linear(Module):
    """y = x @ weight.T + bias; weight (out_features, in_features), PyTorch's kaiming-uniform init."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        bound = 1 / math.sqrt(in_features)
        self.weight = _uniform((out_features, in_features), bound)
        self.bias = _uniform((out_features,), bound) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return x.linear(self.weight, self.bias)


class Conv2d(Module):
    """PyTorch's nn.Conv2d: weight (out, in/groups, kh, kw). Conv1d and Conv3d differ only in the number
    of spatial axes."""

    spatial = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True):
        if in_channels % groups or out_channels % groups:
            raise ShapeError(f"Conv: channels {in_channels}->{out_channels} and groups={groups} differ")
        self.kernel_size = _tuple(kernel_size, self.spatial)
        conv_padding(padding, self.kernel_size, stride, dilation, type(self).__name__)  # (checks a string)
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        bound = 1 / math.sqrt(in_channels // groups * math.prod(self.kernel_size))
        self.weight = _uniform((out_channels, in_channels // groups, *self.kernel_size), bound)
        self.bias = _uniform((out_channels,), bound) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return x.conv2d(self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv1d(Conv2d):
    """PyTorch's nn.Conv1d: weight (out, in/groups, k)."""

    spatial = 1


class Conv3d(Conv2d):
    """PyTorch's nn.Conv3d: weight (out, in/groups, kd, kh, kw)."""

    spatial = 3


class ConvTranspose2d(Module):
    """PyTorch's nn.ConvTranspose2d: weight (in, out/groups, kh, kw)."""

    spatial = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 output_padding=0, groups: int = 1, bias: bool = True, dilation=1):
        if in_channels % groups or out_channels % groups:
            raise ShapeError(f"ConvTranspose: channels {in_channels}->{out_channels}, groups={groups} differ")
        self.kernel_size = _tuple(kernel_size, self.spatial)
        self.stride, self.padding, self.output_padding = stride, padding, output_padding
        self.dilation, self.groups = dilation, groups
        bound = 1 / math.sqrt(out_channels // groups * math.prod(self.kernel_size))
        self.weight = _uniform((in_channels, out_channels // groups, *self.kernel_size), bound)
        self.bias = _uniform((out_channels,), bound) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return x.conv_transpose2d(self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                  self.dilation, self.groups)


class ConvTranspose1d(ConvTranspose2d):
    spatial = 1


class BatchNorm(Module):
    """Batch normalisation over axis 1 of (N, C, ...) inputs. In training (self.training: train() /
    eval(), else Tensor.training; see tgrad/nn/module.py) it uses the
    batch's statistics and updates running_mean / running_var (momentum, unbiased variance) with
    assign(); in eval it uses the running statistics. An optimizer given these tensors (get_parameters
    returns them) realizes the updates in its step()."""

    def __init__(self, num_features: int | None = None, eps: float = 1e-5, affine: bool = True,
                 track_running_stats: bool = True, momentum: float = 0.1, *, sz: int | None = None):
        if (num_features is None) == (sz is None):  # sz: tinygrad's name for num_features
            raise ArgumentError(f"BatchNorm: give num_features (or tinygrad's sz) once, got num_features="
                                f"{num_features}, sz={sz}")
        num_features = num_features if sz is None else sz
        self.eps, self.momentum, self.track_running_stats = eps, momentum, track_running_stats
        self.weight = Tensor.ones(num_features, requires_grad=True) if affine else None
        self.bias = Tensor.zeros(num_features, requires_grad=True) if affine else None
        if track_running_stats:
            self.running_mean = _buffer(np.zeros(num_features, np.float32))
            self.running_var = _buffer(np.ones(num_features, np.float32))
            self.num_batches_tracked = _buffer(np.zeros((), np.int64))

    def forward(self, x: Tensor) -> Tensor:
        axes = tuple(i for i in range(x.ndim) if i != 1)
        training = self.training
        if self.track_running_stats and not training:  # eval: the running statistics
            invstd = (self.running_var + self.eps).rsqrt()
            y = x.batchnorm(self.weight, self.bias, self.running_mean, invstd)
            if not Tensor.no_grad and self._training is None:  # (a backward() through it warns: training
                # mode was likely meant; not after an explicit eval())
                note_eval_mode(y.node, "BatchNorm")
            return y
        # the batch's statistics: Tensor.layernorm over every axis but the channels', whose gradient is
        # PyTorch's r * (g - mean(g) - y * mean(g * y)) in one rule (two sums a channel, one elementwise
        # pass) instead of the composed one through the mean and the variance
        y = x.layernorm(axes, self.eps)
        if training and self.track_running_stats:
            with Tensor.no_grad:  # (the same mean and variance nodes as layernorm's: computed once)
                centered = x - x.mean(axes, keepdim=True)
                mean, var = x.mean(axes), (centered * centered).mean(axes)
                n, m = x.numel() / x.shape[1], self.momentum
                self.running_mean.assign(self.running_mean * (1 - m) + mean * m)
                self.running_var.assign(self.running_var * (1 - m) + var * (n / max(n - 1, 1)) * m)
                self.num_batches_tracked.assign(self.num_batches_tracked + 1)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        y = y if self.weight is None else y * self.weight.reshape(shape)
        return y if self.bias is None else y + self.bias.reshape(shape)


BatchNorm2d = BatchNorm
BatchNorm1d = BatchNorm


class LayerNorm(Module):
    """Normalise over the last len(normalized_shape) axes, then scale and shift (PyTorch's nn.LayerNorm)."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True):
        self.shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.weight = Tensor.ones(*self.shape, requires_grad=True) if elementwise_affine else None
        self.bias = Tensor.zeros(*self.shape, requires_grad=True) if elementwise_affine else None

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-len(self.shape):] != self.shape:
            raise ShapeError(f"LayerNorm: input {x.shape} does not end in {self.shape}")
        y = x.layernorm(tuple(range(-len(self.shape), 0)), self.eps)
        return y if self.weight is None else y * self.weight + self.bias


class LayerNorm2d(LayerNorm):
    """tinygrad's LayerNorm2d: LayerNorm over the channels (axis 1) of (N, C, H, W) inputs."""

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 4:
            raise ShapeError(f"LayerNorm2d: expected an (N, C, H, W) input, got shape {x.shape}")
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class GroupNorm(Module):
    """PyTorch's nn.GroupNorm: channels (axis 1) split into num_groups groups, each normalised."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
        if num_channels % num_groups:
            raise ShapeError(f"GroupNorm: {num_channels} channels do not split into {num_groups} groups")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = Tensor.ones(num_channels, requires_grad=True) if affine else None
        self.bias = Tensor.zeros(num_channels, requires_grad=True) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        y = x.reshape(x.shape[0], self.num_groups, -1).layernorm(-1, self.eps).reshape(x.shape)
        if self.weight is None:
            return y
        shape = (1, -1) + (1,) * (x.ndim - 2)
        return y * self.weight.reshape(shape) + self.bias.reshape(shape)


class InstanceNorm(GroupNorm):
    """tinygrad's nn.InstanceNorm: each channel of each sample normalised over its spatial axes (a
    GroupNorm with one group per channel); affine by default, as in tinygrad."""

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True):
        super().__init__(num_features, num_features, eps, affine)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim < 3 or x.shape[1] != self.num_channels:  # (PyTorch's unbatched (C, L) form is not taken)
            want = f"(N, {self.num_channels}, *spatial)"
            raise ShapeError(f"{type(self).__name__}: input {x.shape} needs {want}")
        return super().forward(x)


class InstanceNorm2d(InstanceNorm):
    """PyTorch's nn.InstanceNorm1d/2d/3d (no running statistics): affine=False by default, as there."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = False,
                 track_running_stats: bool = False):
        if track_running_stats:
            raise ModeError("InstanceNorm: track_running_stats=True is not supported")
        super().__init__(num_features, eps, affine)


InstanceNorm1d = InstanceNorm3d = InstanceNorm2d


class RMSNorm(Module):
    """x / sqrt(mean(x**2 over the last len(normalized_shape) axes) + eps) * weight (PyTorch's nn.RMSNorm;
    eps=None is the dtype's machine epsilon, as there)."""

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True):
        self.shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.weight = Tensor.ones(*self.shape, requires_grad=True) if elementwise_affine else None

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-len(self.shape):] != self.shape:
            raise ShapeError(f"RMSNorm: input {x.shape} does not end in {self.shape}")
        # PyTorch's default: the input dtype's epsilon (bfloat16's 2**-7; its host values are float32)
        finfo_eps = 2.0**-7 if x.dtype == dtypes.bfloat16 else float(np.finfo(x.dtype.np).eps)
        eps = self.eps if self.eps is not None else finfo_eps
        y = x * (x.square().mean(tuple(range(-len(self.shape), 0)), keepdim=True) + eps).rsqrt()
        return y if self.weight is None else y * self.weight


class Dropout(Module):
    """Zeroes elements with probability p while self.training (PyTorch's nn.Dropout)."""

    def __init__(self, p: float = 0.5):
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return x.dropout(self.p, training=self._training)  # (None: Tensor.training)


class LSTMCell(Module):
    """PyTorch's nn.LSTMCell: (h, c) = cell(x, (h, c)); gates i, f, g, o in that order in the weights."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
        bound = 1 / math.sqrt(hidden_size)
        self.hidden_size = hidden_size
        self.weight_ih = _uniform((4 * hidden_size, input_size), bound)
        self.weight_hh = _uniform((4 * hidden_size, hidden_size), bound)
        self.bias_ih = _uniform((4 * hidden_size,), bound) if bias else None
        self.bias_hh = _uniform((4 * hidden_size,), bound) if bias else None

    def forward(self, x: Tensor, hc: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        if hc is None:
            zeros = Tensor.zeros(*x.shape[:-1], self.hidden_size, dtype=x.dtype, device=x.device)
            hc = (zeros, zeros)
        h, c = hc
        gates = x.linear(self.weight_ih, self.bias_ih) + h.linear(self.weight_hh, self.bias_hh)
        i, f, g, o = gates.chunk(4, -1)
        c = f.sigmoid() * c + i.sigmoid() * g.tanh()
        return o.sigmoid() * c.tanh(), c


class LSTM(Module):
    """PyTorch's nn.LSTM (unidirectional): x (T, N, input) or (N, T, input) with batch_first; returns
    (output, (h_n, c_n)) with h_n and c_n (num_layers, N, hidden). Weights are named like PyTorch's
    (weight_ih_l0, ...), so state dicts load."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False):
        self.hidden_size, self.num_layers, self.batch_first = hidden_size, num_layers, batch_first
        for layer in range(num_layers):
            cell = LSTMCell(input_size if layer == 0 else hidden_size, hidden_size, bias)
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                setattr(self, f"{name}_l{layer}", getattr(cell, name))

    def _cell(self, layer: int) -> LSTMCell:
        cell = LSTMCell.__new__(LSTMCell)
        cell.hidden_size = self.hidden_size
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            setattr(cell, name, getattr(self, f"{name}_l{layer}"))
        return cell

    def forward(self, x: Tensor, hc: tuple[Tensor, Tensor] | None = None):
        x = x.transpose(0, 1) if self.batch_first else x  # (T, N, input)
        hs, cs = [], []
        for layer in range(self.num_layers):
            cell = self._cell(layer)
            hc_layer = None if hc is None else (hc[0][layer], hc[1][layer])
            outs = []
            for t in range(x.shape[0]):
                hc_layer = cell(x[t], hc_layer)
                outs.append(hc_layer[0])
            x = Tensor.stack(outs)
            hs.append(hc_layer[0])
            cs.append(hc_layer[1])
        return (x.transpose(0, 1) if self.batch_first else x), (Tensor.stack(hs), Tensor.stack(cs))


class Embedding(Module):
    """Rows of weight (vocab_size, embed_size) picked by integer indices; weight ~ N(0, 1) like PyTorch."""

    def __init__(self, vocab_size: int, embed_size: int):
        self.vocab_size, self.embed_size = vocab_size, embed_size
        self.weight = Tensor.randn(vocab_size, embed_size, requires_grad=True)

    def forward(self, idx: Tensor) -> Tensor:
        if not isinstance(idx, Tensor) or idx.dtype.is_float:
            got = getattr(idx, "dtype", type(idx).__name__)
            raise DTypeError(f"Embedding: indices must be an integer Tensor, got {got}")
        Tensor._check_index(idx, 0, self.vocab_size, "Embedding")  # no negative ids, as in PyTorch
        return self.weight._take(0, idx, checked=True)


__all__ = ["Module", "Linear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
           "BatchNorm", "BatchNorm1d", "BatchNorm2d", "LayerNorm", "LayerNorm2d", "GroupNorm", "InstanceNorm",
           "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "RMSNorm", "Dropout",
           "LSTMCell", "LSTM", "Embedding"]
