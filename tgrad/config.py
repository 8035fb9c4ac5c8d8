"""Every environment variable tgrad reads, in one table: its name, its default and what it does.

Values are read when they are used, not at import (a program or a test that sets a variable before the
setting is used changes it); a variable set to an empty string counts as unset. Nothing else in tgrad
touches os.environ (tests/test_architecture.py checks), so this table is the whole list.
"""

from __future__ import annotations

import os

KNOBS: dict[str, tuple[str, str]] = {
    # what a user sets
    "DEBUG": ("0", "1: kernels and time per realize; 2: a line per kernel; 3: kernel IR; 4: source"),
    "DEVICE": ("", "the default device (CPU, CL, WEBGPU, CUDA, ...); also CPU=1, CL=1, ... (tinygrad's)"),
    "JIT": ("1", "0: TinyJit, replayed optimizer updates and backward() replays run every call plainly"),
    "NOOPT": ("0", "1: no kernel optimizations (upcasts, unrolls, big blocks)"),
    "BEAM": ("0", "n: search each kernel's opts by timing launches, keeping the n fastest (tinygrad's)"),
    "BEAM_TIMEOUT_SEC": ("10", "seconds a BEAM search may spend on one kernel"),
    "IGNORE_BEAM_CACHE": ("0", "1: search again kernels whose BEAM choice is on disk"),
    "TGRAD_CACHE": ("", "compiled-kernel directory; 0: no disk cache; unset: $XDG_CACHE_HOME/tgrad"),
    "TGRAD_DATA": ("", "where datasets.mnist() looks for the MNIST files"),
    "TGRAD_BACKWARD_REPLAY": ("1", "0: backward() leaves gradients lazy (graphs to inspect), never replays"),
    "TGRAD_THREADS": ("", "threads a threaded CPU kernel runs on (else NUMBA_NUM_THREADS, else the cores)"),
    "TGRAD_COMPILE_WORKERS": ("", "CPU compile worker processes (0: none; unset: cores - 1, at most 2)"),
    "TGRAD_NATIVE_THREADS": ("1", "0: CPU kernels' ranges run on Python threads, not native workers"),
    "TGRAD_BACKGROUND_COMPILES": ("1", "0: a CPU kernel is compiled fully before its first run"),
    "TGRAD_NATIVE_GEMM": ("1", "0: a conv's matmul pieces run through numpy, not compiled gemm calls"),
    "TGRAD_OPENBLAS_IDLE": ("1", "0: leave OpenBLAS's thread idle timeout as it is"),
    "TGRAD_HOST_CACHE_MB": ("1024", "MiB of big host blocks the CPU runtime keeps for reuse"),
    "TGRAD_CPU_VECTOR_BITS": ("512", "256: let LLVM prefer 256-bit vectors on AVX-512 hosts"),
    "TGRAD_TRITON_TARGET": ("", "also compile every Triton kernel for these targets (cuda:90,hip:gfx942)"),
    "TGRAD_TRITON_DIRECT": ("1", "0: launch Triton kernels through triton.jit, not tgrad's direct launcher"),
    "TGRAD_TRITON_IMPLICIT_GEMM": ("1", "0: convolutions are not tl.dot kernels"),
    "WEBGPU_INT64": ("0", "1: use shader-int64 where the WebGPU adapter has it"),
    "QCOM_FALLBACK": ("0", "1: QCOM runs on any OpenCL device (no Adreno GPU needed)"),
    # what other software sets, read by tgrad
    "TRITON_INTERPRET": ("0", "Triton's: 1 runs kernels in its CPU interpreter"),
    "NUMBA_NUM_THREADS": ("", "Numba's thread count, read when TGRAD_THREADS is unset"),
    "NUMBA_CPU_FEATURES": ("", "Numba's: the CPU features to compile for, used as given"),
    "OPENBLAS_THREAD_TIMEOUT": ("", "OpenBLAS's: when set, tgrad leaves the idle timeout to it"),
    "XDG_CACHE_HOME": ("", "where the kernel cache goes when TGRAD_CACHE is unset (an absolute path)"),
    "XDG_RUNTIME_DIR": ("", "Mesa's loader warns without a usable one: WEBGPU makes a private one"),
    "PYTHONPATH": ("", "passed on to compile worker processes"),
    # MPI launchers: tgrad.distributed joins MPI.COMM_WORLD when one of these is set
    "OMPI_COMM_WORLD_SIZE": ("", "set by Open MPI's mpiexec"),
    "PMIX_RANK": ("", "set by PMIx launchers"),
    "PMI_RANK": ("", "set by MPICH / Intel MPI"),
    "PMI_SIZE": ("", "set by MPICH / Intel MPI"),
    "MV2_COMM_WORLD_SIZE": ("", "set by MVAPICH2"),
}


def get(name: str) -> str:
    """The variable's value (stripped), or its default from KNOBS when it is unset or empty."""
    default = KNOBS[name][0]
    return os.environ.get(name, "").strip() or default


def on(name: str) -> bool:
    """A switch: anything but 0 is on (JIT, NOOPT, TGRAD_NATIVE_GEMM, ...)."""
    return get(name) != "0"


def is_set(name: str) -> bool:
    return bool(os.environ.get(name, "").strip())


def device_flag(device: str) -> bool:
    """tinygrad's CPU=1, CL=1, ...: the variable named like the device is 1."""
    return os.environ.get(device, "").strip() == "1"


def put(name: str, value: str | None) -> None:
    """Set (or with None remove) a variable another library reads when it starts (Triton, OpenBLAS, Mesa)."""
    if value is not None:
        os.environ[name] = value
    elif name in os.environ:
        del os.environ[name]


def child_environment(**overrides: str) -> dict[str, str]:
    """This process's environment with overrides, for a helper process tgrad starts."""
    return {**os.environ, **overrides}
