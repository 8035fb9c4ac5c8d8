"""OpenCL C and Metal Shading Language (the CL, QCOM and METAL devices): dialect tables of the shared C-style
lowering in emit_cstyle.py and the launch rule (the runtimes: tgrad/runtime/opencl.py and metal.py).

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

import math
from dataclasses import replace

from tgrad import emit_cstyle
from tgrad.emit_cstyle import Dialect
from tgrad.errors import DeviceError
from tgrad.fuse import Kernel
from tgrad.program import Program

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


def render(kernel: Kernel, dialect: Dialect = OPENCL, name: str | None = None,
           max_local: int = 1024) -> Program:
    """One kernel in a C-style dialect (OPENCL, QCOM or METAL): its source (entry point `name`, default the
    kernel's) and 1-D launch (global and local size, for a device whose work-groups hold at most
    `max_local` items)."""
    global_size, local_size = launch_sizes(kernel, max_local)
    source = emit_cstyle.render(kernel, dialect, name)
    return Program(name or kernel.name, source, (global_size,), (local_size,))
