"""Optimizer.param_groups: PyTorch's list of hyperparameter dicts, as views of a tgrad optimizer.

tgrad's optimizers have one group. Its 'lr' reads and writes the optimizer's lr tensor (the setter
Optimizer.lr has), so a step TinyJit captured, or the optimizer's own replayed update, reads the new rate;
'momentum', 'betas', 'eps', 'weight_decay' and 'nesterov' write the optimizer's attributes (a tensor one,
such as a momentum OneCycleLR cycles, in place), which the next step uses (a replayed update is captured
again for new values). Other keys (a scheduler's 'initial_lr') are kept per optimizer, as PyTorch keeps
them in the dict.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, MutableMapping
from typing import Any

import numpy as np

from tgrad.errors import ArgumentError
from tgrad.tensor import Tensor

# keys a user added to an optimizer's group (not hyperparameters tgrad's optimizers read)
_EXTRA: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _value(x: Any) -> Any:
    """A hyperparameter as a Python value; a tensor's as the shortest decimal that is the same number in
    its dtype (0.1, not float32's 0.10000000149011612: what the user wrote, and what the step reads)."""
    if not isinstance(x, Tensor):
        return x
    v = x.numpy().reshape(-1)[0]
    return float(str(v)) if isinstance(v, np.floating) else float(v)


def _write(opt: Any, attr: str, value: Any) -> None:
    """Set an optimizer attribute: in place when it is a tensor (captured kernels read that buffer)."""
    current = getattr(opt, attr)
    if isinstance(current, Tensor):
        current.assign(Tensor([float(value)], device=current.device, dtype=current.dtype)).realize()
    else:
        setattr(opt, attr, value if isinstance(value, bool) else float(value))


class ParamGroup(MutableMapping):
    """The group of one optimizer: 'params', 'lr' and the hyperparameters the optimizer has."""

    def __init__(self, opt: Any):
        self.opt = opt

    def _keys(self) -> dict[str, tuple[str, ...]]:
        """Each hyperparameter key and the optimizer attributes it stands for."""
        opt = self.opt
        if hasattr(opt, "nesterov"):  # SGD
            return {"lr": (), "momentum": ("momentum",), "weight_decay": ("wd",), "nesterov": ("nesterov",),
                    "dampening": ()}
        if hasattr(opt, "b2"):  # LAMB, Adam (weight decay added to the gradient: l2), AdamW
            return {"lr": (), "betas": ("b1", "b2"), "eps": ("eps",),
                    "weight_decay": ("l2",) if hasattr(opt, "l2") else ("wd",)}
        return {"lr": ()}

    def __getitem__(self, key: str) -> Any:
        if key == "params":
            return list(self.opt.params)
        if key == "lr":
            return _value(self.opt.lr)
        if key == "dampening" and key in self._keys():
            return 0.0
        attrs = self._keys().get(key)
        if attrs:
            values = tuple(_value(getattr(self.opt, a)) for a in attrs)
            return values if len(values) > 1 else values[0]
        return _EXTRA.get(self.opt, {})[key]

    def __setitem__(self, key: str, value: Any) -> None:
        keys = self._keys()
        if key == "params":
            raise ArgumentError("param_groups: an optimizer's parameters are fixed; make a new optimizer")
        if key == "lr":
            self.opt.lr = value
        elif key == "dampening" and key in keys:
            if value != 0:
                raise ArgumentError(f"param_groups: SGD has no dampening here (0 only), got {value!r}")
        elif keys.get(key):
            attrs = keys[key]
            values = tuple(value) if len(attrs) > 1 else (value,)
            if len(values) != len(attrs):
                raise ArgumentError(f"param_groups: {key!r} takes {len(attrs)} values, got {value!r}")
            for attr, v in zip(attrs, values):
                _write(self.opt, attr, v)
            if key == "momentum" and hasattr(self.opt, "bufs") and not self.opt.bufs and values[0]:
                opt = self.opt
                opt.bufs = [Tensor(np.zeros(t.shape, t.dtype.np), device=t.device) for t in opt.params]
        else:
            _EXTRA.setdefault(self.opt, {})[key] = value

    def __delitem__(self, key: str) -> None:
        if key in _EXTRA.get(self.opt, {}):
            del _EXTRA[self.opt][key]
        else:
            raise ArgumentError(f"param_groups: {key!r} cannot be removed")

    def __iter__(self) -> Iterator[str]:
        yield "params"
        yield from self._keys()
        yield from _EXTRA.get(self.opt, {})

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return repr({k: (f"<{len(v)} tensors>" if k == "params" else v) for k, v in self.items()})


__all__ = ["ParamGroup"]
