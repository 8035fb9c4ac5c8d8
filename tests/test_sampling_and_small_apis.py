"""Tensor.multinomial against torch.multinomial (the distribution of its draws, shapes, dtypes and errors),
and tinygrad's small APIs (shrink_to, pad_to, const_like, replace, Tensor(None), Tensor(bytes), del t[i],
nn.LayerNorm2d, BatchNorm(sz=)) against what PyTorch or numpy computes for the same thing, on every
device."""

import numpy as np
import pytest
import torch

from tgrad import Tensor, TinyJit, dtypes
from tgrad.errors import ArgumentError, SamplingError, ShapeError
from tgrad.nn import BatchNorm, LayerNorm2d

N = 4000


def _frequencies(samples: np.ndarray, n: int) -> np.ndarray:
    rows = samples.reshape(-1, samples.shape[-1])
    return np.stack([np.bincount(row, minlength=n) / row.size for row in rows])


@pytest.mark.parametrize("replacement", [True, False])
def test_multinomial_distribution_matches_torch(device, replacement):
    w = np.array([[0.453, 0.0, 1.0, 0.81], [0.1, 0.8, 0.0, 0.1]], np.float32)
    Tensor.manual_seed(0)
    if replacement:
        got = Tensor(w, device=device).multinomial(N, replacement=True).numpy()
        want = torch.tensor(w).multinomial(N, replacement=True).numpy()
        assert got.shape == want.shape and got.dtype == want.dtype == np.int64
        np.testing.assert_allclose(_frequencies(got, 4), _frequencies(want, 4), atol=0.04)
        assert (_frequencies(got, 4)[w == 0] == 0).all()  # a zero weight is never drawn
        return
    # without replacement: each position's distribution over N rows, and every row's draws distinct
    rows = np.repeat(w[1:2] + [[0.0, 0.0, 0.3, 0.0]], N, 0).astype(np.float32)
    got = Tensor(rows, device=device).multinomial(3).numpy()
    want = torch.tensor(rows).multinomial(3).numpy()
    assert got.shape == want.shape == (N, 3)
    assert all(len(set(r)) == 3 for r in got[:200])
    for pos in range(3):
        np.testing.assert_allclose(_frequencies(got[:, pos][None], 4), _frequencies(want[:, pos][None], 4),
                                   atol=0.04)


def test_multinomial_shapes_zeros_and_seeds(device):
    t = Tensor([1.0, 0.0, 0.0], device=device)
    # the zero-weight categories come last, by position, when more samples than non-zero weights are taken
    np.testing.assert_array_equal(t.multinomial(3).numpy(), torch.tensor([1.0, 0, 0]).multinomial(3).numpy())
    assert Tensor([[1.0, 2.0]], device=device).multinomial(5, replacement=True).shape == (1, 5)
    assert Tensor.ones(0, 3, device=device).multinomial(2).shape == (0, 2)
    full = Tensor(list(range(1, 33)), device=device).multinomial(32).numpy()  # integer weights (tinygrad)
    assert sorted(full.tolist()) == list(range(32))
    Tensor.manual_seed(5)
    a = Tensor([0.2, 0.3, 0.5], device=device).multinomial(10, replacement=True).numpy()
    Tensor.manual_seed(5)
    np.testing.assert_array_equal(Tensor([0.2, 0.3, 0.5], device=device).multinomial(10, True).numpy(), a)


def test_multinomial_draws_again_under_tinyjit(device):
    w = Tensor([0.1, 0.2, 0.3, 0.4], device=device).realize()
    sample = TinyJit(lambda: w.multinomial(2).realize())
    draws = np.array([sample().numpy() for _ in range(300)])
    assert all(a != b for a, b in draws)
    # the first draw's frequencies against its exact distribution (torch.multinomial's: the weights), within
    # 4.5 standard errors of 300 draws (two samples of 300 compared with each other, as before, differed by
    # 3.3 errors in one run of the suite: a flaky test, not a wrong draw)
    p = np.array([0.1, 0.2, 0.3, 0.4])
    freq = _frequencies(draws[:, 0][None], 4)[0]
    assert np.all(np.abs(freq - p) <= 4.5 * np.sqrt(p * (1 - p) / len(draws))), freq


@pytest.mark.parametrize("weights,kw,message", [
    ([1.0, -1.0, 0.0], {}, "inf, nan or element < 0"),
    ([1.0, float("nan")], {"replacement": True}, "inf, nan or element < 0"),
    ([1.0, float("inf")], {}, "inf, nan or element < 0"),
    ([[1.0, 1.0], [0.0, 0.0]], {}, r"sum of probabilities <= 0\) in row 1"),
    (2.0, {}, "prob_dist must be 1 or 2 dim"),
    ([[[1.0]]], {}, "prob_dist must be 1 or 2 dim"),
    ([1.0, 2.0], {"num_samples": 0}, "n_sample <= 0"),
    ([1.0, 2.0], {"num_samples": 1.5}, "num_samples must be an int"),
    ([1.0, 2.0], {"num_samples": 3}, "n_sample > prob_dist.size"),
    ([True, False], {}, "weights must be numbers, got bool"),
])
def test_multinomial_errors_as_torch(device, weights, kw, message):
    """PyTorch raises for each (a RuntimeError; a TypeError for a float count); tgrad's SamplingError is a
    RuntimeError, and an AssertionError as tinygrad's asserts."""
    torch_w = torch.tensor(weights)
    with pytest.raises((RuntimeError, TypeError)):
        torch_w = torch_w.float() if torch_w.dtype != torch.bool else torch_w
        torch.multinomial(torch_w, **{"num_samples": 1, **kw})
    with pytest.raises(SamplingError, match=message) as info:
        Tensor(weights, device=device).multinomial(**kw)
    assert isinstance(info.value, (RuntimeError, AssertionError))


def test_shrink_to_and_pad_to(device):
    x = np.arange(32, dtype=np.int32).reshape(4, 8)
    t = Tensor(x, device=device)
    np.testing.assert_array_equal(t.shrink_to(2, 2).numpy(), x[:2, :2])
    np.testing.assert_array_equal(t.shrink_to((None, 3)).numpy(), x[:, :3])
    np.testing.assert_array_equal(t.pad_to(5, 10).numpy(), np.pad(x, ((0, 1), (0, 2))))
    np.testing.assert_array_equal(t.pad_to(None, 9, value=-1).numpy(),
                                  np.pad(x, ((0, 0), (0, 1)), constant_values=-1))
    assert t.pad_to(4, 8, value=7) is t
    y = Tensor([[1.0, 2.0]], device=device, requires_grad=True)
    (y.pad_to(2, 3) * Tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], device=device)).sum().backward()
    np.testing.assert_array_equal(y.grad.numpy(), [[1.0, 2.0]])
    for bad in (lambda: t.shrink_to(2), lambda: t.shrink_to(2, 2, 2), lambda: t.pad_to(3)):
        with pytest.raises(ShapeError, match="names 1 sizes|names 3 sizes"):
            bad()
    with pytest.raises(ShapeError, match="pad_to: .* smaller"):
        t.pad_to(3, 8)
    with pytest.raises(ShapeError, match="shrink"):
        t.shrink_to(5, 8)


def test_const_like_replace_none_bytes_delitem(device):
    t = Tensor.ones(3, 4, dtype=dtypes.float16, device=device)
    c = t.const_like(2)
    assert (c.shape, c.dtype, c.device) == ((3, 4), dtypes.float16, t.device)
    np.testing.assert_array_equal(c.numpy(), np.full((3, 4), 2, np.float16))
    assert t.const_like(1, dtypes.int32).dtype == dtypes.int32
    p = Tensor.zeros(2, 2, device=device).realize()
    assert p.replace(Tensor.ones(2, 2, device=device)) is p
    np.testing.assert_array_equal(p.numpy(), np.ones((2, 2)))
    with pytest.raises(ArgumentError, match="replace: needs a tensor of shape"):
        p.replace(Tensor.ones(2, 3, device=device))
    e = Tensor(None, device=device)
    assert e.shape == (0,) and e.dtype == dtypes.default_float
    data = b"abc123"
    b = Tensor(data, device=device)
    assert b.dtype == dtypes.uint8 and b.shape == (6,)
    np.testing.assert_array_equal(b.numpy(), np.frombuffer(data, np.uint8))
    with pytest.raises(TypeError, match="does not support deleting items"):
        del b[0]
    with pytest.raises(TypeError, match="does not support deleting items"):
        del torch.ones(3)[0]


def test_layernorm2d_and_batchnorm_sz(device):
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    layer = LayerNorm2d(3)
    ref = torch.nn.LayerNorm(3)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor([0.5, 2.0, -1.0]))
        ref.bias.copy_(torch.tensor([0.1, 0.0, 0.3]))
    layer.weight = Tensor(ref.weight.detach().numpy(), device=device, requires_grad=True)
    layer.bias = Tensor(ref.bias.detach().numpy(), device=device, requires_grad=True)
    got = layer(Tensor(x, device=device))
    want = ref(torch.tensor(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), atol=1e-5)
    with pytest.raises(ShapeError, match="LayerNorm2d"):
        layer(Tensor.ones(3, 4, device=device))
    bn = BatchNorm(sz=3, track_running_stats=False)
    want = torch.nn.BatchNorm2d(3, track_running_stats=False)(torch.tensor(x))
    np.testing.assert_allclose(bn(Tensor(x, device=device)).numpy(), want.detach().numpy(), atol=1e-5)
    with pytest.raises(ArgumentError, match="BatchNorm: give num_features"):
        BatchNorm(3, sz=3)
    with pytest.raises(ArgumentError, match="BatchNorm: give num_features"):
        BatchNorm()


def test_randperm_as_torch(device):
    Tensor.manual_seed(3)
    a = Tensor.randperm(50, device=device)
    want = torch.randperm(50)
    assert a.dtype == dtypes.int64 and a.numpy().dtype == want.numpy().dtype
    assert sorted(a.tolist()) == sorted(want.tolist()) == list(range(50))
    Tensor.manual_seed(3)
    np.testing.assert_array_equal(Tensor.randperm(50, device=device).numpy(), a.numpy())
    assert Tensor.randperm(0, device=device).shape == tuple(torch.randperm(0).shape)
    assert Tensor.randperm(4, dtype=dtypes.float32, device=device).dtype == dtypes.float32
    step = TinyJit(lambda: (Tensor.randperm(8, device=device) * 1).realize())
    draws = [tuple(step().tolist()) for _ in range(5)]
    assert len(set(draws)) > 1 and all(sorted(d) == list(range(8)) for d in draws)
    with pytest.raises(RuntimeError):
        torch.randperm(-1)
    with pytest.raises(ArgumentError, match="randperm: n must be an int >= 0"):
        Tensor.randperm(-1)


def test_deepcopy_as_torch(device):
    """copy.deepcopy of a leaf: its values, requires_grad and .grad, independent of the original (as
    PyTorch's, which a deepcopy of a model relies on); a non-leaf raises as in PyTorch."""
    import copy

    from tgrad.nn import Linear

    x = np.array([1.0, -2.0, 3.0], np.float32)
    t, tt = Tensor(x, device=device, requires_grad=True), torch.tensor(x, requires_grad=True)
    (t * t).sum().backward()
    (tt * tt).sum().backward()
    c, tc = copy.deepcopy(t), copy.deepcopy(tt)
    assert c is not t and c.requires_grad == tc.requires_grad and c.device == t.device
    np.testing.assert_array_equal(c.numpy(), tc.detach().numpy())
    np.testing.assert_array_equal(c.grad.numpy(), tc.grad.numpy())
    c.assign(c * 0).realize()
    np.testing.assert_array_equal(t.numpy(), x)
    layer = Linear(2, 3)
    copied = copy.deepcopy(layer)
    np.testing.assert_array_equal(copied.weight.numpy(), layer.weight.numpy())
    assert copied.weight is not layer.weight
    with pytest.raises(RuntimeError, match="deepcopy"):
        copy.deepcopy(tt * 2)
    with pytest.raises(RuntimeError, match="deepcopy: only tensors created by the user"):
        copy.deepcopy(t * 2)
