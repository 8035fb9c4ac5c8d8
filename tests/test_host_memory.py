"""The CPU runtime's host memory (tgrad/runtime/cpu/memory.py): big blocks are reused once nothing can
see them, never while a view of them lives, and arrays it did not make are never taken in."""

import gc
import threading

import numpy as np
import pytest

from tgrad.runtime.cpu.memory import MIN_KEEP, PAGE, HostMemory

N = MIN_KEEP // 4  # float32 elements of one kept block


def test_a_released_block_is_handed_out_again_page_aligned():
    mem = HostMemory()
    a = mem.array(N, np.float32)
    assert a.ctypes.data % PAGE == 0 and a.shape == (N,) and a.dtype == np.float32
    address = a.ctypes.data
    mem.release(a)
    del a
    b = mem.array(N, np.int32)
    assert b.ctypes.data == address and (mem.made, mem.reused) == (1, 1)


def test_a_block_some_view_still_sees_is_not_reused():
    mem = HostMemory()
    a = mem.array(N, np.float32)
    a[:] = 7.0
    view = a.reshape(4, -1)[1:]  # what a user holds, e.g. a buffer's array seen through numpy
    mem.release(a)
    del a
    b = mem.array(N, np.float32)
    b[:] = -1.0
    assert (view == 7.0).all() and mem.reused == 0
    del view
    gc.collect()
    c = mem.array(N, np.float32)
    assert mem.reused == 1 and c.size == N


def test_small_sizes_blocks_far_too_big_and_foreign_arrays_are_not_used():
    mem = HostMemory()
    small = mem.array(16, np.float32)
    mem.release(small)
    big = mem.array(4 * N, np.float32)
    mem.release(big)
    del big
    mem.array(N, np.float32)  # a 4x bigger free block is not spent on it
    assert mem.reused == 0
    mine = np.zeros(2 * N, np.float32)
    mem.release(mine)
    mem.release(mine[1:])
    assert mem.pending == [] and np.count_nonzero(mine) == 0


def test_releasing_twice_raises_instead_of_handing_one_block_to_two_owners():
    mem = HostMemory()
    a = mem.array(N, np.float32)
    mem.release(a)
    with pytest.raises(RuntimeError, match="released twice"):
        mem.release(a)


def test_a_buffer_freed_by_a_collection_while_the_lock_is_held_does_not_hang():
    """A Buffer gives its block back in __del__, which may run in a garbage collection that starts inside
    array() (its sweep allocates) while the lock is held: release() must not wait for that lock (it did:
    a softmax benchmark hung for ever)."""
    from tgrad.device import Buffer
    from tgrad.dtype import dtypes

    mem = HostMemory()
    buf = Buffer("CPU", N, dtypes.float32, mem.array(N, np.float32))
    buf.on_free = mem.release
    buf.cycle = buf  # only the collector frees it
    del buf

    def collect_holding_the_lock():
        with mem.lock:
            gc.collect()

    worker = threading.Thread(target=collect_holding_the_lock, daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), "release() waited for the lock its own thread holds"
    mem.array(N, np.float32)
    assert mem.reused == 1


def test_free_blocks_are_kept_up_to_the_limit():
    mem = HostMemory(limit=3 * MIN_KEEP)
    arrays = [mem.array(N, np.float32) for _ in range(5)]
    for a in arrays:
        mem.release(a)
    del a, arrays
    assert mem.kept_bytes() <= 3 * MIN_KEEP
    assert HostMemory(limit=0).array(N, np.float32).base is not None  # still page-aligned, never kept


def test_cpu_kernels_on_reused_blocks_match_numpy():
    # every kernel output, im2col copy and BLAS result of these convolutions comes from reused blocks
    # (windows under opt.host.conv_pieces's size: one im2col copy of 1.8 MB, not pieces of it)
    from tgrad import Tensor, dtypes
    from tgrad.device import get_runtime

    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 1, 3, 3)).astype(np.float32)
    for _ in range(3):
        x = rng.standard_normal((64, 1, 30, 30)).astype(np.float32)
        out = Tensor(x, device="CPU").conv2d(Tensor(w, device="CPU")).relu().numpy()
        win = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))
        ref = np.maximum(np.einsum("bchwij,ocij->bohw", win, w), 0)
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    assert get_runtime("CPU").memory.reused > 0
    assert Tensor.ones(N, dtype=dtypes.int32, device="CPU").sum().item() == N
