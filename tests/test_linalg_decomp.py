"""Tensor.svd and Tensor.qr against torch.linalg (values, shapes, modes, batches, empty matrices, nan and
inf, the errors) and newton_schulz against the same iteration in torch, on every device."""

import numpy as np
import pytest
import torch

from tgrad import Tensor
from tgrad.errors import ArgumentError, AutogradError, DTypeError, ShapeError

RNG = np.random.default_rng(7)
SHAPES = [(2, 2), (5, 3), (3, 5), (3, 4, 4), (2, 2, 2, 2, 3), (0, 3), (2, 0, 3), (1, 1)]


def _rand(shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("full", [True, False])
def test_svd_matches_torch(device, full):
    for shape in SHAPES:
        a = _rand(shape)
        u, s, vh = Tensor(a, device=device).svd(full_matrices=full)
        tu, ts, tvh = torch.linalg.svd(torch.tensor(a), full_matrices=full)
        assert (u.shape, s.shape, vh.shape) == (tuple(tu.shape), tuple(ts.shape), tuple(tvh.shape)), shape
        assert u.dtype == s.dtype == vh.dtype == Tensor(a).dtype
        np.testing.assert_allclose(s.numpy(), ts.numpy(), atol=1e-5, rtol=1e-5)
        k = min(shape[-2:])
        rebuilt = (u.numpy()[..., :k] * s.numpy()[..., None, :]) @ vh.numpy()[..., :k, :]
        np.testing.assert_allclose(rebuilt, a, atol=1e-5)
        # the singular vectors themselves: equal to LAPACK's (PyTorch's), signs included
        np.testing.assert_allclose(np.abs(u.numpy()[..., :k]), np.abs(tu.numpy()[..., :k]), atol=1e-4)


def test_svd_rank_deficient_and_special_values(device):
    for a in ([[1.0, 1.0], [2.0, 2.0]], [[0.0, 0.0], [0.0, 0.0]], np.eye(4, dtype=np.float32)):
        a = np.array(a, np.float32)
        u, s, vh = Tensor(a, device=device).svd()
        np.testing.assert_allclose(s.numpy(), torch.linalg.svdvals(torch.tensor(a)).numpy(), atol=1e-5)
        np.testing.assert_allclose((u.numpy() * s.numpy()) @ vh.numpy(), a, atol=1e-5)
        assert not np.isnan(u.numpy()).any() and not np.isnan(vh.numpy()).any()
    # an inf gives nan everywhere (PyTorch's answer); a nan raises (PyTorch's LinAlgError), naming svd
    inf = torch.tensor([[1.0, float("inf")], [0.0, 1.0]])
    for got, want in zip(Tensor(inf.numpy(), device=device).svd(), torch.linalg.svd(inf)):
        np.testing.assert_array_equal(np.isnan(got.numpy()), np.isnan(want.numpy()))
    with pytest.raises(ArgumentError, match="svd: .*nan"):
        Tensor([[1.0, float("nan")], [0.0, 1.0]], device=device).svd()


@pytest.mark.parametrize("mode", ["complete", "reduced", "r"])
def test_qr_matches_torch(device, mode):
    for shape in SHAPES + [(3, 6), (6, 3)]:
        a = _rand(shape)
        q, r = Tensor(a, device=device).qr(mode)
        tq, tr = torch.linalg.qr(torch.tensor(a), mode=mode)
        assert (q.shape, r.shape) == (tuple(tq.shape), tuple(tr.shape)), (shape, mode)
        np.testing.assert_allclose(r.numpy(), tr.numpy(), atol=1e-5, rtol=1e-5)  # LAPACK's signs too
        if mode != "r":
            np.testing.assert_allclose(q.numpy(), tq.numpy(), atol=1e-5, rtol=1e-5)


def test_qr_default_and_torch_some(device):
    a = _rand((6, 3))
    q, r = Tensor(a, device=device).qr()  # tinygrad's default: complete
    assert (q.shape, r.shape) == ((6, 6), (6, 3))
    q, r = Tensor(a, device=device).qr(some=True)  # torch.Tensor.qr's spelling of "reduced"
    tq, tr = torch.linalg.qr(torch.tensor(a), mode="reduced")  # (torch.Tensor.qr(some=True), deprecated)
    np.testing.assert_allclose(q.numpy(), tq.numpy(), atol=1e-5)
    np.testing.assert_allclose(r.numpy(), tr.numpy(), atol=1e-5)
    q, r = Tensor([[0.0, 1.0], [0.0, 2.0]], device=device).qr()  # a zero column: no nan
    tq, tr = torch.linalg.qr(torch.tensor([[0.0, 1.0], [0.0, 2.0]]))
    np.testing.assert_allclose(q.numpy(), tq.numpy(), atol=1e-6)
    np.testing.assert_allclose(r.numpy(), tr.numpy(), atol=1e-6)


def test_decomposition_errors(device):
    with pytest.raises(ShapeError, match="svd: the input must have at least 2 dimensions"):
        Tensor([1.0, 2.0], device=device).svd()
    with pytest.raises(ShapeError, match="qr: the input must have at least 2 dimensions"):
        Tensor(1.0, device=device).qr()
    with pytest.raises(DTypeError, match="qr: expected a float32 or float64 tensor, got int64"):
        Tensor([[1, 2], [3, 4]], device=device).qr()
    with pytest.raises(DTypeError, match="svd: .* got float16"):
        Tensor.ones(2, 2, dtype="float16", device="NUMPY").svd()
    with pytest.raises(ArgumentError, match="qr: unknown mode 'full'"):
        Tensor.ones(2, 2, device=device).qr("full")
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ArgumentError, match="qr: the input contains nan or inf"):
            Tensor([[1.0, bad], [0.0, 1.0]], device=device).qr()
    # torch.Tensor.svd returns V, not Vh: its keywords are refused instead of answering differently
    with pytest.raises(ArgumentError, match="some"):
        Tensor.ones(2, 2, device=device).svd(some=True)
    with pytest.raises(ArgumentError, match="svd: unexpected True"):  # torch.Tensor.svd's positional some
        Tensor.ones(2, 2, device=device).svd(True)
    with pytest.raises(ArgumentError, match="qr: unknown mode True"):  # torch.Tensor.qr's positional some
        Tensor.ones(2, 2, device=device).qr(True)
    w = Tensor.ones(2, 2, device=device, requires_grad=True)
    for op in (Tensor.svd, Tensor.qr):
        with pytest.raises(AutogradError, match="not implemented; call it on x.detach"):
            op(w * 2)
        with Tensor.no_grad:
            op(w * 2)
        op(w.detach())


def _newton_schulz_torch(a, steps, params, eps):
    x = torch.tensor(a, dtype=torch.float64)
    tall = x.shape[-2] > x.shape[-1]
    x = x.transpose(-2, -1) if tall else x
    x = x / (x.square().sum((-2, -1), keepdim=True).sqrt() + eps)
    for _ in range(steps):
        gram, power, total = x @ x.transpose(-2, -1), x, params[0] * x
        for p in params[1:]:
            power = gram @ power
            total = total + p * power
        x = total
    return (x.transpose(-2, -1) if tall else x).numpy()


@pytest.mark.spread  # (the coefficients are constants of the same kernels)
@pytest.mark.parametrize("params", [(2, -1.5, 0.5), (3.4445, -4.775, 2.0315), (2.0, -1.4, 0.2, 0.2)])
def test_newton_schulz_matches_torch(device, params):
    for shape in [(2, 2), (3, 2), (2, 3), (2, 2, 3)]:
        a = _rand(shape)
        got = Tensor(a, device=device).newton_schulz(5, params, eps=1e-7).numpy()
        np.testing.assert_allclose(got, _newton_schulz_torch(a, 5, params, 1e-7), atol=2e-5, rtol=1e-4)
    # converged (the sign function's coefficients): U @ Vh of the svd, so its rows are orthonormal
    b = Tensor(_rand((3, 5)), device=device).newton_schulz(30, (2, -1.5, 0.5), eps=0.0).numpy()
    np.testing.assert_allclose(b @ b.T, np.eye(3), atol=1e-3)


def test_newton_schulz_gradient_and_errors(device):
    a = _rand((3, 4))
    x = Tensor(a, device=device, requires_grad=True)
    x.newton_schulz(2, (2, -1.5, 0.5)).sum().backward()
    tx = torch.tensor(a, requires_grad=True)
    y = tx / (tx.square().sum().sqrt() + 1e-7)
    for _ in range(2):
        y = 2 * y - 1.5 * (y @ y.T) @ y + 0.5 * (y @ y.T) @ (y @ y.T) @ y
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), atol=1e-4, rtol=1e-4)
    # empty and zero matrices stay zero (the norm's eps), as the same iteration in torch
    for shape in [(0, 3), (2, 3)]:
        got = Tensor.zeros(*shape, device=device).newton_schulz(3, (2, -1.5, 0.5)).numpy()
        want = _newton_schulz_torch(np.zeros(shape, np.float32), 3, (2, -1.5, 0.5), 1e-7)
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ShapeError, match="newton_schulz"):
        Tensor([1.0, 2.0], device=device).newton_schulz(2, (2, -1.5, 0.5))
    with pytest.raises(ArgumentError, match="newton_schulz: steps"):
        Tensor.ones(2, 2, device=device).newton_schulz(-1, (2, -1.5, 0.5))


def test_decompositions_under_tinyjit(device):
    """The host steps are replayed with each call's values (the function computes before and after them)."""
    from tgrad import TinyJit

    svd = TinyJit(lambda a: [t.realize() for t in (a * 2).svd(full_matrices=False)])
    qr = TinyJit(lambda a: [t.realize() for t in (a + 1).qr()])
    for _ in range(4):
        x = _rand((4, 3))
        _, s, _ = svd(Tensor(x, device=device))
        np.testing.assert_allclose(s.numpy(), torch.linalg.svdvals(torch.tensor(x * 2)).numpy(), atol=1e-5)
        q, r = qr(Tensor(x, device=device))
        tq, tr = torch.linalg.qr(torch.tensor(x + 1), mode="complete")
        np.testing.assert_allclose(q.numpy(), tq.numpy(), atol=1e-5)
        np.testing.assert_allclose(r.numpy(), tr.numpy(), atol=1e-5)
