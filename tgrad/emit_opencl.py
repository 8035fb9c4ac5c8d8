"""OpenCL C and Metal Shading Language (the CL, QCOM and METAL devices): dialect tables of the shared C-style
lowering in emit_cstyle.py and the launch rule (the runtimes: tgrad/runtime/opencl.py and metal.py).

Launch (the same for every dialect here): 1-D; with a GROUP(n) opt, one work-group of n work-items per
output; else one work-item per output (per register tile), local size min(LOCAL, N, device maximum) and
global size N rounded up to a multiple of it. The opts come from tgrad/opt/ (the device's properties).

float16: in the OpenCL dialect buffers hold `half` and values are loaded and stored with
`vload_half`/`vstore_half_rte` and computed in float (no `cl_khr_fp16` needed); every inexact op with a
float16 result (fuse.NARROW_ROUNDED) and a CAST to float16 inside a kernel round through
`vstore_half_rte`. Metal (and QCOM on a device with `cl_khr_fp16`) compute in native `half`; half sums
accumulate in float. bool buffers are stored as `uchar`.
"""

from __future__ import annotations

import math
from dataclasses import replace

from tgrad import emit_cstyle
from tgrad.emit_cstyle import Dialect
from tgrad.errors import DeviceError
from tgrad.fuse import Kernel
from tgrad.opt.opts import OptOps, find, upcasts
from tgrad.program import Program

OPENCL = Dialect(
    name="OpenCL",
    header="",
    kernel_prefix="__kernel void",
    out_qual="__global",
    in_qual="__global const",
    local_qual="__local",
    barrier="barrier(CLK_LOCAL_MEM_FENCE);",
    ids={"gid": "get_global_id(0)", "lid": "get_local_id(0)", "grp": "get_group_id(0)"},
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


def launch_sizes(kernel: Kernel, max_local: int) -> tuple[int, int]:
    """(global size, local size) of the 1-D launch of a rendered kernel."""
    n = math.prod(kernel.global_shape) // math.prod(upcasts(kernel.opts).values())
    group = find(kernel.opts, OptOps.GROUP)
    if group:
        if max_local < group:
            raise DeviceError(f"kernel {kernel.name} has work-groups of {group} (its GROUP opt); this "
                              f"device allows {max_local}")
        return n * group, group
    local = max(1, min(find(kernel.opts, OptOps.LOCAL, 1), n, max_local))
    return -(-n // local) * local, local


def render(kernel: Kernel, dialect: Dialect = OPENCL, name: str | None = None,
           max_local: int = 1024) -> Program:
    """One kernel in a C-style dialect (OPENCL, QCOM or METAL): its source (entry point `name`, default the
    kernel's) and 1-D launch (global and local size, for a device whose work-groups hold at most
    `max_local` items)."""
    global_size, local_size = launch_sizes(kernel, max_local)
    source = emit_cstyle.render(kernel, dialect, name)
    return Program(name or kernel.name, source, (global_size,), (local_size,))
