"""Every differentiable op of the sweeps below (unary, binary, losses), forward and gradient, at extreme
inputs (+-1e4, +-350, +-30, +-1, denormals, 0, +-inf, nan) against PyTorch on every device: no nan where
PyTorch has a number, no 0 where it has a slope."""

import numpy as np
import pytest
import torch

from tgrad import Tensor

V = np.array([-1e4, -350.0, -30.0, -1.0, -1e-40, 0.0, 1e-40, 1.0, 30.0, 350.0, 1e4, np.inf, -np.inf, np.nan],
             np.float32)
F = torch.nn.functional
REDUCING = ("log_softmax", "softmax", "logsumexp", "max", "mean")
# PyTorch's own gradient is nan here (inf * 0 inside its formula); tgrad gives the limit (1 and 0)
TORCH_NAN = {("gelu", np.inf), ("gelu", -np.inf)}
SUBNORMAL = 1e-30  # WGSL lets a GPU flush subnormal floats to 0: WEBGPU skips those inputs

OPS = {
    "exp": (lambda t: t.exp(), torch.exp),
    "log": (lambda t: t.log(), torch.log),
    "sqrt": (lambda t: t.sqrt(), torch.sqrt),
    "sin": (lambda t: t.sin(), torch.sin),
    "cos": (lambda t: t.cos(), torch.cos),
    "tanh": (lambda t: t.tanh(), torch.tanh),
    "sigmoid": (lambda t: t.sigmoid(), torch.sigmoid),
    "relu": (lambda t: t.relu(), torch.relu),
    "gelu": (lambda t: t.gelu(), F.gelu),
    "gelu_tanh": (lambda t: t.gelu(approximate="tanh"), lambda x: F.gelu(x, approximate="tanh")),
    "softplus": (lambda t: t.softplus(), F.softplus),
    "silu": (lambda t: t.silu(), F.silu),
    "elu": (lambda t: t.elu(), F.elu),
    "abs": (lambda t: t.abs(), torch.abs),
    "reciprocal": (lambda t: t.reciprocal(), torch.reciprocal),
    "square": (lambda t: t.square(), torch.square),
    "pow2": (lambda t: t**2, lambda x: x**2),
    "pow0.5": (lambda t: t**0.5, lambda x: x**0.5),
    "mish": (lambda t: t.mish(), F.mish),
    "leaky_relu": (lambda t: t.leaky_relu(), F.leaky_relu),
    "hardtanh": (lambda t: t.hardtanh(), F.hardtanh),
    "relu6": (lambda t: t.relu6(), F.relu6),
    "hardsigmoid": (lambda t: t.hardsigmoid(), F.hardsigmoid),
    "hardswish": (lambda t: t.hardswish(), F.hardswish),
    "celu": (lambda t: t.celu(), F.celu),
    "selu": (lambda t: t.selu(), F.selu),
    "softsign": (lambda t: t.softsign(), F.softsign),
    "logsigmoid": (lambda t: t.logsigmoid(), F.logsigmoid),
    "atan": (lambda t: t.atan(), torch.atan),
    "asin": (lambda t: t.asin(), torch.asin),
    "sinh": (lambda t: t.sinh(), torch.sinh),
    "cosh": (lambda t: t.cosh(), torch.cosh),
    "asinh": (lambda t: t.asinh(), torch.asinh),
    "acosh": (lambda t: t.acosh(), torch.acosh),
    "erf": (lambda t: t.erf(), torch.erf),
    "quick_gelu": (lambda t: t.quick_gelu(), lambda x: x * torch.sigmoid(1.702 * x)),
    "log_softmax": (lambda t: t.log_softmax(0), lambda x: torch.log_softmax(x, 0)),
    "softmax": (lambda t: t.softmax(0), lambda x: torch.softmax(x, 0)),
    "logsumexp": (lambda t: t.logsumexp(0), lambda x: torch.logsumexp(x, 0)),
    "max": (lambda t: t.max(), torch.max),
    "mean": (lambda t: t.mean(), torch.mean),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_at_extreme_inputs(device, name):
    fg, ft = OPS[name]
    wrong = []
    for v in V:
        if device == "WEBGPU" and v != 0 and abs(v) < SUBNORMAL:
            continue
        vals = np.array([v, 1.0], np.float32) if name in REDUCING else np.array([v], np.float32)
        xt, xg = torch.tensor(vals, requires_grad=True), Tensor(vals, requires_grad=True)
        yt, yg = ft(xt), fg(xg)
        yt.sum().backward()
        yg.sum().backward()
        with np.errstate(invalid="ignore"):
            if not np.allclose(yg.numpy(), yt.detach().numpy(), rtol=1e-3, atol=1e-5, equal_nan=True):
                wrong.append(f"{name}({v}) = {yg.numpy()}, torch {yt.detach().numpy()}")
            # outside the domain (a nan value from a number) the gradient is not compared: PyTorch's
            # formula gives a number there (acosh(-1e4): 1e-4), tgrad's nan
            defined = np.isnan(v) or not np.isnan(yt.detach().numpy()).any() or name in REDUCING
            grad_ok = np.allclose(xg.grad.numpy(), xt.grad.numpy(), rtol=1e-3, atol=1e-5, equal_nan=True)
            if defined and (name, v) not in TORCH_NAN and not grad_ok:
                wrong.append(f"d {name}({v}) = {xg.grad.numpy()}, torch {xt.grad.numpy()}")
    assert not wrong, "\n".join(wrong)


# binary ops: every pair of V and W, forward and both gradients
W = np.array([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0, 1e-40, 1e4, np.inf, -np.inf, np.nan], np.float32)
BINARY = {
    "add": (lambda a, b: a + b, torch.add),
    "sub": (lambda a, b: a - b, torch.sub),
    "mul": (lambda a, b: a * b, torch.mul),
    "div": (lambda a, b: a / b, torch.div),
    "pow": (lambda a, b: a**b, torch.pow),
    "maximum": (lambda a, b: a.maximum(b), torch.maximum),
    "minimum": (lambda a, b: a.minimum(b), torch.minimum),
    "fmod": (lambda a, b: a.fmod(b), torch.fmod),
    "remainder": (lambda a, b: a % b, torch.remainder),
    "logaddexp": (lambda a, b: a.logaddexp(b), torch.logaddexp),
    "copysign": (lambda a, b: a.copysign(b), torch.copysign),
}
# PyTorch's gradient is nan (inf / inf or inf * 0 in its formula) where tgrad's is the limit: logaddexp of
# the same infinity twice (0.5 each), copysign at an infinite a (+-1); at a nan a, tgrad's copysign and pow
# slopes are 0 (README: pow), PyTorch's nan (pow(nan, 1): 1)
BINARY_TORCH_NAN = {"logaddexp", "copysign"}


def _pairs(device):
    a, b = (x.ravel() for x in np.meshgrid(V, W, indexing="ij"))
    if device == "WEBGPU":
        keep = ~((a != 0) & (np.abs(a) < SUBNORMAL)) & ~((b != 0) & (np.abs(b) < SUBNORMAL))
        a, b = a[keep], b[keep]
    return a, b


def _mismatches(name, what, got, want, a, b, skip):
    with np.errstate(invalid="ignore"):
        bad = ~np.isclose(got, want, rtol=1e-3, atol=1e-5, equal_nan=True) & ~skip
    return [f"{what} {name}({a[i]}, {b[i]}) = {got[i]}, torch {want[i]}" for i in np.flatnonzero(bad)[:10]]


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_op_at_extreme_inputs(device, name):
    fg, ft = BINARY[name]
    a, b = _pairs(device)
    ag, bg = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
    at, bt = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    yg, yt = fg(ag, bg), ft(at, bt)
    yg.sum().backward()
    yt.sum().backward()
    want = yt.detach().numpy()
    skip = np.zeros(a.shape, bool)
    if name in ("fmod", "remainder"):
        # tgrad's fmod is exact for |a / b| < 2**29 (README); PyTorch's CPU reads a subnormal b as 0 (nan)
        with np.errstate(all="ignore"):
            skip = (np.abs(a / b) >= 2**29) & np.isfinite(a) & (b != 0)
    wrong = _mismatches(name, "", yg.numpy(), want, a, b, skip)
    with np.errstate(invalid="ignore"):
        undefined = np.isnan(want) & ~np.isnan(a) & ~np.isnan(b)  # outside the domain: not compared
    for what, x, xt in (("d/da", ag, at), ("d/db", bg, bt)):
        got = x.grad.numpy() if x.grad is not None else np.zeros(a.shape, np.float32)
        skip_grad = skip | undefined
        if name in BINARY_TORCH_NAN:
            skip_grad |= np.isnan(xt.grad.numpy()) & ~np.isnan(a) & ~np.isnan(b)
        if name in ("pow", "copysign"):  # README: pow's gradient is 0 at an inf or nan base, and for b at an
            skip_grad |= ~np.isfinite(a) | (~np.isfinite(b) if what == "d/db" else False)  # inf/nan exponent
        wrong += _mismatches(name, what, got, xt.grad.numpy(), a, b, skip_grad)
    assert not wrong, "\n".join(wrong)


# losses: inputs from V against ordinary targets (bce: probabilities near 0 and 1), value and both gradients
T = np.array([0.0, 1.0, -1.0, 0.5, 30.0], np.float32)
P = np.array([0.0, 1e-40, 1e-30, 1e-7, 0.5, 1 - 1e-7, 1.0], np.float32)
LOSSES = {
    "mse": (Tensor.mse_loss, F.mse_loss, {}),
    "l1": (Tensor.l1_loss, F.l1_loss, {}),
    "smooth_l1": (Tensor.smooth_l1_loss, F.smooth_l1_loss, {}),
    "smooth_l1_beta0": (Tensor.smooth_l1_loss, F.smooth_l1_loss, {"beta": 0.0}),
    "bce_logits": (Tensor.binary_crossentropy_logits, F.binary_cross_entropy_with_logits, {}),
    "bce": (Tensor.binary_crossentropy, F.binary_cross_entropy, {}),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_at_extreme_inputs(device, name):
    fg, ft, kw = LOSSES[name]
    xs, ts = (P, np.array([0.0, 0.3, 1.0], np.float32)) if name == "bce" else (V, T)
    x, t = (v.ravel() for v in np.meshgrid(xs, ts, indexing="ij"))
    if name == "bce_logits":
        t = t.clip(0, 1)
    if device == "WEBGPU":
        keep = (x == 0) | (np.abs(x) >= SUBNORMAL)
        x, t = x[keep], t[keep]
    xg, tg = Tensor(x, requires_grad=True), Tensor(t, requires_grad=True)
    xt, tt = torch.tensor(x, requires_grad=True), torch.tensor(t, requires_grad=True)
    yg, yt = fg(xg, tg, reduction="none", **kw), ft(xt, tt, reduction="none", **kw)
    yg.sum().backward()
    yt.sum().backward()
    # PyTorch's bce_with_logits is nan at a -inf logit ((1 - t) * x + ...: 0 * inf); tgrad's the limit, inf
    skip = np.isinf(x) & np.isnan(yt.detach().numpy()) if name == "bce_logits" else np.zeros(x.shape, bool)
    wrong = _mismatches(name, "", yg.numpy(), yt.detach().numpy(), x, t, skip)
    wrong += _mismatches(name, "d/dx", xg.grad.numpy(), xt.grad.numpy(), x, t, skip)
    wrong += _mismatches(name, "d/dt", tg.grad.numpy(), tt.grad.numpy(), x, t, skip)
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_cross_entropy_and_nll_at_extreme_logits(device, label_smoothing):
    values = V[(V == 0) | (np.abs(V) >= SUBNORMAL)] if device == "WEBGPU" else V
    rows = np.stack([values, np.zeros_like(values), np.ones_like(values)], 1)
    rows = np.concatenate([rows, rows]).astype(np.float32)
    labels = np.repeat([0, 1], len(values))
    xg, xt = Tensor(rows, requires_grad=True), torch.tensor(rows, requires_grad=True)
    lg = xg.cross_entropy(Tensor(labels), label_smoothing=label_smoothing, reduction="none")
    lt = F.cross_entropy(xt, torch.tensor(labels), label_smoothing=label_smoothing, reduction="none")
    ng = xg.log_softmax(1).nll_loss(Tensor(labels), reduction="none")
    nt = F.nll_loss(xt.log_softmax(1), torch.tensor(labels), reduction="none")
    (lg.sum() + ng.sum()).backward()
    (lt.sum() + nt.sum()).backward()
    first = rows[:, 0]
    no_skip = np.zeros(len(rows), bool)
    wrong = _mismatches("cross_entropy", "", lg.numpy(), lt.detach().numpy(), first, labels, no_skip)
    wrong += _mismatches("nll_loss", "", ng.numpy(), nt.detach().numpy(), first, labels, no_skip)
    for c in range(3):
        wrong += _mismatches(f"class {c}", "d", xg.grad.numpy()[:, c], xt.grad.numpy()[:, c], first, labels,
                             no_skip)
    assert not wrong, "\n".join(wrong)
