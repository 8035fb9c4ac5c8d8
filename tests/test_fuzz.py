"""Random graphs (hypothesis): every device against the NUMPY reference and PyTorch, forward and backward.

TGRAD_FUZZ_EXAMPLES sets the budget (CI: 25 examples per device from a fixed seed; nightly:
`TGRAD_FUZZ_EXAMPLES=10000`), TGRAD_FUZZ_SEED the seed (default 1234; a nightly run can vary it). A failure
prints its graph as hypothesis' falsifying example: copy it into a regression test in tests/test_ops.py or
below.
"""

import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from tests.helpers import float64_or_raises
from tgrad import Tensor
from tgrad.errors import TgradError
from tgrad.nn import Embedding

EXAMPLES = int(os.environ.get("TGRAD_FUZZ_EXAMPLES", "25"))
SEED = int(os.environ.get("TGRAD_FUZZ_SEED", "1234"))

UNARY = [
    ("exp", lambda t: (t * 0.5).exp()),
    ("relu", lambda t: t.relu()),
    ("neg", lambda t: -t),
    ("sigmoid", lambda t: t.sigmoid()),
    ("abs", lambda t: t.abs()),
    ("sqrtabs", lambda t: (t.abs() + 1).sqrt()),
    ("tanh", lambda t: t.tanh()),
    ("square", lambda t: t * t),
    ("sin", lambda t: t.sin()),
]
BINARY = [
    ("add", lambda a, b: a + b),
    ("mul", lambda a, b: a * b),
    ("sub", lambda a, b: a - b),
    ("max", lambda a, b: a.maximum(b)),
    ("div", lambda a, b: a / (b.abs() + 0.5)),
    ("rdiv", lambda a, b: b / (a.abs() + 0.5)),
]
# casts go to another dtype and back to float32 (so every later step sees float32); the int cast
# truncates and cuts the gradient, as in PyTorch
CASTS = ["half", "double", "int"]


def _pick(draw, options):
    return options[draw(st.integers(0, len(options) - 1))]


@st.composite
def graphs(draw):
    """A program: a list of steps over a stack of tensors, applied the same way in tgrad and torch."""
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 5)) if draw(st.integers(0, 9)) else 0 for _ in range(ndim))
    steps = []
    cur = shape
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(
            st.sampled_from(
                [
                    "unary",
                    "binary",
                    "reduce",
                    "permute",
                    "flip",
                    "pad",
                    "shrink",
                    "reshape",
                    "expand",
                    "matmul",
                    "cast",
                    "softmax",
                ]
            )
        )
        if kind == "unary":
            steps.append(("unary", _pick(draw, UNARY)[0]))
        elif kind == "binary":
            # the second operand broadcasts: some of its axes are 1, leading ones may be missing
            ones = tuple(draw(st.booleans()) for _ in cur)
            drop = draw(st.integers(0, len(cur))) if draw(st.booleans()) else 0
            steps.append(("binary", _pick(draw, BINARY)[0], ones, drop, draw(st.booleans())))
        elif kind == "cast":
            steps.append(("cast", draw(st.sampled_from(CASTS))))
        elif kind == "softmax":
            steps.append(("softmax", draw(st.integers(0, len(cur) - 1))))
        elif kind == "reduce" and len(cur) > 1:
            ax = draw(st.integers(0, len(cur) - 1))
            # PyTorch's max of an empty axis is an error, not -inf
            op = draw(st.sampled_from(["sum", "max", "min", "mean"] if cur[ax] else ["sum", "mean"]))
            keep = draw(st.booleans())
            steps.append(("reduce", op, ax, keep))
            cur = cur[:ax] + ((1,) if keep else ()) + cur[ax + 1 :]
        elif kind == "permute" and len(cur) > 1:
            order = tuple(draw(st.permutations(range(len(cur)))))
            steps.append(("permute", order))
            cur = tuple(cur[i] for i in order)
        elif kind == "flip":
            steps.append(("flip", draw(st.integers(0, len(cur) - 1))))
        elif kind == "pad":
            ax = draw(st.integers(0, len(cur) - 1))
            lo, hi = draw(st.integers(0, 2)), draw(st.integers(0, 2))
            steps.append(("pad", ax, lo, hi))
            cur = cur[:ax] + (cur[ax] + lo + hi,) + cur[ax + 1 :]
        elif kind == "shrink":
            ax = draw(st.integers(0, len(cur) - 1))
            if cur[ax] > 1:
                b = draw(st.integers(0, cur[ax] - 1))
                e = draw(st.integers(b + 1, cur[ax]))
                steps.append(("shrink", ax, b, e))
                cur = cur[:ax] + (e - b,) + cur[ax + 1 :]
        elif kind == "reshape":
            n = int(np.prod(cur))
            steps.append(("reshape", (n,)))
            cur = (n,)
        elif kind == "expand":
            steps.append(("expand", 3))
            cur = (3,) + cur
        elif kind == "matmul" and len(cur) >= 1:
            k = draw(st.integers(1, 4))
            steps.append(("matmul", k))
            cur = cur[:-1] + (k,)
    return shape, steps


def run(steps, x, other, lib):
    """Apply steps to x; `other(shape)` supplies second operands (broadcasting to the current value)."""
    t = x
    for step in steps:
        kind = step[0]
        if kind == "unary":
            t = dict(UNARY)[step[1]](t)
        elif kind == "binary":
            _, name, ones, drop, swap = step
            shape = tuple(1 if one else n for one, n in zip(ones, t.shape))[drop:]
            a, b = t, other(shape)
            t = dict(BINARY)[name](*((b, a) if swap else (a, b)))
        elif kind == "cast":
            if step[1] == "half":
                t = t.half().float()
            elif step[1] == "double":
                t = t.double().float()
            else:
                t = (t * 4).int().float()
        elif kind == "softmax":
            t = t.softmax(step[1])
        elif kind == "reduce":
            _, op, ax, keep = step
            if op == "sum":
                t = t.sum(ax, keepdim=keep)
            elif op == "mean":
                t = t.mean(ax, keepdim=keep)
            elif op == "min":
                t = t.amin(ax, keepdim=keep) if lib == "torch" else t.min(ax, keepdim=keep)
            else:
                t = t.amax(ax, keepdim=keep) if lib == "torch" else t.max(ax, keepdim=keep)
        elif kind == "permute":
            t = t.permute(*step[1])
        elif kind == "flip":
            t = t.flip((step[1],)) if lib == "torch" else t.flip(step[1])
        elif kind == "pad":
            _, ax, lo, hi = step
            pad = [(0, 0)] * t.ndim
            pad[ax] = (lo, hi)
            flat = [v for p in reversed(pad) for v in p]
            t = torch.nn.functional.pad(t, flat) if lib == "torch" else t.pad(tuple(pad))
        elif kind == "shrink":
            _, ax, b, e = step
            idx = [slice(None)] * t.ndim
            idx[ax] = slice(b, e)
            t = t[tuple(idx)]
        elif kind == "reshape":
            t = t.reshape(step[1])
        elif kind == "expand":
            t = t.unsqueeze(0).expand(step[1], *t.shape)
        elif kind == "matmul":
            t = t @ other((t.shape[-1], step[1]))
    return t


def operand_source(lib, seed_, device=None):
    rng = np.random.default_rng(seed_)

    def other(shape):
        arr = rng.uniform(-1, 1, size=tuple(shape)).astype(np.float32)
        return torch.tensor(arr) if lib == "torch" else Tensor(arr, device=device)

    return other


def check_graph(shape, steps):
    """Forward on this device against PyTorch and the NUMPY reference; the gradient against PyTorch."""
    x = np.random.default_rng(0).uniform(-1.5, 1.5, size=shape).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    xg = Tensor(x, requires_grad=True)
    out_t = run(steps, xt, operand_source("torch", 1), "torch")
    out_g = run(steps, xg, operand_source("tgrad", 1), "tgrad")
    if ("cast", "double") in steps and float64_or_raises(out_g.numpy) is None:
        return  # this device has no float64: it said so
    np.testing.assert_allclose(out_g.numpy(), out_t.detach().numpy(), atol=1e-4, rtol=1e-3)
    ref = run(steps, Tensor(x, device="NUMPY"), operand_source("tgrad", 1, "NUMPY"), "tgrad")
    np.testing.assert_allclose(out_g.numpy(), ref.numpy(), atol=1e-4, rtol=1e-3)
    if not out_t.requires_grad:  # an int cast cut the graph: PyTorch has no gradient to compare
        return
    out_t.sum().backward()
    out_g.sum().backward()
    np.testing.assert_allclose(xg.grad.numpy(), xt.grad.numpy(), atol=1e-3, rtol=1e-3)


@seed(SEED)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(graphs())
def test_random_graph(device, graph):
    check_graph(*graph)


# graphs the fuzzer found failing, each with what was wrong
REGRESSIONS = [
    # flip after a permuted reshape: index (4 - i) % 2 was simplified to (-i) % 2, which C, WGSL and
    # Triton truncate to -1 (CL, WEBGPU, TRITON read out of bounds; CPU through _imod as well)
    ((2, 2), [("permute", (1, 0)), ("reshape", (4,)), ("unary", "exp"), ("flip", 0), ("pad", 0, 1, 0),
              ("unary", "exp")]),
    ((2, 3), [("flip", 0), ("reshape", (6,)), ("pad", 0, 0, 1), ("flip", 0), ("unary", "exp"),
              ("binary", "add", (False,), 0, False), ("unary", "exp")]),
    ((2, 3), [("flip", 0), ("reshape", (6,)), ("shrink", 0, 0, 5), ("flip", 0), ("shrink", 0, 3, 4),
              ("pad", 0, 2, 0), ("unary", "abs"), ("binary", "div", (False,), 0, False), ("expand", 3),
              ("reshape", (9,)), ("cast", "double")]),
    # a padded view of an empty tensor: WEBGPU loaded in0[-1] under a false mask (naga rejects it)
    ((0, 2), [("permute", (1, 0)), ("reshape", (0,)), ("unary", "exp"), ("flip", 0), ("pad", 0, 1, 0),
              ("unary", "exp")]),
    # a shrink to padding only left the mask (2, 1) (empty, but not (0, 0)); expand made it all valid
    ((1,), [("pad", 0, 2, 0), ("shrink", 0, 0, 1), ("expand", 3), ("unary", "neg")]),
    ((1,), [("binary", "max", (True,), 0, True), ("pad", 0, 2, 0), ("shrink", 0, 0, 1), ("expand", 3),
            ("permute", (1, 0)), ("matmul", 3), ("expand", 3), ("reshape", (9,)), ("pad", 0, 2, 2)]),
    # the mean over an empty axis is nan: WEBGPU (Mesa) folded 0 * nan to 0
    ((2, 0), [("permute", (1, 0)), ("unary", "neg"), ("matmul", 2), ("pad", 1, 2, 1), ("unary", "square"),
              ("reduce", "mean", 0, True), ("reshape", (5,))]),
    # max over a softmax: the gradient's mask compared a softmax recomputed in a SUM kernel, which had
    # fast-math reassociation on every op, with the max kernel's: no element equal, 0 * (1/0) = nan (CPU)
    ((1,), [("expand", 3), ("matmul", 3), ("softmax", 1), ("reduce", "max", 0, False)]),
]


@pytest.mark.parametrize("case", range(len(REGRESSIONS)))
def test_fuzz_regression(device, case):
    check_graph(*REGRESSIONS[case])


# ---------------------------------------------------------------------------------------------------
# Edge inputs: integer indices in and out of range, bool masks, nan / inf / -0.0 / subnormal / empty
# tensors, loss targets of the wrong shape or dtype, bad argument values. PyTorch is the oracle: the same
# value (and gradient, where differentiable), or both raise, tgrad with one of its own error classes that
# is also an instance of the builtin class PyTorch raised (tgrad/errors.py: ShapeError is a ValueError
# and a RuntimeError, IndexRangeError an IndexError, DTypeError a TypeError and a RuntimeError...).

F = torch.nn.functional
SPECIAL = [0.0, -0.0, 1.0, -1.5, 2.5, 0.5, -3.0, 1e-40, -1e30, 3e38, np.inf, -np.inf, np.nan]
REDUCTIONS = ["mean", "sum", "none", "avg"]


def _floats(draw, shape, pool=None) -> np.ndarray:
    """A float32 array whose elements are ordinary numbers or, drawn often, the special values."""
    n = int(np.prod(shape))
    ordinary = st.floats(-4, 4, width=32)
    elem = st.one_of(ordinary, st.sampled_from(pool or SPECIAL))
    return np.array(draw(st.lists(elem, min_size=n, max_size=n)), np.float32).reshape(shape)


def _shape(draw, ndim=2, low=0, high=4):
    return tuple(draw(st.integers(low, high)) for _ in range(ndim))


def _labels(draw, shape, c):
    """Class labels, mostly in range, sometimes -1, c or ignore_index's default -100."""
    n = int(np.prod(shape))
    elem = st.one_of(st.integers(0, max(c - 1, 0)), st.sampled_from([-1, c, -100]))
    return np.array(draw(st.lists(elem, min_size=n, max_size=n)), np.int64).reshape(shape)


def _draw_index(draw):
    shape = _shape(draw)
    form = draw(st.sampled_from(["0", "1", "both", "list"]))
    n = shape[1] if form == "1" else shape[0]
    k = draw(st.integers(0, 3))
    idx = np.array(draw(st.lists(st.integers(-n - 1, n), min_size=k, max_size=k)), np.int64)
    idx2 = np.array(draw(st.lists(st.integers(-shape[1] - 1, shape[1]), min_size=k, max_size=k)), np.int64)
    dtype = draw(st.sampled_from(["int64", "int32"]))
    return {"x": _floats(draw, shape), "idx": idx.astype(dtype), "idx2": idx2}, {"form": form}


def _run_index(lib, a, p):
    if p["form"] == "0":
        return a["x"][a["idx"]]
    if p["form"] == "1":
        return a["x"][:, a["idx"]]
    if p["form"] == "both":
        return a["x"][a["idx"], a["idx2"]]
    return a["x"][a["idx"].tolist()]


def _draw_gather(draw):
    shape = _shape(draw, low=1)
    dim = draw(st.integers(-2, 2))
    d = dim % 2 if -2 <= dim < 2 else 0
    ishape = tuple(draw(st.integers(0, s + (i == d))) for i, s in enumerate(shape))
    n = int(np.prod(ishape))
    idx = draw(st.lists(st.integers(-1, shape[d]), min_size=n, max_size=n))
    return {"x": _floats(draw, shape), "idx": np.array(idx, np.int64).reshape(ishape)}, {"dim": dim}


def _run_gather(lib, a, p):
    return a["x"].gather(p["dim"], a["idx"])


def _draw_embedding(draw):
    vocab = draw(st.integers(1, 4))
    ids = np.array(draw(st.lists(st.integers(-1, vocab), min_size=0, max_size=4)), np.int64)
    return {"x": _floats(draw, (vocab, 2), pool=[0.0, 1.0, -2.0]), "idx": ids}, {}


def _run_embedding(lib, a, p):
    if lib == "torch":
        return F.embedding(a["idx"], a["x"])
    emb = Embedding(*a["x"].shape)
    emb.weight = a["x"]
    return emb(a["idx"])


def _draw_class_loss(draw):
    n, c = draw(st.integers(0, 3)), draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["labels", "labels", "column", "onehot", "probs", "float_labels", "bool"]))
    if kind == "labels":
        t = _labels(draw, (n,), c)
    elif kind == "column":  # (N, 1) labels: a common mistake
        t = _labels(draw, (n, 1), c)
    elif kind == "onehot":  # one-hot rows as integers
        t = np.eye(c, dtype=np.int64)[np.array(draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n)),
                                                np.int64)].reshape(n, c)
    elif kind == "probs":
        t = np.full((n, c), 1 / c, np.float32)
    elif kind == "float_labels":
        t = _labels(draw, (n,), c).astype(np.float32)
    else:
        t = _labels(draw, (n,), min(c, 2)).clip(0, 1).astype(bool)
    p = {"reduction": draw(st.sampled_from(REDUCTIONS)), "kind": kind}
    if draw(st.booleans()):
        p["label_smoothing"] = draw(st.sampled_from([0.1, 1.0, 1.5, -0.1]))
    if draw(st.booleans()):
        p["ignore_index"] = draw(st.sampled_from([0, 1, -1]))
    return {"x": _floats(draw, (n, c), pool=[0.0, -0.0, 30.0, -30.0, np.inf, -np.inf, np.nan]), "t": t}, p


def _run_cross_entropy(lib, a, p):
    kw = {k: v for k, v in p.items() if k != "kind"}
    return F.cross_entropy(a["x"], a["t"], **kw) if lib == "torch" else a["x"].cross_entropy(a["t"], **kw)


def _run_nll_loss(lib, a, p):
    kw = {k: v for k, v in p.items() if k in ("reduction", "ignore_index")}
    logp = a["x"].log_softmax(1)
    return F.nll_loss(logp, a["t"], **kw) if lib == "torch" else logp.nll_loss(a["t"], **kw)


def _draw_mask(draw):
    shape = _shape(draw)
    form = draw(st.sampled_from(["index", "fill", "select", "where"]))
    mshape = draw(st.sampled_from([shape, shape[1:], shape[:1], (1,) + shape[1:], (shape[1] + 1,)]))
    if form == "index":
        mshape = draw(st.sampled_from([shape, shape[:1], (shape[0] + 1,)]))
    n = int(np.prod(mshape))
    mask = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool).reshape(mshape)
    if draw(st.integers(0, 5)) == 0:
        mask = mask.astype(draw(st.sampled_from([np.int64, np.float32])))  # not a bool mask
    value = draw(st.sampled_from([np.nan, -np.inf, 2.5, -0.0, "tensor0d", "tensor1d"]))
    arrays = {"x": _floats(draw, shape), "m": mask, "y": _floats(draw, shape[1:])}
    if isinstance(value, str):
        arrays["v"] = np.array(1.5 if value == "tensor0d" else [1.5], np.float32)
    return arrays, {"form": form, "value": value}


def _run_mask(lib, a, p):
    x, m = a["x"], a["m"]
    value = a["v"] if isinstance(p["value"], str) else p["value"]
    if p["form"] == "index":
        return x[m]
    if p["form"] == "fill":
        return x.masked_fill(m, value)
    if p["form"] == "select":
        return torch.masked_select(x, m) if lib == "torch" else x.masked_select(m)
    return torch.where(m, x, a["y"]) if lib == "torch" else m.where(x, a["y"])


PAIR_LOSSES = {
    "mse": (F.mse_loss, Tensor.mse_loss),
    "l1": (F.l1_loss, Tensor.l1_loss),
    "smooth_l1": (F.smooth_l1_loss, Tensor.smooth_l1_loss),
    "bce": (F.binary_cross_entropy, Tensor.binary_crossentropy),
    "bce_logits": (F.binary_cross_entropy_with_logits, Tensor.binary_crossentropy_logits),
}


def _draw_pair_loss(draw):
    shape = _shape(draw, low=1, high=3)
    name = draw(st.sampled_from(sorted(PAIR_LOSSES)))
    tshape = draw(st.sampled_from([shape, shape, (shape[0], 1), shape[1:], shape + (1,), ()]))
    tdtype = draw(st.sampled_from([np.float32, np.float32, np.int64, bool]))
    probs = name == "bce"
    pool = [0.0, 1.0, 0.5, 1e-40, 1.5, -0.5, np.nan] if probs else None
    x = _floats(draw, shape, pool=pool)
    if probs:
        x = np.where(np.isnan(x) | (x < -0.5) | (x > 1.5), x, np.clip(np.abs(x), 0, 1)).astype(np.float32)
    t = _floats(draw, tshape, pool=[0.0, 1.0, 0.5, 2.0]).clip(-1, 2)
    p = {"name": name, "reduction": draw(st.sampled_from(REDUCTIONS))}
    if name == "smooth_l1":
        p["beta"] = draw(st.sampled_from([1.0, 0.0, 0.5, -1.0]))
    return {"x": x, "t": t.astype(tdtype)}, p


def _run_pair_loss(lib, a, p):
    kw = {k: v for k, v in p.items() if k != "name"}
    ft, fg = PAIR_LOSSES[p["name"]]
    return ft(a["x"], a["t"], **kw) if lib == "torch" else fg(a["x"], a["t"], **kw)


BINARY_SPECIAL = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "pow": lambda a, b: a**b,
    "maximum": lambda a, b: a.maximum(b),
    "minimum": lambda a, b: a.minimum(b),
    "fmod": lambda a, b: a.fmod(b),
    "remainder": lambda a, b: a % b,
    "floordiv": lambda a, b: a // b,
    "trunc_div": lambda a, b: a.div(b, rounding_mode="trunc"),
    "logaddexp": lambda a, b: a.logaddexp(b),
    "copysign": lambda a, b: a.copysign(b),
    "ge": lambda a, b: a >= b,
    "le": lambda a, b: a <= b,
    "eq": lambda a, b: a == b,
    "clamp": lambda a, b: a.clamp(min=b),
}


def _draw_binary(draw):
    shape = _shape(draw, ndim=1, high=6)
    op = draw(st.sampled_from(sorted(BINARY_SPECIAL)))
    return {"x": _floats(draw, shape), "y": _floats(draw, shape)}, {"op": op}


def _run_binary(lib, a, p):
    return BINARY_SPECIAL[p["op"]](a["x"], a["y"])


REDUCING_SPECIAL = ["sum", "mean", "amax", "argmax", "softmax", "log_softmax", "cumsum", "cummax", "sort",
                    "topk", "logsumexp", "var"]


def _draw_reducing(draw):
    shape = _shape(draw)
    op, dim = draw(st.sampled_from(REDUCING_SPECIAL)), draw(st.integers(-3, 2))
    return {"x": _floats(draw, shape)}, {"op": op, "dim": dim}


def _run_reducing(lib, a, p):
    x, op, dim = a["x"], p["op"], p["dim"]
    if op == "amax":
        return x.amax(dim) if lib == "torch" else x.max(dim)
    if op in ("cummax", "sort"):
        out = getattr(x, op)(dim)
        return out[1] if lib == "torch" and op == "cummax" else out[0] if op == "sort" else out[1]
    if op == "topk":
        return x.topk(1, dim)[0]
    return getattr(x, op)(dim)


EDGE_OPS = {
    "index": (_draw_index, _run_index),
    "gather": (_draw_gather, _run_gather),
    "embedding": (_draw_embedding, _run_embedding),
    "cross_entropy": (_draw_class_loss, _run_cross_entropy),
    "nll_loss": (_draw_class_loss, _run_nll_loss),
    "mask": (_draw_mask, _run_mask),
    "pair_loss": (_draw_pair_loss, _run_pair_loss),
    "binary": (_draw_binary, _run_binary),
    "reducing": (_draw_reducing, _run_reducing),
}
# forward only: the gradients of these at special values are tests/test_extremes.py's business
NO_GRADIENT = {"binary"}


@st.composite
def edge_cases(draw):
    op = draw(st.sampled_from(sorted(EDGE_OPS)))
    arrays, params = EDGE_OPS[op][0](draw)
    return op, arrays, params


def known_difference(op, arrays, params, torch_error, tgrad_error, torch_out=None) -> bool:
    """Where tgrad gives a value and PyTorch refuses (or the reverse) on purpose; README lists these."""
    if torch_error is None and isinstance(tgrad_error, IndexError) and torch_out is not None:
        return torch_out.size == 0  # an index out of range raises even where it selects nothing
    if tgrad_error is None and op in ("cross_entropy", "nll_loss") and params["kind"] == "labels":
        return "Long" in str(torch_error)  # int32 labels: PyTorch wants int64 (WEBGPU has no int64)
    if tgrad_error is None and op == "pair_loss":  # a target of another dtype is promoted, as mse does
        return arrays["t"].dtype != np.float32
    if tgrad_error is None and op == "mask" and params["form"] == "where":  # tinygrad's cond.where(x, y)
        return arrays["m"].dtype != bool  # takes any nonzero condition as True
    if tgrad_error is not None and op == "cross_entropy":  # PyTorch ignores a negative label_smoothing
        return params.get("label_smoothing", 0) < 0 and "label_smoothing" in str(tgrad_error)
    return False


def _lib_arrays(lib, arrays, device=None):
    out = {}
    for k, v in arrays.items():
        grad = k == "x" and v.dtype == np.float32
        if lib == "torch":
            out[k] = torch.tensor(v, requires_grad=grad)
        else:
            out[k] = Tensor(v, requires_grad=grad, device=device)
    return out


def check_edge(op, arrays, params):
    run = EDGE_OPS[op][1]
    at, ag = _lib_arrays("torch", arrays), _lib_arrays("tgrad", arrays)
    errors = []
    outs = []
    for lib, a in (("torch", at), ("tgrad", ag)):
        try:
            out = run(lib, a, params)
            outs.append(out.detach().numpy() if lib == "torch" else out.numpy())
            errors.append(None)
        except Exception as e:  # noqa: BLE001 - the error is the result compared
            outs.append(None)
            errors.append(e)
            out = None
        if lib == "torch":
            out_t = out
        else:
            out_g = out
    et, eg = errors
    if et is not None or eg is not None:
        if et is not None and eg is not None:
            assert isinstance(eg, TgradError), f"tgrad raised {type(eg).__name__}, not a tgrad error: {eg}"
            for cls in (IndexError, ValueError, TypeError, NotImplementedError, RuntimeError):
                if isinstance(et, cls):
                    assert isinstance(eg, cls), f"PyTorch raised {type(et).__name__} ({et}), tgrad {eg!r}"
                    break
            return
        assert known_difference(op, arrays, params, et, eg, outs[0]), f"PyTorch: {et!r}\ntgrad: {eg!r}"
        return
    want, got = outs
    assert got.shape == want.shape, f"shape {got.shape}, PyTorch {want.shape}"
    if op == "pair_loss" and params["name"] == "bce_logits" and np.isinf(arrays["x"]).any():
        return  # PyTorch's formula gives nan at infinite logits (0 * inf); tgrad the limit (0 or inf)
    if op == "binary" and params["op"] in ("fmod", "remainder", "floordiv"):
        # |x / y| >= 2**29: tgrad's fmod is exact below that (README), PyTorch's everywhere
        with np.errstate(all="ignore"):
            far = np.abs(arrays["x"].astype(np.float64) / arrays["y"]) >= 2**29
        far &= np.isfinite(arrays["x"]) & np.isfinite(arrays["y"])
        want, got = np.where(far, 0, want), np.where(far, 0, got)
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-4, atol=1e-5,
                                   equal_nan=True)
    if op in NO_GRADIENT or not out_t.requires_grad or out_t.numel() == 0:
        return
    if op == "reducing" and params["op"] == "amax" and np.isnan(arrays["x"]).any():
        return  # PyTorch's amax gradient is nan for every element where the max is nan (0 / 0); tgrad's 1
    if op == "reducing" and params["op"] == "topk" and len(np.unique(arrays["x"])) < arrays["x"].size:
        return  # ties: PyTorch's topk picks an index of its own, tgrad the first (stable)
    if op == "reducing" and params["op"] == "logsumexp" and (np.abs(arrays["x"]) > 1e7).any():
        return  # PyTorch's exp(x - lse) is 1 where lse rounds to x (-1e30 twice: 1 and 1); tgrad's 0.5, 0.5
    if op == "reducing" and params["op"] == "var" and not (np.abs(arrays["x"]) < 1e30).all():
        return  # var's gradient at inf, nan or 3e38: PyTorch's 2 (x - mean) / (n - 1) is -inf or nan there
    out_t.sum().backward()
    out_g.sum().backward()
    gt = at["x"].grad.numpy() if at["x"].grad is not None else np.zeros(arrays["x"].shape, np.float32)
    gg = ag["x"].grad.numpy() if ag["x"].grad is not None else np.zeros(arrays["x"].shape, np.float32)
    np.testing.assert_allclose(gg, gt, rtol=1e-3, atol=1e-5, equal_nan=True)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")  # PyTorch's and numpy's own
@seed(SEED)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(edge_cases())
def test_edge_inputs_match_pytorch(device, case):
    check_edge(*case)
