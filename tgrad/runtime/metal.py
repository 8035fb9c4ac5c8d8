"""The Metal runtime (Apple GPUs) through PyObjC; kernels come from emit_opencl's METAL dialect."""

from __future__ import annotations

import sys

import numpy as np

from tgrad import emit_opencl
from tgrad.device import Buffer, Runner, Runtime
from tgrad.dtype import DType, dtypes
from tgrad.emit_opencl import METAL
from tgrad.errors import DeviceError, DTypeError, KernelError, numbered
from tgrad.fuse import Kernel
from tgrad.program import Program


class MetalRuntime(Runtime):
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

    def supports(self, dtype: DType) -> bool:
        return super().supports(dtype) and dtype != dtypes.float64

    def alloc(self, size: int, dtype: DType) -> Buffer:
        if not self.supports(dtype):
            raise DTypeError(f"Metal has no {dtype.name}; use float32")
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

    def render(self, kernel: Kernel) -> Program:
        return emit_opencl.render(kernel, METAL)

    def compile(self, program: Program, kernel: Kernel) -> Runner:
        source = program.source
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
        gsize, lsize = emit_opencl.launch_sizes(kernel, int(pipeline.maxTotalThreadsPerThreadgroup()))
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

        return Runner(program, run, self.name)
