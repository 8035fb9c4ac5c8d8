"""Optimizers: 20-step trajectories against torch.optim, LAMB against a numpy reference, kernel counts."""
import numpy as np
import pytest
import torch
import torch._dynamo  # noqa: F401  (loads triton's LLVM before a WEBGPU test loads Mesa's; see report)

from tgrad import Tensor
from tgrad.device import Stats
from tgrad.errors import AutogradError, ShapeError
from tgrad.nn import BatchNorm, Linear
from tgrad.nn.optim import LAMB, SGD, Adam, AdamW

RNG = np.random.default_rng(0)
X = RNG.standard_normal((8, 5)).astype(np.float32)
Y = RNG.integers(0, 3, 8).astype(np.int32)


class Model:
    def __init__(self):
        Tensor.manual_seed(0)
        self.l1, self.l2 = Linear(5, 7), Linear(7, 3)

    def params(self):
        return [self.l1.weight, self.l1.bias, self.l2.weight, self.l2.bias]

    def __call__(self, x):
        return self.l2(self.l1(x).relu())


def _torch_twin(m: Model):
    t1, t2 = torch.nn.Linear(5, 7), torch.nn.Linear(7, 3)
    with torch.no_grad():
        for a, b in ((m.l1, t1), (m.l2, t2)):
            b.weight[...] = torch.tensor(a.weight.numpy())
            b.bias[...] = torch.tensor(a.bias.numpy())
    return torch.nn.Sequential(t1, torch.nn.ReLU(), t2)


CASES = {
    "sgd": (lambda p: SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    "sgd_momentum_wd": (lambda p: SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
                        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01)),
    "sgd_nesterov": (lambda p: SGD(p, lr=0.05, momentum=0.8, nesterov=True),
                     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True)),
    "adam": (lambda p: Adam(p, lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    "adam_l2": (lambda p: Adam(p, lr=0.01, weight_decay=0.1),
                lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1)),
    "adamw": (lambda p: AdamW(p, lr=0.01, weight_decay=0.1),
              lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_trajectory_matches_torch(name):
    make_g, make_t = CASES[name]
    model = Model()
    tmodel = _torch_twin(model)
    opt, topt = make_g(model.params()), make_t(tmodel.parameters())
    x, y, xt, yt = Tensor(X), Tensor(Y), torch.tensor(X), torch.tensor(Y).long()
    for _ in range(20):
        opt.zero_grad()
        loss = model(x).cross_entropy(y)
        loss.backward()
        opt.step(loss)
        topt.zero_grad()
        tloss = torch.nn.functional.cross_entropy(tmodel(xt), yt)
        tloss.backward()
        topt.step()
        np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-4, atol=1e-5)
    for a, b in zip(model.params(), tmodel.parameters()):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-3, atol=1e-5)


def test_lamb_matches_numpy_reference():
    w0 = RNG.standard_normal((4, 3)).astype(np.float32)
    target = RNG.standard_normal((4, 3)).astype(np.float32)
    w = Tensor(w0.copy(), requires_grad=True)
    opt = LAMB([w], lr=0.05, weight_decay=0.01)
    ref, m, v = w0.astype(np.float64), np.zeros((4, 3)), np.zeros((4, 3))
    b1, b2, eps = 0.9, 0.999, 1e-6
    for t in range(1, 11):
        opt.zero_grad()
        ((w - Tensor(target)) ** 2).sum().backward()
        opt.step()
        g = 2 * (ref - target)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        up = (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps) + 0.01 * ref
        ref = ref - 0.05 * (np.linalg.norm(ref) / np.linalg.norm(up)) * up
        np.testing.assert_allclose(w.numpy(), ref, rtol=1e-4, atol=1e-5)


def test_adam_step_kernel_count():
    # backward() computes the loss and the gradient 2*w when it returns (two kernels); one Adam step on one
    # parameter is then the step counter, m, v and the parameter itself; on the CPU m, v and the parameter
    # are one row group (one loop)
    from tgrad.device import Device

    w0 = RNG.standard_normal((4, 4)).astype(np.float32)
    w = Tensor(w0, requires_grad=True)
    opt = Adam([w], lr=0.01)
    before = Stats.kernels_run
    (w * w).sum().backward()
    assert Stats.kernels_run - before == 2
    before = Stats.kernels_run
    opt.step()
    assert Stats.kernels_run - before == (2 if Device.DEFAULT == "CPU" else 4)


def test_gradients_stay_readable_after_the_step(device):
    # the gradient reads the parameter's old value; the step overwrites the parameter in place
    w0 = RNG.standard_normal((4, 4)).astype(np.float32)
    w = Tensor(w0, requires_grad=True)
    opt = SGD([w], lr=0.5)
    (w * w).sum().backward()
    opt.step()
    np.testing.assert_allclose(w.grad.numpy(), 2 * w0, rtol=1e-6)
    np.testing.assert_allclose(w.numpy(), w0 - 0.5 * 2 * w0, rtol=1e-6)


def _squared_loss_step(x, w, opt):
    """A training step on sum((x @ w)^2) that calls opt.step() without the loss and returns the loss."""

    def step():
        opt.zero_grad()
        loss = (x @ w).square().sum()
        loss.backward()
        opt.step()
        return loss

    return step


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_loss_read_after_the_step_is_the_loss_before_it(device, name, jit):
    """PyTorch's loop `loss.backward(); opt.step(); print(loss.item())`: step() realizes what backward() ran
    from with its update, so the loss read afterwards is the one at the old weights (it was computed from
    the overwritten ones: 3.35 instead of 11.17 for one SGD step below), also when a TinyJit step returns
    the loss without handing it to step()."""
    from tgrad.jit import TinyJit

    rng = np.random.default_rng(14)
    w0, x0 = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    w, x = Tensor(w0, requires_grad=True).realize(), Tensor(x0).realize()
    opt = {"SGD": SGD, "Adam": Adam}[name]([w], lr=0.1)
    tw = torch.tensor(w0, requires_grad=True)
    topt = getattr(torch.optim, name)([tw], lr=0.1)

    step = _squared_loss_step(x, w, opt)
    run = TinyJit(step) if jit else step
    for _ in range(4):
        loss = run()
        topt.zero_grad()
        tloss = (torch.from_numpy(x0) @ tw).square().sum()
        tloss.backward()
        topt.step()
        np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-4)
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_a_loss_from_outside_a_jitted_step_keeps_its_value(device):
    """backward() run outside a TinyJit step whose function steps the optimizer: that loss keeps the value
    at the weights it was built on (the step inside the capturing call realizes it before the update), and
    the step's replays do not compute it again (a replay launches as many kernels as one of a step with no
    outside loss)."""
    from tgrad.device import Stats
    from tgrad.jit import TinyJit

    rng = np.random.default_rng(15)
    w0, x0 = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)

    def run(outside_loss: bool):
        w, x = Tensor(w0, requires_grad=True).realize(), Tensor(x0).realize()
        opt = SGD([w], lr=0.05)

        step = TinyJit(_squared_loss_step(x, w, opt))
        losses = [step().item()]  # (runs plainly; the next call captures)
        w1 = w.numpy().astype(np.float64)
        outside = (x @ w).square().mean() if outside_loss else None  # on the weights after one step
        if outside is not None:
            outside.backward()
        losses += [step().item() for _ in range(3)]  # capture, then two replays
        before = Stats.kernels_run
        step()
        return losses, Stats.kernels_run - before, outside, w1, w.numpy()

    losses, replay, outside, w1, w_end = run(True)
    _, control, _, _, _ = run(False)
    assert replay == control, (replay, control)
    np.testing.assert_allclose(outside.item(), np.square(x0 @ w1).mean(), rtol=1e-5)
    wn, want = w0.astype(np.float64), []
    for _ in range(5):  # the same SGD steps in numpy (the outside backward's gradient is zeroed first)
        want.append(np.square(x0 @ wn).sum())
        wn = wn - 0.05 * 2 * x0.T @ (x0 @ wn)
    np.testing.assert_allclose(losses, want[:4], rtol=1e-4)
    np.testing.assert_allclose(w_end, wn, rtol=1e-4, atol=1e-5)


def test_step_writes_parameters_in_place():
    w = Tensor(np.ones((3,), np.float32), requires_grad=True)
    opt = SGD([w], lr=0.5)
    buf = w.node.buffer
    for _ in range(3):
        opt.zero_grad()
        (w * w).sum().backward()
        opt.step()
        assert w.node.buffer is buf
    np.testing.assert_allclose(w.numpy(), np.zeros(3))  # 1 - 0.5 * 2 * 1 = 0, then stays 0


def test_step_realizes_running_stats():
    bn = BatchNorm(3)
    opt = SGD([bn.weight, bn.bias, bn.running_mean, bn.running_var], lr=0.1)
    x = RNG.standard_normal((6, 3)).astype(np.float32) + 2
    Tensor.training = True
    try:
        opt.zero_grad()
        bn(Tensor(x)).sum().backward()
        opt.step()
    finally:
        Tensor.training = False
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.1 * x.mean(0), rtol=1e-5)


def test_optimizer_errors():
    w = Tensor.ones(3, requires_grad=True)
    opt = Adam([w])
    with pytest.raises(AutogradError, match="no gradient"):
        opt.step()
    with pytest.raises(ValueError, match="empty"):
        SGD([])
    with pytest.raises(AutogradError, match="requires a gradient"):
        SGD([Tensor.ones(3, requires_grad=False)])


def test_setting_lr_after_tinyjit_captured_the_step(device):
    """opt.lr = x writes into the tensor the captured kernels read (it used to rebind the attribute, and
    the replayed step kept the old rate)."""
    from tgrad.jit import TinyJit

    w0 = np.array([1.0, -2.0, 0.5], np.float32)
    w, wt = Tensor(w0, requires_grad=True), torch.tensor(w0, requires_grad=True)
    opt, topt = SGD([w], lr=0.1), torch.optim.SGD([wt], lr=0.1)

    @TinyJit
    def step(x: Tensor) -> Tensor:
        opt.zero_grad()
        loss = (w * w * x).sum()
        loss.backward()
        opt.step(loss)
        return loss

    x = np.array([1.0, 2.0, 3.0], np.float32)
    for i in range(6):
        if i == 4:
            opt.lr = 0.01
            topt.param_groups[0]["lr"] = 0.01
        step(Tensor(x)).numpy()
        topt.zero_grad()
        (wt * wt * torch.tensor(x)).sum().backward()
        topt.step()
    np.testing.assert_allclose(w.numpy(), wt.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert step.replays >= 2 or device == "NUMPY"  # the reference has no kernels: it always runs plainly
    with pytest.raises(ShapeError):
        opt.lr = Tensor([0.1, 0.2])


# eager steps replay the optimizer's update (Optimizer._replayed_update): from the third step on, the update's
# kernels run without its graph being built again. Every change users make between steps must still count.

def _eager_pair(make_g, make_t, device: str):
    model = Model()
    tmodel = _torch_twin(model)
    params = [Tensor(p.numpy(), requires_grad=True, device=device) for p in model.params()]
    return params, tmodel, make_g(params), make_t(tmodel.parameters())


def _forward(params, x):
    w1, b1, w2, b2 = params
    return x.linear(w1, b1).relu().linear(w2, b2)


def _eager_steps(params, tmodel, opt, topt, steps: int, change=None, device: str = "CPU"):
    x, y = Tensor(X, device=device), Tensor(Y, device=device)
    xt, yt = torch.tensor(X), torch.tensor(Y).long()
    for i in range(steps):
        if change is not None:
            change(i, opt, topt)
        opt.zero_grad()
        loss = _forward(params, x).cross_entropy(y)
        loss.backward()
        opt.step(loss)
        topt.zero_grad()
        tloss = torch.nn.functional.cross_entropy(tmodel(xt), yt)
        tloss.backward()
        topt.step()
        np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-4, atol=1e-5, err_msg=f"step {i}")
    for a, b in zip(params, tmodel.parameters()):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_eager_steps_replay_the_update(device, name):
    params, tmodel, opt, topt = _eager_pair(*CASES[name], device)
    _eager_steps(params, tmodel, opt, topt, 8, device=device)
    if device != "NUMPY":  # (the reference device has no kernels: its update always runs plainly)
        assert opt._update.replays == 6  # steps 1 and 2 run and capture it


@pytest.mark.spread  # (a changed hyperparameter reaching the replayed update is host logic)
@pytest.mark.parametrize("name, attribute, value, group_key, group_value", [
    ("adam", "b2", 0.9, "betas", (0.9, 0.9)),
    ("adam", "b1", 0.5, "betas", (0.5, 0.999)),
    ("adam", "eps", 0.5, "eps", 0.5),
    ("adam_l2", "l2", 0.5, "weight_decay", 0.5),
    ("adamw", "wd", 2.0, "weight_decay", 2.0),
    ("sgd_momentum_wd", "momentum", 0.5, "momentum", 0.5),
    ("sgd_momentum_wd", "wd", 0.5, "weight_decay", 0.5),
    ("sgd_nesterov", "nesterov", False, "nesterov", False),
])
def test_eager_steps_see_a_changed_hyperparameter(device, name, attribute, value, group_key, group_value):
    """A Python value the update reads, changed between eager steps after the update was captured, is
    used from the next step on (as PyTorch's param_groups): the capture is keyed by them."""

    def change(i, opt, topt):
        if i == 5:
            setattr(opt, attribute, value)
            topt.param_groups[0][group_key] = group_value

    params, tmodel, opt, topt = _eager_pair(*CASES[name], device)
    _eager_steps(params, tmodel, opt, topt, 9, change, device)


def test_eager_steps_see_lr_schedules_and_loaded_parameters(device):
    """The lr through a scheduler (a pending assign the step realizes before the update's replay), and
    parameters overwritten between steps by load_state_dict: the replayed update reads both."""
    from tgrad.nn.optim import StepLR
    from tgrad.nn.state import load_state_dict

    params, tmodel, opt, topt = _eager_pair(*CASES["adam"], device)
    sched, tsched = StepLR(opt, 2, 0.5), torch.optim.lr_scheduler.StepLR(topt, 2, 0.5)
    new = [RNG.standard_normal(p.shape).astype(np.float32) * 0.3 for p in params]

    def change(i, opt, topt):
        if i:
            sched.step()
            tsched.step()
        if i == 6:
            load_state_dict({str(k): p for k, p in enumerate(params)}, {str(k): a for k, a in enumerate(new)})
            with torch.no_grad():
                for p, a in zip(tmodel.parameters(), new):
                    p[...] = torch.tensor(a)

    _eager_steps(params, tmodel, opt, topt, 10, change, device)


def test_a_tensor_built_before_an_eager_step_keeps_the_old_values(device):
    """Tensors built from the parameters and not computed before the step are computed before the
    replayed update overwrites the parameters (PyTorch computed them at once)."""
    w0 = RNG.standard_normal((5, 3)).astype(np.float32)
    w = Tensor(w0, requires_grad=True, device=device)
    opt = Adam([w], lr=0.1)
    ref, m, v = w0.astype(np.float64), 0.0, 0.0
    for i in range(6):
        old = w.numpy()
        opt.zero_grad()
        (w * w).sum().backward()
        before = w * 2  # not computed yet
        opt.step()
        g = 2 * ref
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        up = (m / (1 - 0.9 ** (i + 1))) / (np.sqrt(v / (1 - 0.999 ** (i + 1))) + 1e-8)
        np.testing.assert_array_equal(before.numpy(), 2 * old, err_msg=f"step {i}")
        ref = ref - 0.1 * up
        np.testing.assert_allclose(w.numpy(), ref, rtol=1e-4, atol=1e-5, err_msg=f"step {i}")


def test_two_optimizers_alternate_eager_steps(device):
    """Two models trained in turns (a GAN's pattern), each optimizer replaying its own update while the
    other model's parameters hold gradients or none; against PyTorch."""
    a, b = _eager_pair(*CASES["adam"], device), _eager_pair(*CASES["sgd_momentum_wd"], device)
    x, y = Tensor(X, device=device), Tensor(Y, device=device)
    xt, yt = torch.tensor(X), torch.tensor(Y).long()
    for i in range(7):
        for params, tmodel, opt, topt in (a, b) if i % 2 else (b, a):
            loss = (_forward(a[0], x) + _forward(b[0], x)).cross_entropy(y)
            loss.backward()  # both models' parameters get gradients; only one optimizer steps
            opt.step()
            tloss = torch.nn.functional.cross_entropy(a[1](xt) + b[1](xt), yt)
            tloss.backward()
            topt.step()
            opt.zero_grad()
            topt.zero_grad()
            if i == 3:  # the other model's gradients accumulate across one step, then are dropped
                for p, tp in zip(params, tmodel.parameters()):
                    p.grad, tp.grad = None, None
    for params, tmodel, _, _ in (a, b):
        for p, tp in zip(params, tmodel.parameters()):
            np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adam", "adamw"])
@pytest.mark.parametrize("lr", [1e10, 1e-3])
def test_hyperparameters_in_float32_whatever_the_default_float(device, monkeypatch, kind, lr):
    """With dtypes.default_float set to float16, float32 parameters step as PyTorch's: lr, momentum, the
    betas and the step count are float32 tensors (a float16 lr of 1e10 was inf, and the parameters with it;
    tinygrad's test_mixed_precision), and float16 parameters update in float32, rounded once."""
    from tgrad import dtypes

    monkeypatch.setattr(dtypes, "default_float", dtypes.float16)
    x0 = RNG.standard_normal((3, 4)).astype(np.float32)
    g0 = RNG.standard_normal((3, 4)).astype(np.float32)
    make = {"sgd": lambda p, t: (SGD, torch.optim.SGD, {}), "momentum": lambda p, t: (SGD, torch.optim.SGD,
            {"momentum": 0.9}), "adam": lambda p, t: (Adam, torch.optim.Adam, {}),
            "adamw": lambda p, t: (AdamW, torch.optim.AdamW, {"weight_decay": 0.01})}[kind]
    mine_cls, torch_cls, kw = make(None, None)
    p, tp = Tensor(x0, requires_grad=True), torch.tensor(x0, requires_grad=True)
    opt, topt = mine_cls([p], lr=lr, **kw), torch_cls([tp], lr=lr, **kw)
    for _ in range(3):
        opt.zero_grad()
        topt.zero_grad()
        (p * Tensor(g0)).sum().backward()
        (tp * torch.tensor(g0)).sum().backward()
        opt.step()
        topt.step()
    assert p.dtype == dtypes.float32 and opt.lr.dtype == dtypes.float32
    # (WEBGPU: its exp2 and log2 in the bias correction, up to 6e-5 relative)
    np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-4, atol=1e-5 * max(lr, 1))
