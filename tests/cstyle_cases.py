"""A small op suite for the C-style emitters: each case runs in PyTorch and tgrad (tests/test_opencl.py)
and is rendered as Metal (tests/test_metal.py). Shapes are small but cross the group-reduce threshold
(tgrad.emit_opencl.GROUP_REDUCE_MIN) so both reduction strategies are covered."""
from __future__ import annotations

import functools
import shutil

import numpy as np
import torch

from tests.helpers import make_inputs
from tgrad import Tensor, fuse


def where(cond, x, y):
    return torch.where(cond, x, y) if isinstance(cond, torch.Tensor) else cond.where(x, y)


def pad(x, padding):
    return torch.nn.functional.pad(x, padding) if isinstance(x, torch.Tensor) else x.pad(padding)


# name -> (input shapes, function of tensors (torch or tgrad), helper_test_op keyword arguments)
CASES = {
    "add_mul_relu_sum": ([(4, 5), (4, 5), (5,)], lambda a, b, c: (a * b + c).relu().sum(), {}),
    "unary_chain": ([(3, 7)], lambda a: (a.exp() + a.sin() + (a * a + 1).sqrt()).reciprocal(), {}),
    "log_trunc": ([(3, 7)], lambda a: (a.abs() + 0.1).log() + (a * 3).trunc(), {"forward_only": True}),
    "maximum_where": ([(4, 6), (4, 6)], lambda a, b: where(a > b * 0.5, a.maximum(b), -a), {}),
    "pad_flip_permute": ([(2, 3, 4)], lambda a: pad(a.permute(2, 0, 1).flip(0), (1, 2)) * 2, {}),
    "shrink_expand": ([(4, 5), (1, 3)], lambda a, b: a[1:3, 2:5] + b.expand(2, 3), {}),
    "sum_axis_short": ([(6, 9)], lambda a: a.sum(1), {}),
    "sum_axis_long": ([(3, 700)], lambda a: a.sum(1), {}),
    "sum_all_long": ([(40, 50)], lambda a: a.sum(), {}),
    "max_long": ([(2, 600)], lambda a: a.amax(1), {}),
    "prod_short": ([(3, 5)], lambda a: a.prod(1), {"low": 0.5, "high": 1.5}),
    "mean_first_axis_long": ([(300, 3)], lambda a: a.mean(0), {}),
    "softmax": ([(3, 300)], lambda a: a.softmax(-1), {}),
    "matmul_long_k": ([(4, 260), (260, 3)], lambda a, b: a @ b, {"atol": 1e-4}),
    "matmul_small": ([(5, 6), (6, 7)], lambda a, b: a @ b, {}),
    "matmul_tiled_relu": ([(8, 12), (12, 16)], lambda a, b: (a @ b).relu() * 2, {}),
    "batched_matmul_tiled": ([(2, 4, 5), (2, 5, 8)], lambda a, b: a @ b, {}),
}


def int_inputs() -> list[np.ndarray]:
    """Signed integers with both signs (C division semantics matter) and no zero divisors."""
    a = np.array([[-7, 7, 9, -9], [100, -100, 3, 0]], dtype=np.int32)
    b = np.array([[2, -2, 4, 4], [-3, 3, -5, 7]], dtype=np.int32)
    return [a, b]


INT_CASES = {
    "trunc_div": lambda a, b: torch.div(a, b, rounding_mode="trunc") if isinstance(a, torch.Tensor)
    else (a - a.fmod(b)) // b,
    "fmod": lambda a, b: torch.fmod(a, b) if isinstance(a, torch.Tensor) else a.fmod(b),
    "floordiv": lambda a, b: a // b,
    "mod": lambda a, b: a % b,
    "max_int": lambda a, b: a.maximum(b) if not isinstance(a, torch.Tensor) else torch.maximum(a, b),
    "cmp_logic": lambda a, b: ((a < b) & (a != 0)) | ((a > b) ^ (b < 0)),
    "cast_chain": lambda a, b: (a.float() * 0.7).int() + (a < b).int(),
}


def _graph_nodes(fn, arrays, grads: bool) -> list:
    ts = [Tensor(a, device="NUMPY", requires_grad=grads) for a in arrays]
    out = fn(*ts)
    nodes = [out.node]
    if grads:
        w = Tensor(np.random.default_rng(1).uniform(0.5, 1.5, out.shape).astype(np.float32), device="NUMPY")
        (out * w).sum().backward()
        nodes += [t.grad.node for t in ts if t.grad is not None]
    return nodes


def _extra_dtype_cases() -> list:
    f16 = np.linspace(-3, 3, 12, dtype=np.float16).reshape(3, 4)
    b = np.array([[True, False, True, True]] * 3)
    u8 = np.arange(12, dtype=np.uint8).reshape(3, 4)
    i64 = np.arange(12, dtype=np.int64).reshape(3, 4) - 5
    return [
        _graph_nodes(lambda h, m: (h * 2 + m.half()).exp().sum(1), [f16, b], grads=False),
        _graph_nodes(lambda h: h.max(1).float() + h.float().sum(), [np.tile(f16, (1, 100))], grads=False),
        _graph_nodes(lambda u, m: (u * 3 + 7).maximum(u) * m.logical_not().int(), [u8, b], grads=False),
        _graph_nodes(lambda x: (x // 3 + x % 4 + (x < 0).long()).sum(0), [i64], grads=False),
        _graph_nodes(lambda x: x.float().half().float() * 0.3, [i64], grads=False),
    ]


@functools.cache
def suite_kernels() -> list:
    """Every distinct kernel of the cases of tests/cstyle_cases.py, forward and backward."""
    nodes = []
    for shapes, fn, kw in CASES.values():
        nodes += _graph_nodes(fn, make_inputs(shapes, kw.get("low", -2.0), kw.get("high", 2.0)), grads=True)
    for fn in INT_CASES.values():
        nodes += _graph_nodes(fn, int_inputs(), grads=False)
    for extra in _extra_dtype_cases():
        nodes += extra
    kernels = []
    for node in nodes:
        for it in fuse.schedule([node]):
            if it.kernel not in kernels:
                kernels.append(it.kernel)
    return kernels


def find_clang() -> str | None:
    for name in ("clang++", "clang++-15", "clang++-16", "clang++-17", "clang++-14"):
        path = shutil.which(name)
        if path:
            return path
    return None
