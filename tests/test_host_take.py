"""Indexing a big table by an integer tensor (Embedding, t[idx], index_select-like takes) against PyTorch on
every device. On the host devices (CPU, NUMPY) it is numpy's take in a host step (the one-hot form costs
rows times as much); elsewhere the one-hot form. Bounds, gradients with repeated indices, second
derivatives and TinyJit replays are checked on both paths. The host take's gradient is kernels (a one-hot
reduce) up to ONEHOT_GRAD_MAX products, a host step above: the gradient tests run both ways."""

import numpy as np
import pytest
import torch

from tgrad import Tensor, dtypes
from tgrad.errors import IndexRangeError
from tgrad.jit import TinyJit
from tgrad.nn import Embedding
from tgrad.ops import indexing as indexing_ops

VOCAB, DIM = 5000, 16  # 80 ids x 5000 rows: above HOST_TAKE_MIN, so CPU and NUMPY take on the host


@pytest.fixture(params=["kernels", "host step"])
def take_grad(request, monkeypatch):
    """The host take's gradient one way or the other; the other way raises, so a test cannot pass on it."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"the take's gradient went the other way than {request.param}")

    if request.param == "host step":
        monkeypatch.setattr(indexing_ops, "ONEHOT_GRAD_MAX", 0)
        monkeypatch.setattr(Tensor, "_onehot_put", refuse)
    else:
        monkeypatch.setattr(Tensor, "_host_put", refuse)
    return request.param


def _ids(seed=0, shape=(8, 10)):
    ids = np.random.default_rng(seed).integers(0, VOCAB, shape)
    ids[0, :3] = ids[1, 0]  # repeated ids: their gradients add up
    return ids


def test_embedding_forward_backward(device, take_grad):
    emb = Embedding(VOCAB, DIM)
    w = emb.weight.numpy()
    ids, c = _ids(), np.random.default_rng(1).standard_normal((8, 10, DIM)).astype(np.float32)
    tw = torch.tensor(w, requires_grad=True)
    out_t = torch.nn.functional.embedding(torch.tensor(ids), tw)
    (out_t * torch.tensor(c)).square().sum().backward()
    out = emb(Tensor(ids))
    (out * Tensor(c)).square().sum().backward()
    np.testing.assert_array_equal(out.numpy(), out_t.detach().numpy())
    np.testing.assert_allclose(emb.weight.grad.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [0, 1])
def test_index_by_tensor_with_negative_indices(device, axis, take_grad):
    rng = np.random.default_rng(2)
    table = rng.standard_normal((VOCAB, 7) if axis == 0 else (7, VOCAB)).astype(np.float32)
    idx = rng.integers(-VOCAB, VOCAB, (6, 9))
    t = torch.tensor(table, requires_grad=True)
    x = Tensor(table, requires_grad=True)
    got = x[Tensor(idx)] if axis == 0 else x[:, Tensor(idx)]
    want = t[torch.tensor(idx)] if axis == 0 else t[:, torch.tensor(idx)]
    np.testing.assert_array_equal(got.numpy(), want.detach().numpy())
    w = rng.standard_normal(want.shape).astype(np.float32)
    (want * torch.tensor(w)).sum().backward()
    (got * Tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_take_second_derivative(device):
    """d/dW of sum(dL/dW * r), L = sum(c * W[ids]^2): the gradient's own gradient is a take again."""
    rng = np.random.default_rng(3)
    w, ids = rng.standard_normal((VOCAB, 4)).astype(np.float32), _ids(4)
    c = rng.standard_normal((8, 10, 4)).astype(np.float32)
    r = rng.standard_normal((VOCAB, 4)).astype(np.float32)
    tw = torch.tensor(w, requires_grad=True)
    loss = (torch.tensor(c) * tw[torch.tensor(ids)].square()).sum()
    (gt,) = torch.autograd.grad(loss, tw, create_graph=True)
    (gt * torch.tensor(r)).sum().backward()
    W = Tensor(w)
    (g,) = (Tensor(c) * W[Tensor(ids)].square()).sum().gradient(W)
    np.testing.assert_allclose(g.numpy(), gt.detach().numpy(), rtol=1e-5, atol=1e-5)
    (gg,) = (g * Tensor(r)).sum().gradient(W)
    np.testing.assert_allclose(gg.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["int32", "bool", "float16"])
def test_take_other_dtypes(device, dtype):
    table = (np.arange(VOCAB * 3).reshape(VOCAB, 3) % 5).astype(dtype)
    dt = getattr(dtypes, dtype)
    idx = _ids(5)
    np.testing.assert_array_equal(Tensor(table, dtype=dt)[Tensor(idx)].numpy(), table[idx])


def test_take_out_of_range_raises(device):
    x = Tensor.rand(VOCAB, 3)
    for bad in (VOCAB, -VOCAB - 1):
        idx = np.zeros((8, 10), dtype=np.int64)
        idx[3, 4] = bad
        with pytest.raises(IndexRangeError, match=f"index {bad} is out of bounds for size {VOCAB}"):
            x[Tensor(idx)].numpy()
    with pytest.raises(IndexRangeError, match="Embedding"):
        Embedding(VOCAB, 2)(Tensor(np.full((8, 10), -1)))


def test_take_under_tinyjit(device):
    """Replays take each call's indices (and check them)."""
    emb = Embedding(VOCAB, DIM)
    w = emb.weight.numpy()
    step = TinyJit(lambda ids: emb(ids).sum(1).realize())
    for seed in range(4):
        ids = _ids(seed)
        np.testing.assert_allclose(step(Tensor(ids)).numpy(), w[ids].sum(1), rtol=1e-5, atol=1e-5)
    bad = _ids(9)
    bad[2, 2] = VOCAB + 3
    with pytest.raises(IndexRangeError):
        step(Tensor(bad)).numpy()


@pytest.mark.parametrize("case", ["middle_axis", "empty", "nan_inf", "float64"])
def test_take_gradient_sums_repeated_rows(device, case, take_grad):
    """The take's gradient adds each id's rows once per occurrence (grouped by id on the host devices):
    along a middle axis, for no ids at all, with nan/inf gradients, in float64; against PyTorch."""
    rng = np.random.default_rng(6)
    dt = np.float64 if case == "float64" else np.float32
    if case == "float64" and device not in ("CPU", "NUMPY"):
        pytest.skip("float64 tables: the host devices")
    axis = 1 if case == "middle_axis" else 0
    table = rng.standard_normal((3, VOCAB, 2) if axis else (VOCAB, 4)).astype(dt)
    idx = rng.integers(-VOCAB, VOCAB, (0,) if case == "empty" else (12, 9))
    if idx.size:  # repeated ids, and one row named from the end and from the start
        flat = idx.reshape(-1)
        flat[:4] = flat[4]
        flat[5] = flat[4] - VOCAB if flat[4] >= 0 else flat[4] + VOCAB
    x, t = Tensor(table, requires_grad=True), torch.tensor(table, requires_grad=True)
    got = x[:, Tensor(idx)] if axis else x[Tensor(idx)]
    want = t[:, torch.tensor(idx)] if axis else t[torch.tensor(idx)]
    w = rng.standard_normal(want.shape).astype(dt)
    if case == "nan_inf":
        w.reshape(-1)[[0, 5, 9]] = [np.nan, np.inf, -np.inf]
    (got * Tensor(w)).sum().backward()
    (want * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_take_gradient_of_a_zero_dim_index(device, take_grad):
    """A 0-d index tensor picks one row (the take's gradient then has no index axis to sum over)."""
    rng = np.random.default_rng(7)
    table = rng.standard_normal((40000, 3)).astype(np.float32)  # 40000 rows: a host take on CPU and NUMPY
    w = rng.standard_normal(3).astype(np.float32)
    for i in (5, -3):
        x, t = Tensor(table, requires_grad=True), torch.tensor(table, requires_grad=True)
        (x[Tensor(np.array(i))] * Tensor(w)).sum().backward()
        (t[torch.tensor(i)] * torch.tensor(w)).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-6, atol=1e-6)
