"""OpenCL C and Metal Shading Language (the CL, QCOM and METAL devices): dialect tables of the shared C-style
lowering in emit_cstyle.py, the launch rule, and the runtimes.

Launch rule (the same for every dialect here): 1-D launch; for one work-item per output, local size
min(LOCAL_SIZE, N, device maximum) and global size N rounded up to a multiple of it; for a group reduction
(at least GROUP_REDUCE_MIN reduced elements into at most GROUP_REDUCE_MAX_OUT outputs, not bool), one
work-group of GROUP_SIZE work-items per output; matmul-shaped reductions get UPCAST x UPCAST register tiles.
Measured on PoCL (2 busy cores): sum over axis 1 of (8, 100000) 3 ms with group reduction, 28 ms with
one work-item per row; a 256x256 matmul 287 ms with group reduction, 53 ms with one work-item per
output, 2.4 ms with 4x4 register tiles.

float16: in the OpenCL dialect buffers hold `half` and values are loaded and stored with
`vload_half`/`vstore_half_rte` and computed in float (no `cl_khr_fp16` needed); a CAST to float16
inside a kernel rounds through `vstore_half_rte`. Metal (and QCOM on a device with `cl_khr_fp16`)
compute in native `half`; half sums accumulate in float. bool buffers are stored as `uchar`.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
from dataclasses import replace

import numpy as np

from tgrad import emit_cstyle
from tgrad.device import Buffer, Device, Program, cache_dir
from tgrad.dtype import DType, dtypes
from tgrad.emit_cstyle import Dialect, _kernel_dtypes
from tgrad.errors import DeviceError, DTypeError, KernelError, numbered
from tgrad.fuse import Kernel

LOCAL_SIZE = 128  # work-items per work-group for element-wise kernels
GROUP_REDUCE_MIN = 256  # reduce length from which one work-group cooperates on each output...
GROUP_REDUCE_MAX_OUT = 2048  # ...when there are at most this many outputs (else they fill the device)
GROUP_SIZE = 128  # work-items per output in a group reduction (a power of two)
UPCAST = 4  # register tile: outputs per work-item along each tiled axis

OPENCL = Dialect(
    name="OpenCL",
    header="",
    kernel_prefix="__kernel void",
    out_qual="__global",
    in_qual="__global const",
    local_qual="__local",
    barrier="barrier(CLK_LOCAL_MEM_FENCE);",
    ids={"gid": "get_global_id(0)", "lid": "get_local_id(0)", "grp": "get_group_id(0)"},
    local_size=LOCAL_SIZE,
    upcast=UPCAST,
    group_min=GROUP_REDUCE_MIN,
    group_max_out=GROUP_REDUCE_MAX_OUT,
    group_size=GROUP_SIZE,
)
QCOM = replace(OPENCL, name="QCOM", native_half=True)  # Adreno: half is fast; used where cl_khr_fp16 exists
METAL = replace(
    OPENCL,
    name="Metal",
    header="#include <metal_stdlib>\nusing namespace metal;",
    kernel_prefix="kernel void",
    out_qual="device",
    in_qual="const device",
    local_qual="threadgroup",
    barrier="threadgroup_barrier(mem_flags::mem_threadgroup);",
    ids={"gid": "gid_", "lid": "lid_", "grp": "grp_"},
    id_params={
        "gid": "uint gid_ [[thread_position_in_grid]]",
        "lid": "uint lid_ [[thread_position_in_threadgroup]]",
        "grp": "uint grp_ [[threadgroup_position_in_grid]]",
    },
    buffer_attr=" [[buffer({})]]",
    native_half=True,
    has_double=False,
    extension_pragmas=False,
)
DIALECTS = {"CL": OPENCL, "QCOM": QCOM, "METAL": METAL}


def uses_group_reduce(kernel: Kernel) -> bool:
    """The launch rule: long reductions get one work-group per output element."""
    return emit_cstyle.uses_group_reduce(kernel, OPENCL)


def launch_sizes(kernel: Kernel, max_local: int) -> tuple[int, int]:
    """(global size, local size) of the 1-D launch of a rendered kernel."""
    d = OPENCL  # QCOM and METAL launch alike
    n = math.prod(kernel.global_shape) // d.upcast ** len(emit_cstyle.tiled_axes(kernel, d))
    if uses_group_reduce(kernel):
        if max_local < d.group_size:
            raise DeviceError(f"kernel {kernel.name} needs work-groups of {d.group_size}; the device allows "
                              f"{max_local}: lower tgrad.emit_opencl.GROUP_SIZE")
        return n * d.group_size, d.group_size
    local = max(1, min(d.local_size, n, max_local))
    return -(-n // local) * local, local


def render(kernel: Kernel, dialect: Dialect = OPENCL, name: str | None = None) -> str:
    """Source text of one kernel in a C-style dialect (OPENCL, QCOM or METAL)."""
    return emit_cstyle.render(kernel, dialect, name)


# ---------------------------------------------------------------------------------------------------
# OpenCL runtime (pyopencl)


class CLBuffer(Buffer):
    """A device allocation; `.data` is the pyopencl Buffer (bool is stored as uint8)."""

    def numpy(self) -> np.ndarray:
        from tgrad.device import get_device

        return get_device(self.device).to_numpy(self)


def _import_pyopencl():
    try:
        import pyopencl as cl
    except ImportError as e:
        raise DeviceError("the CL device needs pyopencl: pip install pyopencl (or tgrad[opencl])") from e
    return cl


class CLDevice(Device):
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
        self.max_local = int(self.device.max_work_group_size)
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

    def alloc(self, size: int, dtype: DType) -> Buffer:
        if dtype == dtypes.float64 and "cl_khr_fp64" not in self.exts:
            raise DTypeError(f"OpenCL device {self.device.name} has no float64 (cl_khr_fp64); use float32")
        mem = self.cl.Buffer(self.ctx, self.cl.mem_flags.READ_WRITE, max(1, size * dtype.itemsize))
        return CLBuffer(self.name, size, dtype, mem)

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

    def compile(self, kernel: Kernel) -> Program:
        if dtypes.float64 in _kernel_dtypes(kernel) and "cl_khr_fp64" not in self.exts:
            raise DTypeError(
                f"kernel {kernel.name} uses float64 but OpenCL device {self.device.name} has no "
                "cl_khr_fp64; use float32"
            )
        source = render(kernel, self.dialect)
        knl = self.build(kernel.name, source)
        gsize, lsize = launch_sizes(kernel, self.max_local)
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

        return Program(kernel.name, source, run, self.name)

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


class QCOMDevice(CLDevice):
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
        if os.environ.get("QCOM_FALLBACK") == "1":
            return dev
        raise DeviceError(
            f"no Qualcomm Adreno OpenCL device (found: {', '.join(d.name for d in found)}); "
            "set QCOM_FALLBACK=1 to run the QCOM dialect on it anyway"
        )


# ---------------------------------------------------------------------------------------------------
# Metal runtime (PyObjC, macOS only)


class MetalDevice(Device):
    """Apple GPUs through PyObjC's Metal bindings (pip install pyobjc-framework-Metal); macOS only.

    Written for macOS but not run in tgrad's CI (no Mac there): the rendered source is tested instead."""

    name = "METAL"

    def __init__(self):
        super().__init__()
        if sys.platform != "darwin":
            raise DeviceError(
                "the METAL device needs macOS with a Metal GPU; here use CL or CPU "
                "(tgrad.emit_opencl.render(kernel, METAL) still renders Metal source)"
            )
        try:
            import Metal
        except ImportError as e:
            raise DeviceError("the METAL device needs PyObjC: pip install pyobjc-framework-Metal") from e
        self.mtl = Metal
        self.dev = Metal.MTLCreateSystemDefaultDevice()
        if self.dev is None:
            raise DeviceError("no Metal GPU found")
        self.queue = self.dev.newCommandQueue()
        self.pending: list = []

    def alloc(self, size: int, dtype: DType) -> Buffer:
        if dtype == dtypes.float64:
            raise DTypeError("Metal has no float64; use float32")
        mem = self.dev.newBufferWithLength_options_(max(1, size * dtype.itemsize), 0)  # shared storage
        return Buffer(self.name, size, dtype, mem)

    def _view(self, buf: Buffer) -> np.ndarray:
        mem = buf.data.contents().as_buffer(max(1, buf.size * buf.dtype.itemsize))
        host = np.frombuffer(mem, np.uint8 if buf.dtype == dtypes.bool else buf.dtype.np, count=buf.size)
        return host.view(np.bool_) if buf.dtype == dtypes.bool else host

    def from_numpy(self, array: np.ndarray) -> Buffer:
        flat = np.ascontiguousarray(array).reshape(-1)
        buf = self.alloc(flat.size, dtypes.from_any(flat.dtype))
        self._view(buf)[:] = flat
        return buf

    def to_numpy(self, buf: Buffer) -> np.ndarray:
        if isinstance(buf.data, np.ndarray):
            return buf.data
        self.synchronize()
        return self._view(buf).copy()

    def synchronize(self) -> None:
        for cmd in self.pending:
            cmd.waitUntilCompleted()
        self.pending.clear()

    def compile(self, kernel: Kernel) -> Program:
        source = render(kernel, METAL)
        options = self.mtl.MTLCompileOptions.new()
        options.setFastMathEnabled_(False)  # keep nan/inf semantics (MAX propagates nan)
        lib, err = self.dev.newLibraryWithSource_options_error_(source, options, None)
        if lib is None:
            raise KernelError(
                f"Metal kernel {kernel.name} failed to build:\n{numbered(source)}\n--- log ---\n{err}"
            )
        fn = lib.newFunctionWithName_(kernel.name)
        pipeline, err = self.dev.newComputePipelineStateWithFunction_error_(fn, None)
        if pipeline is None:
            raise KernelError(f"Metal kernel {kernel.name}: pipeline failed: {err}")
        gsize, lsize = launch_sizes(kernel, int(pipeline.maxTotalThreadsPerThreadgroup()))
        mtl = self.mtl

        def run(out: Buffer, *inputs: Buffer) -> None:
            cmd = self.queue.commandBuffer()
            enc = cmd.computeCommandEncoder()
            enc.setComputePipelineState_(pipeline)
            for i, b in enumerate((out, *inputs)):
                enc.setBuffer_offset_atIndex_(b.data, 0, i)
            enc.dispatchThreadgroups_threadsPerThreadgroup_(
                mtl.MTLSizeMake(gsize // lsize, 1, 1), mtl.MTLSizeMake(lsize, 1, 1)
            )
            enc.endEncoding()
            cmd.commit()
            self.pending.append(cmd)

        return Program(kernel.name, source, run, self.name)

