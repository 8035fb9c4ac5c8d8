"""Optimizers. step() builds the update lazily with assign() (so it fuses and writes each parameter's
buffer in place) and realizes every new parameter, state tensor and running statistic in one call.

Tensors given to an optimizer that do not require gradients (BatchNorm running statistics from
get_parameters) are realized by step() too, so their pending assign() updates happen each step.
"""

from __future__ import annotations

import math

import numpy as np

from tgrad import replay
from tgrad.dtype import dtypes
from tgrad.errors import ArgumentError, AutogradError, ShapeError
from tgrad.jit import TinyJit
from tgrad.nn.param_groups import ParamGroup
from tgrad.tensor import Tensor, backward_roots, pending_assigns


def _run_update(opt: Optimizer) -> None:
    """Build and realize an optimizer's update (what replay.update captures and replays)."""
    tensors, n = opt.schedule_step(), len(opt.params) + len(opt.buffers)
    # the state first: the step count's kernels are scheduled before the parameters' updates, which
    # then are one row group with their moments (m, v and the parameter in one loop)
    Tensor.realize(*tensors[n:], *tensors[:n])


def _state(t: Tensor, value: float = 0.0) -> Tensor:
    """A state tensor like t with a buffer of its own."""
    return Tensor(np.full(t.shape, value, t.dtype.np), device=t.device)


def _hyper(value: float, params: list[Tensor]) -> Tensor:
    """A hyperparameter (lr, momentum, beta1, the step count) as a realized 1-element tensor: float64 where
    a parameter is float64, else float32 whatever dtypes.default_float is, as PyTorch applies its Python
    float hyperparameters in float (its opmath type) to float16 and bfloat16 parameters too. In float16 an
    lr of 1e10 was inf and an lr of 1e-4 lost 3 digits; updates of narrow parameters now compute in float32
    and round once as they are assigned."""
    wide = any(t.dtype == dtypes.float64 for t in params)
    return Tensor([float(value)], dtype=dtypes.float64 if wide else dtypes.float32, device=params[0].device)


def _check(op: str, what: str, value, below: float | None = None) -> None:
    """PyTorch's ValueError for a negative hyperparameter (or a beta not below 1); tensors pass."""
    if isinstance(value, (int, float)) and not (0 <= value and (below is None or value < below)):
        bounds = f"in [0, {below})" if below is not None else "at least 0"
        raise ArgumentError(f"{op}: invalid {what} {value}; it must be {bounds}")


class Optimizer:
    def __init__(self, params: list[Tensor], lr: float):
        _check(type(self).__name__, "learning rate", lr)
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list; pass get_parameters(model)")
        for t in params:  # tinygrad's rule: a tensor not decided (requires_grad None) becomes a parameter
            if t.requires_grad is None and t.dtype.is_float:
                t.requires_grad = True
        self.params = [t for t in params if t.requires_grad]
        self.buffers = [t for t in params if not t.requires_grad]
        if not self.params:
            raise AutogradError(
                "no parameter requires a gradient: every tensor given was made with requires_grad=False "
                "(or is not floating point); pass the tensors to train"
            )
        Tensor.realize(*self.params, *self.buffers)
        # lr is a tensor so that changing it also works under TinyJit (see the lr property); a float one
        # even from an int (lr=10 made an int64 tensor: a later opt.lr = 0.5 truncated to 0, NUMPY's Adam
        # step multiplied in int64)
        self._lr = (_hyper(lr, self.params) if isinstance(lr, (int, float)) else
                    Tensor([lr], device=self.params[0].device)).realize()

    @property
    def lr(self) -> Tensor:
        """The learning rate, a 1-element tensor the update kernels read."""
        return self._lr

    @lr.setter
    def lr(self, value) -> None:
        """`opt.lr = 0.01` writes into that tensor (realized now), so a step TinyJit captured earlier
        uses the new rate too; rebinding it to another tensor would leave the captured kernels reading
        the old one."""
        new = value if isinstance(value, Tensor) else \
            Tensor([float(value)], dtype=self._lr.dtype, device=self._lr.device)
        if new.numel() != 1:
            raise ShapeError(f"Optimizer.lr: expected one number, got a tensor of shape {new.shape}")
        self._lr.assign(new.reshape(1).cast(self._lr.dtype).to(self._lr.device)).realize()

    @property
    def param_groups(self) -> list[ParamGroup]:
        """PyTorch's param_groups: one dict-like group ('params', 'lr', the hyperparameters) whose writes
        change what the next step uses (tgrad/nn/param_groups.py)."""
        return [ParamGroup(self)]

    def zero_grad(self) -> None:
        for t in self.params:
            t.grad = None

    def _check_gradients(self) -> None:
        for t in self.params:
            if t.grad is None:
                raise AutogradError(
                    f"step(): a parameter of shape {t.shape} has no gradient; call loss.backward() first "
                    "(or leave parameters that the loss does not use out of the optimizer)"
                )

    def schedule_step(self) -> list[Tensor]:
        """Build the lazy update; returns every tensor that must be realized to apply it."""
        self._check_gradients()
        with Tensor.no_grad:
            state = self._step()
        return self.params + self.buffers + state

    def step(self, *also: Tensor) -> None:
        """Apply one update. Tensors in `also`, the gradients and the tensors backward() ran from (the loss)
        are realized before any parameter buffer is overwritten (in the same call, or just before the
        update's replay: replay.update)."""
        # the gradients too: they read the parameters' old values, which the update overwrites, so
        # computing them later (reading p.grad after the step) would see the new ones; so would the loss
        # (`opt.step(); loss.item()`, PyTorch's usual loop). Pending assigns (BatchNorm's running
        # statistics when this optimizer was not given them) run too: each reads this step's
        # activations, which it would keep alive until the next step's forward
        update = self._replayed_update()
        if update is None:
            tensors = self.schedule_step()
            Tensor.realize(*also, *tensors, *[t.grad for t in self.params], *pending_assigns(),
                           *backward_roots())
            return
        self._check_gradients()
        Tensor.realize(*also, *self.params, *self.buffers, *[t.grad for t in self.params], *pending_assigns(),
                       *backward_roots())
        update()

    def _replayed_update(self) -> TinyJit | None:
        """The update's program for eager steps (replay.update): only this module's optimizers, whose
        update reads nothing but their attributes; a subclass may read more (the plain step)."""
        if type(self) not in _REPLAYED:
            return None
        return replay.update(self, _run_update)

    def _step(self) -> list[Tensor]:
        raise NotImplementedError

    def momentum_tensor(self) -> Tensor:
        """The momentum (SGD) or beta1 (Adam, AdamW, LAMB) as a 1-element tensor the update kernels read,
        made so on first use: what OneCycleLR's cycle_momentum changes (PyTorch's cycle_momentum)."""
        name = type(self).__name__
        raise ArgumentError(f"{name} has no momentum or beta1 to cycle; use cycle_momentum=False")


class SGD(Optimizer):
    """PyTorch's torch.optim.SGD (dampening 0)."""

    def __init__(self, params: list[Tensor], lr: float = 0.001, momentum: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        super().__init__(params, lr)
        _check("SGD", "momentum", momentum)
        _check("SGD", "weight_decay", weight_decay)
        if nesterov and momentum <= 0:
            raise ValueError("SGD: nesterov needs momentum > 0")
        self.momentum, self.wd, self.nesterov = momentum, weight_decay, nesterov
        self.bufs = [_state(t) for t in self.params] if momentum else []

    def _step(self) -> list[Tensor]:
        for i, t in enumerate(self.params):
            grad = t.grad.detach()
            if self.wd:
                grad = grad + self.wd * t.detach()
            if self.bufs:
                buf = self.bufs[i].assign(self.momentum * self.bufs[i] + grad)
                grad = grad + self.momentum * buf if self.nesterov else buf
            t.assign(t.detach() - self.lr * grad)
        return self.bufs

    def momentum_tensor(self) -> Tensor:
        if not isinstance(self.momentum, Tensor):
            self.momentum = _hyper(self.momentum, self.params).realize()
            self.bufs = self.bufs or [_state(t) for t in self.params]
        return self.momentum


class LAMB(Optimizer):
    """LAMB (You et al.); with adam=True it is Adam / AdamW with decoupled weight decay. The step count
    lives in a tensor so bias correction keeps working when the step is replayed by TinyJit."""

    def __init__(self, params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-6, weight_decay: float = 0.0, adam: bool = False):
        super().__init__(params, lr)
        for what, value, top in (("b1", b1, 1), ("b2", b2, 1), ("epsilon", eps, None),
                                 ("weight_decay", weight_decay, None)):
            _check(type(self).__name__, what, value, top)
        self.b1, self.b2, self.eps, self.wd, self.adam = b1, b2, eps, weight_decay, adam
        self.t = _hyper(0.0, self.params)
        self.m = [_state(t) for t in self.params]
        self.v = [_state(t) for t in self.params]

    def _step(self) -> list[Tensor]:
        step = self.t.assign(self.t + 1)
        # 1 - b**t as exp2(t * log2(b)): one small expression instead of two running products
        log_b1 = self.b1.log2() if isinstance(self.b1, Tensor) else math.log2(self.b1)
        c1 = 1 - (step * log_b1).exp2()  # with the current beta1, as PyTorch when OneCycleLR cycles it
        c2 = 1 - (step * math.log2(self.b2)).exp2()
        rc1, rc2 = c1.reciprocal(), c2.reciprocal()
        for t, m, v in zip(self.params, self.m, self.v):
            grad = self._grad(t)
            m.assign(m * self.b1 + grad * (1 - self.b1))
            v.assign(v * self.b2 + grad * grad * (1 - self.b2))
            # multiplications by reciprocals: c1, c2 and the denominator are never tiny (>= 1 - b, >= eps),
            # so the guarded division (Tensor.div, ~10 more graph nodes each) has nothing to guard here
            up = m * rc1 * ((v * rc2).sqrt() + self.eps).reciprocal()
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

    def momentum_tensor(self) -> Tensor:
        if not isinstance(self.b1, Tensor):
            self.b1 = _hyper(self.b1, self.params).realize()
        return self.b1


class Adam(LAMB):
    """PyTorch's torch.optim.Adam; weight_decay is L2 (added to the gradient) like PyTorch's."""

    def __init__(self, params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(params, lr, b1, b2, eps, 0.0, adam=True)
        _check("Adam", "weight_decay", weight_decay)
        self.l2 = weight_decay

    def _grad(self, t: Tensor) -> Tensor:
        grad = t.grad.detach()
        return grad + self.l2 * t.detach() if self.l2 else grad


class AdamW(LAMB):
    """PyTorch's torch.optim.AdamW (decoupled weight decay, default 0.01)."""

    def __init__(self, params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.01):
        super().__init__(params, lr, b1, b2, eps, weight_decay, adam=True)


class Muon(Optimizer):
    """torch.optim.Muon (tinygrad's Muon takes the same keywords): momentum, then the update orthogonalized
    by newton_schulz's iteration, decoupled weight decay, and the rate scaled for the matrix's shape
    (adjust_lr_fn "original": sqrt(max(1, rows / cols)); "match_rms_adamw": 0.2 * sqrt(max(rows, cols))).
    PyTorch takes 2-d parameters only; a parameter of more dimensions is orthogonalized as the matrix
    (shape[0], the rest), as tinygrad does. The iteration runs in the parameter's dtype (PyTorch's in
    bfloat16). Hyperparameters after lr are keywords only: the two anchors order them differently."""

    def __init__(self, params: list[Tensor], lr: float = 0.001, *, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True,
                 ns_coefficients: tuple[float, ...] = (3.4445, -4.775, 2.0315), eps: float = 1e-7,
                 ns_steps: int = 5, adjust_lr_fn: str | None = None):
        super().__init__(params, lr)
        _check("Muon", "momentum", momentum)
        _check("Muon", "weight_decay", weight_decay)
        if adjust_lr_fn not in (None, "original", "match_rms_adamw"):
            raise ArgumentError(f"Muon: adjust_lr_fn must be None, 'original' or 'match_rms_adamw', "
                                f"not {adjust_lr_fn!r}")
        if not isinstance(ns_steps, int) or not 0 <= ns_steps < 100:
            raise ArgumentError(f"Muon: ns_steps must be an int in [0, 100), got {ns_steps!r}")
        for t in self.params:
            if t.ndim < 2:
                raise ShapeError(f"Muon: only parameters of 2 or more dimensions (matrices), got one of "
                                 f"shape {t.shape}; optimize biases and embeddings with AdamW")
        self.momentum, self.wd, self.nesterov, self.eps = momentum, weight_decay, nesterov, eps
        self.ns_coefficients, self.ns_steps = tuple(ns_coefficients), ns_steps
        self.adjust_lr_fn = adjust_lr_fn
        self.bufs = [_state(t) for t in self.params]

    def _step(self) -> list[Tensor]:
        for t, buf in zip(self.params, self.bufs):
            grad = t.grad.detach()
            buf.assign(buf * self.momentum + grad * (1 - self.momentum))
            up = grad * (1 - self.momentum) + buf * self.momentum if self.nesterov else buf
            rows, cols = t.shape[0], math.prod(t.shape[1:])
            up = up.reshape(rows, cols)
            norm = up.square().sum().sqrt().maximum(self.eps)
            up = up._odd_polynomial(self.ns_steps, self.ns_coefficients, norm)
            if self.adjust_lr_fn == "match_rms_adamw":
                ratio = 0.2 * math.sqrt(max(rows, cols))
            else:
                ratio = math.sqrt(max(1.0, rows / cols)) if cols else 1.0
            kept = t.detach() * (1 - self.lr * self.wd) if self.wd else t.detach()
            t.assign(kept - self.lr * ratio * up.reshape(t.shape))
        return self.bufs

    def momentum_tensor(self) -> Tensor:
        if not isinstance(self.momentum, Tensor):
            self.momentum = _hyper(self.momentum, self.params).realize()
        return self.momentum


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0) -> Tensor:
    """Scale the gradients so that their joint norm is at most max_norm (PyTorch's
    torch.nn.utils.clip_grad_norm_); returns the norm before clipping. Lazy: works inside TinyJit."""
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    params = [p for p in params if p.grad is not None]
    if not params:
        return Tensor(0.0)
    with Tensor.no_grad:
        grads = [p.grad.detach().float().flatten() for p in params]
        if norm_type == math.inf:
            total = Tensor.stack([g.abs().max() for g in grads]).max()
        else:
            total = Tensor.stack([g.abs().pow(norm_type).sum() for g in grads]).sum().pow(1 / norm_type)
        scale = (max_norm / (total + 1e-6)).minimum(1.0)
        for p in params:
            p.grad = p.grad * scale.cast(p.grad.dtype)
    return total


class LRScheduler:
    """Changes optimizer.lr (a tensor) on each step(). The step count is a tensor too and the new lr is
    computed lazily from it. With TinyJit, step() may be called inside the jitted function (its assigns are
    replayed) or outside it (the replayed kernels read the lr tensor, so they use each new value). Like
    PyTorch's: after construction lr is the value at step 0; each step() moves to the next."""

    def __init__(self, optimizer: Optimizer):
        self.optimizer = optimizer
        self.base_lr = float(optimizer.lr.numpy()[0])
        self.step_count = Tensor([0.0], dtype=optimizer.lr.dtype, device=optimizer.lr.device)
        Tensor.realize(*self._apply())

    def lr_at(self, step: Tensor) -> Tensor:
        raise NotImplementedError

    def momentum_at(self, step: Tensor) -> Tensor | None:
        """The momentum (beta1) at a step, for schedulers that cycle it; None: left alone."""
        return None

    def step(self) -> None:
        """Advance one step (lazily: the new lr is computed with the next realize that reads it)."""
        with Tensor.no_grad:
            self.step_count.assign(self.step_count + 1)
            self._apply()

    def _apply(self) -> list[Tensor]:
        """Assign the lr (and the momentum, if this scheduler cycles it) at step_count; returns them."""
        out = [self.optimizer.lr.assign(self.lr_at(self.step_count))]
        momentum = self.momentum_at(self.step_count)
        if momentum is not None:
            out.append(self.optimizer.momentum_tensor().assign(momentum))
        return out

    def get_last_lr(self) -> list[float]:
        return [float(self.optimizer.lr.numpy()[0])]


class StepLR(LRScheduler):
    """lr * gamma ** (step // step_size)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer)

    def lr_at(self, step: Tensor) -> Tensor:
        return self.base_lr * ((step / self.step_size).floor() * math.log2(self.gamma)).exp2()


class CosineAnnealingLR(LRScheduler):
    """eta_min + (lr - eta_min) * (1 + cos(pi * step / T_max)) / 2 (PyTorch's closed form)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0):  # noqa: N803
        self.t_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer)

    def lr_at(self, step: Tensor) -> Tensor:
        return self.eta_min + (self.base_lr - self.eta_min) * (1 + (step * (math.pi / self.t_max)).cos()) / 2


class LinearLR(LRScheduler):
    """Linear warm-up: lr * factor, factor going from start_factor to end_factor over total_iters steps."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1 / 3, end_factor: float = 1.0,
                 total_iters: int = 5):
        self.start, self.end, self.total = start_factor, end_factor, total_iters
        super().__init__(optimizer)

    def lr_at(self, step: Tensor) -> Tensor:
        done = step.minimum(self.total) / self.total
        return self.base_lr * (self.start + (self.end - self.start) * done)


class OneCycleLR(LRScheduler):
    """PyTorch's OneCycleLR (two phases): lr from max_lr/div_factor up to max_lr over pct_start of
    total_steps, then down to max_lr/div_factor/final_div_factor, by cosine (or linear) annealing. With
    cycle_momentum (the default, as PyTorch), the optimizer's momentum (SGD) or beta1 (Adam...) goes the
    other way, from max_momentum down to base_momentum and back."""

    def __init__(self, optimizer: Optimizer, max_lr: float, total_steps: int, pct_start: float = 0.3,
                 anneal_strategy: str = "cos", cycle_momentum: bool = True, base_momentum: float = 0.85,
                 max_momentum: float = 0.95, div_factor: float = 25.0, final_div_factor: float = 1e4,
                 three_phase: bool = False):
        if anneal_strategy not in ("cos", "linear"):
            raise ArgumentError(
                f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', not {anneal_strategy!r}"
            )
        if three_phase:
            raise ArgumentError("OneCycleLR: three_phase=True is not supported")
        if not isinstance(total_steps, int) or total_steps <= 0:
            raise ArgumentError(f"OneCycleLR: total_steps must be a positive int, got {total_steps!r}")
        if not 0 <= pct_start <= 1:
            raise ArgumentError(f"OneCycleLR: pct_start must be in [0, 1], got {pct_start}")
        self.max_lr, self.initial = max_lr, max_lr / div_factor
        self.min_lr = self.initial / final_div_factor
        self.up_end = float(pct_start * total_steps) - 1
        self.down_end = float(total_steps - 1)
        self.anneal = self._cos if anneal_strategy == "cos" else self._linear
        self.momenta = (max_momentum, base_momentum) if cycle_momentum else None
        super().__init__(optimizer)

    @staticmethod
    def _cos(start: float, end: float, pct: Tensor) -> Tensor:
        return end + (start - end) / 2 * ((pct * math.pi).cos() + 1)

    @staticmethod
    def _linear(start: float, end: float, pct: Tensor) -> Tensor:
        return start + (end - start) * pct

    def _phases(self, step: Tensor, start: float, peak: float, end: float) -> Tensor:
        up = self.anneal(start, peak, step / self.up_end)
        down = self.anneal(peak, end, (step - self.up_end) / (self.down_end - self.up_end))
        return (step <= self.up_end).where(up, down)

    def lr_at(self, step: Tensor) -> Tensor:
        return self._phases(step, self.initial, self.max_lr, self.min_lr)

    def momentum_at(self, step: Tensor) -> Tensor | None:
        if self.momenta is None:
            return None
        high, low = self.momenta
        return self._phases(step, high, low, high)


__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "LAMB", "Muon", "clip_grad_norm_", "LRScheduler", "StepLR",
           "CosineAnnealingLR", "LinearLR", "OneCycleLR"]


_REPLAYED = (SGD, LAMB, Adam, AdamW)  # optimizers whose update Optimizer._replayed_update may replay
