"""Optimizations as data: what the optimizer decides for one kernel, and what a device says about itself.

A Kernel from fuse.py says what to compute; its `opts` say how (tinygrad's Opt list): how many outputs a
work-group or Triton program computes, register tiles, a cooperative reduction, the reduce loop's step.
An emitter renders exactly the opts it is given and adds none; a kernel without opts renders plainly (one
output per work-item, no tiles, no cooperation). Opts are part of the kernel's hash, so two choices for the
same computation are two compiled programs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum

from tgrad.fuse_roots import FuseTuning


class OptOps(Enum):
    LOCAL = "local"  # outputs per work-group (C-style: work-items, one output each; Triton: BLOCK_G)
    UPCAST = "upcast"  # register tile: `arg` outputs per work-item along global axis `axis` (C-style)
    GROUP = "group"  # `arg` work-items cooperate on each output's reduction (one work-group per output)
    REDUCE = "reduce"  # reduce elements per loop step (Triton: BLOCK_R; a tl.dot's BLOCK_K)
    DOT = "dot"  # matmul-shaped kernel as tl.dot tiles: BLOCK_N = `arg` (BLOCK_M is LOCAL)
    SPLIT = "split"  # the reduction in `arg` shares, partial results added by a second pass (Triton)
    WARPS = "warps"  # Triton's num_warps
    UNROLL = "unroll"  # the innermost reduce loop (a GROUP's strided loop) does `arg` steps per iteration
    # C-style, without GROUP or UPCAST: the innermost reduce loop does `arg` steps per iteration, each into
    # an accumulator of its own (a float sum's compensated), combined after the loop: `arg` independent
    # chains of adds where one chain waits on each add's latency (a CPU running a work-item's long loop)
    LANES = "lanes"
    # the CPU (emit_numba, opt/host.py):
    CONTRACT = "contract"  # how a matmul-shaped reduce runs: `arg` a Contract
    THREADS = "threads"  # the outer loop split over threads: the kernel's (axis None), or sub-kernel `axis`'s
    # of a BLAS plan (its computed operands in order, then its epilogue)
    CHUNK = "chunk"  # a BLAS matmul whose operand is copied runs in pieces of `arg` indices of axis `axis`
    BATCH = "batch"  # a BLAS plan loops over the leading `arg` global axes as batch axes (blas.lead_axes)
    # the LLVM optimization level `arg` the kernel's function compiles at (else compile.KERNEL_OPT, 1)
    LEVEL = "level"


class Contract(IntEnum):
    """How the CPU computes a matmul-shaped reduce (tgrad/blas.py analyses it)."""

    LOOP = 0  # the generated reduce loop (emit_numba.render_loops)
    BLAS = 1  # a BLAS matmul on strided views, generated functions around it (runtime/cpu/blas.py)
    BATCHED = 2  # a batch of small matmuls as one generated function (emit_numba.render_batched)
    DIRECT = 3  # a 2-d convolution's forward as a direct loop nest (emit_numba_conv; BLAS until compiled)
    WGRAD = 4  # a 2-d convolution's weight gradient the same way


@dataclass(frozen=True)
class Opt:
    op: OptOps
    arg: int
    axis: int | None = None

    def __repr__(self) -> str:
        arg = Contract(self.arg).name if self.op is OptOps.CONTRACT else self.arg
        return f"{self.op.name}({arg}{'' if self.axis is None else f', axis={self.axis}'})"


def find(opts: tuple[Opt, ...], op: OptOps, default: int = 0) -> int:
    """The argument of the opt `op` in opts (at most one of each op but UPCAST), else default."""
    return next((o.arg for o in opts if o.op is op), default)


def upcasts(opts: tuple[Opt, ...]) -> dict[int, int]:
    """{axis: outputs per work-item along it} of the UPCAST opts."""
    return {o.axis: o.arg for o in opts if o.op is OptOps.UPCAST}


@dataclass(frozen=True)
class HostTuning:
    """The CPU heuristic's defaults (opt/host.py): where one implementation starts to beat another. They
    were measured on one machine (bench/HISTORY.md); a device may set others, a search may try others."""

    parallel_min_work: int = 1 << 18  # iterations from which a kernel's outer loop runs on threads
    blas_min_work: int = 1 << 16  # multiply-adds from which a BLAS call beats the generated loop
    blas_min_matvec_work: int = 1 << 20  # ... for a matrix (rows along memory) times a vector
    blas_max_operand: int = 1 << 26  # elements of an operand's matrix (an im2col copy) BLAS may take
    windows_max_k: int = 36  # a conv whose K (channels x taps) and output channels are at most these reads
    windows_max_n: int = 64  # its windows in place in the generated loop instead of copying them for BLAS
    lead_min_work: int = 1 << 14  # multiply-adds per matmul from which leading axes become batch axes
    batched_max_work: int = 1 << 17  # a batch of matmuls of at most this many multiply-adds each, K at
    batched_max_k: int = 64  # most this, runs as one generated function (a BLAS call's cost dominates),
    batched_rows: int = 2  # rows of each matmul's result a pass (UPCAST on its M axis)
    # a batch of matmuls of at most this many multiply-adds each is split over the cores, a one-thread BLAS
    # call per piece of the batch, instead of BLAS's own threads inside each small matrix (a decode step's
    # attention; from 512K a matrix the pieces' Python threads cost more than they save: bench/HISTORY.md)
    split_batch_max_work: int = 1 << 17
    one_index_min_work: int = 1 << 18  # multiply-adds of a one-image piece from which pieces are one image
    pair_min_result: int = 1 << 21  # elements of a matmul's result from which a piece pair pays
    pair_max_points: int = 1 << 22  # points of one image up to which a pair's reads are checked (and a
    # conv's input gradient scattered: its window shares)
    direct_min_work: int = 1 << 20  # a conv's multiply-adds from which a direct convolution pays,
    direct_min_depth: int = 256  # its multiply-adds per output value,
    direct_min_channels: int = 16  # its output channels (a vector of them),
    direct_max_taps: int = 49  # its kernel taps at most (written out in the loop body)
    scatter_max_taps: int = 25  # an input gradient scattered directly: taps at most (registers),
    scatter_max_k: int = 32  # output channels at most (twice that on images of at most
    scatter_small_image: int = 144  # this many output pixels; else the col2im pair wins)
    # an elementwise kernel whose innermost loop runs at most this many iterations (one AVX-512 vector of
    # float32) and gates loads on its index (a col2im's taps, a pooled gradient's windows) compiles at LLVM
    # O3, which writes the short loop out and folds each copy's gates to constants; at O1 every gated load
    # stays a branch (a 3x3 conv's col2im over 8x8 images, measured: bench/HISTORY.md)
    short_loop_max: int = 16
    # the generated code and the runtime:
    split_min: int = 8  # a divided axis splits in two where the inner loop keeps this many (a vector)
    reduce_shares: int = 64  # chunks a threaded full reduction splits its outer axis into (a partial each)
    sum_block: int = 4096  # elements a chunk of a full float sum adds on their own before adding the blocks
    tile_registers: int = 24  # accumulator vectors of a direct conv's register tile (of 32 AVX-512 registers)
    chunks_per_thread: int = 4  # ranges per thread of a threaded kernel (a thread done early takes another)
    spin_cycles: int = 1 << 17  # time-stamp cycles a worker thread spins for its next job before it sleeps
    openblas_idle: int = 21  # log2 of the cycles an idle OpenBLAS thread spins before it sleeps (its own: 28)


@dataclass(frozen=True)
class DeviceProps:
    """What a device's runtime tells the optimizer. Limits come from the driver where it reports them;
    the `preferred_*` and `group_*` fields are the device's tuning defaults, with the reason in its
    runtime (a BEAM search would time alternatives instead)."""

    name: str
    # which rules apply: "cstyle" (OpenCL, Metal, WGSL), "triton", "cpu" (opt/host.py), "host" (NUMPY: none)
    kind: str = "cstyle"
    compute_units: int = 1  # cores / compute units / streaming multiprocessors
    max_local: int = 1024  # work-items in one work-group at most
    max_groups_per_dim: int = 2**31 - 1  # work-groups per launch dimension at most
    preferred_local: int = 128  # work-items per work-group of one-output-per-item kernels
    register_tiles: int = 4  # outputs per work-item along a tiled axis (1: the renderer has no tiles)
    group_size: int = 128  # work-items cooperating on one output (a power of two)
    group_min_reduce: int = 256  # reduce length from which they cooperate ...
    group_max_outputs: int = 2048  # ... on kernels with at most this many outputs (more fill the device)
    group_bool: bool = False  # bool reductions cooperate too
    # the API runs on the host's cores (Mesa's lavapipe / llvmpipe; not set for PoCL, where this rule
    # measured slower: PoCL has `cpu_device` below): a work-group's cooperation is emulated (its barriers
    # are loops over the items), while independent work-items fill the SIMD lanes.
    # Then float sums cooperate in groups just big enough for `group_items` work-items in all (16 to
    # `group_size`: a full sum takes the largest, 4096 row sums the smallest; their items compensate: the
    # accuracy of a GROUP sum), other reductions only where outputs x `group_size` stay under
    # `group_items` (a full max), else one work-item per output (measured: bench/HISTORY.md)
    cpu_backed: bool = False
    group_items: int = 4096
    # an OpenCL device that says it is a CPU (CL_DEVICE_TYPE_CPU: PoCL): a work-group's items run one after
    # another in one thread, so a GROUP's strided items reread each cache line and each item's compensated
    # sum is one chain of dependent adds. There a reduction the GROUP rule would give a group, or one that
    # reads memory along its reduce loop, runs one work-item per output with independent accumulators
    # (LANES): `sum_lanes` for a float sum (compensated; two of the device's float vectors, which its
    # compiler packs the lanes into; PoCL on AVX-512: 32), `reduce_lanes` for others, at most one per
    # `lane_steps` steps of the loop, in work-groups small enough that every compute unit gets one
    # (measured, bench/HISTORY.md: 2048 row sums of 2048 took 2.0 / 0.6 ms with 8 / 32 lanes, the row max
    # 0.65 / 1.4 ms with 8 / 16)
    cpu_device: bool = False
    sum_lanes: int = 32
    reduce_lanes: int = 8
    lane_steps: int = 8
    interpreted: bool = False  # kernels run in an interpreter whose cost grows with the programs launched
    # Triton: elements of one program's tile (a GPU's: fits the registers of 4-8 warps; the interpreter's
    # runtime sets 65536: few, big programs, as its cost is per program)
    tile_elements: int = 4096
    # loop iterations one invocation may run in all (None: no limit); Mesa's llvmpipe and lavapipe stop a
    # shader's loops after 65535 of them in all and go on with wrong values (opt/limits.py keeps under it)
    max_loop: int | None = None
    max_unroll: int = 16  # reduce steps per loop iteration at most (the body written out that many times)
    # the CPU: a core's L2 cache (a copied operand's pieces are sized to stay in it), whether compiled conv
    # pieces (runtime/cpu/gemm.py) run, and the heuristic's defaults
    cache_bytes: int = 1 << 21
    native_pieces: bool = False
    host: HostTuning = HostTuning()
    fuse: FuseTuning = FuseTuning()  # fusion's choices (fuse_roots.py), every device
