"""The OpenCL runtime (CL, and QCOM for Qualcomm Adreno) through pyopencl; kernels come from emit_opencl.

Compiled programs are kept on disk (`TGRAD_CACHE/opencl`) as the driver's binaries. The new kernels of one
schedule are built as one program (`CLRuntime.prepare`): PoCL spends most of a small kernel's build on
work it does once per program.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np

from tgrad import config, emit_opencl
from tgrad.cachefiles import write_atomic
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
        # a CPU device (PoCL) runs a work-group's items one after another in a thread: reductions get
        # independent accumulators per work-item instead of groups (DeviceProps.cpu_device)
        cpu = bool(self.device.type & cl.device_type.CPU)
        vector = max(1, int(self.device.preferred_vector_width_float))  # (PoCL on AVX-512: 16)
        self.props = DeviceProps(self.name, compute_units=int(self.device.max_compute_units),
                                 max_local=self.max_local, cpu_device=cpu, sum_lanes=max(8, 2 * vector))
        if self.dialect.native_half and "cl_khr_fp16" not in self.exts:
            self.dialect = replace(self.dialect, native_half=False)
        self.built: dict[str, object] = {}  # source hash -> cl.Kernel (one per program, reused)
        self.rendered: dict[Kernel, Program] = {}  # rendered by prepare(), not compiled yet
        self.batches: dict[str, object] = {}  # hash of a batch's source -> its cl.Program (loaded once)
        self.programs_built = 0  # OpenCL programs built from source (the tests count them)
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
        hit = self.rendered.pop(kernel, None)
        return hit if hit is not None else emit_opencl.render(kernel, self.dialect, max_local=self.max_local)

    def prepare(self, kernels: list, groups: list = ()) -> None:
        """Before a schedule runs: build the kernels that are neither built nor in the disk cache as one
        OpenCL program. PoCL's cost per program (its front end parses the whole OpenCL C header) is most
        of a small kernel's build, and a schedule often brings several new kernels. Each kernel's cache
        entry is then a reference into that program's binary (`_cache_paths`). A kernel that fails to
        render or build here is left to its own build at its first run, whose error names it."""
        todo: dict[str, tuple[str, str]] = {}  # digest -> (name in the batch, source)
        for kernel in kernels:
            optimized = self.optimize(kernel)
            try:
                program = self.rendered[optimized] = self.render(optimized)
            except Exception:  # (raised again where runner() renders it)
                continue
            digest = self._digest(program.source)
            signature = f"{self.dialect.kernel_prefix} {program.name}("
            if digest in self.built or digest in todo or program.source.count(signature) != 1:
                continue
            binary, ref = self._cache_paths(digest)
            if binary is not None and (binary.exists() or ref.exists()):
                continue
            name = f"{program.name}_b{len(todo)}"  # (two kernels of a schedule may share a name)
            todo[digest] = name, program.source.replace(signature, f"{self.dialect.kernel_prefix} {name}(")
        if len(todo) < 2:
            return
        source = "\n".join(src for _, src in todo.values())
        prg = self.cl.Program(self.ctx, source)
        try:
            self._compile(prg)
        except self.cl.Error:
            return
        for digest, (name, _) in todo.items():
            self.built[digest] = self.cl.Kernel(prg, name)
        batch = self._digest(source)
        binary, _ = self._cache_paths(batch)
        if binary is not None and self.save_binary(prg, binary):
            for digest, (name, _) in todo.items():
                write_atomic(self._cache_paths(digest)[1], f"{batch} {name}".encode())

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

    def _digest(self, source: str) -> str:
        return hashlib.sha256((self.id + "\n" + source).encode()).hexdigest()[:24]

    def _cache_paths(self, digest: str) -> tuple:
        """(binary, reference) disk-cache paths of a program: its own binary, or for a kernel built with
        others (prepare) a reference 'batch-digest name-in-batch' to the binary of their program."""
        folder = cache_dir()
        if folder is None:
            return None, None
        return folder / "opencl" / f"{digest}.bin", folder / "opencl" / f"{digest}.ref"

    def _load_binary(self, path):
        """The program of a cached binary, or None when it is missing, damaged or foreign (a stale driver).
        Only a file whose checksum matches reaches the driver: PoCL kills the process on a truncated one."""
        try:
            data = path.read_bytes()
        except OSError:
            return None
        head, digest, binary = data[: len(_SEAL)], data[len(_SEAL) : len(_SEAL) + 32], data[len(_SEAL) + 32 :]
        if head != _SEAL or hashlib.sha256(binary).digest() != digest:
            return None
        try:
            return self.cl.Program(self.ctx, [self.device], [binary]).build()
        except self.cl.Error:
            return None

    def _from_reference(self, ref):
        """The cl.Kernel a reference file names (prepare wrote it), or None when it or its batch's binary
        is missing or damaged (the kernel is then built again from its own source)."""
        try:
            batch, name = ref.read_text().split()
        except (OSError, ValueError):
            return None
        prg = self.batches.get(batch)
        if prg is None:
            prg = self._load_binary(self._cache_paths(batch)[0])
            if prg is None:
                return None
            self.batches[batch] = prg
        try:
            return self.cl.Kernel(prg, name)
        except self.cl.Error:
            return None

    def _compile(self, prg) -> None:
        """Build a program from its source (cache_dir=False: tgrad keeps its own cache of binaries)."""
        self.programs_built += 1
        prg.build(options=["-cl-std=CL1.2"], cache_dir=False)

    def build(self, name: str, source: str):
        cl = self.cl
        digest = self._digest(source)
        knl = self.built.get(digest)
        if knl is not None:
            return knl
        path, ref = self._cache_paths(digest)
        prg = None
        if path is not None and path.exists():
            prg = self._load_binary(path)  # (None: a stale or foreign binary, built from source below)
        elif ref is not None and ref.exists():
            knl = self._from_reference(ref)
            if knl is not None:
                self.built[digest] = knl
                return knl
        if prg is None:
            prg = cl.Program(self.ctx, source)
            try:
                self._compile(prg)
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

    def save_binary(self, prg, path) -> bool:
        """Write the program's binary to the disk cache; False where the driver hands out none."""
        try:
            binary = prg.get_info(self.cl.program_info.BINARIES)[0]
        except self.cl.Error:
            return False
        if binary:
            binary = bytes(binary)
            write_atomic(path, _SEAL + hashlib.sha256(binary).digest() + binary)
        return bool(binary)


_SEAL = b"tgrad-cl-binary-1\n"  # what a cached binary starts with, then the sha256 of the rest


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
