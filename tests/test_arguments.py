"""Every bad argument value raises, naming the argument: mode and reduction names, rounding modes, dtype
strings, dims out of range or repeated, counts and probabilities out of their range. One table, each
case with PyTorch's call where there is one (it must raise too, and tgrad's error is then an instance of
the builtin class PyTorch raised: tgrad/errors.py). The checks run before any kernel: no device fixture."""

import numpy as np
import pytest
import torch

from tgrad import Tensor
from tgrad.errors import ArgumentError, DTypeError, IndexRangeError, ModeError, ShapeError, TgradError

F = torch.nn.functional
X = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 24
P = np.full((2, 3), 0.5, np.float32)
LABELS = np.array([0, 2], np.int64)


def g(a=X):
    return Tensor(a)


def t(a=X):
    return torch.tensor(a)


CASES = [
    # (tgrad call, PyTorch call or None, tgrad error class, words the message must hold)
    # reduction=, mode=, rounding_mode=, approximate=, indexing=, reduce=
    (lambda: g(P).cross_entropy(Tensor(LABELS), reduction="avg"),
     lambda: F.cross_entropy(t(P), torch.tensor(LABELS), reduction="avg"), ArgumentError,
     ["reduction", "avg"]),
    (lambda: g(P).nll_loss(Tensor(LABELS), reduction="elementwise"),
     lambda: F.nll_loss(t(P), torch.tensor(LABELS), reduction="elementwise"), ArgumentError, ["reduction"]),
    (lambda: g(P).mse_loss(g(P), reduction="MEAN"), lambda: F.mse_loss(t(P), t(P), reduction="MEAN"),
     ArgumentError, ["reduction", "MEAN"]),
    (lambda: g(P).l1_loss(g(P), reduction=None), None, ArgumentError, ["reduction", "None"]),
    (lambda: g(P).smooth_l1_loss(g(P), reduction="x"), lambda: F.smooth_l1_loss(t(P), t(P), reduction="x"),
     ArgumentError, ["reduction"]),
    (lambda: g(P).binary_crossentropy(g(P), reduction="x"),
     lambda: F.binary_cross_entropy(t(P), t(P), reduction="x"), ArgumentError, ["reduction"]),
    (lambda: g(P).binary_crossentropy_logits(g(P), reduction="x"),
     lambda: F.binary_cross_entropy_with_logits(t(P), t(P), reduction="x"), ArgumentError, ["reduction"]),
    (lambda: g(P).sparse_categorical_crossentropy(Tensor(LABELS), reduction="x"), None, ArgumentError,
     ["reduction"]),
    (lambda: g().div(2, rounding_mode="round"), lambda: t().div(2, rounding_mode="round"), ArgumentError,
     ["rounding_mode", "round"]),
    (lambda: g().gelu(approximate="fast"), lambda: F.gelu(t(), approximate="fast"), ArgumentError,
     ["approximate", "fast"]),
    (lambda: g().pad(((0, 0), (0, 0), (1, 1)), mode="wrap"), lambda: F.pad(t(), (1, 1), mode="wrap"),
     ModeError, ["mode", "wrap"]),
    (lambda: g()[None].interpolate((2, 3, 8), mode="cubic"),
     lambda: F.interpolate(t()[None], size=(2, 3, 8), mode="cubic"), ArgumentError, ["mode", "cubic"]),
    (lambda: g()[0, 0].meshgrid(g()[0, 0], indexing="yx"),
     lambda: torch.meshgrid(t()[0, 0], t()[0, 0], indexing="yx"), ArgumentError, ["indexing", "yx"]),
    (lambda: g().scatter(1, Tensor(np.zeros((2, 1, 4), np.int64)), 1.0, reduce="mean"),
     lambda: t().scatter(1, torch.zeros(2, 1, 4, dtype=torch.long), 1.0, reduce="mean"), ArgumentError,
     ["reduce", "mean"]),
    (lambda: g().scatter_reduce(1, Tensor(np.zeros((2, 1, 4), np.int64)), g()[:, :1], "median"),
     lambda: t().scatter_reduce(1, torch.zeros(2, 1, 4, dtype=torch.long), t()[:, :1], "median"),
     ArgumentError, ["reduce", "median"]),
    # dtype strings
    (lambda: Tensor([1.0], dtype="flaot32"), None, DTypeError, ["dtype", "flaot32"]),
    (lambda: g().cast("floaty"), None, DTypeError, ["dtype", "floaty"]),
    (lambda: g().sum(dtype="int128"), None, DTypeError, ["dtype", "int128"]),
    (lambda: Tensor.zeros(2, dtype="complex64"), None, DTypeError, ["dtype", "complex64"]),
    (lambda: Tensor.arange(3, dtype="str"), None, DTypeError, ["dtype", "str"]),
    # dims out of range
    (lambda: g().sum(3), lambda: t().sum(3), IndexRangeError, ["axis 3", "out of range"]),
    (lambda: g().mean(-4), lambda: t().mean(-4), IndexRangeError, ["axis -4"]),
    (lambda: g().max(3), lambda: t().amax(3), IndexRangeError, ["axis 3"]),
    (lambda: g().argmax(3), lambda: t().argmax(3), IndexRangeError, ["axis 3"]),
    (lambda: g().var(5), lambda: t().var(5), IndexRangeError, ["axis 5"]),
    (lambda: g().logsumexp(3), lambda: t().logsumexp(3), IndexRangeError, ["axis 3"]),
    (lambda: g().softmax(3), lambda: t().softmax(3), IndexRangeError, ["axis 3"]),
    (lambda: g().log_softmax(-4), lambda: t().log_softmax(-4), IndexRangeError, ["axis -4"]),
    (lambda: g().cumsum(3), lambda: t().cumsum(3), IndexRangeError, ["axis 3"]),
    (lambda: g().cummax(3), lambda: t().cummax(3), IndexRangeError, ["axis 3"]),
    (lambda: g().sort(3), lambda: t().sort(3), IndexRangeError, ["axis 3"]),
    (lambda: g().topk(1, 3), lambda: t().topk(1, 3), IndexRangeError, ["axis 3"]),
    (lambda: g().flip(3), lambda: t().flip(3), IndexRangeError, ["axis 3"]),
    (lambda: g().transpose(0, 3), lambda: t().transpose(0, 3), IndexRangeError, ["axis 3"]),
    (lambda: g().squeeze(3), lambda: t().squeeze(3), IndexRangeError, ["axis 3"]),
    (lambda: g().unsqueeze(4), lambda: t().unsqueeze(4), IndexRangeError, ["axis 4"]),
    (lambda: g().flatten(3), lambda: t().flatten(3), IndexRangeError, ["axis 3"]),
    (lambda: g().movedim(0, 3), lambda: t().movedim(0, 3), IndexRangeError, ["axis 3"]),
    (lambda: g().roll(1, 3), lambda: t().roll(1, 3), IndexRangeError, ["axis 3"]),
    (lambda: g().cat(g(), dim=3), lambda: torch.cat([t(), t()], 3), IndexRangeError, ["axis 3"]),
    (lambda: g().stack(g(), dim=4), lambda: torch.stack([t(), t()], 4), IndexRangeError, ["axis 4"]),
    (lambda: g().split(1, 3), lambda: t().split(1, 3), IndexRangeError, ["axis 3"]),
    (lambda: g().chunk(2, 3), lambda: t().chunk(2, 3), IndexRangeError, ["axis 3"]),
    (lambda: g().gather(3, Tensor(np.zeros((2, 3, 1), np.int64))),
     lambda: t().gather(3, torch.zeros(2, 3, 1, dtype=torch.long)), IndexRangeError, ["axis 3"]),
    (lambda: g().unfold(3, 2, 1), lambda: t().unfold(3, 2, 1), IndexRangeError, ["axis 3"]),
    (lambda: g().diagonal(0, 1, 3), lambda: t().diagonal(0, 1, 3), IndexRangeError, ["axis 3"]),
    (lambda: g().repeat_interleave(2, 3), lambda: t().repeat_interleave(2, 3), IndexRangeError, ["axis 3"]),
    (lambda: g().any(3), lambda: t().bool().any(3), IndexRangeError, ["axis 3"]),
    # a dim named twice
    (lambda: g().sum((0, 0)), lambda: t().sum((0, 0)), IndexRangeError, ["more than once"]),
    (lambda: g().mean((1, -2)), lambda: t().mean((1, -2)), IndexRangeError, ["more than once"]),
    (lambda: g().max((1, 1)), lambda: t().amax((1, 1)), IndexRangeError, ["more than once"]),
    (lambda: g().var((1, 1)), lambda: t().var((1, 1)), IndexRangeError, ["more than once"]),
    (lambda: g().logsumexp((1, 1)), lambda: t().logsumexp((1, 1)), IndexRangeError, ["more than once"]),
    (lambda: g().all((2, 2)), lambda: t().bool().all((2, 2)), IndexRangeError, ["more than once"]),
    (lambda: g().flip((0, 0)), lambda: t().flip((0, 0)), ShapeError, ["repeats an axis"]),
    (lambda: g().permute(0, 0, 1), lambda: t().permute(0, 0, 1), ShapeError, ["permutation"]),
    (lambda: g().sum(1.0), lambda: t().sum(1.0), DTypeError, ["dim", "1.0"]),
    # numbers out of their range
    (lambda: g(P).cross_entropy(Tensor(LABELS), label_smoothing=1.5),
     lambda: F.cross_entropy(t(P), torch.tensor(LABELS), label_smoothing=1.5), ArgumentError,
     ["label_smoothing", "1.5"]),
    (lambda: g(P).cross_entropy(Tensor(LABELS), label_smoothing=float("nan")), None, ArgumentError,
     ["label_smoothing", "nan"]),
    (lambda: g(P).cross_entropy(g(P), ignore_index=1),
     lambda: F.cross_entropy(t(P), t(P), ignore_index=1), ArgumentError, ["ignore_index"]),
    (lambda: g(P).smooth_l1_loss(g(P), beta=-1.0), lambda: F.smooth_l1_loss(t(P), t(P), beta=-1.0),
     ArgumentError, ["beta", "-1.0"]),
    (lambda: g().dropout(1.5), lambda: F.dropout(t(), 1.5), ArgumentError, ["p must be", "1.5"]),
    (lambda: g().chunk(0, 1), lambda: t().chunk(0, 1), ArgumentError, ["chunks", "0"]),
    (lambda: g().repeat_interleave(-1, 1), lambda: t().repeat_interleave(-1, 1), ArgumentError,
     ["repeats", "-1"]),
    (lambda: g().flatten(2, 1), lambda: t().flatten(2, 1), IndexRangeError, ["start_dim", "end_dim"]),
    (lambda: g().topk(5), lambda: t().topk(5), IndexRangeError, ["k=5"]),
    (lambda: g().unfold(2, 2, 0), lambda: t().unfold(2, 2, 0), ShapeError, ["step 0"]),
    (lambda: Tensor([1]).one_hot(-2), lambda: F.one_hot(torch.tensor([1]), -2), ArgumentError,
     ["num_classes", "-2"]),
    (lambda: Tensor.linspace(0, 1, -1), lambda: torch.linspace(0, 1, -1), ArgumentError, ["steps", "-1"]),
    (lambda: Tensor.arange(0, 1, 0), lambda: torch.arange(0, 1, 0), ArgumentError, ["step"]),
    (lambda: Tensor.eye(-1), lambda: torch.eye(-1), ShapeError, ["n=-1"]),
    (lambda: Tensor.zeros(2, -1), lambda: torch.zeros(2, -1), ShapeError, ["negative dimension"]),
    (lambda: Tensor.randint(2, low=5, high=3), lambda: torch.randint(5, 3, (2,)), ArgumentError,
     ["low", "high"]),
    (lambda: g().clamp(), lambda: t().clamp(), ArgumentError, ["min or max"]),
    (lambda: Tensor.zeros(1, 1, 0).interpolate((3,), mode="nearest"),
     lambda: F.interpolate(torch.zeros(1, 1, 0), size=3), ShapeError, ["size", "non-empty"]),
    (lambda: g()[None].interpolate((0,), mode="nearest"), lambda: F.interpolate(t()[None], size=0),
     ShapeError, ["size", "non-empty"]),
    (lambda: g(P).masked_fill(Tensor([1, 0, 1]), 0.0), lambda: t(P).masked_fill(torch.tensor([1, 0, 1]), 0.0),
     DTypeError, ["mask", "int64"]),
    (lambda: g(P).masked_fill(Tensor([True, False, True]), Tensor([1.0])),
     lambda: t(P).masked_fill(torch.tensor([True, False, True]), torch.tensor([1.0])), ShapeError,
     ["value", "0-d"]),
    (lambda: g(P).masked_select(Tensor([1.0, 0.0, 1.0])),
     lambda: t(P).masked_select(torch.tensor([1.0, 0.0, 1.0])), DTypeError, ["mask", "float32"]),
    (lambda: g(P).gather(1, Tensor([[0.0], [1.0]])), lambda: t(P).gather(1, torch.tensor([[0.0], [1.0]])),
     DTypeError, ["index", "float32"]),
    (lambda: g(P)[1.0], lambda: t(P)[1.0], IndexRangeError, ["1.0", "float"]),
    (lambda: g(P)[Tensor([1], dtype="uint8")], None, IndexRangeError, ["uint8"]),
    (lambda: g(P).cross_entropy(Tensor([True, False])),
     lambda: F.cross_entropy(t(P), torch.tensor([True, False])), DTypeError, ["labels", "bool"]),
    (lambda: g(P).nll_loss(Tensor([0.0, 1.0])), lambda: F.nll_loss(t(P), torch.tensor([0.0, 1.0])),
     DTypeError, ["target", "float32"]),
    (lambda: g(P).nll_loss(Tensor(LABELS), weight=Tensor.ones(2)),
     lambda: F.nll_loss(t(P), torch.tensor(LABELS), weight=torch.ones(2)), ShapeError, ["weight", "(3,)"]),
    (lambda: g(P).cross_entropy([0, 2]), lambda: F.cross_entropy(t(P), [0, 2]), DTypeError,
     ["target", "list"]),
    (lambda: g(P).binary_crossentropy(Tensor(np.full((2, 3), 1.5, np.float32))),
     lambda: F.binary_cross_entropy(t(P), torch.full((2, 3), 1.5)), ArgumentError, ["target", "1.5"]),
    (lambda: (g(P) * 3).binary_crossentropy(g(P)), lambda: F.binary_cross_entropy(t(P) * 3, t(P)),
     ArgumentError, ["input", "1.5"]),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_bad_argument_raises_naming_it(case):
    tgrad_call, torch_call, cls, words = CASES[case]
    with pytest.raises(cls) as info:
        out = tgrad_call()
        out.numpy() if isinstance(out, Tensor) else None
    error = info.value
    assert isinstance(error, TgradError)
    for word in words:
        assert word in str(error), f"{word!r} not in: {error}"
    if torch_call is None:
        return
    with pytest.raises(Exception) as torch_info:  # noqa: PT011 - the class is what is compared
        torch_call()
    for builtin in (IndexError, ValueError, TypeError, NotImplementedError, RuntimeError):
        if isinstance(torch_info.value, builtin):
            assert isinstance(error, builtin), f"PyTorch raised {torch_info.value!r}, tgrad {error!r}"
            break
