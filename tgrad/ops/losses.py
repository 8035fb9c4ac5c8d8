"""Tensor's losses, PyTorch's: cross_entropy, nll_loss, binary cross-entropy, mse, l1, smooth l1."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from tgrad import graph as g
from tgrad import realize as driver
from tgrad.dtype import DType, dtypes
from tgrad.errors import ArgumentError, AutogradError, DTypeError, ShapeError, user_stacklevel
from tgrad.graph import Node, Op
from tgrad.ops.helpers import _position_dtype
from tgrad.ops.numerics import _gradient_only

if TYPE_CHECKING:
    from tgrad.tensor import Tensor


class LossOps:
    """Tensor's losses (a mixin: tensor.py's Tensor is made of these)."""

    __slots__ = ()

    def cross_entropy(
        self, target: Tensor, reduction: str = "mean", label_smoothing: float = 0.0, ignore_index: int = -100,
        weight: Tensor | None = None,
    ) -> Tensor:
        """PyTorch's F.cross_entropy: class-index targets (N,) or probabilities (N, C); classes on axis 1.
        weight (C,): each class's weight; with class indices the mean divides by the summed weights of
        the rows' classes (rows labelled ignore_index left out), as PyTorch's."""
        _check_reduction(reduction)
        _check_target(target, "cross_entropy", type(self))
        x = self if self.ndim != 1 else self.unsqueeze(0)
        logp = x.log_softmax(1)
        c = x.shape[1]
        wb = None if weight is None else _class_weights(weight, x, "cross_entropy")  # (1, C, 1...)
        keep = None  # which rows count (not ignore_index)
        if target.dtype.is_float and target.shape == self.shape:
            if ignore_index >= 0:  # PyTorch's rule (a negative one can match no class)
                raise ArgumentError("cross_entropy: ignore_index is not supported for probability targets")
            _check_smoothing(label_smoothing)
            probs = target if self.ndim != 1 else target.unsqueeze(0)
            if label_smoothing:
                probs = probs * (1 - label_smoothing) + label_smoothing / c
            if wb is not None:
                probs = probs * wb
            loss = -(logp * probs).sum(1)  # as PyTorch's: a 0 probability of a -inf logit is nan
        else:
            t = target if self.ndim != 1 else target.reshape(1)
            if target.dtype.kind == "b":
                raise DTypeError("cross_entropy: class labels must be integers, got bool")
            if target.dtype.is_float or t.shape != (x.shape[0],) + x.shape[2:]:
                raise ShapeError(
                    f"cross_entropy: target {target.shape} ({target.dtype.name}) fits neither class indices "
                    f"nor probabilities for input {self.shape}"
                )
            ignore = ignore_index if t.dtype.min <= ignore_index <= t.dtype.max else None  # none can be it
            type(self)._check_index(t, 0, c, "cross_entropy (target)", ignore=ignore)
            _check_smoothing(label_smoothing)
            tc, cls = _class_positions(t, c, ignore, x.ndim)
            if wb is not None:
                return _weighted_cross_entropy(logp, t, tc, cls, wb, ignore, label_smoothing, reduction,
                                               self.ndim == 1)
            # picked with where(), not multiplied by a one-hot: another class's -inf logit is no 0 * -inf
            loss = -(tc.unsqueeze(1) != cls).where(0, logp).sum(1)  # (!=: == is != and a not)
            if label_smoothing:
                loss = loss * (1 - label_smoothing) - logp.sum(1) * (label_smoothing / c)
            if ignore is not None:
                keep = t != ignore
                loss = keep.where(loss, 0)  # not loss * 0: an ignored row's inf or nan stays out
        if reduction == "none":
            return loss if self.ndim != 1 else loss.reshape(())
        if reduction == "sum":
            return loss.sum()
        if keep is not None:
            count = keep.sum().cast(loss.dtype)
            if loss.dtype == dtypes.float32:  # (a count in [0, 2**31): no scaling, the quotient is the same)
                return loss.sum() * count.reciprocal()
            return loss.sum() / count
        return loss.mean()

    def sparse_categorical_crossentropy(
        self, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0, reduction: str = "mean"
    ) -> Tensor:  # noqa: N803
        """tinygrad's name: logits (N, C) and class indices Y (N,), classes on the last axis."""
        x = self if self.ndim == 2 else self.reshape(-1, self.shape[-1])
        y = Y.reshape(-1)
        return x.cross_entropy(
            y, reduction=reduction, label_smoothing=label_smoothing, ignore_index=ignore_index
        )

    def _same_shape_target(self, y: Tensor, op: str) -> None:
        _check_target(y, op, type(self))
        if y.shape != self.shape:
            shape = y.shape if isinstance(y, type(self)) else type(y).__name__
            raise ShapeError(f"{op}: target {shape} must have the input's shape {self.shape} (PyTorch does "
                             "not broadcast it either)")

    def binary_crossentropy(self, y: Tensor, reduction: str = "mean") -> Tensor:
        """self are probabilities; log is clamped at -100 like PyTorch. Both must lie in [0, 1] (checked
        like PyTorch, by a host step that reads their min and max)."""
        self._same_shape_target(y, "binary_crossentropy")
        _check_reduction(reduction)
        type(self)._check_within(self, 0.0, 1.0, "binary_crossentropy", "input")
        type(self)._check_within(y, 0.0, 1.0, "binary_crossentropy", "target")
        p, t = self.detach(), y.detach()
        loss = -(t * p.log().maximum(-100) + (1 - t) * (1 - p).log().maximum(-100))
        # PyTorch's gradients: (p - y) / max(p (1 - p), 1e-12), finite at p = 0 and 1 where the clamped
        # logs' own would be 0 * inf = nan; for the target log(1 - p) - log(p), not clamped
        loss = loss + _gradient_only(self, (p - t) / (p * (1 - p)).maximum(1e-12))
        if y.dtype.is_float:
            loss = loss + _gradient_only(y, (1 - p).log() - p.log())
        return _reduce_loss(loss, reduction)

    def binary_crossentropy_logits(self, y: Tensor, reduction: str = "mean", pos_weight: Tensor | None = None
                                   ) -> Tensor:
        """PyTorch's binary_cross_entropy_with_logits; pos_weight scales the positive term."""
        self._same_shape_target(y, "binary_crossentropy_logits")
        log_sig, log_one_minus = self.logsigmoid(), (-self).logsigmoid()
        pos = y * log_sig if pos_weight is None else y * pos_weight * log_sig
        return _reduce_loss(-(pos + (1 - y) * log_one_minus), reduction)

    def nll_loss(self, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
                 reduction: str = "mean") -> Tensor:
        """PyTorch's F.nll_loss: self holds log-probabilities (N, C, ...) or (C,), target class indices."""
        _check_reduction(reduction)
        _check_target(target, "nll_loss", type(self))
        if not target.dtype.is_int:
            raise DTypeError(f"nll_loss: target must hold integer class labels, got {target.dtype.name}")
        x = self.unsqueeze(0) if self.ndim == 1 else self
        t = target.reshape(1) if self.ndim == 1 else target
        if t.shape != (x.shape[0],) + x.shape[2:]:
            raise ShapeError(f"nll_loss: target shape {target.shape} does not fit input {self.shape}")
        c = x.shape[1]
        if weight is not None and weight.shape != (c,):
            raise ShapeError(f"nll_loss: weight must have one value per class ({c},), got {weight.shape}")
        ignore = ignore_index if t.dtype.min <= ignore_index <= t.dtype.max else None  # none can be it
        type(self)._check_index(t, 0, c, "nll_loss (target)", ignore=ignore)
        tc, cls = _class_positions(t, c, ignore, x.ndim)
        onehot = tc.unsqueeze(1) == cls
        w = (t != ignore).cast(x.dtype) if ignore is not None else t.ones_like(dtype=x.dtype)
        if weight is not None:
            w = w * onehot.where(weight.reshape((1, c) + (1,) * (x.ndim - 2)), 0).sum(1)
        loss = (w != 0).where(-onehot.where(x, 0).sum(1) * w, 0)  # an ignored row's nan or inf stays out
        if reduction == "none":
            return loss.reshape(()) if self.ndim == 1 else loss
        return loss.sum() if reduction == "sum" else loss.sum() / w.sum()

    def mse_loss(self, target: Tensor, reduction: str = "mean") -> Tensor:
        _warn_broadcast(self, target, "mse_loss")
        return _reduce_loss((self - target).square(), reduction)

    def l1_loss(self, target: Tensor, reduction: str = "mean") -> Tensor:
        _warn_broadcast(self, target, "l1_loss")
        return _reduce_loss((self - target).abs(), reduction)

    def smooth_l1_loss(self, target: Tensor, reduction: str = "mean", beta: float = 1.0) -> Tensor:
        """0.5 * d**2 / beta where |d| < beta, else |d| - 0.5 * beta (PyTorch's)."""
        if not beta >= 0:
            raise ArgumentError(f"smooth_l1_loss: beta must be >= 0, got {beta}")
        _warn_broadcast(self, target, "smooth_l1_loss")
        d = (self - target).abs()
        small = (d < beta) | d.isnan()  # nan: PyTorch's gradient is nan there (d / beta)
        dq = small.where(d, 0)  # the square only sees |d| < beta: no 0 * inf gradient from an inf d
        loss = small.where(0.5 * dq * dq / beta, d - 0.5 * beta) if beta else d
        return _reduce_loss(loss, reduction)

    def huber_loss(self, target: Tensor, reduction: str = "mean", delta: float = 1.0) -> Tensor:
        """0.5 * d**2 where |d| < delta, else delta * (|d| - 0.5 * delta) (PyTorch's F.huber_loss)."""
        if not delta > 0:
            raise ArgumentError(f"huber_loss: delta must be > 0 (as PyTorch's), got {delta}")
        _warn_broadcast(self, target, "huber_loss")
        d = (self - target).abs()
        small = (d < delta) | d.isnan()  # nan: PyTorch's gradient is nan there
        dq = small.where(d, 0)  # the square only sees |d| < delta: no 0 * inf gradient from an inf d
        return _reduce_loss(small.where(0.5 * dq * dq, delta * (d - 0.5 * delta)), reduction)

    def kl_div(self, target: Tensor, reduction: str = "mean", log_target: bool = False) -> Tensor:
        """PyTorch's F.kl_div with self the log-probabilities: target * (log(target) - self), 0 where target
        is 0 (log_target: exp(target) * (target - self)); reduction "mean" (over elements, as PyTorch's),
        "batchmean" (the sum / the batch size: the mathematical KL divergence), "sum" or "none"."""
        if reduction not in ("mean", "batchmean", "sum", "none"):
            raise ArgumentError(f"kl_div: reduction must be 'mean', 'batchmean', 'sum' or 'none', not "
                                f"{reduction!r}")
        _warn_broadcast(self, target, "kl_div")
        if log_target:
            loss = target.exp() * (target - self)
        else:  # xlogy(t, t) - t * self: 0 * log(0) is 0 (a nan target stays nan)
            loss = (target == 0).where(0, target * target.log()) - target * self
        if reduction == "batchmean":
            return loss.sum() / (loss.shape[0] if loss.ndim else 1)
        return _reduce_loss(loss, reduction)


def _class_weights(weight, x: Tensor, op: str) -> Tensor:
    """weight (C,) checked (a Tensor of x's dtype, one value per class: PyTorch's rules), shaped to
    broadcast along x's class axis 1."""
    c = x.shape[1]
    if not isinstance(weight, type(x)):
        raise DTypeError(f"{op}: weight must be a Tensor, got {type(weight).__name__}")
    if weight.shape != (c,):
        raise ShapeError(f"{op}: weight must have one value per class ({c},), got shape {weight.shape}")
    if weight.dtype != x.dtype:
        raise DTypeError(f"{op}: weight is {weight.dtype.name} but the input is {x.dtype.name}; cast it")
    return weight.reshape((1, c) + (1,) * (x.ndim - 2))


def _weighted_cross_entropy(logp: Tensor, t: Tensor, tc: Tensor, cls: Tensor, wb: Tensor, ignore: int | None,
                            smoothing: float, reduction: str, single: bool) -> Tensor:
    """cross_entropy with class weights and class-index targets, PyTorch's formula: each row's loss is
    w[y] * -logp[y], with label smoothing (1 - s) times that plus s / C * -sum_c w[c] logp[c]; the mean
    divides the sum by the summed w[y] of the rows kept."""
    if wb.requires_grad and not type(wb).no_grad:
        raise AutogradError("cross_entropy: weight cannot require a gradient with class-index targets (as in "
                            "PyTorch); pass weight.detach()")
    other = tc.unsqueeze(1) != cls  # (where, not a one-hot product: another class's -inf is no 0 * -inf)
    w_row = other.where(0, wb).sum(1)
    loss = -other.where(0, logp).sum(1) * w_row
    if smoothing:
        loss = loss * (1 - smoothing) - (logp * wb).sum(1) * (smoothing / logp.shape[1])
    if ignore is not None:
        keep = t != ignore
        loss, w_row = keep.where(loss, 0), keep.where(w_row, 0)  # an ignored row's inf or nan stays out
    if reduction == "none":
        return loss.reshape(()) if single else loss
    return loss.sum() if reduction == "sum" else loss.sum() / w_row.sum()


def _warn_broadcast(x: Tensor, target, op: str) -> None:
    """PyTorch's UserWarning for a target of another shape than the input (broadcasting them, e.g. (N, 1)
    against (N,), makes an (N, N) loss: a likely mistake). Shapes that do not broadcast raise later."""
    shape = getattr(target, "shape", None)
    if shape is not None and shape != x.shape:
        warnings.warn(
            f"{op}: Using a target size ({shape}) that is different to the input size ({x.shape}). This will "
            "likely lead to incorrect results due to broadcasting. Please ensure they have the same size.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


def _check_smoothing(label_smoothing: float) -> None:
    if not 0.0 <= label_smoothing <= 1.0:  # also nan; PyTorch ignores a negative one silently
        raise ArgumentError(f"cross_entropy: label_smoothing must be between 0 and 1, got {label_smoothing}")


def _check_target(target, op: str, tensor_class: type) -> None:
    if not isinstance(target, tensor_class):
        raise DTypeError(f"{op}: target must be a Tensor, got {type(target).__name__}")


def _class_positions(t: Tensor, c: int, ignore: int | None, ndim: int) -> tuple[Tensor, Tensor]:
    """Class labels (checked: in [0, c) or `ignore`) and the classes (1, c, 1...) they are compared with,
    both int32 where every value fits (as `_position_dtype`'s masks), else in the labels' dtype."""
    dt = _position_dtype(c, 0 if ignore is None else ignore) if t.dtype.is_int else t.dtype
    cls = type(t)(g.move(_arange_buffer(type(t), c, dt, t.device), Op.RESHAPE, (1, c) + (1,) * (ndim - 2)))
    return t.cast(dt), cls


_ARANGES: dict[tuple, Node] = {}  # (n, dtype name, device) -> its BUFFER node


def _arange_buffer(tensor_class: type, n: int, dtype: DType, device: str) -> Node:
    """0, 1, ..., n - 1 as a realized node that ops read and never write, uploaded once instead of at each
    call (Tensor.arange is a host array sent to the device, a large share of a cross_entropy's time;
    measured: bench/HISTORY.md). At most 64 kept (then they are made again). Made outside any TinyJit
    recording: a constant of tgrad's, like a parameter, not host data of the call (else the call that made
    it differed from the next, which found it made, and the capture waited a call more)."""
    key = (n, dtype.name, device)
    node = _ARANGES.get(key)
    if node is None:
        if len(_ARANGES) >= 64:
            _ARANGES.clear()
        with driver.recording(None):
            node = _ARANGES[key] = tensor_class.arange(n, device=device, dtype=dtype).realize().node
        node.buffer.computed = True  # (an assign to a tensor holding it would write a buffer of its own)
    return node


def _check_reduction(reduction: str) -> None:
    if reduction not in ("mean", "sum", "none"):
        raise ArgumentError(f"reduction must be 'mean', 'sum' or 'none', not {reduction!r}")


def _reduce_loss(loss: Tensor, reduction: str) -> Tensor:
    _check_reduction(reduction)
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss
