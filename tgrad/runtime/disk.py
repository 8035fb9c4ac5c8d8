"""The DISK device (tinygrad's `disk:`): a file's bytes, memory-mapped with numpy.

A device is named "DISK:<absolute path>", one runtime per file. Its buffers are DiskBuffers: `data` is a
uint8 view into the file's mapping (MAP_SHARED: what is written reaches the file), covering exactly the
buffer's bytes. It runs no kernels. What a disk tensor supports: views that are one contiguous range of
the file (reshape, shrink, slicing, bitcast: graph.py builds them through DiskBuffer.moved, so a view is
a new buffer over the same bytes), copies to and from other devices (the host step of Tensor.to reads
`to_numpy`, the bytes as values), and writes of whole values (Tensor.assign, t[...] = v: `write`). Any
other op raises a DiskError naming it. Pages are read only when touched, so a tensor of a large weight
file costs nothing until it is copied to a compute device.

Tensor.empty(..., device="disk:f") creates the file, or extends it to the tensor's size; a file that
changed on disk since it was mapped (replaced, grown, shrunk) is mapped again for new tensors, while
tensors made before keep the mapping they were made from.
"""

from __future__ import annotations

import mmap
import os
import weakref

import numpy as np

from tgrad.device import Buffer, Runtime
from tgrad.dtype import DType, from_bytes
from tgrad.errors import DiskError
from tgrad.graph import Op


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


class DiskBuffer(Buffer):
    """`size` elements of `dtype` in a file: `data` is their bytes, a uint8 view into the mapping. Not
    device memory, so not counted in Stats."""

    def __init__(self, device: str, size: int, dtype: DType, data: np.ndarray):
        self.device, self.size, self.dtype, self.data = device, size, dtype, data

    def __del__(self) -> None:
        pass

    def elements(self, shape: tuple[int, ...]) -> np.ndarray:
        """The bytes as an array of `shape` whose items are this dtype's elements (numpy void items of its
        size): numpy's views of it are exactly the views of the file's bytes."""
        return self.data.view(np.dtype(f"V{self.dtype.itemsize}")).reshape(shape)

    def moved(self, op: Op, arg, shape: tuple[int, ...], new: tuple[int, ...]) -> DiskBuffer:
        """The buffer of a movement op of this one (of `shape`; the result has shape `new`): the same
        bytes, when the view is one contiguous range of them; else a DiskError."""
        arr = self.elements(shape)
        if op is Op.RESHAPE:
            out = arr.reshape(new)
        elif op is Op.SHRINK:
            out = arr[tuple(slice(b, e) for b, e in arg)]
        elif op is Op.PERMUTE:
            out = arr.transpose(arg)
        elif op is Op.FLIP:
            out = np.flip(arr, arg)
        elif op is Op.EXPAND:
            out = np.broadcast_to(arr, new)
        else:  # PAD: the border is not in the file
            out = None
        if out is None or not out.flags.c_contiguous or out.shape != new:
            padded = "; a padded one has elements the file has not" if op is Op.PAD else ""
            raise DiskError(f"{op.name} {arg} of a disk tensor of shape {shape} ({self.device}): a "
                            "non-contiguous view is not supported on a disk device (a view there is one "
                            f"contiguous range of the file{padded}); copy it to a compute device first: "
                            "t.to('CPU')")
        return DiskBuffer(self.device, _prod(new), self.dtype, out.reshape(-1).view(np.uint8))

    def retyped(self, dtype: DType) -> DiskBuffer:
        """The same bytes read as `dtype` (a bitcast)."""
        return DiskBuffer(self.device, self.data.size // dtype.itemsize, dtype, self.data)

    def write(self, raw: np.ndarray) -> None:
        """Write bytes (to_bytes' layout, this buffer's length) into the file."""
        try:
            self.data[...] = raw
        except ValueError as e:  # a read-only mapping
            raise DiskError(f"cannot write into {self.device}: the file is mapped read-only ({e})") from e


class DiskRuntime(Runtime):
    """One file's device: its mapping (made, or made again, by `mapped`) and DiskBuffers over it."""

    def __init__(self, name: str):
        self.name = name
        self.path = name[len("DISK:"):]
        super().__init__()
        # the mapping, weakly: its buffers hold it, and it goes (with the file's space, where the file was
        # deleted) when the last of them does
        self._mapping: weakref.ref | None = None
        self.identity: tuple | None = None  # (device, inode, size) of the file when mapped

    @property
    def mapping(self) -> np.ndarray | None:
        """The file's mapping, while a buffer over it lives."""
        return None if self._mapping is None else self._mapping()

    def supports(self, dtype: DType) -> bool:
        return True  # bytes of any dtype

    def release(self, buf: DiskBuffer) -> None:
        """Take the pages under buf out of this process's resident memory (MADV_DONTNEED; the mapping is
        shared, so nothing written is lost and the bytes are read from the file again if touched): a
        loader that copied them to a compute device does not hold the file and the copy at once."""
        mapping = self.mapping
        mm = getattr(mapping, "_mmap", None)  # (numpy's memmap keeps its mmap there)
        if mm is None or not hasattr(mm, "madvise") or buf.data.size == 0:
            return
        offset = buf.data.ctypes.data - mapping.ctypes.data
        if not 0 <= offset <= len(mm) - buf.data.size:
            return  # (not a view of this mapping: one made before the file changed)
        start = offset - offset % mmap.PAGESIZE
        mm.madvise(mmap.MADV_DONTNEED, start, offset + buf.data.size - start)

    def buffer_limit(self) -> tuple[int, str]:
        return 2**63 - 1, "the file system's limit"

    def mapped(self, nbytes: int) -> np.ndarray:
        """The file's mapping, at least `nbytes` long: the file is created, or extended with zeros, where
        it is shorter (a read-only file that is shorter raises)."""
        if not os.path.exists(self.path):
            open(self.path, "xb").close()
        st = os.stat(self.path)
        writable = os.access(self.path, os.W_OK)
        if st.st_size < nbytes:
            if not writable:
                raise DiskError(f"{self.name}: the file is {st.st_size} bytes and read-only; a tensor of "
                                f"{nbytes} bytes does not fit in it")
            os.truncate(self.path, nbytes)
            st = os.stat(self.path)
        if st.st_size == 0:  # (nothing to map: numpy refuses an empty file)
            return np.empty(0, np.uint8)
        identity, mapping = (st.st_dev, st.st_ino, st.st_size), self.mapping
        if mapping is None or identity != self.identity:
            mapping = np.memmap(self.path, np.uint8, mode="r+" if writable else "r")
            self._mapping, self.identity = weakref.ref(mapping), identity
        return mapping

    def alloc(self, size: int, dtype: DType) -> DiskBuffer:
        """`size` elements of `dtype` at the start of the file."""
        nbytes = size * dtype.itemsize
        return DiskBuffer(self.name, size, dtype, self.mapped(nbytes)[:nbytes])

    def from_numpy(self, array: np.ndarray) -> Buffer:
        raise DiskError(f"host data cannot be put on {self.name} as a new tensor: a disk device holds a "
                        "file's bytes and computes nothing. Write into the file with "
                        "Tensor.empty(shape, dtype=..., device='disk:...').assign(values), or "
                        "Tensor(values).to('disk:...')")

    def to_numpy(self, buf: Buffer) -> np.ndarray:
        return from_bytes(buf.data, buf.dtype)

    def render(self, kernel):
        raise DiskError(f"{self.name} runs no kernels; copy the tensor to a compute device first")

    def compile(self, program, kernel):
        raise DiskError(f"{self.name} runs no kernels; copy the tensor to a compute device first")
