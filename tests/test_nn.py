"""nn ops (conv, pool, norm, attention, dropout) and layers, compared with PyTorch."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.helpers import helper_test_op
from tgrad import Tensor
from tgrad.errors import ShapeError
from tgrad.nn import BatchNorm, BatchNorm2d, Conv2d, Embedding, GroupNorm, LayerNorm, Linear

CONV = dict(atol=1e-4, grad_atol=1e-3)


@pytest.mark.parametrize("kw", [
    dict(),
    dict(stride=2, padding=1, groups=2),
    dict(padding=(1, 2), dilation=2),
])
def test_conv2d(device, kw):
    w = (6, 2, 3, 3) if kw.get("groups") else (6, 4, 3, 3)
    helper_test_op([(2, 4, 7, 7), w, (6,)], lambda x, w, b: F.conv2d(x, w, b, **kw),
                   lambda x, w, b: x.conv2d(w, b, **kw), **CONV)


def test_conv2d_no_bias_rect_kernel(device):
    helper_test_op([(1, 2, 5, 6), (3, 2, 2, 3)], lambda x, w: F.conv2d(x, w, stride=(1, 2)),
                   lambda x, w: x.conv2d(w, stride=(1, 2)), **CONV)


def test_conv2d_shape_errors():
    with pytest.raises(ShapeError, match="channels"):
        Tensor.ones(1, 3, 5, 5).conv2d(Tensor.ones(2, 2, 3, 3))
    with pytest.raises(ShapeError, match="larger than the input"):
        Tensor.ones(1, 2, 2, 2).conv2d(Tensor.ones(2, 2, 3, 3))


@pytest.mark.parametrize("args", [(2,), (3, 2, 1), (3, 1, 0)])
def test_max_pool2d(device, args):
    helper_test_op([(2, 3, 7, 7)], lambda x: F.max_pool2d(x, *args), lambda x: x.max_pool2d(*args))


@pytest.mark.parametrize("args,include", [((2,), True), ((3, 2, 1), True), ((3, 2, 1), False)])
def test_avg_pool2d(device, args, include):
    helper_test_op([(2, 3, 7, 7)], lambda x: F.avg_pool2d(x, *args, count_include_pad=include),
                   lambda x: x.avg_pool2d(*args, count_include_pad=include))


def test_batchnorm_functional(device):
    def tg(x, w, b, m, v):
        return x.batchnorm(w, b, m, (v.abs() + 1e-5).rsqrt())

    def tt(x, w, b, m, v):  # F.batch_norm has no gradient for the statistics: write it out
        def r(t):
            return t.reshape(1, -1, 1, 1)

        return (x - r(m)) * r(w) / torch.sqrt(r(v.abs()) + 1e-5) + r(b)

    helper_test_op([(2, 3, 4, 4), (3,), (3,), (3,), (3,)], tt, tg, grad_atol=1e-3)


def test_layernorm(device):
    helper_test_op([(3, 4, 8)], lambda x: F.layer_norm(x, (8,)), lambda x: x.layernorm())
    helper_test_op([(3, 4, 8)], lambda x: F.layer_norm(x, (4, 8), eps=1e-3),
                   lambda x: x.layernorm((-2, -1), eps=1e-3))


@pytest.mark.parametrize("axis", [-1, (-2, -1)])
def test_layernorm_second_derivative(axis):
    """layernorm's gradient is a closed form, r * (g - mean(g) - y * mean(g * y)) over its output y; its
    own gradient (a second derivative) is PyTorch's too, including at constant rows (variance 0)."""
    x = np.random.default_rng(0).standard_normal((3, 5, 8)).astype(np.float32)
    x[1, 2] = 4.0  # a constant row: y = 0, r = 1 / sqrt(eps)
    w = np.random.default_rng(1).standard_normal((3, 5, 8)).astype(np.float32)
    tx = torch.tensor(x, requires_grad=True)
    shape = tx.shape[-1:] if axis == -1 else tx.shape[-2:]
    loss = (F.layer_norm(tx, shape, eps=1e-5) * torch.tensor(w)).sum()
    (gx,) = torch.autograd.grad(loss, tx, create_graph=True)
    (gg,) = torch.autograd.grad((gx**2).sum(), tx)
    t = Tensor(x, requires_grad=True)
    (g1,) = (t.layernorm(axis, eps=1e-5) * Tensor(w)).sum().gradient(t)
    (g2,) = (g1**2).sum().gradient(t)
    np.testing.assert_allclose(g1.numpy(), gx.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(g2.numpy(), gg.numpy(), rtol=1e-3, atol=1e-1)


@pytest.mark.parametrize("mask", [None, "causal", "bool", "float"])
def test_scaled_dot_product_attention(device, mask):
    shapes = [(2, 3, 5, 8), (2, 3, 5, 8), (2, 3, 5, 6)]
    m = np.tril(np.ones((5, 5), bool), 1)
    if mask == "bool":
        shapes.append((5, 5))
    if mask in (None, "causal"):
        kw = dict(is_causal=mask == "causal")
        helper_test_op(shapes, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw),
                       lambda q, k, v: q.scaled_dot_product_attention(k, v, **kw))
    elif mask == "bool":
        helper_test_op(shapes[:3], lambda q, k, v: F.scaled_dot_product_attention(q, k, v, torch.tensor(m)),
                       lambda q, k, v: q.scaled_dot_product_attention(k, v, Tensor(m)))
    else:
        helper_test_op(shapes + [(5, 5)], F.scaled_dot_product_attention,
                       lambda q, k, v, a: q.scaled_dot_product_attention(k, v, a))


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_attention_of_a_query_with_every_key_masked_is_zero(device, kind):
    """A query whose every key is masked (a padding row) gives 0 and no gradient, as PyTorch's safe softmax:
    softmax over all -inf gave nan there, and its gradient put nan into every query, key and value."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 4)))
    m = np.ones((3, 5), bool)
    m[1], m[2, 1:] = False, False  # row 1: nothing; row 2: its first key only
    mask = m if kind == "bool" else np.where(m, 0, -np.inf).astype(np.float32)
    mine = [Tensor(a, requires_grad=True) for a in (q, k, v)]
    ref = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    out = mine[0].scaled_dot_product_attention(mine[1], mine[2], attn_mask=Tensor(mask))
    want = F.scaled_dot_product_attention(*ref, attn_mask=torch.tensor(mask))
    (out * out).sum().backward()
    (want * want).sum().backward()
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert not np.isnan(out.numpy()).any()
    for a, b in zip(mine, ref):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["causal", "tril", "triu", "max_pool_grad", "cross_entropy"])
def test_masks_compare_int32_positions(op):
    """Causal attention, tril/triu, max_pool2d's gradient (which element of a window is its first
    maximum) and cross_entropy's classes compare positions they make as int32 where they fit: a CPU
    kernel then compares 16 per 512-bit vector, as many as the float32 values it selects (int64 made a
    causal softmax's exp pass 2.7x slower). Diagonals beyond int32 still give PyTorch's triangles."""
    from tgrad.dtype import dtypes
    from tgrad.fuse import schedule

    x = np.random.default_rng(0).standard_normal((2, 3, 6, 8)).astype(np.float32)
    q = Tensor(x, requires_grad=op == "max_pool_grad")
    allowed = set()
    if op == "max_pool_grad":
        q.max_pool2d(2).sum().backward()
        out = q.grad
    elif op == "cross_entropy":  # int64 labels (checked in range) are compared with int32 classes
        labels = np.array([[0, 7, 3], [5, 5, -100]], np.int64).reshape(2, 3, 1).repeat(6, 2)
        target = Tensor(labels).realize()
        allowed = {target.node}  # the labels themselves: read once per row, cast there
        out = q.reshape(2, 8, 3, 6).cross_entropy(target, ignore_index=-100)
        want = F.cross_entropy(torch.from_numpy(x).reshape(2, 8, 3, 6), torch.from_numpy(labels))
        np.testing.assert_allclose(q.reshape(2, 8, 3, 6).cross_entropy(target).numpy(), want.numpy(),
                                   rtol=1e-5)
    else:
        out = {"causal": lambda: q.scaled_dot_product_attention(q, q, is_causal=True),
               "tril": lambda: q.tril(-2), "triu": lambda: q.triu(1)}[op]()
    buffers = {n for item in schedule([out.node]) for n in item.inputs if n.op.name == "BUFFER"}
    assert {n for n in buffers if n.dtype == dtypes.int64} <= allowed
    if op in ("tril", "triu"):
        t = torch.from_numpy(x)
        for d in (-(10**10), -3, 0, 4, 10**10):
            np.testing.assert_array_equal(getattr(q, op)(d).numpy(), getattr(t, op)(d).numpy())


def test_dropout(device):
    x = Tensor.ones(200, 50)
    assert (x.dropout(0.5).numpy() == 1).all()  # not training: identity
    Tensor.training = True
    try:
        out = x.dropout(0.25).numpy()
        zero = (out == 0).mean()
        assert 0.2 < zero < 0.3
        np.testing.assert_allclose(out[out != 0], 1 / 0.75, rtol=1e-6)
        assert (x.dropout(1.0).numpy() == 0).all()
        a = Tensor.ones(4, 4, requires_grad=True)
        a.dropout(0.5).sum().backward()
        g = a.grad.numpy()
        assert set(np.unique(g)) <= {0.0, 2.0}
    finally:
        Tensor.training = False


# ---------------------------------------------------------------------------------------------------
# layers


def _copy_to_torch(tg_layer, torch_layer) -> None:
    with torch.no_grad():
        for name in ("weight", "bias"):
            t = getattr(tg_layer, name, None)
            if t is not None:
                getattr(torch_layer, name)[...] = torch.tensor(t.numpy())


def _check_layer(tg_layer, torch_layer, x: np.ndarray, atol=1e-5):
    _copy_to_torch(tg_layer, torch_layer)
    xt = torch.tensor(x, requires_grad=True)
    xg = Tensor(x, requires_grad=True)
    out_t, out_g = torch_layer(xt), tg_layer(xg)
    np.testing.assert_allclose(out_g.numpy(), out_t.detach().numpy(), atol=atol, rtol=1e-4)
    w = np.random.default_rng(1).standard_normal(out_t.shape).astype(np.float32)
    (out_t * torch.tensor(w)).sum().backward()
    (out_g * Tensor(w)).sum().backward()
    np.testing.assert_allclose(xg.grad.numpy(), xt.grad.numpy(), atol=1e-4, rtol=1e-3)
    for name in ("weight", "bias"):
        t = getattr(tg_layer, name, None)
        if t is not None:
            np.testing.assert_allclose(t.grad.numpy(), getattr(torch_layer, name).grad.numpy(), atol=1e-4,
                                       rtol=1e-3, err_msg=name)


X4 = np.random.default_rng(0).standard_normal((2, 4, 6, 6)).astype(np.float32)


def test_linear():
    _check_layer(Linear(6, 3), torch.nn.Linear(6, 3), X4)


def test_conv2d_layer():
    _check_layer(Conv2d(4, 6, 3, padding=1, groups=2), torch.nn.Conv2d(4, 6, 3, padding=1, groups=2), X4,
                 atol=1e-4)


def test_layernorm_layer():
    _check_layer(LayerNorm((6, 6)), torch.nn.LayerNorm((6, 6)), X4)


def test_groupnorm_layer():
    _check_layer(GroupNorm(2, 4), torch.nn.GroupNorm(2, 4), X4)


@pytest.mark.filterwarnings("ignore:backward\\(\\) through a BatchNorm in eval mode")  # (eval on purpose)
def test_batchnorm2d_train_and_eval():
    bn, tbn = BatchNorm2d(4), torch.nn.BatchNorm2d(4)
    Tensor.training = True
    try:
        for seed in range(2):  # two training steps move the running statistics
            x = np.random.default_rng(seed).standard_normal((3, 4, 5, 5)).astype(np.float32) * 2 + 1
            out = bn(Tensor(x))
            np.testing.assert_allclose(out.numpy(), tbn(torch.tensor(x)).detach().numpy(), atol=1e-4)
            Tensor.realize(bn.running_mean, bn.running_var, bn.num_batches_tracked)
    finally:
        Tensor.training = False
    np.testing.assert_allclose(bn.running_mean.numpy(), tbn.running_mean.numpy(), atol=1e-5)
    np.testing.assert_allclose(bn.running_var.numpy(), tbn.running_var.numpy(), atol=1e-5)
    assert bn.num_batches_tracked.item() == 2
    tbn.eval()
    _check_layer(bn, tbn, X4, atol=1e-4)


def test_batchnorm_train_gradients():
    bn, tbn = BatchNorm2d(4), torch.nn.BatchNorm2d(4)
    Tensor.training = True
    try:
        _check_layer(bn, tbn, X4, atol=1e-4)
    finally:
        Tensor.training = False


@pytest.mark.parametrize("shape,kw", [
    ((6, 4), {}), ((5, 4, 7), {}), ((3, 4, 5, 5), {"affine": False}),
    ((3, 4, 5, 5), {"track_running_stats": False}), ((2, 4, 1, 1), {}),  # one value a channel per image
])
def test_batchnorm_train_gradients_more_shapes(shape, kw):
    """BatchNorm1d/2d in training against PyTorch: output, input and parameter gradients, running stats.
    Its input's gradient is one rule (Tensor.layernorm's, PyTorch's formula over the channel's values)."""
    x = (np.random.default_rng(3).standard_normal(shape) * 3 - 1).astype(np.float32)
    tcls = torch.nn.BatchNorm1d if len(shape) < 4 else torch.nn.BatchNorm2d
    bn, tbn = BatchNorm(shape[1], **kw), tcls(shape[1], **kw)
    Tensor.training = True
    try:
        _check_layer(bn, tbn, x, atol=1e-4)
        if bn.track_running_stats:
            Tensor.realize(bn.running_mean, bn.running_var)
            np.testing.assert_allclose(bn.running_mean.numpy(), tbn.running_mean.numpy(), atol=1e-5)
            np.testing.assert_allclose(bn.running_var.numpy(), tbn.running_var.numpy(), atol=1e-5)
    finally:
        Tensor.training = False


def test_batchnorm_backward_kernels(monkeypatch):
    """The MNIST CNN's relu -> BatchNorm2d -> max_pool in training: BatchNorm's input gradient is one rule
    (Tensor.layernorm's: two channel sums and an elementwise pass), 9 backward kernels here against 12 for
    the composed gradient through the mean and the variance (the CNN step's kernels 58-61 -> 55-57 ms).
    Values: the gradient tests above."""
    from tgrad import fuse

    monkeypatch.setenv("DEVICE", "CPU")
    rng = np.random.default_rng(4)
    bn = BatchNorm2d(32)
    a = Tensor(rng.standard_normal((64, 32, 20, 20)).astype(np.float32), requires_grad=True)
    c = Tensor(rng.standard_normal((1, 32, 1, 1)).astype(np.float32))
    Tensor.training = True
    try:
        out = bn((a + c).relu()).max_pool2d(2)
    finally:
        Tensor.training = False
    g = Tensor(rng.standard_normal(out.shape).astype(np.float32))
    grads = (out * g).sum().gradient(a, bn.weight, bn.bias)
    forward, both = fuse.schedule([out.node]), fuse.schedule([out.node, *(t.node for t in grads)])
    assert len(both) - len(forward) <= 9, [it.kernel.name for it in both]


def test_embedding():
    emb, temb = Embedding(10, 4), torch.nn.Embedding(10, 4)
    with torch.no_grad():
        temb.weight[...] = torch.tensor(emb.weight.numpy())
    idx = np.array([[1, 5, 9], [0, 5, 2]])
    out = emb(Tensor(idx))
    np.testing.assert_allclose(out.numpy(), temb(torch.tensor(idx)).detach().numpy())
    out.sum().backward()
    temb(torch.tensor(idx)).sum().backward()
    np.testing.assert_allclose(emb.weight.grad.numpy(), temb.weight.grad.numpy())


def test_default_init_bounds():
    # PyTorch: kaiming_uniform(a=sqrt(5)) and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    Tensor.manual_seed(0)
    lin = Linear(100, 50)
    conv = Conv2d(8, 16, 3, groups=2)
    for t, fan_in in ((lin.weight, 100), (lin.bias, 100), (conv.weight, 36), (conv.bias, 36)):
        a, bound = t.numpy(), 1 / np.sqrt(fan_in)
        # the largest of n uniform draws is below 0.5 * bound with probability 0.5 ** n (16 biases: 2e-5)
        assert np.abs(a).max() <= bound and np.abs(a).max() > 0.5 * bound
        assert t.requires_grad
    assert conv.weight.shape == (16, 4, 3, 3)
    assert np.abs(lin.weight.numpy().std() - 1 / np.sqrt(300)) < 0.1 / np.sqrt(300)
