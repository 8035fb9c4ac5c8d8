"""What a PyTorch user types on the first day: tensor spellings (cpu, dim, type, to's forms), numpy scalars'
dtypes, nn.Module's methods, opt.param_groups, cross_entropy's class weights, the gradient through a value
changed in place under no_grad, matmul / linear shape errors and schedulers stepped inside TinyJit; each
compared with PyTorch."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tgrad.nn as nn
from tgrad import Tensor, TinyJit, dtypes
from tgrad.device import Device
from tgrad.errors import ArgumentError, AutogradError, DTypeError, ShapeError
from tgrad.nn.optim import SGD, Adam, AdamW, CosineAnnealingLR, StepLR
from tgrad.nn.state import StateDictError, get_parameters, get_state_dict

# ------------------------------------------------------------------------------------------------------
# tensor spellings


def _torch_dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def test_cpu_dim_type(device):
    x = np.array([[1.5, -2.0, 3.25]], np.float32)
    t, tt = Tensor(x), torch.tensor(x)
    assert t.cpu().device == "CPU"
    np.testing.assert_array_equal(t.cpu().numpy(), tt.cpu().numpy())
    assert t.dim() == tt.dim() == 2
    assert t.type() == tt.type() == "torch.FloatTensor"
    for torch_dt, name in ((torch.int32, "int32"), (torch.float16, "float16"), (torch.bool, "bool")):
        got, want = t.type(torch_dt), tt.type(torch_dt)
        assert got.dtype.name == _torch_dtype_name(want)
        assert got.type() == want.type()
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        assert t.type(name).dtype.name == _torch_dtype_name(want)
    for legacy in ("torch.IntTensor", "torch.ShortTensor", "torch.BoolTensor", "torch.HalfTensor"):
        assert t.type(legacy).type() == tt.type(legacy).type() == legacy
        np.testing.assert_array_equal(t.type(legacy).numpy(), tt.type(legacy).numpy())
    assert t.type(torch.DoubleTensor).type() == tt.type(torch.DoubleTensor).type() == "torch.DoubleTensor"
    with pytest.raises(DTypeError, match="unknown tensor type"):
        t.type("torch.NopeTensor")


def test_to_forms(device):
    x = np.array([1.7, -2.2, 3.0], np.float32)
    t, tt = Tensor(x), torch.tensor(x)
    other, tother = Tensor([1, 2], dtype=dtypes.int16), torch.tensor([1, 2], dtype=torch.int16)
    cases = [
        (lambda a: a.to(dtype=torch.int32), lambda a: a.to(dtype=torch.int32)),
        (lambda a: a.to(torch.float16), lambda a: a.to(torch.float16)),
        (lambda a: a.to("cpu", torch.int32), lambda a: a.to("cpu", torch.int32)),
        (lambda a: a.to(device="cpu", dtype=torch.bool), lambda a: a.to(device="cpu", dtype=torch.bool)),
        (lambda a: a.to(other), lambda a: a.to(tother)),
        (lambda a: a.to("cpu", dtype=torch.int16, copy=True),
         lambda a: a.to("cpu", dtype=torch.int16, copy=True)),
    ]
    for ours, theirs in cases:
        got, want = ours(t), theirs(tt)
        assert got.dtype.name == _torch_dtype_name(want)
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert t.to("cpu", "int32").device == "CPU"
    assert t.to(device).device == device and t.to(dtype=dtypes.float32) is t
    with pytest.raises(ArgumentError, match="expected a device, a dtype or a Tensor"):
        t.to(3)


def test_to_dtype_keeps_gradient(device):
    x = np.array([0.5, -1.5, 2.0], np.float32)
    t, tt = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    (t.to(dtype=torch.float64) * 3).sum().backward()
    (tt.to(dtype=torch.float64) * 3).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy())


@pytest.mark.parametrize("value", [
    np.float64(3.0), np.float32(2.5), np.float16(1.5), np.int32(7), np.int64(-4), np.int16(3), np.int8(-2),
    np.uint8(200), np.bool_(True), [np.float64(1.0), 2.0], [np.int64(1), 2.5],
    [[np.float32(1.0)], [np.float64(2.0)]], [np.int32(1), 2], [True, np.int8(3)], [np.bool_(True), 2.0],
    [1.0, 2.0], [1, 2], 3.0,
])
def test_numpy_scalar_dtypes(device, value):
    want = torch.tensor(value)
    dt = dtypes.from_any(_torch_dtype_name(want))
    if not Device[device].supports(dt):
        pytest.skip(f"{device} has no {dt.name}")
    got = Tensor(value)
    assert got.dtype.name == _torch_dtype_name(want)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


# ------------------------------------------------------------------------------------------------------
# nn.Module


class Net(nn.Module):
    def __init__(self):
        super().__init__()  # (PyTorch's habit; Module needs no __init__ call)
        self.fc = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)
        self.drop = nn.Dropout(0.5)
        self.layers = [nn.Linear(3, 3), nn.Linear(3, 2, bias=False)]

    def forward(self, x):
        x = self.drop(self.bn(self.fc(x)).relu())
        return self.layers[1](self.layers[0](x).relu())


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.bn = torch.nn.BatchNorm1d(3)
        self.drop = torch.nn.Dropout(0.5)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(3, 3), torch.nn.Linear(3, 2, bias=False)])

    def forward(self, x):
        x = self.drop(F.relu(self.bn(self.fc(x))))
        return self.layers[1](F.relu(self.layers[0](x)))


def test_module_names_match_torch():
    net, tnet = Net(), TorchNet()
    assert list(net.state_dict()) == list(tnet.state_dict())
    assert [k for k, _ in net.named_parameters()] == [k for k, _ in tnet.named_parameters()]
    assert [k for k, _ in net.named_buffers()] == [k for k, _ in tnet.named_buffers()]
    assert [p.shape for p in net.parameters()] == [tuple(p.shape) for p in tnet.parameters()]
    assert [type(m).__name__ for m in net.modules()] == ["Net", "Linear", "BatchNorm", "Dropout", "Linear",
                                                          "Linear"]


def _load_from_torch(net, tnet):
    tnet.bn.running_mean.copy_(torch.tensor([0.1, -0.2, 0.3]))
    tnet.bn.running_var.copy_(torch.tensor([1.5, 0.5, 2.0]))
    result = net.load_state_dict(tnet.state_dict())
    assert result.missing_keys == result.unexpected_keys == []


def test_module_eval_and_train_match_torch(device):
    torch.manual_seed(0)
    net, tnet = Net(), TorchNet()
    with torch.no_grad():
        _load_from_torch(net, tnet)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    assert net.eval() is net and not net.training and not net.bn.training
    tnet.eval()
    np.testing.assert_allclose(net(Tensor(x)).numpy(), tnet(torch.tensor(x)).detach().numpy(), atol=1e-5)
    # train(): BatchNorm uses the batch's statistics and updates the running ones (Dropout off: p=0)
    net.drop.p = tnet.drop.p = 0.0
    net.train()
    tnet.train()
    assert net.training and net.layers[0].training and net.bn.training
    out, tout = net(Tensor(x)), tnet(torch.tensor(x))
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(net.bn.running_var.numpy(), tnet.bn.running_var.numpy(), atol=1e-6)
    # gradients through parameters(), zero_grad()
    out.sum().backward()
    tout.sum().backward()
    for (name, p), tp in zip(net.named_parameters(), tnet.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), atol=1e-5, err_msg=name)
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_module_training_follows_tensor_training_until_set():
    net = Net()
    assert not net.training
    with Tensor.train():
        assert net.training and net.bn.training
        net.eval()
        assert not net.bn.training  # its own flag now wins over the global one
    Tensor.training = True
    try:
        assert not net.training
        assert net.train().training
    finally:
        Tensor.training = False
    assert net.bn.training  # (train() set every module below)
    x = Tensor.ones(100)
    assert nn.Dropout(0.5).eval()(x).tolist() == x.tolist()
    kept = nn.Dropout(0.5).train()(x).numpy()
    assert set(np.unique(kept)) <= {0.0, 2.0} and 0 < (kept == 0).sum() < 100
    with pytest.raises(ValueError, match="mode must be a bool"):
        net.train("yes")


def test_module_load_state_dict_errors():
    net, tnet = Net(), TorchNet()
    state = dict(tnet.state_dict())
    state.pop("fc.bias")
    state["extra.weight"] = torch.zeros(2)
    for model in (net, tnet):
        with pytest.raises(RuntimeError, match=r"(?s)[Mm]issing.*fc\.bias.*[Uu]nexpected.*extra\.weight"):
            model.load_state_dict(state)
    with pytest.raises(StateDictError):
        net.load_state_dict(state)
    before = net.fc.weight.numpy()
    ours, theirs = net.load_state_dict(state, strict=False), tnet.load_state_dict(state, strict=False)
    assert ours.missing_keys == theirs.missing_keys and ours.unexpected_keys == theirs.unexpected_keys
    np.testing.assert_array_equal(net.fc.weight.numpy(), tnet.fc.weight.detach().numpy())
    assert not np.array_equal(before, net.fc.weight.numpy())
    # a wrong shape raises (strict or not, as in PyTorch), naming the key, and copies nothing
    bad = dict(tnet.state_dict())
    bad["layers.1.weight"] = torch.zeros(2, 4)
    bad["fc.weight"] = torch.ones(3, 4)
    for strict in (True, False):
        with pytest.raises(RuntimeError, match=r"layers\.1\.weight"):
            tnet.load_state_dict(bad, strict=strict)
        wrong = r"`layers\.1\.weight`: Expected shape \(2, 3\), but found \(2, 4\)"  # the key, both shapes
        with pytest.raises(ShapeError, match=wrong):
            net.load_state_dict(bad, strict=strict)
    assert not np.array_equal(net.fc.weight.numpy(), np.ones((3, 4), np.float32))


def test_plain_classes_keep_working():
    class Plain:  # tinygrad style: no base class, __call__
        def __init__(self):
            self.l1 = nn.Linear(2, 3)

        def __call__(self, x):
            return self.l1(x)

    m = Plain()
    assert list(get_state_dict(m)) == ["l1.weight", "l1.bias"] and len(get_parameters(m)) == 2
    assert m(Tensor.ones(1, 2)).shape == (1, 3)
    with pytest.raises(NotImplementedError, match="defines forward"):
        nn.Module()(Tensor.ones(1))


# ------------------------------------------------------------------------------------------------------
# param_groups


def _train(opt, topt, w, tw, x, steps, edit):
    for i in range(steps):
        edit(i, opt.param_groups[0], topt.param_groups[0])
        opt.zero_grad()
        topt.zero_grad()
        ((w * x).sin().square().sum()).backward()
        ((tw * torch.tensor(x)).sin().square().sum()).backward()
        opt.step()
        topt.step()
        np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=f"step {i}")


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_param_groups_edits_take_effect(device, kind):
    """Edits through param_groups between steps, as a hand-written schedule does: later steps replay the
    update (tgrad's eager optimizer update), so the edits must reach the replayed kernels too."""
    x = np.array([0.3, -1.2, 0.8, 2.0], np.float32)
    w0 = np.array([1.0, 0.5, -0.7, 0.2], np.float32)
    w, tw = Tensor(w0.copy(), requires_grad=True), torch.tensor(w0.copy(), requires_grad=True)
    if kind == "sgd":
        opt, topt = SGD([w], lr=0.1), torch.optim.SGD([tw], lr=0.1)
        changes = {4: ("lr", 0.05), 6: ("momentum", 0.9), 8: ("weight_decay", 0.1), 10: ("lr", 0.2)}
    else:
        cls, tcls = (Adam, torch.optim.Adam) if kind == "adam" else (AdamW, torch.optim.AdamW)
        opt, topt = cls([w], lr=0.01), tcls([tw], lr=0.01)
        changes = {4: ("lr", 0.05), 6: ("betas", (0.8, 0.99)), 8: ("eps", 1e-3), 9: ("weight_decay", 0.05),
                   10: ("lr", 0.002)}

    def edit(i, g, tg):
        assert set(g) == set(tg) - {"foreach", "maximize", "capturable", "differentiable", "fused", "amsgrad",
                                    "decoupled_weight_decay"}, set(g) ^ set(tg)
        assert g["lr"] == tg["lr"]
        if i in changes:
            key, value = changes[i]
            g[key] = tg[key] = value
            assert g[key] == tg[key]

    _train(opt, topt, w, tw, x, 12, edit)


def test_param_groups_scale_lr_and_extra_keys(device):
    x = np.array([0.5, -1.0], np.float32)
    w, tw = Tensor([1.0, 2.0], requires_grad=True), torch.tensor([1.0, 2.0], requires_grad=True)
    opt, topt = SGD([w], lr=0.1), torch.optim.SGD([tw], lr=0.1)

    def edit(i, g, tg):  # a scheduler written against PyTorch's API
        for group in (g, tg):
            group.setdefault("initial_lr", group["lr"])
            group["lr"] = group["initial_lr"] * 0.5 ** (i // 2)
        assert g["initial_lr"] == tg["initial_lr"]

    _train(opt, topt, w, tw, x, 6, edit)
    assert opt.param_groups[0]["params"][0] is w
    with pytest.raises(ArgumentError, match="parameters are fixed"):
        opt.param_groups[0]["params"] = []


def _jitted_step(opt, w: Tensor, scheduler=None) -> TinyJit:
    """A TinyJit of one step of ((w * x) ** 2).sum() with opt (and the scheduler's step, if given)."""

    @TinyJit
    def step(xt):
        opt.zero_grad()
        loss = (w * xt).square().sum()
        loss.backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()
        return loss

    return step


def test_param_groups_under_tinyjit(device):
    x = np.array([0.5, -1.0, 2.0], np.float32)
    w, tw = Tensor([1.0, 2.0, -1.0], requires_grad=True), torch.tensor([1.0, 2.0, -1.0], requires_grad=True)
    opt, topt = SGD([w], lr=0.1), torch.optim.SGD([tw], lr=0.1)
    step = _jitted_step(opt, w)
    for i in range(6):
        if i == 4:
            opt.param_groups[0]["lr"] = topt.param_groups[0]["lr"] = 0.01
        step(Tensor(x))
        topt.zero_grad()
        (tw * torch.tensor(x)).square().sum().backward()
        topt.step()
        np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, err_msg=f"step {i}")


# ------------------------------------------------------------------------------------------------------
# cross_entropy(weight=)


@pytest.mark.sweep  # (tests/conftest.py: whole on NUMPY and CPU, a diagonal elsewhere)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("spatial", [False, True])
def test_cross_entropy_weight(device, reduction, smoothing, spatial):
    rng = np.random.default_rng(1)
    shape = (5, 3, 2) if spatial else (6, 3)
    x = rng.standard_normal(shape).astype(np.float32)
    target = rng.integers(0, 3, (shape[0],) + shape[2:])
    ignore = -100 if spatial else 7
    target.reshape(-1)[[1, 3]] = ignore
    w = np.array([0.5, 2.0, 3.0], np.float32)
    tx = torch.tensor(x, requires_grad=True)
    want = F.cross_entropy(tx, torch.tensor(target), weight=torch.tensor(w), reduction=reduction,
                           label_smoothing=smoothing, ignore_index=ignore)
    want.sum().backward()
    gx = Tensor(x, requires_grad=True)
    got = gx.cross_entropy(Tensor(target), weight=Tensor(w), reduction=reduction, label_smoothing=smoothing,
                           ignore_index=ignore)
    got.sum().backward()
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gx.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_cross_entropy_weight_probabilities(device, smoothing):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    p = rng.random((4, 3)).astype(np.float32)
    p /= p.sum(1, keepdims=True)
    w = np.array([1.5, 0.2, 1.0], np.float32)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    want = F.cross_entropy(tx, torch.tensor(p), weight=tw, label_smoothing=smoothing)
    want.backward()
    gx, gw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    got = gx.cross_entropy(Tensor(p), weight=gw, label_smoothing=smoothing)
    got.backward()
    np.testing.assert_allclose(got.numpy(), want.item(), rtol=1e-5)
    np.testing.assert_allclose(gx.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(gw.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_cross_entropy_weight_single_sample_and_errors():
    x, t, w = np.array([0.2, -1.0, 0.5], np.float32), np.array(2), np.array([1.0, 2.0, 0.5], np.float32)
    for reduction in ("mean", "none"):
        want = F.cross_entropy(torch.tensor(x), torch.tensor(t), weight=torch.tensor(w), reduction=reduction)
        got = Tensor(x).cross_entropy(Tensor(t), weight=Tensor(w), reduction=reduction)
        assert got.shape == tuple(want.shape)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    x2, t2 = Tensor.randn(4, 3), Tensor([0, 1, 2, 1])
    bad = [
        (Tensor([1.0, 2.0]), torch.tensor([1.0, 2.0]), ShapeError, r"one value per class \(3,\)"),
        (Tensor([1.0, 2.0, 3.0], dtype="float64"), torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64),
         DTypeError, "weight is float64 but the input is float32"),
        (Tensor([1.0, 2.0, 3.0], requires_grad=True), torch.tensor([1.0, 2.0, 3.0], requires_grad=True),
         AutogradError, "weight cannot require a gradient"),
    ]
    for ours, theirs, error, message in bad:
        with pytest.raises(RuntimeError):  # PyTorch's error class; tgrad's errors are RuntimeErrors too
            F.cross_entropy(torch.randn(4, 3), torch.tensor([0, 1, 2, 1]), weight=theirs).sum().backward()
        with pytest.raises(error, match=message):
            x2.cross_entropy(t2, weight=ours)
        with pytest.raises(RuntimeError):
            x2.cross_entropy(t2, weight=ours)


# ------------------------------------------------------------------------------------------------------
# the gradient through a value changed under no_grad


@pytest.mark.parametrize("case", ["lazy", "realized", "computed_leaf", "read_after", "twice"])
def test_gradient_through_value_before_assign(device, case):
    w0, x = np.array([1.0, -2.0, 3.0], np.float32), np.array([0.5, 4.0, -1.0], np.float32)
    if case == "computed_leaf":  # a leaf whose buffer a kernel computed: the assign writes a new buffer
        w = (Tensor(w0 / 2) * 2).realize()
        w.requires_grad = True
    else:
        w = Tensor(w0.copy(), requires_grad=True)
    tw = torch.tensor(w0.copy(), requires_grad=True)
    for _ in range(2 if case == "twice" else 1):  # (twice: a graph structure seen before, maybe replayed)
        w.grad, tw.grad = None, None
        loss, tloss = (w * Tensor(x)).sum(), (tw * torch.tensor(x)).sum()
        with Tensor.no_grad:
            w.assign(w * 3 + 1)
        with torch.no_grad():
            tw.copy_(tw * 3 + 1)
        if case == "realized":
            w.realize()
        if case == "read_after":  # the new value read too: both reads give gradients to the leaf
            loss, tloss = loss + (w * w).sum(), tloss + (tw * tw).sum()
        loss.backward()
        tloss.backward()
        np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-6)
        np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-6)
        np.testing.assert_allclose(loss.numpy(), tloss.item(), rtol=1e-6)


# ------------------------------------------------------------------------------------------------------
# shape errors name the user's shapes


def test_matmul_batch_error_names_user_shapes():
    with pytest.raises(RuntimeError) as theirs:
        torch.randn(2, 3, 4) @ torch.randn(3, 4, 5)
    with pytest.raises(ShapeError) as ours:
        Tensor.randn(2, 3, 4) @ Tensor.randn(3, 4, 5)
    message = str(ours.value)
    assert "(2, 3, 4)" in message and "(3, 4, 5)" in message and "(3, 1, 5, 4)" not in message
    assert "size of tensor a (2) must match the size of tensor b (3) at non-singleton dimension 0" in message
    assert "size of tensor a (2) must match the size of tensor b (3) at non-singleton dimension 0" in \
        str(theirs.value)
    expected = r"\(5, 2\) of \(5, 2, 3, 4\).*tensor a \(2\).*tensor b \(3\).*dimension 1"
    with pytest.raises(ShapeError, match=expected):
        Tensor.randn(5, 2, 3, 4) @ Tensor.randn(3, 4, 5)


def test_linear_error_names_user_shapes():
    with pytest.raises(RuntimeError) as theirs:
        torch.nn.Linear(10, 2)(torch.randn(4, 7))
    with pytest.raises(ShapeError) as ours:
        nn.Linear(10, 2)(Tensor.randn(4, 7))
    torch_words = "mat1 and mat2 shapes cannot be multiplied (4x7 and 10x2)"
    assert torch_words in str(theirs.value) and torch_words in str(ours.value)
    assert "input (4, 7)" in str(ours.value) and "weight (2, 10)" in str(ours.value)
    with pytest.raises(ShapeError, match=r"\(12x7 and 10x2\)"):
        nn.Linear(10, 2, bias=False)(Tensor.randn(3, 4, 7))
    with pytest.raises(ShapeError, match=r"mat1 and mat2 shapes cannot be multiplied \(2x3 and 4x5\)"):
        Tensor.randn(2, 3) @ Tensor.randn(4, 5)


@pytest.mark.parametrize("shapes", [((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)), ((1, 3, 4), (2, 4, 5)),
                                    ((2, 1, 3, 4), (5, 4, 2)), ((4,), (3, 4, 2))])
def test_matmul_broadcast_values_unchanged(device, shapes):
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), (torch.tensor(a) @ torch.tensor(b)).numpy(),
                               rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------------
# schedulers stepped inside a TinyJit function


@pytest.mark.parametrize("sched", ["step", "cosine"])
def test_scheduler_stepped_inside_tinyjit(device, sched):
    x = np.array([0.5, 1.5, -1.0], np.float32)
    w0 = np.array([1.0, -2.0, 3.0], np.float32)
    w, tw = Tensor(w0.copy(), requires_grad=True), torch.tensor(w0.copy(), requires_grad=True)
    opt, topt = SGD([w], lr=0.1), torch.optim.SGD([tw], lr=0.1)
    if sched == "step":
        s, ts = StepLR(opt, 2, 0.5), torch.optim.lr_scheduler.StepLR(topt, 2, 0.5)
    else:
        s, ts = CosineAnnealingLR(opt, 5), torch.optim.lr_scheduler.CosineAnnealingLR(topt, 5)
    step = _jitted_step(opt, w, s)
    for i in range(7):
        loss = step(Tensor(x))
        topt.zero_grad()
        tloss = (tw * torch.tensor(x)).square().sum()
        tloss.backward()
        topt.step()
        ts.step()
        np.testing.assert_allclose(loss.numpy(), tloss.item(), rtol=1e-5, err_msg=f"step {i}")
        np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=f"step {i}")
        np.testing.assert_allclose(s.get_last_lr(), ts.get_last_lr(), rtol=1e-6, atol=1e-9)
