"""Tensors too big for their device raise tgrad's OutOfMemoryError (a MemoryError) naming the op, the shape,
dtype and bytes and the user's line, before anything is computed; the process goes on working. The sizes
are far beyond any machine (10**6 x 10**6 float32: 4 TB), so every case fails at once."""

import numpy as np
import pytest

from tgrad import Tensor, TinyJit
from tgrad.device import get_runtime
from tgrad.errors import OutOfMemoryError

HUGE = (10**6, 10**6)


def _check_message(e: pytest.ExceptionInfo, op: str) -> None:
    text = str(e.value)
    assert isinstance(e.value, MemoryError)
    assert op in text and "(1000000, 1000000)" in text and "float32" in text, text
    assert "4000000000000 bytes" in text and "float64" not in text, text
    assert "test_out_of_memory.py:" in text, text  # the user's line


def _still_works(device: str) -> None:
    """A normal allocation and a TinyJit function still give numpy's answers."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose((Tensor(a, device=device) * 2 + 1).numpy(), a * 2 + 1)

    @TinyJit
    def step(x: Tensor) -> Tensor:
        return (x * x).sum(axis=1)

    for i in range(3):
        x = a + i
        np.testing.assert_allclose(step(Tensor(x, device=device)).numpy(), (x * x).sum(axis=1), rtol=1e-6)


def test_realize_too_big(device):
    with pytest.raises(OutOfMemoryError) as e:
        Tensor.zeros(*HUGE, device=device).realize()
    _check_message(e, "Tensor.realize")
    _still_works(device)


def test_random_too_big(device):
    """randn of a float32 tensor reports the float32 tensor (it drew float64 numbers for all of it)."""
    with pytest.raises(OutOfMemoryError) as e:
        Tensor.randn(*HUGE, device=device)
    _check_message(e, "Tensor.randn")
    _still_works(device)


def test_empty_and_compute_too_big(device):
    with pytest.raises(OutOfMemoryError) as e:
        Tensor.empty(*HUGE, device=device)
    _check_message(e, "Tensor.empty")
    x = Tensor.ones(10**6, 1, device=device) * Tensor.ones(1, 10**6, device=device)
    with pytest.raises(OutOfMemoryError) as e:
        x.numpy()
    _check_message(e, "Tensor.numpy")
    _still_works(device)


def test_failed_assign_leaves_its_target(device):
    t = Tensor([1.0, 2.0, 3.0], device=device).realize()
    before = t.node.buffer
    # (a sum of two real buffers: a constant's copy would fold into a constant, which needs no memory)
    big = (Tensor.ones(HUGE[0], 1, device=device) + Tensor.arange(HUGE[1], device=device).reshape(1, -1))
    big = big.contiguous()
    t.assign(t + big[0, :3])
    with pytest.raises(OutOfMemoryError):
        t.realize()
    np.testing.assert_array_equal(before.numpy()[:3], [1.0, 2.0, 3.0])
    # the failed assign did not happen (as in PyTorch, where its op raised): t keeps its value and takes
    # the next one
    np.testing.assert_array_equal(t.numpy(), [1.0, 2.0, 3.0])
    t.assign(t * 10)
    np.testing.assert_array_equal(t.numpy(), [10.0, 20.0, 30.0])
    _still_works(device)


def test_a_small_limit_names_it(device, monkeypatch):
    """A device's largest buffer (here a fake one of 1 KiB) is named in the error, and a tensor within it
    still computes."""
    rt = get_runtime(device)
    monkeypatch.setattr(rt, "max_buffer", (1024, "a test's limit of 1024 bytes"))
    np.testing.assert_allclose((Tensor.ones(256, device=device) * 3).numpy(), np.full(256, 3.0))
    with pytest.raises(OutOfMemoryError, match="a test's limit of 1024 bytes") as e:
        (Tensor.ones(257, device=device) * 3).realize()
    assert "(257,)" in str(e.value) and "1028 bytes" in str(e.value)


def _fail_allocations(device: str, monkeypatch) -> str:
    """Make the device's allocator fail as its driver does when memory runs out; returns the driver's
    message, which the OutOfMemoryError carries."""
    rt = get_runtime(device)
    message = "the driver ran out of memory"
    if device == "CPU":
        def fail(*args, **kwargs):
            raise MemoryError(message)  # numpy's _ArrayMemoryError is a MemoryError

        monkeypatch.setattr(rt.memory, "array", fail)
    elif device == "CL":
        cl = rt.cl

        class Buffer:
            def __init__(self, *args, **kwargs):
                raise cl.MemoryError(cl._cl._ErrorRecord("clCreateBuffer", -4, message))

        monkeypatch.setattr(cl, "Buffer", Buffer)
    elif device == "WEBGPU":
        def fail(*args, **kwargs):
            raise rt.wgpu.GPUOutOfMemoryError(message)

        monkeypatch.setattr(rt.device, "create_buffer", fail)
    elif device == "TRITON":
        def fail(*args, **kwargs):
            raise rt.torch.OutOfMemoryError(message)

        monkeypatch.setattr(rt.torch, "empty", fail)
    else:
        pytest.skip(f"{device} evaluates with numpy (its MemoryError: test_realize_too_big)")
    return message


def test_driver_out_of_memory_is_translated(device, monkeypatch):
    """An allocation the size check lets through but the driver refuses (numpy's MemoryError, PoCL's
    CL_MEM_OBJECT_ALLOCATION_FAILURE, wgpu's GPUOutOfMemoryError, torch's OutOfMemoryError) raises tgrad's
    OutOfMemoryError naming the kernel, shape and the driver's message; afterwards allocations work."""
    t = Tensor([1.0, 2.0, 3.0], device=device).realize()
    x = Tensor.arange(6, device=device).reshape(2, 3).float().realize()
    with monkeypatch.context() as m:
        message = _fail_allocations(device, m)
        with pytest.raises(OutOfMemoryError) as e:
            (x * 2 + t).realize()
    assert message in str(e.value) and "(2, 3)" in str(e.value) and "test_out_of_memory.py:" in str(e.value)
    np.testing.assert_array_equal((x * 2 + t).numpy(), np.arange(6).reshape(2, 3) * 2 + [1.0, 2.0, 3.0])
    _still_works(device)
