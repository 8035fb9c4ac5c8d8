"""The OpenCL runtime (CL, and QCOM for Qualcomm Adreno) through pyopencl; kernels come from emit_opencl."""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace

import numpy as np

from tgrad import config, emit_opencl
from tgrad.device import Buffer, Runner, Runtime, cache_dir
from tgrad.dtype import DType, dtypes
from tgrad.emit_cstyle import kernel_dtypes
from tgrad.emit_opencl import OPENCL, QCOM
from tgrad.errors import DeviceError, DTypeError, KernelError, byte_size, numbered
from tgrad.fuse import Kernel
from tgrad.opt import DeviceProps
from tgrad.program import Program
from tgrad.runtime.llvm_order import load_triton_first


def _import_pyopencl():
    load_triton_first()  # before an OpenCL driver (PoCL, Mesa's) loads its LLVM (see llvm_order)
    try:
        import pyopencl as cl
    except ImportError as e:
        raise DeviceError("the CL device needs pyopencl: pip install pyopencl (or tgrad[opencl])") from e
    return cl


# OpenCL error codes of a failed allocation: MEM_OBJECT_ALLOCATION_FAILURE, OUT_OF_RESOURCES,
# OUT_OF_HOST_MEMORY, INVALID_BUFFER_SIZE (beyond CL_DEVICE_MAX_MEM_ALLOC_SIZE)
_NO_MEMORY = (-4, -5, -6, -61)


class CLRuntime(Runtime):
    """OpenCL through pyopencl: the first GPU found, else the first device of any kind (PoCL: a CPU)."""

    name = "CL"
    dialect = OPENCL

    def __init__(self):
        super().__init__()
        cl = self.cl = _import_pyopencl()
        self.device = self.pick_device(cl)
        self.ctx = cl.Context([self.device])
        self.queue = cl.CommandQueue(self.ctx)
        self.exts = set(self.device.extensions.split())
        # work-items per work-group: the group limit, and the limit along dimension 0 (launches are 1-D)
        self.max_local = min(int(self.device.max_work_group_size), int(self.device.max_work_item_sizes[0]))
        # tuning defaults (DeviceProps' own): work-groups of 128, groups of 128 per output for reductions of
        # 256+ elements into <= 2048 outputs, 4x4 register tiles (PoCL on 2 cores: opt/heuristic.py)
        self.props = DeviceProps(self.name, compute_units=int(self.device.max_compute_units),
                                 max_local=self.max_local)
        if self.dialect.native_half and "cl_khr_fp16" not in self.exts:
            self.dialect = replace(self.dialect, native_half=False)
        self.built: dict[str, object] = {}  # source hash -> cl.Kernel (one per program, reused)
        self.id = f"{self.device.platform.name}|{self.device.name}|{self.device.driver_version}"

    def pick_device(self, cl):
        try:
            platforms = cl.get_platforms()
        except cl.Error:
            platforms = []
        found = [d for p in platforms for d in p.get_devices()]
        if not found:
            raise DeviceError("no OpenCL platform found: install pocl-opencl-icd or a GPU driver")
        gpus = [d for d in found if d.type & cl.device_type.GPU]
        return (gpus or found)[0]

    def supports(self, dtype: DType) -> bool:
        return super().supports(dtype) and (dtype != dtypes.float64 or "cl_khr_fp64" in self.exts)

    def alloc(self, size: int, dtype: DType) -> Buffer:
        if not self.supports(dtype):
            ext = " (cl_khr_fp64)" if dtype == dtypes.float64 else ""
            raise DTypeError(f"OpenCL device {self.device.name} has no {dtype.name}{ext}; use float32")
        try:
            mem = self.cl.Buffer(self.ctx, self.cl.mem_flags.READ_WRITE, max(1, size * dtype.itemsize))
        except self.cl.Error as e:  # the driver's allocation failures, as the MemoryError realize names
            if isinstance(e, self.cl.MemoryError) or getattr(e, "code", None) in _NO_MEMORY:
                raise MemoryError(f"OpenCL {self.device.name}: {e}") from e
            raise
        return Buffer(self.name, size, dtype, mem)

    def buffer_limit(self) -> tuple[int, str]:
        if self.max_buffer is None:
            most = int(self.device.max_mem_alloc_size)
            self.max_buffer = (most, f"the largest buffer OpenCL device {self.device.name} allocates "
                                     f"(CL_DEVICE_MAX_MEM_ALLOC_SIZE, {byte_size(most)})")
        return self.max_buffer

    def from_numpy(self, array: np.ndarray) -> Buffer:
        flat = np.ascontiguousarray(array).reshape(-1)
        buf = self.alloc(flat.size, dtypes.from_any(flat.dtype))
        if flat.size:
            host = flat.view(np.uint8) if flat.dtype == np.bool_ else flat
            self.cl.enqueue_copy(self.queue, buf.data, host)
        return buf

    def to_numpy(self, buf: Buffer) -> np.ndarray:
        if not isinstance(buf.data, self.cl.Buffer):
            return buf.data
        host = np.empty(buf.size, np.uint8 if buf.dtype == dtypes.bool else buf.dtype.np)
        if buf.size:
            self.cl.enqueue_copy(self.queue, host, buf.data)
        return host.view(np.bool_) if buf.dtype == dtypes.bool else host

    def synchronize(self) -> None:
        self.queue.finish()

    def render(self, kernel: Kernel) -> Program:
        if not self.supports(dtypes.float64) and dtypes.float64 in kernel_dtypes(kernel):
            raise DTypeError(
                f"kernel {kernel.name} uses float64 but OpenCL device {self.device.name} has no "
                "cl_khr_fp64; use float32"
            )
        return emit_opencl.render(kernel, self.dialect, max_local=self.max_local)

    def compile(self, program: Program, kernel: Kernel) -> Runner:
        source = program.source
        knl = self.build(kernel.name, source)
        (gsize,), (lsize,) = program.global_size, program.local_size
        cl, queue = self.cl, self.queue

        def run(out: Buffer, *inputs: Buffer) -> None:
            try:
                knl.set_args(out.data, *[b.data for b in inputs])
                cl.enqueue_nd_range_kernel(queue, knl, (gsize,), (lsize,))
            except Exception as e:
                raise KernelError(
                    f"OpenCL kernel {kernel.name} failed to run on {self.device.name}: "
                    f"{type(e).__name__}: {e}\n{numbered(source)}"
                ) from e

        return Runner(program, run, self.name)

    def build(self, name: str, source: str):
        cl = self.cl
        digest = hashlib.sha256((self.id + "\n" + source).encode()).hexdigest()[:24]
        knl = self.built.get(digest)
        if knl is not None:
            return knl
        folder = cache_dir()
        path = folder / "opencl" / f"{digest}.bin" if folder is not None else None
        prg = None
        if path is not None and path.exists():
            try:
                prg = cl.Program(self.ctx, [self.device], [path.read_bytes()]).build()
            except cl.Error:
                prg = None  # a stale or foreign binary: build from source below
        if prg is None:
            prg = cl.Program(self.ctx, source)
            try:  # cache_dir=False: tgrad keeps its own cache of binaries
                prg.build(options=["-cl-std=CL1.2"], cache_dir=False)
            except cl.Error as e:
                log = self.build_log(prg) or str(e)
                raise KernelError(
                    f"OpenCL kernel {name} failed to build on {self.device.name}:\n{numbered(source)}\n"
                    f"--- driver log ---\n{log.strip()}"
                ) from e
            if path is not None:
                self.save_binary(prg, path)
        knl = self.built[digest] = cl.Kernel(prg, name)
        return knl

    def build_log(self, prg) -> str:
        try:
            return prg.get_build_info(self.device, self.cl.program_build_info.LOG)
        except self.cl.Error:
            return ""

    def save_binary(self, prg, path) -> None:
        try:
            binary = prg.get_info(self.cl.program_info.BINARIES)[0]
        except self.cl.Error:
            return  # this driver does not hand out binaries
        if binary:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(bytes(binary))
            os.replace(tmp, path)


class QCOMRuntime(CLRuntime):
    """Qualcomm Adreno through its OpenCL driver: the QCOM dialect (native half where cl_khr_fp16 exists).

    With no Adreno device, QCOM_FALLBACK=1 runs the dialect on whatever OpenCL device there is."""

    name = "QCOM"
    dialect = QCOM

    def pick_device(self, cl):
        dev = super().pick_device(cl)
        found = [d for p in cl.get_platforms() for d in p.get_devices()]
        adreno = [d for d in found if "qualcomm" in (d.vendor + d.name).lower() or "adreno" in d.name.lower()]
        if adreno:
            return adreno[0]
        if config.on("QCOM_FALLBACK"):
            return dev
        raise DeviceError(
            f"no Qualcomm Adreno OpenCL device (found: {', '.join(d.name for d in found)}); "
            "set QCOM_FALLBACK=1 to run the QCOM dialect on it anyway"
        )
