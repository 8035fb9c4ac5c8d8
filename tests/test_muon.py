"""nn.optim.Muon against torch.optim.Muon on every device: trajectories over several steps for each option
(nesterov, momentum, weight decay, coefficients, steps, both learning-rate adjustments, tall and wide
matrices), a parameter of more than 2 dimensions (tinygrad's flattening), TinyJit, and the errors.

torch.optim.Muon runs its Newton-Schulz iteration in bfloat16; tgrad's runs in the parameter's dtype. The
reference here is PyTorch's optimizer with that one function computing in float32 (the same formula), so
the comparison is tight; the unpatched optimizer is compared too, with bfloat16's tolerance."""

import numpy as np
import pytest
import torch
import torch.optim._muon as torch_muon

from tgrad import Tensor, TinyJit
from tgrad.errors import ArgumentError, ShapeError
from tgrad.nn.optim import Muon


def _newton_schulz_float32(grad, ns_coefficients, ns_steps, eps):
    """torch.optim._muon._zeropower_via_newtonschulz without its cast to bfloat16."""
    a, b, c = ns_coefficients
    x = grad.T if grad.size(0) > grad.size(1) else grad
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if grad.size(0) > grad.size(1) else x


@pytest.fixture
def float32_torch_muon(monkeypatch):
    monkeypatch.setattr(torch_muon, "_zeropower_via_newtonschulz", _newton_schulz_float32)


def _trajectory(shape, steps, kw, device=None, jit=False):
    rng = np.random.default_rng(sum(shape))
    w0 = rng.standard_normal(shape).astype(np.float32)
    xs = [rng.standard_normal((3, shape[0])).astype(np.float32) for _ in range(steps)]
    w = Tensor(w0, device=device, requires_grad=True)
    opt = Muon([w], **kw)
    tw = torch.tensor(w0, requires_grad=True)
    topt = torch.optim.Muon([tw], **kw)

    def step(x):
        opt.zero_grad()
        loss = (x @ w.reshape(shape[0], -1)).tanh().square().sum()
        loss.backward()
        opt.step()
        return loss

    run = TinyJit(step) if jit else step
    for x in xs:
        run(Tensor(x, device=device))
        topt.zero_grad()
        (torch.tensor(x) @ tw.reshape(shape[0], -1)).tanh().square().sum().backward()
        topt.step()
    assert not np.allclose(tw.detach().numpy(), w0)  # it moved
    return w.numpy(), tw.detach().numpy()


OPTIONS = [
    {"lr": 0.02},
    {"lr": 0.02, "nesterov": False, "momentum": 0.9},
    {"lr": 0.05, "weight_decay": 0.01, "ns_coefficients": (2.0, -1.5, 0.5), "ns_steps": 3},
    {"lr": 0.02, "adjust_lr_fn": "match_rms_adamw", "weight_decay": 0.0},
    {"lr": 0.02, "momentum": 0.0},
]


@pytest.mark.sweep
@pytest.mark.parametrize("kw", OPTIONS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
@pytest.mark.parametrize("shape", [(4, 4), (6, 3), (3, 6)])
def test_muon_matches_torch(device, float32_torch_muon, shape, kw):
    got, want = _trajectory(shape, 3, kw, device)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)


def test_muon_matches_unpatched_torch_within_bfloat16(device):
    got, want = _trajectory((6, 3), 3, {"lr": 0.02}, device)
    np.testing.assert_allclose(got, want, atol=2e-3)


def test_muon_under_tinyjit(device, float32_torch_muon):
    got, want = _trajectory((4, 4), 4, {"lr": 0.02, "weight_decay": 0.01}, device, jit=True)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)


def test_muon_flattens_a_conv_weight_as_tinygrad(device, float32_torch_muon):
    """A (4, 2, 3) parameter is orthogonalized as the (4, 6) matrix (PyTorch refuses it): the same steps as
    PyTorch's Muon on that matrix."""
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal((4, 2, 3)).astype(np.float32)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    w = Tensor(w0, device=device, requires_grad=True)
    opt = Muon([w], lr=0.03)
    tw = torch.tensor(w0.reshape(4, 6), requires_grad=True)
    topt = torch.optim.Muon([tw], lr=0.03)
    for _ in range(2):
        opt.zero_grad()
        (Tensor(x, device=device) @ w.reshape(4, 6)).sin().sum().backward()
        opt.step()
        topt.zero_grad()
        (torch.tensor(x) @ tw).sin().sum().backward()
        topt.step()
    np.testing.assert_allclose(w.numpy().reshape(4, 6), tw.detach().numpy(), atol=2e-5, rtol=1e-4)


def test_muon_zero_and_empty_gradients_as_torch(device):
    """A zero gradient orthogonalizes to zero (the norm is clamped at eps): only the weight decay moves
    the parameter, as in PyTorch; an empty matrix steps without error."""
    for shape in [(2, 3), (0, 3)]:
        w = Tensor.ones(*shape, device=device, requires_grad=True)
        opt = Muon([w])
        tw = torch.ones(shape, requires_grad=True)
        topt = torch.optim.Muon([tw])
        (w * 0).sum().backward()
        opt.step()
        (tw * 0).sum().backward()
        topt.step()
        np.testing.assert_array_equal(w.numpy(), tw.detach().numpy())


def test_muon_errors():
    w = Tensor.ones(2, 2, requires_grad=True)
    with pytest.raises(ShapeError, match="Muon: only parameters of 2 or more dimensions"):
        Muon([Tensor.ones(3, requires_grad=True)])
    with pytest.raises(ArgumentError, match="Muon: invalid momentum -0.1"):
        Muon([w], momentum=-0.1)
    with pytest.raises(ArgumentError, match="Muon: invalid learning rate -1"):
        Muon([w], lr=-1)
    with pytest.raises(ArgumentError, match="Muon: adjust_lr_fn"):
        Muon([w], adjust_lr_fn="mine")
    with pytest.raises(ArgumentError, match="Muon: ns_steps"):
        Muon([w], ns_steps=100)
    with pytest.raises(TypeError):  # the anchors order these differently: keywords only
        Muon([w], 0.01, 0.9)


def test_muon_under_one_cycle_lr(device, float32_torch_muon):
    """OneCycleLR cycles Muon's momentum as PyTorch's does (its group's 'momentum')."""
    from tgrad.nn.optim import OneCycleLR

    rng = np.random.default_rng(11)
    w0 = rng.standard_normal((3, 5)).astype(np.float32)
    w = Tensor(w0, device=device, requires_grad=True)
    opt = Muon([w], lr=0.02)
    sched = OneCycleLR(opt, max_lr=0.05, total_steps=6)
    tw = torch.tensor(w0, requires_grad=True)
    topt = torch.optim.Muon([tw], lr=0.02)
    tsched = torch.optim.lr_scheduler.OneCycleLR(topt, max_lr=0.05, total_steps=6)
    for _ in range(5):
        x = rng.standard_normal((2, 3)).astype(np.float32)
        opt.zero_grad()
        (Tensor(x, device=device) @ w).exp().sum().backward()
        opt.step()
        sched.step()
        topt.zero_grad()
        (torch.tensor(x) @ tw).exp().sum().backward()
        topt.step()
        tsched.step()
    assert opt.param_groups[0]["momentum"] == pytest.approx(topt.param_groups[0]["momentum"])
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), atol=2e-5, rtol=1e-4)
