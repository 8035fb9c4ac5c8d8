"""A PyTorch user's first hour: printing, Python conversions, no_grad forms, in-place ops, Tensor.empty,
the new nn layers and the learning-rate schedulers, each against PyTorch where it computes something."""

import math

import numpy as np
import pytest
import torch

from tests.helpers import compare
from tgrad import Tensor, TinyJit, dtypes
from tgrad.errors import ArgumentError
from tgrad.nn import (
    LSTM,
    Conv1d,
    ConvTranspose2d,
    Dropout,
    LSTMCell,
    RMSNorm,
)
from tgrad.nn.optim import SGD, CosineAnnealingLR, LinearLR, OneCycleLR, StepLR, clip_grad_norm_
from tgrad.realize import pretty


def test_print_and_python_conversions(device):
    t = Tensor([[1.5, 2.0], [3.0, 4.0]], requires_grad=True)
    assert repr(t) == (
        "Tensor([[1.5, 2. ],\n        [3. , 4. ]], dtype=float32, device=" + device + ", requires_grad=True)"
    )
    big = Tensor.ones(100, 100) + 1  # large and not computed: no values, nothing runs
    assert repr(big) == f"<Tensor (100, 100) float32 on {device}>"
    s = t.sum()
    assert float(s) == 10.5 and int(t[1, 1]) == 4 and f"{s:.2f}" == "10.50" and bool(t[0, 0] > 1)
    assert np.asarray(t).dtype == np.float32 and np.array(t, dtype=np.float64).dtype == np.float64
    out = np.array([1.0, 2.0], np.float32) * Tensor([3.0, 4.0])  # numpy defers to the tensor
    assert isinstance(out, Tensor) and out.tolist() == [3.0, 8.0]


def test_no_grad_forms(device):
    @Tensor.no_grad()
    def called():
        return bool(Tensor.no_grad)

    @Tensor.no_grad
    def bare():
        return bool(Tensor.no_grad)

    assert called() and bare() and not Tensor.no_grad
    with Tensor.no_grad():
        y = Tensor([1.0], requires_grad=True) * 2
    assert not y.requires_grad and not Tensor.no_grad
    with Tensor.train():
        assert Tensor.training
    assert not Tensor.training


def test_in_place_ops(device):
    w = Tensor([1.0, 2.0, 3.0])
    assert w.add_(1).mul_(2).sub_(1).div_(2).tolist() == [1.5, 2.5, 3.5]
    assert w.clamp_(2, 3).tolist() == [2.0, 2.5, 3.0]
    assert w.zero_().tolist() == [0.0, 0.0, 0.0] and w.fill_(7).tolist() == [7.0, 7.0, 7.0]
    Tensor.manual_seed(0)
    assert 0 <= w.uniform_(0, 1).numpy().min() and w.normal_().shape == (3,)


def test_empty_is_a_buffer(device):
    e = Tensor.empty(4, 5, dtype=dtypes.int32)
    assert e.shape == (4, 5) and e.dtype == dtypes.int32 and e.node.realized
    assert (e * 0).sum().item() == 0


def test_tinyjit_import(device):
    from tgrad.jit import TinyJit as FromJit

    assert TinyJit is FromJit


def test_debug3_pretty_prints_long_expressions():
    class E:  # a stand-in expression: op, srcs, repr
        def __init__(self, op, *srcs):
            self.op, self.srcs, self.arg = op, srcs, None

        def __repr__(self):
            return f"{self.op}({', '.join(map(repr, self.srcs))})" if self.srcs else self.op

    deep = E("ADD", *[E("MUL", E("x" * 30), E("y" * 30)) for _ in range(3)])
    lines = pretty(deep).splitlines()
    assert lines[0] == "ADD(" and all(len(ln) <= 100 for ln in lines) and len(lines) == 5
    assert pretty(E("ADD", E("a"), E("b"))) == "ADD(a, b)"


# ------------------------------------------------------------------------------------------------
# nn layers against PyTorch's


def _copy(dst: Tensor, src: torch.Tensor) -> None:
    dst.assign(Tensor(src.detach().numpy())).realize()


def test_conv1d_and_conv_transpose2d_layers(device):
    x = np.random.default_rng(0).standard_normal((2, 4, 9)).astype(np.float32)
    ours, theirs = Conv1d(4, 6, 3, stride=2, padding=1, groups=2), torch.nn.Conv1d(4, 6, 3, 2, 1, groups=2)
    assert ours.weight.shape == tuple(theirs.weight.shape)
    _copy(ours.weight, theirs.weight)
    _copy(ours.bias, theirs.bias)
    compare("conv1d", ours(Tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(), 1e-5, 1e-4)
    x2 = np.random.default_rng(1).standard_normal((1, 4, 5, 5)).astype(np.float32)
    ours, theirs = (
        ConvTranspose2d(4, 2, 3, stride=2, output_padding=1),
        torch.nn.ConvTranspose2d(4, 2, 3, 2, 0, 1),
    )
    assert ours.weight.shape == tuple(theirs.weight.shape)
    _copy(ours.weight, theirs.weight)
    _copy(ours.bias, theirs.bias)
    compare("conv_transpose", ours(Tensor(x2)).numpy(), theirs(torch.tensor(x2)).detach().numpy(), 1e-5, 1e-4)


def test_rmsnorm_dropout_lstmcell(device):
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    ours, theirs = RMSNorm(8, eps=1e-6), torch.nn.RMSNorm(8, eps=1e-6)
    compare("rmsnorm", ours(Tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(), 1e-5, 1e-4)
    assert Dropout(0.5)(Tensor(x)).tolist() == Tensor(x).tolist()  # not training: identity
    with Tensor.train():
        kept = Dropout(0.5)(Tensor.ones(1000)).numpy()
    assert set(np.unique(kept)) <= {0.0, 2.0} and 300 < (kept > 0).sum() < 700
    cell, ref = LSTMCell(8, 5), torch.nn.LSTMCell(8, 5)
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        _copy(getattr(cell, name), getattr(ref, name))
    h, c = cell(Tensor(x))
    h, c = cell(Tensor(x), (h, c))
    th, tc = ref(torch.tensor(x))
    th, tc = ref(torch.tensor(x), (th, tc))
    compare("lstm h", h.numpy(), th.detach().numpy(), 1e-5, 1e-4)
    compare("lstm c", c.numpy(), tc.detach().numpy(), 1e-5, 1e-4)


def test_sequential(device):
    x = Tensor([[-1.0, 2.0]])
    assert x.sequential([lambda t: t * 2, Tensor.relu]).tolist() == [[0.0, 4.0]]


# ------------------------------------------------------------------------------------------------
# optim: clip_grad_norm_ and schedulers


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
def test_clip_grad_norm(device, norm_type):
    rng = np.random.default_rng(0)
    g1, g2 = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    ours = [Tensor.zeros(3, 4, requires_grad=True), Tensor.zeros(5, requires_grad=True)]
    theirs = [torch.zeros(3, 4, requires_grad=True), torch.zeros(5, requires_grad=True)]
    for p, t, g in zip(ours, theirs, (g1, g2)):
        p.grad, t.grad = Tensor(g), torch.tensor(g)
    total = clip_grad_norm_(ours, 1.5, norm_type)
    expected = torch.nn.utils.clip_grad_norm_(theirs, 1.5, norm_type)
    compare("norm", total.numpy(), expected.numpy(), 1e-5, 1e-5)
    for p, t in zip(ours, theirs):
        compare("clipped", p.grad.numpy(), t.grad.numpy(), 1e-5, 1e-4)


@pytest.mark.parametrize(
    "make_ours,make_theirs",
    [
        (lambda o: StepLR(o, 3, 0.5), lambda o: torch.optim.lr_scheduler.StepLR(o, 3, 0.5)),
        (
            lambda o: CosineAnnealingLR(o, 10, 0.01),
            lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 10, 0.01),
        ),
        (lambda o: LinearLR(o, 0.1, 1.0, 5), lambda o: torch.optim.lr_scheduler.LinearLR(o, 0.1, 1.0, 5)),
        (
            lambda o: OneCycleLR(o, 1.0, 12),
            lambda o: torch.optim.lr_scheduler.OneCycleLR(o, 1.0, total_steps=12),
        ),
    ],
)
def test_lr_schedulers(device, make_ours, make_theirs):
    p = torch.nn.Parameter(torch.zeros(2))
    topt = torch.optim.SGD([p], lr=0.5)
    theirs = make_theirs(topt)
    opt = SGD([Tensor.zeros(2, requires_grad=True)], lr=0.5)
    ours = make_ours(opt)
    for _ in range(12):
        assert abs(ours.get_last_lr()[0] - topt.param_groups[0]["lr"]) < 1e-6
        topt.step()
        theirs.step()
        ours.step()


def test_scheduler_with_tinyjit(device):
    """The scheduler steps outside the jitted function; the replayed kernels read the new lr tensor and
    give the same weights as PyTorch with the same schedule."""
    x = np.array([[0.5, -1.0], [0.25, 2.0]], np.float32)
    w = Tensor([0.3, -0.2], requires_grad=True)
    opt = SGD([w], lr=0.1)
    sched = StepLR(opt, 2, 0.5)

    @TinyJit
    def step(x):
        opt.zero_grad()
        loss = (x @ w).square().sum()
        loss.backward()
        opt.step(loss)
        return loss

    tw = torch.tensor([0.3, -0.2], requires_grad=True)
    topt = torch.optim.SGD([tw], lr=0.1)
    tsched = torch.optim.lr_scheduler.StepLR(topt, 2, 0.5)
    for _ in range(6):
        step(Tensor(x))
        sched.step()
        topt.zero_grad()
        (torch.tensor(x) @ tw).square().sum().backward()
        topt.step()
        tsched.step()
    assert step.replays > 0 or device == "NUMPY"  # NUMPY has no kernels: the function always runs
    compare("weights", w.numpy(), tw.detach().numpy(), 1e-6, 1e-5)


def test_debug1_names_compile_time_and_user_line(device, monkeypatch, capsys):
    from tgrad import device as device_module

    if device == "NUMPY":
        pytest.skip("the NUMPY reference runs no kernels")
    monkeypatch.setattr(device_module, "DEBUG", 1)
    (Tensor.rand(3, 5) * 7).sum().item()
    err = capsys.readouterr().err
    assert "compiled in" in err and "test_api.py" in err and "Tensor.item" in err


def test_debug2_times_a_row_groups_build_apart(monkeypatch, capsys):
    """A CPU row group's function is built (compiled, or loaded from the kernel cache) at its first run in
    a process: DEBUG=2 reports that time apart, not as the kernel's time (a 0-compiled realize once showed
    ~200 ms of loading as kernel time). The build is slowed here so that the two cannot be confused."""
    import re
    import time

    from tgrad import device as device_module

    rt = device_module.get_runtime("CPU")
    build = type(rt)._build

    def slow_build(self, *args, **kwargs):
        time.sleep(0.3)
        return build(self, *args, **kwargs)

    # (on the class: an instance attribute would be put back as one, the bound method, which then hides
    # every later patch of the class's method, e.g. test_direct_conv's counting of the scatter's builds)
    monkeypatch.setattr(type(rt), "_build", slow_build)
    monkeypatch.setattr(device_module, "DEBUG", 2)
    x = np.random.default_rng(3).standard_normal((29, 173)).astype(np.float32)  # a shape no other test runs
    got = Tensor(x, device="CPU").softmax(1).numpy()
    compare("softmax", got, torch.softmax(torch.tensor(x), 1).numpy(), 1e-5, 1e-6)
    err = capsys.readouterr().err
    line = re.search(r"rows_\S+ +\(29, 173\) +([\d.]+) ms .*built first: ([\d.]+) ms", err)
    assert line is not None, err
    assert float(line[1]) < 250 and float(line[2]) >= 300, line[0]
    assert re.search(r"1 row group functions built in [\d.]+ ms", err), err


def test_lstm(device):
    batch_first = True  # (N, T, in); two layers
    x = np.random.default_rng(0).standard_normal((3, 2, 4)).astype(np.float32)  # (T, N, in) or (N, T, in)
    ours, theirs = (
        LSTM(4, 5, num_layers=2, batch_first=batch_first),
        torch.nn.LSTM(4, 5, 2, batch_first=batch_first),
    )
    for name, value in theirs.named_parameters():
        _copy(getattr(ours, name), value)
    out, (h, c) = ours(Tensor(x))
    tout, (th, tc) = theirs(torch.tensor(x))
    for what, a, b in (("out", out, tout), ("h", h, th), ("c", c, tc)):
        compare(what, a.numpy(), b.detach().numpy(), 1e-5, 1e-4)


def test_torch_load(device, tmp_path):
    """A torch.save checkpoint read without torch: strided views, bfloat16 (float32 on devices without it),
    half, int64. tests/test_bfloat16.py has the legacy format."""
    from tgrad.nn.state import StateDictError, torch_load

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    state = dict(model.state_dict())
    state["view"] = torch.arange(12).reshape(3, 4).T
    state["bf16"] = torch.tensor([1.5, -2.25]).bfloat16()
    state["half"] = torch.tensor([0.5]).half()
    torch.save(state, tmp_path / "model.pt")
    loaded = torch_load(tmp_path / "model.pt")
    assert list(loaded) == list(state)
    for key, value in state.items():
        expected = value.float().numpy() if value.dtype == torch.bfloat16 else value.numpy()
        np.testing.assert_array_equal(loaded[key].numpy(), expected, err_msg=key)
        assert loaded[key].device == device
    assert loaded["bf16"].dtype == (dtypes.bfloat16 if device in dtypes.HOST_DEVICES else dtypes.float32)
    (tmp_path / "legacy.pt").write_bytes(b"not a zip")
    with pytest.raises(StateDictError, match="neither a zip nor a legacy torch.save checkpoint"):
        torch_load(tmp_path / "legacy.pt")


@pytest.mark.parametrize(
    "index",
    [
        0,
        (slice(None), 1),
        (Ellipsis, slice(1, 3)),
        (1, slice(None), 2),
        (slice(None), slice(None, None, 2)),
        ([0, 1], [2, 0]),
        (None, 0, -1),
    ],
)
def test_setitem(device, index):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    ours, theirs = Tensor(x), torch.tensor(x)
    ours[index] = 5.0
    theirs[index] = 5.0
    compare("setitem", ours.numpy(), theirs.numpy(), 0, 0)


def test_setitem_tensor_values_masks_gradients(device):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    ours, theirs = Tensor(x), torch.tensor(x)
    ours[1, :, 2], theirs[1, :, 2] = Tensor([9.0, 8.0, 7.0]), torch.tensor([9.0, 8.0, 7.0])
    ours[0], theirs[0] = Tensor.ones(1, 3, 4), torch.ones(1, 3, 4)
    ours[ours > 10], theirs[theirs > 10] = 0.0, 0.0
    compare("setitem", ours.numpy(), theirs.numpy(), 0, 0)
    leaf, tleaf = (
        Tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True),
        torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True),
    )
    value, tvalue = Tensor(10.0, requires_grad=True), torch.tensor(10.0, requires_grad=True)
    y, ty = leaf * 2, tleaf * 2
    y[0, 1], ty[0, 1] = value, tvalue
    (y * Tensor([[1.0, 2.0], [3.0, 4.0]])).sum().backward()
    (ty * torch.tensor([[1.0, 2.0], [3.0, 4.0]])).sum().backward()
    compare("grad", leaf.grad.numpy(), tleaf.grad.numpy(), 0, 0)
    compare("value grad", value.grad.numpy(), tvalue.grad.numpy(), 0, 0)
    with pytest.raises(IndexError):
        ours[2] = 1.0


def test_safe_load_bfloat16_and_half(device, tmp_path):
    from safetensors.torch import save_file

    from tgrad.nn.state import safe_load

    state = {
        "bf16": torch.tensor([[1.5, -2.25], [3.0, 0.1]]).bfloat16(),
        "half": torch.tensor([0.5]).half(),
        "ints": torch.arange(3),
        "empty": torch.zeros(0, 2),
    }
    save_file(state, str(tmp_path / "m.safetensors"))
    loaded = safe_load(tmp_path / "m.safetensors")
    bf16 = dtypes.bfloat16 if device in dtypes.HOST_DEVICES else dtypes.float32  # float32: exact values
    assert loaded["bf16"].dtype == bf16 and loaded["half"].dtype == dtypes.float16
    for key, value in state.items():
        np.testing.assert_array_equal(
            loaded[key].numpy(), value.float().numpy() if key == "bf16" else value.numpy()
        )


def test_contiguous_is_a_kernel_of_its_own(device):
    """contiguous() of a view is a row-major copy that users read as a buffer (tinygrad's contiguous, a
    PyTorch copy of a non-contiguous tensor); an unrealized result is computed by a kernel of its own
    instead of inside each user; a whole buffer is itself; gradients flow through."""
    from tgrad.fuse import schedule

    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), requires_grad=True)
    t = x.T.contiguous()
    assert [it.out for it in schedule([(t * 2).node])][0] is t.node.srcs[0]  # the copy runs first
    assert len(schedule([(t * 2).node])) == 2 and len(schedule([(x.T * 2).node])) == 1
    np.testing.assert_array_equal(t.numpy(), np.arange(12).reshape(3, 4).T)
    assert x.contiguous() is x
    y = (x + 1).exp()
    assert len(schedule([(y.contiguous() * 2).node])) == 2 and len(schedule([(y * 2).node])) == 1
    np.testing.assert_allclose((y.contiguous() * 2).numpy(), np.exp(x.numpy() + 1) * 2, rtol=1e-6)
    # contiguous() of a contiguous() is the same value: one kernel, not a second one copying the first
    # (conv2d's computed input got two: 1 ms of copying in the MNIST CNN's step)
    z = (x + 2).exp()
    assert len(schedule([(z.contiguous().contiguous() * 2).node])) == 2
    assert len(schedule([(x.T.contiguous().contiguous() * 2).node])) == 2
    np.testing.assert_allclose(z.contiguous().contiguous().numpy(), np.exp(x.numpy() + 2), rtol=1e-6)
    (t * torch_like_weights(t.shape)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), torch_like_weights(t.shape).numpy().T)


def torch_like_weights(shape):
    return Tensor(np.arange(np.prod(shape), dtype=np.float32).reshape(shape))


@pytest.mark.parametrize(
    "opt_name,kw",
    [("SGD", {}), ("SGD_momentum", {"anneal_strategy": "linear", "pct_start": 0.5}), ("Adam", {}),
     ("AdamW", {"cycle_momentum": False})],
)
def test_one_cycle_trains_like_pytorch(device, opt_name, kw):
    """OneCycleLR cycles the momentum (SGD) or beta1 (Adam) by default, as PyTorch: the weights after 10
    steps of training match PyTorch's, with the scheduler stepped outside a TinyJit step."""
    from tgrad.nn.optim import Adam, AdamW

    x = np.array([[0.5, -1.0, 2.0], [0.25, 2.0, -0.5]], np.float32)
    w0 = np.array([0.3, -0.2, 0.1], np.float32)
    make = {"SGD": (SGD, torch.optim.SGD, {}), "SGD_momentum": (SGD, torch.optim.SGD, {"momentum": 0.9}),
            "Adam": (Adam, torch.optim.Adam, {}), "AdamW": (AdamW, torch.optim.AdamW, {})}[opt_name]
    tw = torch.nn.Parameter(torch.tensor(w0))
    topt = make[1]([tw], lr=0.1, **make[2])
    tsched = torch.optim.lr_scheduler.OneCycleLR(topt, 0.2, total_steps=10, **kw)
    w = Tensor(w0, requires_grad=True)
    opt = make[0]([w], lr=0.1, **make[2])
    sched = OneCycleLR(opt, 0.2, 10, **kw)

    @TinyJit
    def step(x):
        opt.zero_grad()
        loss = (x @ w).tanh().square().sum()
        loss.backward()
        opt.step(loss)
        return loss

    for _ in range(9):
        topt.zero_grad()
        (torch.tensor(x) @ tw).tanh().square().sum().backward()
        topt.step()
        tsched.step()
        step(Tensor(x))
        sched.step()
        compare("weights", w.numpy(), tw.detach().numpy(), 1e-5, 1e-4)
        assert abs(sched.get_last_lr()[0] - tsched.get_last_lr()[0]) < 1e-6


def test_one_cycle_bad_arguments():
    opt = SGD([Tensor.zeros(2, requires_grad=True)], lr=0.5)
    bad = (({"anneal_strategy": "cosine"}, "anneal_strategy"), ({"three_phase": True}, "three_phase"),
           ({"pct_start": 1.5}, "pct_start"))
    for kw, match in bad:
        with pytest.raises(ArgumentError, match=match):
            OneCycleLR(opt, 1.0, 10, **kw)
