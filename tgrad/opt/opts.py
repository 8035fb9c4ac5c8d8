"""Optimizations as data: what the optimizer decides for one kernel, and what a device says about itself.

A Kernel from fuse.py says what to compute; its `opts` say how (tinygrad's Opt list): how many outputs a
work-group or Triton program computes, register tiles, a cooperative reduction, the reduce loop's step.
An emitter renders exactly the opts it is given and adds none; a kernel without opts renders plainly (one
output per work-item, no tiles, no cooperation). Opts are part of the kernel's hash, so two choices for the
same computation are two compiled programs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class OptOps(Enum):
    LOCAL = "local"  # outputs per work-group (C-style: work-items, one output each; Triton: BLOCK_G)
    UPCAST = "upcast"  # register tile: `arg` outputs per work-item along global axis `axis` (C-style)
    GROUP = "group"  # `arg` work-items cooperate on each output's reduction (one work-group per output)
    REDUCE = "reduce"  # reduce elements per loop step (Triton: BLOCK_R; a tl.dot's BLOCK_K)
    DOT = "dot"  # matmul-shaped kernel as tl.dot tiles: BLOCK_N = `arg` (BLOCK_M is LOCAL)
    SPLIT = "split"  # the reduction in `arg` shares, partial results added by a second pass (Triton)
    WARPS = "warps"  # Triton's num_warps
    UNROLL = "unroll"  # the innermost reduce loop (a GROUP's strided loop) does `arg` steps per iteration


@dataclass(frozen=True)
class Opt:
    op: OptOps
    arg: int
    axis: int | None = None

    def __repr__(self) -> str:
        return f"{self.op.name}({self.arg}{'' if self.axis is None else f', axis={self.axis}'})"


def find(opts: tuple[Opt, ...], op: OptOps, default: int = 0) -> int:
    """The argument of the opt `op` in opts (at most one of each op but UPCAST), else default."""
    return next((o.arg for o in opts if o.op is op), default)


def upcasts(opts: tuple[Opt, ...]) -> dict[int, int]:
    """{axis: outputs per work-item along it} of the UPCAST opts."""
    return {o.axis: o.arg for o in opts if o.op is OptOps.UPCAST}


@dataclass(frozen=True)
class DeviceProps:
    """What a device's runtime tells the optimizer. Limits come from the driver where it reports them;
    the `preferred_*` and `group_*` fields are the device's tuning defaults, with the reason in its
    runtime (a BEAM search would time alternatives instead)."""

    name: str
    kind: str = "cstyle"  # which rules apply: "cstyle" (OpenCL, Metal, WGSL), "triton", "host" (CPU, NUMPY)
    compute_units: int = 1  # cores / compute units / streaming multiprocessors
    max_local: int = 1024  # work-items in one work-group at most
    max_groups_per_dim: int = 2**31 - 1  # work-groups per launch dimension at most
    preferred_local: int = 128  # work-items per work-group of one-output-per-item kernels
    register_tiles: int = 4  # outputs per work-item along a tiled axis (1: the renderer has no tiles)
    group_size: int = 128  # work-items cooperating on one output (a power of two)
    group_min_reduce: int = 256  # reduce length from which they cooperate ...
    group_max_outputs: int = 2048  # ... on kernels with at most this many outputs (more fill the device)
    group_bool: bool = False  # bool reductions cooperate too
    interpreted: bool = False  # kernels run in an interpreter whose cost grows with the programs launched
    # loop iterations one invocation may run in all (None: no limit); Mesa's llvmpipe and lavapipe stop a
    # shader's loops after 65535 of them in all and go on with wrong values (opt/limits.py keeps under it)
    max_loop: int | None = None
