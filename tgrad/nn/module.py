"""tgrad.nn.Module: an optional base class with PyTorch's module methods (parameters, state_dict,
load_state_dict, train/eval, zero_grad, __call__ -> forward), built on tgrad.nn.state's attribute walk.
Plain classes with __call__ (tinygrad style) keep working with tgrad.nn.state's functions.

Training mode: a module's `training` is its own flag once train() or eval() was called on it or on a
module holding it (they set every module below, as in PyTorch); before that it follows the global
Tensor.training (tinygrad's flag, `with Tensor.train():`). tgrad's BatchNorm and Dropout read it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from tgrad.nn.state import get_state_dict, load_state_dict
from tgrad.tensor import Tensor


class IncompatibleKeys(NamedTuple):
    """What load_state_dict(strict=False) returns (PyTorch's _IncompatibleKeys)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class Module:
    """Subclass it and write forward(); tensors (and modules, lists, dicts of them) kept as attributes
    are found by name, as PyTorch's are ('layers.0.weight'). No __init__ call is needed."""

    _training: bool | None = None  # None: follow Tensor.training

    @property
    def training(self) -> bool:
        return bool(Tensor.training) if self._training is None else self._training

    @training.setter
    def training(self, mode: bool | None) -> None:
        self._training = None if mode is None else bool(mode)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__}: a Module subclass defines forward()")

    def modules(self) -> Iterator[Module]:
        """This module and every module below it (through attributes, lists, tuples and dicts), once each."""
        seen: set[int] = set()
        stack: list[Any] = [self]
        while stack:
            obj = stack.pop()
            if id(obj) in seen or isinstance(obj, (Tensor, str, bytes, type)):
                continue
            seen.add(id(obj))
            if isinstance(obj, Module):
                yield obj
            if isinstance(obj, (list, tuple)):
                stack.extend(reversed(obj))
            elif isinstance(obj, dict):
                stack.extend(reversed(list(obj.values())))
            elif hasattr(obj, "__dict__"):
                stack.extend(reversed([v for k, v in vars(obj).items() if not k.startswith("_")]))

    def state_dict(self) -> dict[str, Tensor]:
        """Every tensor, keyed like PyTorch's ('fc.weight', 'bn.running_mean'): the tensors themselves."""
        return get_state_dict(self)

    def named_parameters(self) -> Iterator[tuple[str, Tensor]]:
        """The trainable tensors with their names: those not made with requires_grad=False (running
        statistics are buffers, as in PyTorch)."""
        for name, t in get_state_dict(self).items():
            if t.requires_grad is not False:
                yield name, t

    def parameters(self) -> Iterator[Tensor]:
        for _, t in self.named_parameters():
            yield t

    def named_buffers(self) -> Iterator[tuple[str, Tensor]]:
        for name, t in get_state_dict(self).items():
            if t.requires_grad is False:
                yield name, t

    def buffers(self) -> Iterator[Tensor]:
        for _, t in self.named_buffers():
            yield t

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> IncompatibleKeys:
        """Copy the values in (Tensors, numpy arrays or torch tensors). strict: a missing or unexpected key
        raises a StateDictError naming every one; a value of the wrong shape always raises a ShapeError.
        Returns the missing and unexpected keys, as PyTorch does."""
        own = get_state_dict(self)
        load_state_dict(self, state_dict, strict=strict)
        missing = [k for k in own if k not in state_dict]
        return IncompatibleKeys(missing, [k for k in state_dict if k not in own])

    def train(self, mode: bool = True) -> Module:
        """Set training mode on this module and every module below it (PyTorch's); returns self."""
        if not isinstance(mode, bool):
            raise ValueError(f"train(): mode must be a bool, got {mode!r}")
        for m in self.modules():
            m._training = mode
        return self

    def eval(self) -> Module:
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every parameter's gradient (set_to_none=False: zeros instead, as PyTorch)."""
        for t in self.parameters():
            if t.grad is not None:
                t.grad = None if set_to_none else t.grad.zeros_like()

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}: {t.shape}" for k, t in get_state_dict(self).items())
        return f"{type(self).__name__}({inner})"


__all__ = ["Module", "IncompatibleKeys"]
