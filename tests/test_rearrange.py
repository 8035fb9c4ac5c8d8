"""Tensor.rearrange (einops patterns, tinygrad's method) against the numpy reshapes and transposes each
pattern means, on every device; malformed patterns raise a PatternError (an ArgumentError and, as in
tinygrad, an AssertionError) naming the pattern."""

import numpy as np
import pytest

from tgrad import Tensor
from tgrad.errors import PatternError, ShapeError

X = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)

CASES = [  # pattern, sizes, what numpy does
    ("a b c d -> d c b a", {}, lambda x: x.transpose(3, 2, 1, 0)),
    ("a b c d -> (a b) c d", {}, lambda x: x.reshape(6, 4, 5)),
    ("a b (c1 c2) d -> a c2 b c1 d", {"c1": 2}, lambda x: x.reshape(2, 3, 2, 2, 5).transpose(0, 3, 1, 2, 4)),
    ("a ... d -> d (...) a", {}, lambda x: x.transpose(3, 1, 2, 0).reshape(5, 12, 2)),
    ("... -> (...)", {}, lambda x: x.reshape(-1)),
    ("a b c d -> a () b 1 c d", {}, lambda x: x.reshape(2, 1, 3, 1, 4, 5)),
    ("a b c d -> b (d a) c", {"a": 2, "d": 5}, lambda x: x.transpose(1, 3, 0, 2).reshape(3, 10, 4)),
    ("a b … -> … b a", {}, lambda x: x.transpose(2, 3, 1, 0)),
]


@pytest.mark.parametrize("pattern,sizes,ref", CASES, ids=[c[0] for c in CASES])
def test_rearrange_matches_numpy(device, pattern, sizes, ref):
    out = Tensor(X, device=device).rearrange(pattern, **sizes)
    np.testing.assert_array_equal(out.numpy(), ref(X))


def test_rearrange_gradient(device):
    x = Tensor(X, device=device, requires_grad=True)
    w = np.random.default_rng(0).standard_normal((3, 2 * 5, 4)).astype(np.float32)
    (x.rearrange("a b c d -> b (d a) c") * Tensor(w, device=device)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), w.reshape(3, 5, 2, 4).transpose(2, 0, 3, 1))


@pytest.mark.parametrize("pattern,sizes", [
    ("a b c d -> a b c", {}), ("a b c d -> a b c e", {}), ("a b c d -> a b c d -> a b c d", {}),
    ("a b (c d -> a b c d", {}), ("a b* c d -> a b c d", {}), ("_a b c d -> _a b c d", {}),
    ("a ... c ... -> a c", {}), ("a (b ...) -> a b ...", {}), ("a b c d -> a b c d", {"e": 2}),
    ("a b c d -> a b c d", {"b": 4}), ("a b c -> a b c", {}),
])
def test_rearrange_bad_patterns_raise(pattern, sizes):
    with pytest.raises(PatternError, match="rearrange: .* in '"):
        Tensor(X).rearrange(pattern, **sizes)
    assert issubclass(PatternError, AssertionError) and issubclass(PatternError, ValueError)


def test_rearrange_sizes_that_do_not_divide_raise():
    with pytest.raises(ShapeError):
        Tensor(X).rearrange("a b (c1 c2) d -> a b c1 c2 d", c1=3)
