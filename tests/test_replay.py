"""backward() replayed for a graph of a structure seen before (tgrad/replay.py): the gradients and
the loss of every step against PyTorch's, on every device, in the cases where a replay could go wrong
(new data, new parameters of the same shapes, accumulation, realized intermediates, aliasing)."""

import numpy as np
import pytest
import torch
import torch._dynamo  # noqa: F401  (loads triton's LLVM before a WEBGPU test loads Mesa's; see conftest)

from tgrad import Tensor, replay
from tgrad.jit import TinyJit

RNG = np.random.default_rng(21)
W1 = RNG.standard_normal((6, 5)).astype(np.float32) * 0.5
B1 = RNG.standard_normal(6).astype(np.float32) * 0.1
W2 = RNG.standard_normal((3, 6)).astype(np.float32) * 0.5
XS = [RNG.standard_normal((8, 5)).astype(np.float32) for _ in range(6)]
Y = RNG.integers(0, 3, 8)


def _params(*arrays):
    ours = [Tensor(a, requires_grad=True) for a in arrays]
    return ours, [torch.tensor(a, requires_grad=True) for a in arrays]


def _loss(x, params, act="relu"):
    w1, b1, w2 = params
    if isinstance(x, Tensor):
        h = x.linear(w1, b1)
        h = h.relu() if act == "relu" else h.tanh()
        return h.linear(w2).cross_entropy(Tensor(Y))
    h = torch.nn.functional.linear(x, w1, b1)
    h = h.relu() if act == "relu" else h.tanh()
    return torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w2), torch.tensor(Y))


@pytest.fixture(autouse=True)
def _count_from_here():
    """These tests count replays from a first sight: structures seen by earlier tests (or keyed alike, a
    tensor at a reused address) are forgotten first. Values never depend on it."""
    replay.reset()


def _same(ours, theirs, what=""):
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=what)


def _replays(device: str, before: int, expected: int) -> None:
    if device != "NUMPY":  # (the reference device evaluates graphs: nothing to replay)
        assert replay.Stats.replays - before == expected


def test_steps_on_new_data_replay_with_pytorchs_gradients(device):
    ours, theirs = _params(W1, B1, W2)
    before = replay.Stats.replays
    for i, x in enumerate(XS):
        for p in ours + theirs:
            p.grad = None
        loss = _loss(Tensor(x), ours)
        loss.backward()
        tloss = _loss(torch.tensor(x), theirs)
        tloss.backward()
        _same(ours, theirs, f"step {i}")
        np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5, atol=1e-6, err_msg=f"step {i}")
    _replays(device, before, len(XS) - 3)  # the first runs plainly, the next two run and capture


def test_new_parameters_of_the_same_shapes_get_their_own_gradients(device):
    """A new model of the same structure (a re-initialization) while the old one lives on: its tensors
    get the gradients, computed from its own values."""
    models = []  # (kept alive: the capture's tensors are still there, with gradients)
    for k in range(4):
        scale = 1.0 + k
        ours, theirs = _params(W1 * scale, B1, W2)
        models.append(ours)
        for x in XS[:3]:
            for p in [p for m in models for p in m] + theirs:  # (every model's, as one zero_grad would)
                p.grad = None
            _loss(Tensor(x), ours).backward()
            _loss(torch.tensor(x), theirs).backward()
            _same(ours, theirs, f"model {k}")


def test_accumulated_gradients(device):
    """Several backward() calls before the gradients are read add up (micro-batches), replayed too."""
    ours, theirs = _params(W1, B1, W2)
    for step in range(4):
        for p in ours + theirs:
            p.grad = None
        for x in XS[:3]:
            _loss(Tensor(x), ours).backward()
            _loss(torch.tensor(x), theirs).backward()
        _same(ours, theirs, f"step {step}")


def test_gradients_flow_through_realized_intermediates(device):
    """The structure is keyed below realized nodes: a realized hidden layer computed by relu in some
    steps and tanh in others gets each its own gradient."""
    ours, theirs = _params(W1, B1, W2)
    for i in range(8):
        act = "relu" if i % 3 else "tanh"
        for p in ours + theirs:
            p.grad = None
        x = Tensor(XS[i % len(XS)])
        h = x.linear(ours[0], ours[1])
        h = (h.relu() if act == "relu" else h.tanh()).realize()
        h.linear(ours[2]).cross_entropy(Tensor(Y)).backward()
        xt = torch.tensor(XS[i % len(XS)])
        ht = torch.nn.functional.linear(xt, theirs[0], theirs[1])
        ht = ht.relu() if act == "relu" else ht.tanh()
        tloss = torch.nn.functional.cross_entropy(torch.nn.functional.linear(ht, theirs[2]), torch.tensor(Y))
        tloss.backward()
        _same(ours, theirs, f"step {i} ({act})")


def test_one_tensor_read_twice_or_two_tensors(device):
    """a @ b with b the same tensor as a in some steps and another tensor of its shape in others."""
    a0 = RNG.standard_normal((4, 4)).astype(np.float32)
    b0 = RNG.standard_normal((4, 4)).astype(np.float32)
    for i in range(8):
        a, at = Tensor(a0, requires_grad=True), torch.tensor(a0, requires_grad=True)
        if i % 2:
            b, bt = Tensor(b0 + i, requires_grad=True), torch.tensor(b0 + i, requires_grad=True)
        else:
            b, bt = a, at
        (a @ b).tanh().sum().backward()
        (at @ bt).tanh().sum().backward()
        np.testing.assert_allclose(a.grad.numpy(), at.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"step {i}")
        if i % 2:
            np.testing.assert_allclose(b.grad.numpy(), bt.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_nan_and_inf_reach_the_gradients_as_in_pytorch(device):
    ours, theirs = _params(W1, B1, W2)
    for i in range(6):
        x = XS[i].copy()
        x[0, 0] = [np.nan, np.inf, -np.inf, 1.0, np.nan, 0.0][i]
        for p in ours + theirs:
            p.grad = None
        _loss(Tensor(x), ours).backward()
        _loss(torch.tensor(x), theirs).backward()
        _same(ours, theirs, f"step {i}")


def test_backward_computes_when_it_returns_at_every_call(device):
    """backward() behaves the same at every call, whatever the process saw before: the loss and the
    gradients are computed when it returns (PyTorch's rule), plainly at a first sight and by a replay
    later; with TGRAD_BACKWARD_REPLAY=0 it stays lazy at every call (tinygrad's rule)."""
    ours, theirs = _params(W1, B1, W2)
    for i, x in enumerate(XS):
        for p in ours + theirs:
            p.grad = None
        loss = _loss(Tensor(x), ours)
        loss.backward()
        assert all(p.grad.node.base.realized for p in ours), f"step {i}"
        assert loss.node.base.realized, f"step {i}"
        tloss = _loss(torch.tensor(x), theirs)
        tloss.backward()
        _same(ours, theirs, f"step {i}")


def test_backward_stays_lazy_when_asked(device, lazy_backward):
    ours, theirs = _params(W1, B1, W2)
    for i, x in enumerate(XS[:4]):
        for p in ours + theirs:
            p.grad = None
        loss = _loss(Tensor(x), ours)
        loss.backward()
        assert not any(p.grad.node.base.realized for p in ours), f"step {i}"
        tloss = _loss(torch.tensor(x), theirs)
        tloss.backward()
        _same(ours, theirs, f"step {i}")


def test_backward_inside_a_tinyjit_function_is_captured_by_it(device):
    ours, theirs = _params(W1, B1, W2)

    @TinyJit
    def step(x):
        for p in ours:
            p.grad = None
        loss = _loss(x, ours)
        loss.backward()
        assert not any(p.grad.node.base.realized for p in ours)  # (lazy: fused with what follows)
        return loss.realize(*[p.grad for p in ours])

    before = replay.Stats.replays
    for x in XS:
        step(Tensor(x))
        for p in theirs:
            p.grad = None
        _loss(torch.tensor(x), theirs).backward()
        _same(ours, theirs)
    assert replay.Stats.replays == before  # (TinyJit's replays, not backward's)


@pytest.mark.parametrize("gradient", [False, True])
def test_explicit_gradient_and_non_scalar_losses_run_plainly(device, gradient):
    w, wt = Tensor(W1, requires_grad=True), torch.tensor(W1, requires_grad=True)
    g = RNG.standard_normal((8, 6)).astype(np.float32)
    before = replay.Stats.replays
    for x in XS:
        w.grad, wt.grad = None, None
        out, tout = Tensor(x) @ w.T, torch.tensor(x) @ wt.T
        if gradient:
            out.backward(Tensor(g))
            tout.backward(torch.tensor(g))
        else:
            out.square().mean().backward()
            tout.square().mean().backward()
        np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-4, atol=1e-6)
    _replays(device, before, 0 if gradient else len(XS) - 3)


def test_a_graph_built_before_an_assign_keeps_the_old_values(device):
    """v = w * a built before a.assign(...) (not run yet), the loss from v: its value and gradient read the
    old a (PyTorch computed v before the in-place write), in every step."""
    w0 = RNG.standard_normal((4, 3)).astype(np.float32)
    a0 = RNG.standard_normal((4, 3)).astype(np.float32)
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    w, a, ref = Tensor(w0, requires_grad=True), Tensor(a0), a0.copy()
    for i in range(6):
        w.grad = None
        v = w * a
        a.assign(a + 1)  # not run yet
        loss = (Tensor(x) @ v).tanh().sum()
        loss.backward()
        wt = torch.tensor(w0, requires_grad=True)
        tloss = (torch.tensor(x) @ (wt * torch.tensor(ref))).tanh().sum()
        tloss.backward()
        np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5, atol=1e-6, err_msg=f"step {i}")
        np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=f"step {i}")
        ref = ref + 1
        np.testing.assert_allclose(a.numpy(), ref, rtol=1e-6)


def test_a_graph_deeper_than_the_recursion_limit_runs_plainly(device):
    """A chain of 3000 ops (deeper than the replay's recursive walk goes): the plain path, right each time."""
    x0 = RNG.standard_normal(4).astype(np.float32)
    before = replay.Stats.replays
    for _ in range(4):
        x = Tensor(x0, requires_grad=True)
        y = x
        for _ in range(3000):
            y = y * 1.0001
        y.sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), np.full(4, 1.0001**3000, np.float32), rtol=1e-3)
    _replays(device, before, 0)


F = torch.nn.functional
CW = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
CB = RNG.standard_normal(4).astype(np.float32) * 0.1
LW = RNG.standard_normal(8).astype(np.float32)
MW = RNG.standard_normal((8, 8)).astype(np.float32) * 0.4
IMAGES = [RNG.standard_normal((2, 3, 8, 8)).astype(np.float32) for _ in range(6)]

# ops whose gradient is a custom rule (autodiff.custom_gradient, keyed by its code and closure), as
# (tgrad loss, torch loss, parameters): each over the image x and the parameters p
CUSTOM_CASES = {
    "conv_relu_maxpool": (
        lambda x, p: x.conv2d(p[0], p[1], stride=2, padding=1).relu().max_pool2d(2).square().sum(),
        lambda x, p: F.max_pool2d(F.conv2d(x, p[0], p[1], stride=2, padding=1).relu(), 2).square().sum(),
        (CW, CB)),
    "conv_dilated_grouped": (
        lambda x, p: x.conv2d(p[0][:, :1].expand(4, 1, 3, 3).contiguous()[:3], None, padding=2, dilation=2,
                              groups=3).tanh().sum(),
        lambda x, p: F.conv2d(x, p[0][:, :1].expand(4, 1, 3, 3).contiguous()[:3], None, padding=2, dilation=2,
                              groups=3).tanh().sum(),
        (CW,)),
    "layernorm_gelu": (
        lambda x, p: (x.layernorm() * p[0] + p[1]).gelu().square().mean(),
        lambda x, p: F.gelu(F.layer_norm(x, (8,)) * p[0] + p[1]).square().mean(),
        (LW, LW[::-1].copy())),
    "softmax_pow": (
        lambda x, p: (x @ p[0]).softmax(-1).add(0.5).pow(1.5).sum(),
        lambda x, p: (x @ p[0]).softmax(-1).add(0.5).pow(1.5).sum(),
        (MW,)),
    "attention": (
        lambda x, p: (x.reshape(6, 8, 8) @ p[0]).scaled_dot_product_attention(
            x.reshape(6, 8, 8), x.reshape(6, 8, 8) @ p[0], is_causal=True).square().sum(),
        lambda x, p: F.scaled_dot_product_attention(
            x.reshape(6, 8, 8) @ p[0], x.reshape(6, 8, 8), x.reshape(6, 8, 8) @ p[0],
            is_causal=True).square().sum(),
        (MW,)),
}


@pytest.mark.parametrize("name", list(CUSTOM_CASES))
def test_custom_gradients_replay_with_pytorchs_values(device, name):
    ours_f, theirs_f, arrays = CUSTOM_CASES[name]
    ours, theirs = _params(*arrays)
    before = replay.Stats.replays
    for i, x in enumerate(IMAGES):
        for p in ours + theirs:
            p.grad = None
        loss, tloss = ours_f(Tensor(x), ours), theirs_f(torch.tensor(x), theirs)
        loss.backward()
        tloss.backward()
        np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-4, atol=1e-5, err_msg=f"step {i}")
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-3, atol=1e-4, err_msg=str(i))
    _replays(device, before, len(IMAGES) - 3)


def test_dropout_draws_a_new_mask_at_every_replay(device):
    """Dropout's random mask is drawn anew at each step (a replay does not keep the captured one): each
    step's gradient is numpy's for the mask that step's output shows, and the masks differ."""
    Tensor.manual_seed(5)
    w = Tensor(W1.T.copy(), requires_grad=True)  # (5, 6)
    old, Tensor.training = Tensor.training, True
    masks = []
    try:
        before = replay.Stats.replays
        for i, x in enumerate(XS):
            w.grad = None
            y = (Tensor(x) @ w).dropout(0.5)
            y.sum().backward()
            kept = (y.numpy() != 0).astype(np.float32)
            masks.append(kept)
            np.testing.assert_allclose(w.grad.numpy(), x.T @ (kept * 2), rtol=1e-5, atol=1e-6, err_msg=str(i))
        _replays(device, before, len(XS) - 3)
    finally:
        Tensor.training = old
    assert len({m.tobytes() for m in masks}) == len(masks)


def test_a_refused_capture_leaves_backward_lazy_and_right(device, monkeypatch):
    """Where the structure's TinyJit refuses to capture (here: every call's kernels 'differ'), backward()
    runs plainly again, with PyTorch's gradients at every step."""
    monkeypatch.setattr(TinyJit, "_changed", staticmethod(lambda *args: "the kernels (forced by the test)"))
    replay.reset()
    ours, theirs = _params(W1, B1, W2)
    before = replay.Stats.replays
    for i in range(8):
        for p in ours + theirs:
            p.grad = None
        x = XS[i % len(XS)]
        loss, tloss = _loss(Tensor(x), ours), _loss(torch.tensor(x), theirs)
        loss.backward()
        tloss.backward()
        _same(ours, theirs, f"step {i}")
        np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5, atol=1e-6)
    _replays(device, before, 0)
    replay.reset()


def test_tensors_kept_from_every_step_keep_their_values(device):
    """A hidden layer kept from each step and read at the end: the capturing step computed its matmul into
    a buffer that every replay writes again, so it showed the last replay's value (1.98 off) until the
    graph's nodes got copies of what the capture computed. Each step's own values, numpy's."""
    w1, w2 = W1[:, :5], W2
    t1, t2 = Tensor(w1.copy(), requires_grad=True), Tensor(w2, requires_grad=True)
    kept = []
    for x in XS:
        t1.grad = t2.grad = None
        h = (Tensor(x) @ t1.T).tanh()
        loss = (h @ t2.T).square().sum() + h.sum()
        loss.backward()
        kept.append((h, loss, np.tanh(x @ w1.T)))
    for i, (h, loss, ref) in enumerate(kept):
        np.testing.assert_allclose(h.numpy(), ref, rtol=1e-5, atol=1e-6, err_msg=f"step {i}")
        np.testing.assert_allclose(loss.item(), np.square(ref @ w2.T).sum() + ref.sum(), rtol=1e-5,
                                   err_msg=f"step {i}")


def _block(x, p, lib):
    """A pre-LayerNorm transformer block (causal attention, tanh-GELU MLP) and a squared loss, in tgrad or
    torch: the custom gradients of layernorm, softmax, gelu in one replayed graph."""
    wqkv, wo, w1, w2, g1, g2 = p
    b, t, d = x.shape
    if lib == "tgrad":
        h = x.layernorm() * g1
        q, k, v = h.linear(wqkv).reshape(b, t, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
        a = q.scaled_dot_product_attention(k, v, is_causal=True).permute(0, 2, 1, 3).reshape(b, t, d)
        x = x + a.linear(wo)
        x = x + (x.layernorm() * g2).linear(w1).gelu("tanh").linear(w2)
        return x.square().mean()
    h = F.layer_norm(x, (d,)) * g1
    q, k, v = F.linear(h, wqkv).reshape(b, t, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True).permute(0, 2, 1, 3).reshape(b, t, d)
    x = x + F.linear(a, wo)
    x = x + F.linear(F.gelu(F.linear(F.layer_norm(x, (d,)) * g2, w1), approximate="tanh"), w2)
    return x.square().mean()


def test_a_transformer_block_trained_eagerly_matches_pytorch(device):
    """Eight eager Adam steps of a transformer block on new data each step (backward() and the update both
    replayed from the fourth step on): PyTorch's losses and parameters."""
    from tgrad.nn.optim import Adam

    d = 8
    shapes = ((3 * d, d), (d, d), (4 * d, d), (d, 4 * d))
    arrays = [RNG.standard_normal(s).astype(np.float32) * 0.3 for s in shapes]
    arrays += [np.ones(d, np.float32), np.ones(d, np.float32)]
    ours, theirs = _params(*arrays)
    opt, topt = Adam(ours, lr=0.01), torch.optim.Adam(theirs, lr=0.01)
    before = replay.Stats.replays
    for i in range(8):
        x = RNG.standard_normal((2, 5, d)).astype(np.float32)
        opt.zero_grad()
        loss = _block(Tensor(x), ours, "tgrad")
        loss.backward()
        opt.step(loss)
        topt.zero_grad()
        tloss = _block(torch.tensor(x), theirs, "torch")
        tloss.backward()
        topt.step()
        np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-4, atol=1e-6, err_msg=f"step {i}")
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-3, atol=1e-5)
    _replays(device, before, 5)


def test_batchnorm_in_training_replays_with_its_running_statistics(device):
    """Conv, BatchNorm (training: its running statistics are assigns waiting at backward()), relu, a linear
    head; eight eager Adam steps. The program runs the assigns with the loss and gradients, and every
    replay writes them again: PyTorch's losses, parameters and running statistics."""
    from tgrad.nn import BatchNorm2d
    from tgrad.nn.optim import Adam

    bn, tbn = BatchNorm2d(4), torch.nn.BatchNorm2d(4)
    head = RNG.standard_normal((3, 4 * 4 * 4)).astype(np.float32) * 0.2
    ours, theirs = _params(CW, head)  # (no conv bias: BatchNorm takes the mean out, its gradient is ~0)
    ours += [bn.weight, bn.bias]
    theirs += [tbn.weight, tbn.bias]
    opt, topt = Adam(ours, lr=0.01), torch.optim.Adam(theirs, lr=0.01)
    old, Tensor.training = Tensor.training, True
    try:
        before = replay.Stats.replays
        for i, x in enumerate(IMAGES + IMAGES[:2]):
            opt.zero_grad()
            h = bn(Tensor(x).conv2d(ours[0], None, stride=2, padding=1)).relu()
            loss = h.reshape(2, -1).linear(ours[1]).cross_entropy(Tensor(Y[:2]))
            loss.backward()
            opt.step(loss)
            topt.zero_grad()
            th = tbn(F.conv2d(torch.tensor(x), theirs[0], None, stride=2, padding=1)).relu()
            tloss = F.cross_entropy(F.linear(th.reshape(2, -1), theirs[1]), torch.tensor(Y[:2]))
            tloss.backward()
            topt.step()
            np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-4, atol=1e-5, err_msg=f"step {i}")
        _replays(device, before, 5)
    finally:
        Tensor.training = old
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(bn.running_mean.numpy(), tbn.running_mean.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bn.running_var.numpy(), tbn.running_var.numpy(), rtol=1e-4, atol=1e-5)


def test_an_assign_made_at_one_step_runs_once(device):
    """An assign waiting at one step's backward() is run by that step only, not by later replays."""
    ours, theirs = _params(W1, B1, W2)
    counter = Tensor(np.zeros(3, np.float32))
    for i in range(9):
        if i in (4, 6):
            counter.assign(counter + 1)  # waits: run with this step's backward()
        for p in ours + theirs:
            p.grad = None
        _loss(Tensor(XS[i % len(XS)]), ours).backward()
        _loss(torch.tensor(XS[i % len(XS)]), theirs).backward()
        _same(ours, theirs, f"step {i}")
    np.testing.assert_array_equal(counter.numpy(), np.full(3, 2, np.float32))


def test_an_error_in_a_replay_leaves_the_waiting_assigns_waiting(device, monkeypatch):
    """A replay that fails (here: made to raise) leaves the assigns that waited at backward() waiting: a
    later realize runs them once."""
    if device == "NUMPY":
        return  # (nothing is replayed there)
    ours, _ = _params(W1, B1, W2)
    counter = Tensor(np.zeros(3, np.float32))
    steps, before = 0, replay.Stats.replays
    while replay.Stats.replays == before:  # (until the structure replays)
        assert steps < 8
        for p in ours:
            p.grad = None
        counter.assign(counter + 1)
        _loss(Tensor(XS[steps % len(XS)]), ours).backward()
        steps += 1
    monkeypatch.setattr(TinyJit, "_replay", lambda *args: 1 / 0)
    for p in ours:
        p.grad = None
    counter.assign(counter + 1)
    with pytest.raises(ZeroDivisionError):
        _loss(Tensor(XS[0]), ours).backward()
    from tgrad.tensor import pending_assigns

    assert any(t is counter for t in pending_assigns())  # (what an optimizer step or a TinyJit call runs)
    np.testing.assert_array_equal(counter.numpy(), np.full(3, steps + 1, np.float32))
