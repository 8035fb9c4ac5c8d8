"""Optimizers. step() builds the update lazily with assign() (so it fuses and writes each parameter's
buffer in place) and realizes every new parameter, state tensor and running statistic in one call.

Tensors given to an optimizer that do not require gradients (BatchNorm running statistics from
get_parameters) are realized by step() too, so their pending assign() updates happen each step.
"""

from __future__ import annotations

import math

import numpy as np

from tgrad.errors import AutogradError
from tgrad.tensor import Tensor


def _state(t: Tensor, value: float = 0.0) -> Tensor:
    """A state tensor like t with a buffer of its own."""
    return Tensor(np.full(t.shape, value, t.dtype.np), device=t.device)


class Optimizer:
    def __init__(self, params: list[Tensor], lr: float):
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list; pass get_parameters(model)")
        self.params = [t for t in params if t.requires_grad]
        self.buffers = [t for t in params if not t.requires_grad]
        if not self.params:
            raise AutogradError("no parameter requires a gradient; create them with requires_grad=True")
        Tensor.realize(*self.params, *self.buffers)
        # lr is a tensor so that changing it (opt.lr.assign(...)) also works under TinyJit
        self.lr = Tensor([lr], device=self.params[0].device)

    def zero_grad(self) -> None:
        for t in self.params:
            t.grad = None

    def schedule_step(self) -> list[Tensor]:
        """Build the lazy update; returns every tensor that must be realized to apply it."""
        for t in self.params:
            if t.grad is None:
                raise AutogradError(
                    f"step(): a parameter of shape {t.shape} has no gradient; call loss.backward() first "
                    "(or leave parameters that the loss does not use out of the optimizer)"
                )
        with Tensor.no_grad:
            state = self._step()
        return self.params + self.buffers + state

    def step(self, *also: Tensor) -> None:
        """Apply one update. Tensors in `also` (e.g. the loss) and the gradients are realized in the same
        call, before any parameter buffer is overwritten."""
        tensors = self.schedule_step()
        # the gradients too: they read the parameters' old values, which the update overwrites, so
        # computing them later (reading p.grad after the step) would see the new ones
        Tensor.realize(*also, *tensors, *[t.grad for t in self.params])

    def _step(self) -> list[Tensor]:
        raise NotImplementedError


class SGD(Optimizer):
    """PyTorch's torch.optim.SGD (dampening 0)."""

    def __init__(self, params: list[Tensor], lr: float = 0.001, momentum: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        super().__init__(params, lr)
        if nesterov and momentum <= 0:
            raise ValueError("SGD: nesterov needs momentum > 0")
        self.momentum, self.wd, self.nesterov = momentum, weight_decay, nesterov
        self.bufs = [_state(t) for t in self.params] if momentum else []

    def _step(self) -> list[Tensor]:
        for i, t in enumerate(self.params):
            grad = t.grad.detach()
            if self.wd:
                grad = grad + self.wd * t.detach()
            if self.momentum:
                buf = self.bufs[i].assign(self.momentum * self.bufs[i] + grad)
                grad = grad + self.momentum * buf if self.nesterov else buf
            t.assign(t.detach() - self.lr * grad)
        return self.bufs


class LAMB(Optimizer):
    """LAMB (You et al.); with adam=True it is Adam / AdamW with decoupled weight decay. The step count
    lives in a tensor so bias correction keeps working when the step is replayed by TinyJit."""

    def __init__(self, params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-6, weight_decay: float = 0.0, adam: bool = False):
        super().__init__(params, lr)
        self.b1, self.b2, self.eps, self.wd, self.adam = b1, b2, eps, weight_decay, adam
        self.t = Tensor([0.0], device=self.params[0].device)
        self.m = [_state(t) for t in self.params]
        self.v = [_state(t) for t in self.params]

    def _step(self) -> list[Tensor]:
        step = self.t.assign(self.t + 1)
        # 1 - b**t as exp2(t * log2(b)): one small expression instead of two running products
        c1 = 1 - (step * math.log2(self.b1)).exp2()
        c2 = 1 - (step * math.log2(self.b2)).exp2()
        for t, m, v in zip(self.params, self.m, self.v):
            grad = self._grad(t)
            m.assign(m * self.b1 + grad * (1 - self.b1))
            v.assign(v * self.b2 + grad * grad * (1 - self.b2))
            up = (m / c1) / ((v / c2).sqrt() + self.eps)
            if self.wd:
                up = up + self.wd * t.detach()
            if not self.adam:
                r1 = t.detach().square().sum().sqrt()
                r2 = up.square().sum().sqrt()
                up = up * ((r1 > 0) & (r2 > 0)).where(r1 / r2, 1.0)
            t.assign(t.detach() - self.lr * up)
        return [self.t, *self.m, *self.v]

    def _grad(self, t: Tensor) -> Tensor:
        return t.grad.detach()


class Adam(LAMB):
    """PyTorch's torch.optim.Adam; weight_decay is L2 (added to the gradient) like PyTorch's."""

    def __init__(self, params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(params, lr, b1, b2, eps, 0.0, adam=True)
        self.l2 = weight_decay

    def _grad(self, t: Tensor) -> Tensor:
        grad = t.grad.detach()
        return grad + self.l2 * t.detach() if self.l2 else grad


class AdamW(LAMB):
    """PyTorch's torch.optim.AdamW (decoupled weight decay, default 0.01)."""

    def __init__(self, params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.01):
        super().__init__(params, lr, b1, b2, eps, weight_decay, adam=True)


__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "LAMB"]
