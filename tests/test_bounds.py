"""No silent wrong answers at bad indices and empty reductions: every case raises where PyTorch raises
(an IndexError), and gives PyTorch's value where PyTorch gives one. Indices on the device are checked by
a host step, so a replayed TinyJit step checks them too."""

import numpy as np
import pytest
import torch

from tgrad import Tensor
from tgrad.errors import ShapeError
from tgrad.jit import TinyJit
from tgrad.nn import Embedding

X = np.arange(12, dtype=np.float32).reshape(3, 4)


def both_raise(torch_fn, tgrad_fn, error=IndexError):
    with pytest.raises((IndexError, RuntimeError)):
        torch_fn()
    with pytest.raises(error):
        tgrad_fn()


def test_tensor_index_out_of_range_raises(device):
    t, tt = Tensor(X), torch.tensor(X)
    for bad in ([3], [-4], [0, 5]):
        both_raise(lambda b=bad: tt[torch.tensor(b)], lambda b=bad: t[Tensor(b)].numpy())
    both_raise(lambda: tt[torch.tensor([0, 1]), torch.tensor([1, 4])],
               lambda: t[Tensor([0, 1]), Tensor([1, 4])].numpy())
    np.testing.assert_array_equal(t[Tensor([-1, 0])].numpy(), tt[torch.tensor([-1, 0])].numpy())


def test_gather_scatter_one_hot_out_of_range_raise(device):
    t, tt = Tensor(X), torch.tensor(X)
    both_raise(lambda: tt.gather(1, torch.tensor([[-1], [0], [1]])),
               lambda: t.gather(1, Tensor([[-1], [0], [1]])).numpy())
    both_raise(lambda: tt.gather(1, torch.tensor([[4], [0], [1]])),
               lambda: t.gather(1, Tensor([[4], [0], [1]])).numpy())
    both_raise(lambda: torch.zeros(3, 4).scatter(1, torch.tensor([[4], [0], [1]]), 1.0),
               lambda: Tensor.zeros(3, 4).scatter(1, Tensor([[4], [0], [1]]), 1.0).numpy())
    both_raise(lambda: torch.nn.functional.one_hot(torch.tensor([3]), 3),
               lambda: Tensor([3]).one_hot(3).numpy())
    np.testing.assert_array_equal(t.gather(1, Tensor([[3], [0], [1]])).numpy(),
                                  tt.gather(1, torch.tensor([[3], [0], [1]])).numpy())


def test_losses_check_class_labels_and_shapes(device):
    logits = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    lg, lt = Tensor(logits), torch.tensor(logits)
    F = torch.nn.functional
    both_raise(lambda: F.cross_entropy(lt, torch.tensor([0, 3])),
               lambda: lg.cross_entropy(Tensor([0, 3])).numpy())
    both_raise(lambda: F.cross_entropy(lt, torch.tensor([-1, 0])),
               lambda: lg.cross_entropy(Tensor([-1, 0])).numpy())
    both_raise(lambda: F.nll_loss(lt, torch.tensor([0, 7])), lambda: lg.nll_loss(Tensor([0, 7])).numpy())
    both_raise(lambda: F.cross_entropy(lt, torch.tensor([-100, 3])),
               lambda: lg.cross_entropy(Tensor([-100, 3])).numpy())
    both_raise(lambda: F.cross_entropy(lt, torch.tensor([0, 1]) + 2),  # a computed label
               lambda: lg.cross_entropy(Tensor([0, 1]) + 2).numpy())
    np.testing.assert_allclose(lg.cross_entropy(Tensor([0, 1])[::-1] + 1).numpy(),  # a view
                               F.cross_entropy(lt, torch.tensor([2, 1])).numpy(), rtol=1e-5)
    ignored = lg.cross_entropy(Tensor([-100, 2])).numpy()
    np.testing.assert_allclose(ignored, F.cross_entropy(lt, torch.tensor([-100, 2])).numpy(), rtol=1e-5)
    p = np.array([[0.2], [0.7]], np.float32)
    with pytest.raises(ValueError):
        F.binary_cross_entropy(torch.tensor(p), torch.tensor([0.0, 1.0]))
    with pytest.raises(ShapeError):
        Tensor(p).binary_crossentropy(Tensor([0.0, 1.0]))
    with pytest.raises(ShapeError):
        Tensor(p).binary_crossentropy_logits(Tensor([0.0, 1.0]))


def test_narrow_labels_past_the_sign_bit_are_checked(device):
    """int8 labels and 200 classes: -100 read as uint8 is 156, inside the bound, so it must still raise (as
    PyTorch does for these values in its int64 labels); 127 is a class."""
    logits = np.random.default_rng(0).standard_normal((2, 200)).astype(np.float32)
    lg, lt = Tensor(logits), torch.tensor(logits)
    F = torch.nn.functional
    both_raise(lambda: F.cross_entropy(lt, torch.tensor([-100, 2]), ignore_index=-1),
               lambda: lg.cross_entropy(Tensor(np.array([-100, 2], np.int8)), ignore_index=-1).numpy())
    np.testing.assert_allclose(lg.cross_entropy(Tensor(np.array([127, 2], np.int8))).numpy(),
                               F.cross_entropy(lt, torch.tensor([127, 2])).numpy(), rtol=1e-5)


def test_embedding_rejects_ids_outside_the_vocabulary(device):
    emb, temb = Embedding(3, 2), torch.nn.Embedding(3, 2)
    for bad in ([[3]], [[-1]]):
        both_raise(lambda b=bad: temb(torch.tensor(b)), lambda b=bad: emb(Tensor(b)).numpy())
    assert emb(Tensor([[2, 0]])).shape == (1, 2, 2)


def test_argmax_of_nan_and_empty_reductions(device):
    for values in ([1.0, float("nan"), 3.0], [float("nan"), float("nan")], [2.0, 5.0, 5.0]):
        assert Tensor(values).argmax().item() == torch.tensor(values).argmax().item()
        assert Tensor(values).argmin().item() == torch.tensor(values).argmin().item()
    nan_rows = [[1.0, float("nan")], [3.0, 2.0]]
    want = torch.tensor(nan_rows).argmax(1).numpy()
    np.testing.assert_array_equal(Tensor(nan_rows).argmax(1).numpy(), want)
    both_raise(lambda: torch.tensor([]).argmax(), lambda: Tensor([]).argmax().numpy())
    both_raise(lambda: torch.zeros(2, 0).amax(1), lambda: Tensor.zeros(2, 0).max(1).numpy())
    both_raise(lambda: torch.zeros(2, 0).amin(1), lambda: Tensor.zeros(2, 0).min(1).numpy())
    assert Tensor.zeros(0, dtype="bool").any().item() is False
    assert Tensor.zeros(2, 0).sum().item() == 0


def test_jitted_step_checks_its_labels_on_every_replay(device):
    w = Tensor(np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32), requires_grad=True)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        loss = (x @ w).cross_entropy(y)
        loss.backward()
        return loss

    x = Tensor(np.ones((2, 4), np.float32))
    for _ in range(4):
        step(x, Tensor([0, 2])).numpy()
    with pytest.raises(IndexError, match="cross_entropy"):
        step(x, Tensor([0, 3]))


def test_index_into_a_broadcast_axis_takes_its_one_value(device):
    """An index into an expanded (broadcast) axis reads the one value there without a take: values and
    gradients as PyTorch's, out-of-range indices raise; on the host devices an axis of 2**31 + 3 too (the
    host take wrote the whole 16 GiB expansion first and the process died: tinygrad's
    test_tensor_index_overflow)."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3, 1)
    ids = [[4, 0], [-1, 2]]
    t, tt = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out, ref = t.expand(2, 3, 5)[:, 1, Tensor(ids)], tt.expand(2, 3, 5)[:, 1, torch.tensor(ids)]
    np.testing.assert_array_equal(out.numpy(), ref.detach().numpy())
    (out * out).sum().backward()
    (ref * ref).sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), tt.grad.numpy())
    both_raise(lambda: tt.expand(2, 3, 5)[:, :, torch.tensor([5])],
               lambda: t.expand(2, 3, 5)[:, :, Tensor([5])].numpy())
    if device in ("CPU", "NUMPY"):
        big = Tensor([7]).expand(2**31 + 3)
        np.testing.assert_array_equal(big[Tensor([0, 2**31 + 2, -1])].numpy(), [7, 7, 7])
        with pytest.raises(IndexError):
            big[Tensor([2**31 + 3])].numpy()
