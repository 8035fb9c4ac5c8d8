"""The WEBGPU runtime: WGSL from emit_wgsl, run through wgpu-native on the first adapter found."""

from __future__ import annotations

import hashlib
import math
import os
import tempfile

import numpy as np

from tgrad import config, emit_wgsl, emit_wgsl_int64
from tgrad.device import Buffer, Runner, Runtime
from tgrad.dtype import DType, dtypes
from tgrad.emit_cstyle import INT32_MAX
from tgrad.emit_wgsl import Target
from tgrad.errors import DeviceError, DTypeError, KernelError, OutOfMemoryError, byte_size, numbered
from tgrad.fuse import IDX_DT, INF, Kernel
from tgrad.loop_axes import nodes
from tgrad.opt import DeviceProps
from tgrad.program import Program
from tgrad.runtime.llvm_order import load_triton_first


def _private_runtime_dir() -> None:
    """Mesa's Vulkan loader warns when XDG_RUNTIME_DIR is unset or unusable: give it a private one."""
    current = config.get("XDG_RUNTIME_DIR")
    if current and os.path.isdir(current) and os.access(current, os.W_OK):
        return
    path = os.path.join(tempfile.gettempdir(), f"tgrad-xdg-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    if os.stat(path).st_uid == os.getuid():
        os.chmod(path, 0o700)
        config.put("XDG_RUNTIME_DIR", path)


MESA_MAX_LOOP = 65534  # loop iterations one invocation runs on Mesa llvmpipe (65535; one kept spare)


def max_loop(info: dict) -> int | None:
    """The loop limit of an adapter (its GPUAdapterInfo): Mesa's software rasterizer, llvmpipe over OpenGL and
    lavapipe over Vulkan (both report the device "llvmpipe (LLVM ...)"), stops loops past MESA_MAX_LOOP."""
    names = " ".join(str(info.get(k, "")) for k in ("vendor", "device", "description")).lower()
    return MESA_MAX_LOOP if "llvmpipe" in names or "lavapipe" in names else None


def device_props(limits: dict, info: dict | None = None) -> DeviceProps:
    """What the optimizer knows of a WebGPU adapter with these limits (and GPUAdapterInfo). Workgroups of 64
    (a multiple of every vendor's SIMD width, within WebGPU's default limit of 256); tree reductions of 256
    invocations for 256+ elements into <= 8192 outputs (bools too: the WGSL renderer reduces them in u32
    workgroup memory); the WGSL renderer has no register tiles. A software adapter: workgroups of 256, and
    the cooperation rules of DeviceProps.cpu_backed."""
    local = limits["max-compute-invocations-per-workgroup"]
    local = min(local, limits.get("max-compute-workgroup-size-x", local))
    # a software adapter (Mesa's lavapipe / llvmpipe: adapter type "CPU") runs work-groups as loops on the
    # host's cores: fewer cooperating invocations, bigger work-groups (DeviceProps.cpu_backed)
    cpu = str((info or {}).get("adapter_type", "")).upper() == "CPU"
    return DeviceProps("WEBGPU", max_local=local,
                       max_groups_per_dim=limits["max-compute-workgroups-per-dimension"],
                       preferred_local=256 if cpu else 64, register_tiles=1, group_size=256,
                       group_max_outputs=8192, group_bool=True, max_loop=max_loop(info or {}), cpu_backed=cpu)


def _check_index_range(kernel: Kernel) -> None:
    """WGSL indexes with 32-bit integers (emit_wgsl): a kernel whose loops or index arithmetic go past
    2**31 - 1 would wrap (or fail validation) there, so it raises a DeviceError naming the limit. Index
    bounds that are not known (an index loaded from a tensor) are left to the loads' bounds checks."""
    limit = f"more than the 32-bit integers WGSL indexes with hold ({INT32_MAX})"
    advice = "reduce one axis at a time, split the tensor, or use another device (CPU, CL)"
    parallel, reduce = math.prod(kernel.global_shape), math.prod(kernel.reduce_shape)
    for what, count in (("computes", parallel), ("reduces over", reduce)):
        if count > INT32_MAX:
            raise DeviceError(f"kernel {kernel.name} {what} {count} elements, {limit}; {advice}")
    roots = [kernel.out_index]
    roots += [s for e in nodes(kernel.expr, kernel.reduce_expr) if e.op == "LOAD" for s in e.srcs]
    for e in nodes(*roots):
        if e.dtype == IDX_DT and e.op != "LOAD" and (INT32_MAX < e.vmax < INF or -INF < e.vmin < -INT32_MAX):
            raise DeviceError(f"kernel {kernel.name} computes indices up to {max(e.vmax, -e.vmin)}, {limit}; "
                              f"{advice}")


NO_ADAPTER = (
    "no WebGPU adapter found; install a Vulkan driver (Debian/Ubuntu: apt-get install mesa-vulkan-drivers "
    "libvulkan1 gives the llvmpipe CPU adapter)"
)


class WebGPURuntime(Runtime):
    """Kernels rendered as WGSL and run through wgpu-native on the first adapter found."""

    name = "WEBGPU"

    def __init__(self, int64: bool | None = None):
        """int64: compute int64 as WGSL i64 where the adapter has shader-int64 (default: no, int64 is
        held as int32; WEBGPU_INT64=1 turns it on). Mesa 22.3's lavapipe miscompiles i64 comparisons
        of converted 32-bit values with constants, so the default is the int32 rule."""
        super().__init__()
        load_triton_first()  # before wgpu opens Mesa's LLVM (see llvm_order)
        try:
            import wgpu
        except ImportError as e:
            raise DeviceError("the WEBGPU device needs wgpu: pip install wgpu (or tgrad[webgpu])") from e
        self.wgpu = wgpu
        _private_runtime_dir()
        adapter = None
        for kwargs in ({"power_preference": "high-performance"}, {"force_fallback_adapter": True}):
            try:
                adapter = wgpu.gpu.request_adapter_sync(**kwargs)
            except Exception:  # wgpu raises RuntimeError or its own errors when nothing is found
                adapter = None
            if adapter is not None:
                break
        if adapter is None:
            raise DeviceError(NO_ADAPTER)
        features = set(adapter.features)
        if int64 is None:
            int64 = config.on("WEBGPU_INT64")
        has64 = "shader-int64" in features
        self.target = Target(int64 and has64, "shader-f64" in features and has64)
        wanted = [f for f in ("shader-int64", "shader-f64") if f in features]
        limits = adapter.limits
        keep = (
            "max-storage-buffer-binding-size",
            "max-buffer-size",
            "max-storage-buffers-per-shader-stage",
            "max-compute-workgroups-per-dimension",
            "max-compute-invocations-per-workgroup",
            "max-compute-workgroup-size-x",
        )
        self.adapter_info = adapter.info
        self.device = adapter.request_device_sync(
            required_features=wanted, required_limits={k: limits[k] for k in keep}
        )
        self.limits = {k: limits[k] for k in keep}
        self.props = device_props(self.limits, dict(adapter.info))
        self.pipelines: dict[str, tuple] = {}
        self.usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        self.fence = self.device.create_buffer(size=4, usage=self.usage)
        self.overflow = self.device.create_buffer(size=4, usage=self.usage)  # (emit_wgsl_int64's word)

    # buffers

    def nbytes(self, size: int, dtype: DType) -> int:
        raw = size * self.target.itemsize(dtype)
        return max(4, -(-raw // 4) * 4)

    def buffer_bytes(self, size: int, dtype: DType) -> int:
        return self.nbytes(size, dtype)

    def buffer_limit(self) -> tuple[int, str]:
        if self.max_buffer is None:  # a kernel binds each buffer whole
            most = min(self.limits["max-storage-buffer-binding-size"], self.limits["max-buffer-size"])
            self.max_buffer = (most, f"the largest storage buffer this WEBGPU adapter binds "
                                     f"({byte_size(most)}); split the tensor or use another device")
        return self.max_buffer

    def _fits(self, nbytes: int) -> None:
        limit, why = self.buffer_limit()
        if nbytes > limit:
            raise OutOfMemoryError(f"a buffer of {byte_size(nbytes)} is more than {why}")

    def supports(self, dtype: DType) -> bool:
        return super().supports(dtype) and (dtype != dtypes.float64 or self.target.float64)

    def alloc(self, size: int, dtype: DType) -> Buffer:
        self.target.check(dtype)
        self._fits(self.nbytes(size, dtype))
        try:
            handle = self.device.create_buffer(size=self.nbytes(size, dtype), usage=self.usage)
        except self.wgpu.GPUOutOfMemoryError as e:  # as the MemoryError realize names
            raise MemoryError(f"WEBGPU: {e}") from e
        return Buffer(self.name, size, dtype, handle)

    def from_numpy(self, array: np.ndarray) -> Buffer:
        flat = np.ascontiguousarray(array).reshape(-1)
        dtype = dtypes.from_any(flat.dtype)
        flat = flat.astype(dtype.np, copy=False)  # native byte order: the raw bytes are uploaded
        self.target.check(dtype)
        if dtype == dtypes.int64 and not self.target.int64:
            if flat.size and (flat.min() < -(2**31) or flat.max() >= 2**31):
                raise DTypeError(
                    "this WEBGPU adapter has no shader-int64, so int64 tensors are held as int32, and "
                    f"these values ({flat.min()}..{flat.max()}) do not fit; use smaller values or another "
                    "device"
                )
            flat = flat.astype(np.int32)
        raw = flat.tobytes()
        raw += bytes(self.nbytes(flat.size, dtype) - len(raw))
        self._fits(len(raw))
        try:
            handle = self.device.create_buffer_with_data(data=raw, usage=self.usage)
        except self.wgpu.GPUOutOfMemoryError as e:
            raise MemoryError(f"WEBGPU: {e}") from e
        return Buffer(self.name, flat.size, dtype, handle)

    def to_numpy(self, buf: Buffer) -> np.ndarray:
        raw = self.device.queue.read_buffer(buf.data)
        storage = np.int32 if buf.dtype == dtypes.int64 and not self.target.int64 else buf.dtype.np
        return np.frombuffer(raw, dtype=storage, count=buf.size).astype(buf.dtype.np, copy=True)

    def synchronize(self) -> None:
        self.device.queue.read_buffer(self.fence)  # a read waits for all submitted work

    # programs

    def render(self, kernel: Kernel) -> Program:
        _check_index_range(kernel)
        return emit_wgsl.render(kernel, self.target, self.limits["max-compute-workgroups-per-dimension"])

    def compile(self, program: Program, kernel: Kernel) -> Runner:
        source = program.source
        n_in = len(kernel.in_dtypes)
        checked = program.launch.get("overflow", False)  # binds the word its overflow checks set
        if n_in + 1 + checked > self.limits["max-storage-buffers-per-shader-stage"]:
            word = " (and binds an int64 overflow word)" if checked else ""
            raise KernelError(
                f"kernel {kernel.name} reads {n_in} buffers{word}; this WEBGPU adapter binds at most "
                f"{self.limits['max-storage-buffers-per-shader-stage']} per shader; realize() a part earlier"
            )
        digest = hashlib.sha256(source.encode()).hexdigest()
        cached = self.pipelines.get(digest)
        if cached is None:
            cached = self.pipelines[digest] = self.build(program, n_in, checked)
        pipeline, layout = cached
        groups = program.global_size

        def run(out: Buffer, *inputs: Buffer) -> None:
            try:
                bits = launch(out, *inputs)
            except self.wgpu.GPUOutOfMemoryError as e:  # (a copy of a buffer read and written)
                raise MemoryError(f"WEBGPU: {e}") from e
            except Exception as e:
                raise KernelError(
                    f"kernel {kernel.name} failed to run: {type(e).__name__}: {e}\n{numbered(source)}"
                ) from e
            if bits:
                raise emit_wgsl_int64.overflow_error(kernel.name, bits)

        def launch(out: Buffer, *inputs: Buffer) -> int:
            """Runs the kernel; the bits its overflow checks set (0 for a kernel without checks)."""
            encoder = self.device.create_command_encoder()
            backup = None
            if checked:  # out as it was, put back if a check fires: an assign's target is not half-written
                encoder.clear_buffer(self.overflow)
                backup = self.device.create_buffer(size=out.data.size, usage=self.usage)
                encoder.copy_buffer_to_buffer(out.data, 0, backup, 0, out.data.size)
            handles = []
            for b in inputs:
                handle = b.data
                if handle is out.data:  # read and written in one dispatch: WebGPU forbids; read a copy
                    nbytes = self.nbytes(b.size, b.dtype)
                    handle = self.device.create_buffer(size=nbytes, usage=self.usage)
                    encoder.copy_buffer_to_buffer(b.data, 0, handle, 0, nbytes)
                handles.append(handle)
            bind = self.device.create_bind_group(
                layout=layout,
                entries=[
                    {"binding": i, "resource": {"buffer": h}}
                    for i, h in enumerate([out.data, *handles, *([self.overflow] if checked else [])])
                ],
            )
            cpass = encoder.begin_compute_pass()
            cpass.set_pipeline(pipeline)
            cpass.set_bind_group(0, bind)
            cpass.dispatch_workgroups(*groups)
            cpass.end()
            self.device.queue.submit([encoder.finish()])
            if backup is None:
                return 0
            bits = int(np.frombuffer(self.device.queue.read_buffer(self.overflow), np.uint32)[0])
            if bits:
                encoder = self.device.create_command_encoder()
                encoder.copy_buffer_to_buffer(backup, 0, out.data, 0, out.data.size)
                self.device.queue.submit([encoder.finish()])
            return bits

        return Runner(program, run, self.name)

    def build(self, program: Program, n_in: int, checked: bool = False) -> tuple:
        """The compute pipeline of a program and its bind group layout (output, then n_in inputs, then
        where `checked` the word its overflow checks set)."""
        wgpu = self.wgpu
        kinds = ["storage"] + ["read-only-storage"] * n_in + ["storage"] * checked
        entries = [{"binding": i, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": kind}}
                   for i, kind in enumerate(kinds)]
        try:
            module = self.device.create_shader_module(code=program.source)
            layout = self.device.create_bind_group_layout(entries=entries)
            pipeline = self.device.create_compute_pipeline(
                layout=self.device.create_pipeline_layout(bind_group_layouts=[layout]),
                compute={"module": module, "entry_point": program.name},
            )
        except Exception as e:
            message = f"kernel {program.name} failed to build: {e}\n{numbered(program.source)}"
            raise KernelError(message) from e
        return pipeline, layout
