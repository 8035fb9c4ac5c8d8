"""var / std where the degrees of freedom run out (axes of 0 or 1 elements, correction >= n) and where the
deviation is 0: values and gradients as PyTorch's (its var_backward / std_backward: inf or nan where the
formula divides by 0, finite past it, 0 for std's zero deviation), on every device; and comparisons of
bool tensors (WGSL orders no bools: they failed shader validation)."""

import warnings

import numpy as np
import pytest
import torch

from tgrad import Tensor

CASES = [((3, 1), 1), ((3, 0), 1), ((1,), 0), ((0,), 0), ((2, 1, 3), 1), ((2, 2), 1), ((2, 3), 1),
         ((4,), None)]


@pytest.mark.parametrize("fn", ["var", "std"])
@pytest.mark.parametrize("shape,axis", CASES)
def test_var_and_std_at_the_edges_match_pytorch(device, fn, shape, axis):
    a = np.random.default_rng(1).random(shape).astype(np.float32)
    if shape == (2, 2):
        a[1] = 0.3  # (a row with no deviation)
    for correction in (0, 1, 2, 3, 4):
        for keepdim in (False, True):
            t = Tensor(a, device=device, requires_grad=True)
            out = getattr(t, fn)(axis, keepdim=keepdim, correction=correction)
            (out * 1.5).sum().backward()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # (PyTorch warns that the degrees of freedom are <= 0)
                tt = torch.tensor(a, requires_grad=True)
                ref = getattr(tt, fn)(axis, keepdim=keepdim, correction=correction)
                (ref * 1.5).sum().backward()
            what = f"{fn}{shape} axis={axis} correction={correction} keepdim={keepdim}"
            np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-6, err_msg=what)
            np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=what)


@pytest.mark.parametrize("op", ["__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__", "minimum",
                                "maximum"])
def test_bool_comparisons_match_pytorch(device, op):
    a, b = np.array([True, False, True, False]), np.array([True, True, False, False])
    got = getattr(Tensor(a, device=device), op)(Tensor(b, device=device)).numpy()
    np.testing.assert_array_equal(got, getattr(torch.tensor(a), op)(torch.tensor(b)).numpy())


@pytest.mark.parametrize("fn", ["var", "std"])
@pytest.mark.parametrize("shape,axis", [((1, 2, 3, 1, 5), (0, 3)), ((1, 0, 3, 0, 5), (1, 3)), ((2, 1), 1)])
def test_var_and_std_by_gradient_match_pytorch(device, fn, shape, axis):
    """tinygrad's test_ops cases (by Tensor.gradient): WEBGPU gave 0 where PyTorch gives nan, as Mesa folded
    the empty reduce's 0 times 1 / 0 and the gradient's x + -x for an inf x."""
    a = np.random.default_rng(2).uniform(-2, 2, shape).astype(np.float32)
    t = Tensor(a, device=device)
    out = getattr(t, fn)(axis)
    (grad,) = getattr(t, fn)(axis).sum().gradient(t)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tt = torch.tensor(a, requires_grad=True)
        ref = getattr(tt, fn)(axis)
        (ref_grad,) = torch.autograd.grad(getattr(tt, fn)(axis).sum(), tt)
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grad.numpy(), ref_grad.numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("form", ["x + -x", "x * 1 - x", "-x + x", "x * 0", "x - x"])
def test_cancelling_terms_keep_inf_and_nan(device, form):
    """x - x, x + -x, x * 0 are 0 only for a finite x; a shader compiler that assumes no inf or nan folds
    them to 0 (WEBGPU writes them out)."""
    a = np.array([1.5, -2.0, np.inf, -np.inf, np.nan, 0.0], dtype=np.float32)
    fns = {"x + -x": lambda x: x + -x, "x * 1 - x": lambda x: x * 1 - x, "-x + x": lambda x: -x + x,
           "x * 0": lambda x: x * 0, "x - x": lambda x: x - x}
    got = fns[form](Tensor(a, device=device) * 1.0).numpy()
    np.testing.assert_array_equal(got, fns[form](torch.tensor(a)).numpy())
