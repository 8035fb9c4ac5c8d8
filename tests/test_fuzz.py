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
