"""Batches of small matmuls (attention's q @ k.T and p @ v) run on the CPU as one generated function
(emit_numba.render_batched, chosen by opt/host.py: CONTRACT BATCHED) instead of one BLAS call per
matmul. Values and gradients against PyTorch; which path a kernel takes is checked too, so a test cannot
pass on BLAS alone."""

import numpy as np
import pytest
import torch

from tests.helpers import cpu_plan, cpu_render
from tgrad import Tensor, fuse


def _matmul_program(t: Tensor):
    kernels = [it.kernel for it in fuse.schedule([t.node])]
    plans = [(k, cpu_plan(k)) for k in kernels]
    k, plan = next((k, p) for k, p in plans if p is not None)
    return cpu_render(k), plan


def _generated(t: Tensor) -> bool:
    program, _ = _matmul_program(t)
    return "blas" not in program.launch and "_fma(" in program.source


def _attention(seed: int, batch=16, ctx=64, heads=4, dim=16, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, ctx, 3 * heads * dim)).astype(dtype)


def _split(qkv, heads: int, dim: int):
    """q, k, v of a fused projection: (B, H, T, D) views of one buffer (strided, as in a GPT block)."""
    b, t, _ = qkv.shape
    c = heads * dim
    parts = [qkv[:, :, i * c:(i + 1) * c] for i in range(3)]
    return [p.reshape(b, t, heads, dim).permute(0, 2, 1, 3) for p in parts]


def _pair(rng, shape_a, shape_b):
    return rng.standard_normal(shape_a).astype(np.float32), rng.standard_normal(shape_b).astype(np.float32)


def _close(out: Tensor, ref: torch.Tensor, tol: float = 1e-5):
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_attention_scores_and_values_match_torch(dtype, tol):
    qkv = _attention(0, dtype=dtype)
    q, k, v = _split(Tensor(qkv, device="CPU"), 4, 16)
    tq, tk, tv = _split(torch.from_numpy(qkv), 4, 16)
    scores = q @ k.transpose(-1, -2)  # B of its rows not contiguous: copied to `pack` first
    assert _generated(scores)
    np.testing.assert_allclose(scores.numpy(), (tq @ tk.transpose(-1, -2)).numpy(), rtol=tol, atol=tol)
    p = Tensor(np.random.default_rng(1).random((16, 4, 64, 64)).astype(dtype), device="CPU")
    out = p @ v  # B's rows contiguous: read in place
    assert _generated(out)
    np.testing.assert_allclose(out.numpy(), (torch.from_numpy(p.numpy()) @ tv).numpy(), rtol=tol, atol=tol)
    back = q.transpose(-1, -2) @ p  # A read across its rows (M = 16)
    assert _generated(back)
    ref = tq.transpose(-1, -2) @ torch.from_numpy(p.numpy())
    np.testing.assert_allclose(back.numpy(), ref.numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("batch,m,k,n", [((64,), 17, 8, 9), ((8, 9), 31, 5, 33), ((2,), 255, 2, 256),
                                         ((130,), 3, 64, 20), ((3, 1, 50), 7, 3, 40)])
def test_odd_sizes_match_torch(batch, m, k, n):
    """An odd M (its last row computed alone), N not a multiple of the vector width, K of 2 and 3, three
    rows, batch axes of one."""
    rng = np.random.default_rng(2)
    a, b = _pair(rng, (*batch, m, k), (*batch, k, n))
    out = Tensor(a, device="CPU") @ Tensor(b, device="CPU")
    assert _generated(out)
    _close(out, torch.from_numpy(a) @ torch.from_numpy(b))


def test_flipped_and_transposed_operands_match_torch():
    """Negative strides (a flip) and a transposed B, with an offset into the buffer."""
    rng = np.random.default_rng(3)
    a, b = _pair(rng, (32, 40, 24), (32, 30, 24))
    ta, tb = Tensor(a, device="CPU"), Tensor(b, device="CPU")
    out = ta.flip(1)[:, 3:] @ tb.flip(2).transpose(-1, -2)
    assert _generated(out)
    ref = torch.from_numpy(a).flip(1)[:, 3:] @ torch.from_numpy(b).flip(2).transpose(-1, -2)
    _close(out, ref)


def test_nan_and_inf_propagate_as_in_torch():
    rng = np.random.default_rng(4)
    a, b = _pair(rng, (64, 16, 16), (64, 16, 32))
    a[0, 0, 0], a[1, 2, 3], b[2, 5, 7], b[3, 0, :] = np.nan, np.inf, -np.inf, 0.0
    a[3, :, 0] = np.inf  # inf * 0: nan
    out = Tensor(a, device="CPU") @ Tensor(b, device="CPU")
    assert _generated(out)
    _close(out, torch.from_numpy(a) @ torch.from_numpy(b))


def test_gradients_of_causal_attention_match_torch():
    qkv = _attention(5, batch=4, ctx=32)
    x = Tensor(qkv, device="CPU", requires_grad=True)
    q, k, v = _split(x, 4, 16)
    mask = Tensor(np.triu(np.full((32, 32), -np.inf, np.float32), 1), device="CPU")
    att = ((q @ k.transpose(-1, -2)) * 0.25 + mask).softmax(-1)
    ((att @ v) ** 2).sum().backward()
    tx = torch.from_numpy(qkv).requires_grad_()
    tq, tk, tv = _split(tx, 4, 16)
    tatt = ((tq @ tk.transpose(-1, -2)) * 0.25 + torch.from_numpy(mask.numpy())).softmax(-1)
    ((tatt @ tv) ** 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape_a,shape_b", [((4, 128, 128), (4, 128, 128)),  # each matmul too big
                                             ((64, 16, 65), (64, 65, 16)),  # K above batched_max_k
                                             ((96, 128), (128, 64))])  # no batch
def test_big_or_unbatched_matmuls_keep_blas(shape_a, shape_b):
    rng = np.random.default_rng(6)
    a, b = _pair(rng, shape_a, shape_b)
    out = Tensor(a, device="CPU") @ Tensor(b, device="CPU")
    program, plan = _matmul_program(out)
    assert "blas" in program.launch and plan is not None
    _close(out, torch.from_numpy(a) @ torch.from_numpy(b), 1e-4)


def test_matmul_forms_and_linear_build_the_same_nodes():
    """linear builds the nodes of matmul of the transposed weight plus the bias, and matmul's 1-d, batched
    and promoted forms its 2-d product around reshapes and casts: the same graph nodes (hash-consed), so
    the same kernels, whatever the form."""
    rng = np.random.default_rng(3)
    x, w, b = (Tensor(rng.standard_normal(s).astype(np.float32), requires_grad=True)
               for s in ((2, 3, 4), (5, 4), (5,)))
    assert x.linear(w, b).node is (x @ w.T + b).node and x.linear(w).node is (x @ w.T).node
    v = Tensor(rng.standard_normal(4).astype(np.float32))
    assert (v @ w.T).node is (v.unsqueeze(0) @ w.T).squeeze(0).node
    h = Tensor(rng.standard_normal((4, 5)).astype(np.float16))
    assert (x @ h).node is (x @ h.cast("float32")).node


def test_matmul_of_bools_raises_as_in_pytorch():
    a = Tensor([[True, False]])
    with pytest.raises(Exception) as ours:
        (a @ a.T).numpy()
    with pytest.raises(RuntimeError):
        torch.tensor([[True, False]]) @ torch.tensor([[True], [False]])
    assert "bool" in str(ours.value)
