"""helper_test_op: run the same function in PyTorch (CPU) and tgrad and compare values and gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tgrad import Device, Tensor, dtypes
from tgrad.device import get_runtime
from tgrad.errors import DTypeError
from tgrad.opt.host import piece_pair, plan_for
from tgrad.runtime.cpu import runtime as cpu_runtime

TOL = {  # (atol, rtol) for forward values, per dtype
    dtypes.float32: (1e-5, 1e-4),
    dtypes.float16: (1e-2, 1e-2),
    dtypes.float64: (1e-9, 1e-9),
}


def make_inputs(shapes, low=-2.0, high=2.0, seed=0, vals=None, dtype=np.float32):
    rng = np.random.default_rng(seed)
    if vals is not None:
        return [np.array(v, dtype=dtype if np.array(v).dtype.kind == "f" else None) for v in vals]
    return [rng.uniform(low, high, size=s).astype(dtype) for s in shapes]


def compare(name, tg: np.ndarray, tt: np.ndarray, atol: float, rtol: float) -> None:
    tt = np.asarray(tt)
    assert tg.shape == tt.shape, f"{name}: shape {tg.shape} != torch {tt.shape}"
    if tt.dtype == np.bool_ or tt.dtype.kind in "iu":
        np.testing.assert_array_equal(tg, tt, err_msg=name)
    else:
        np.testing.assert_allclose(
            tg.astype(np.float64), tt.astype(np.float64), atol=atol, rtol=rtol, err_msg=name, equal_nan=True
        )


def helper_test_op(
    shapes,
    torch_fxn,
    tgrad_fxn=None,
    atol=1e-5,
    rtol=1e-4,
    grad_atol=1e-4,
    grad_rtol=1e-3,
    forward_only=False,
    vals=None,
    low=-2.0,
    high=2.0,
    dtype=np.float32,
    seed=0,
):
    """torch_fxn and tgrad_fxn take the same number of tensors; values and (unless forward_only or the
    inputs are not float) the gradients of sum(out * random) are compared."""
    tgrad_fxn = tgrad_fxn or torch_fxn
    arrays = make_inputs(shapes, low, high, seed, vals, dtype)
    grads = not forward_only and all(a.dtype.kind == "f" for a in arrays)
    tt = [torch.tensor(a, requires_grad=grads) for a in arrays]
    tg = [Tensor(a, requires_grad=grads) for a in arrays]
    out_t = torch_fxn(*tt)
    out_g = tgrad_fxn(*tg)
    compare("forward", out_g.numpy(), out_t.detach().numpy(), atol, rtol)
    assert out_g.dtype.name == str(out_t.dtype).split(".")[-1], f"dtype {out_g.dtype} != torch {out_t.dtype}"
    if grads and out_t.requires_grad:
        w = np.random.default_rng(seed + 1).uniform(0.5, 1.5, size=out_t.shape).astype(arrays[0].dtype)
        (out_t * torch.tensor(w)).sum().backward()
        (out_g * Tensor(w)).sum().backward()
        for i, (a, b) in enumerate(zip(tg, tt)):
            if b.grad is None:
                continue
            assert a.grad is not None, f"input {i}: torch has a gradient, tgrad has none"
            compare(f"grad of input {i}", a.grad.numpy(), b.grad.numpy(), grad_atol, grad_rtol)
    return out_g


def has_float64(device: str | None = None) -> bool:
    """Whether the device (default: the default device) computes float64; elsewhere float64 must raise a
    DTypeError that names it (WEBGPU over OpenGL, Metal, OpenCL without cl_khr_fp64)."""
    return Device[device or Device.DEFAULT].supports(dtypes.float64)


def float64_or_raises(fn, device: str | None = None):
    """fn() where the device has float64; elsewhere check that it raises a DTypeError naming float64."""
    if has_float64(device):
        return fn()
    with pytest.raises(DTypeError, match="float64"):
        fn()
    return None


def cpu_plan(kernel):
    """The BLAS plan the CPU device runs a scheduled kernel with (its optimizer's choice: opt/host.py), or
    None where it runs the generated loop."""
    return plan_for(get_runtime("CPU").optimize(kernel))


def cpu_render(kernel):
    """The Program the CPU device renders a scheduled kernel as (with the opts its optimizer chooses)."""
    runtime = get_runtime("CPU")
    return cpu_runtime._render(runtime.optimize(kernel), runtime.props)


def cpu_pair(k1, k2, reads):
    """The piece pair (opt.host.piece_pair) the CPU device runs two scheduled kernels as, or None."""
    rt = get_runtime("CPU")
    return piece_pair(rt.optimize(k1), k2, reads, rt.props)
