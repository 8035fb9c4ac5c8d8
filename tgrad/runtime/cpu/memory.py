"""Host memory for the CPU runtime: page-aligned arrays, the big ones kept for reuse when freed.

Every fresh allocation of N bytes costs the operating system N / 4 KiB page faults (or N / 2 MiB with
huge pages), each handing out zeroed memory, the first time it is written. That is system time in the
middle of a kernel: the im2col operand of the CNN's conv input gradient (236 MB, a new array on every
step) took far longer to fault in than to fill on this shared VM, and an eager training step spent more
time in page faults than in its kernels (measured: bench/HISTORY.md). PyTorch keeps freed blocks for the same
reason (its CPU caching allocator); so does tinygrad's LRU allocator.

`HostMemory.array` hands out arrays of at least MIN_KEEP bytes from kept blocks; `release` gives one back.
A block is reused only when nothing can still see it: a freed Buffer's array may live on in a numpy view
the user holds (`t.numpy()` returns the buffer's array itself), so released blocks wait in `pending` until
the numpy array owning their memory is referenced by the block alone (CPython's reference count; every
view of the memory holds the owner).
"""

from __future__ import annotations

import sys
import threading
import weakref
from pathlib import Path

import numpy as np

from tgrad import config

PAGE = 4096
MIN_KEEP = 1 << 20  # smaller arrays come from malloc's free lists, already warm
# bytes of free blocks kept at most (TGRAD_HOST_CACHE_MB; 0 keeps none)
LIMIT = int(float(config.get("TGRAD_HOST_CACHE_MB")) * (1 << 20))


def cache_bytes(cpu: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """A core's level-2 cache in bytes (Linux's sysfs; 2 MiB where it does not say): the optimizer sizes
    the pieces of copied matmul operands to it (opt/host.py)."""
    try:
        for index in sorted(Path(cpu).glob("index*")):
            if (index / "level").read_text().strip() == "2":
                size = (index / "size").read_text().strip().upper()
                scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
                return int(size.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    return 1 << 21


def page_aligned(size: int, dtype) -> np.ndarray:
    """np.empty(size, dtype), starting on a page boundary when it is bigger than a page. A kernel that
    reads one array and writes another streams both; when the output starts a little after the input
    modulo 4 KiB (the usual case for two equal-size numpy allocations) each store looks to the CPU like
    it may feed a later load ("4K aliasing") and the loop runs several times slower (softmax's last kernel;
    measured: bench/HISTORY.md). With every large buffer page-aligned, the offset is 0 and nothing
    stalls."""
    dtype = np.dtype(dtype)
    nbytes = size * dtype.itemsize
    if nbytes <= PAGE:
        return np.empty(size, dtype)
    raw = np.empty(nbytes + PAGE, np.uint8)
    start = -raw.ctypes.data % PAGE
    return raw[start : start + nbytes].view(dtype)


def _free_refs() -> int:
    """sys.getrefcount of an array held only by a list, seen from a loop over that list (as `_sweep` sees a
    block nobody else holds). Measured, not assumed: interpreters differ in the references they count."""
    held = [np.empty(1, np.uint8)]
    for array in held:
        return sys.getrefcount(array)
    return 0


_FREE_REFS = _free_refs()


class HostMemory:
    """Page-aligned arrays; blocks of MIN_KEEP bytes or more are kept when released and handed out again
    (the smallest free block that fits within 25%), up to `limit` bytes of free blocks (oldest dropped)."""

    def __init__(self, limit: int = LIMIT):
        self.limit = limit
        self.free: list[np.ndarray] = []  # uint8 blocks nobody sees, oldest first
        self.pending: list[np.ndarray] = []  # released blocks that a view may still see
        # blocks given back by release(), which takes no lock: a Buffer's __del__ releases its block, and
        # may run inside a garbage collection that starts while this thread holds the lock (array()'s
        # sweep allocates); waiting for the lock there would wait for ever. Moved to `pending` under it.
        self.returned: list[np.ndarray] = []
        self.lock = threading.Lock()
        self.owners: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # id -> owner, made here
        self.reused = self.made = 0  # counters for tests and DEBUG

    def array(self, size: int, dtype) -> np.ndarray:
        """An uninitialised array of `size` elements of `dtype` (flat, page-aligned when big)."""
        dtype = np.dtype(dtype)
        nbytes = size * dtype.itemsize
        if nbytes < MIN_KEEP or self.limit <= 0 or _FREE_REFS < 2:
            return page_aligned(size, dtype)
        with self.lock:
            self._sweep()
            fits = [i for i, b in enumerate(self.free) if nbytes <= b.nbytes <= nbytes + nbytes // 4 + PAGE]
            block = self.free.pop(min(fits, key=lambda i: self.free[i].nbytes)) if fits else None
            self.reused += block is not None
        if block is None:
            block = page_aligned(-(-nbytes // PAGE) * PAGE, np.uint8)
            with self.lock:
                self.owners[id(block.base)] = block.base
                self.made += 1
        return block[:nbytes].view(dtype)

    def release(self, array: np.ndarray) -> None:
        """`array` (from `array()`) is no longer used by its holder; its block is reused once no view of
        it is left."""
        owner = array.base
        if owner is None or self.owners.get(id(owner)) is not owner:
            return  # not made here (a user's array, a view of one): never reused
        if any(o is owner for o in self.returned):
            raise RuntimeError("tgrad: a host memory block was released twice")
        self.returned.append(owner)  # (list.append is atomic: no lock, see __init__)

    def kept_bytes(self) -> int:
        with self.lock:
            self._sweep()
            return sum(b.nbytes for b in self.free)

    def _sweep(self) -> None:
        """Move pending blocks that only this pool references to `free` (holding the lock)."""
        while self.returned:
            owner = self.returned.pop(0)
            if any(o is owner for o in self.pending) or any(b.base is owner for b in self.free):
                raise RuntimeError("tgrad: a host memory block was released twice")
            self.pending.append(owner)
        still = []
        for owner in self.pending:
            # references: the list, the loop variable, getrefcount's argument (_FREE_REFS); any view adds one
            if sys.getrefcount(owner) > _FREE_REFS:
                still.append(owner)
                continue
            block = owner[-owner.ctypes.data % PAGE :] if owner.ctypes.data % PAGE else owner
            self.free.append(block[: block.nbytes // PAGE * PAGE])
        self.pending = still
        total = sum(b.nbytes for b in self.free)
        while self.free and total > self.limit:
            total -= self.free.pop(0).nbytes
