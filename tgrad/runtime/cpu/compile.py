"""Numba as a compiler of CPU kernels to native functions over raw pointers (no Python or C wrappers).

Used by the CPU runtime (tgrad/runtime/cpu/runtime.py) and by its compile workers (cpu/pool.py). Numba is
imported inside the functions: a process whose kernels are all in the disk cache never imports it.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
import types

from tgrad import config
from tgrad.dtype import DType, dtypes

# LLVM optimization level of kernel compiles: at 1 they still vectorize and ran as fast as at Numba's
# default 3 in bench/ (elementwise, softmax, reductions), and compile faster (measured: bench/HISTORY.md)
KERNEL_OPT = 1


@functools.cache
def cpu_features() -> str:
    """The LLVM target features kernels compile for: the host's, and on an AVX-512 host without LLVM's
    preference for 256-bit vectors (a tuning flag LLVM sets for every AVX-512 CPU since Skylake-X, whose
    clock dropped under 512-bit math): loops then vectorize 16 floats wide. On this machine's Xeon the
    memory-bound kernels (softmax, sums over an axis, fused elementwise work) ran faster that way and the
    training steps, BLAS-bound, no slower (measured: bench/HISTORY.md).
    TGRAD_CPU_VECTOR_BITS=256 keeps LLVM's choice; NUMBA_CPU_FEATURES, when set, is used as it is."""
    import llvmlite.binding as llvm

    if config.is_set("NUMBA_CPU_FEATURES"):
        return config.get("NUMBA_CPU_FEATURES")
    llvm.initialize_native_target()
    host = llvm.get_host_cpu_features()
    wide = host.get("avx512f") and config.get("TGRAD_CPU_VECTOR_BITS") != "256"
    return host.flatten() + (",-prefer-256-bit" if wide else "")


def vector_bytes() -> int:
    """The bytes of one vector register kernels compile for: 64 where AVX-512 is used (cpu_features), else
    32 (the register-tiled convolutions size their tiles by it, emit_numba_conv)."""
    features = cpu_features()
    return 64 if "+avx512f" in features and "-prefer-256-bit" in features else 32


def use_cpu_features() -> None:
    """Numba's code generator makes its target machine once, from config.CPU_FEATURES: set it first (a
    process that compiled its own Numba functions earlier keeps the host's preference; only speed differs).
    Numba functions the process compiles later get the same features."""
    from numba.core import config

    if config.CPU_FEATURES is None:
        config.CPU_FEATURES = cpu_features()


@contextlib.contextmanager
def _numba_opt_level(level: int):
    """Numba's NUMBA_OPT for the compiles inside, under its compiler lock so no other compile sees it."""
    from numba.core import config
    from numba.core.compiler_lock import global_compiler_lock

    with global_compiler_lock:
        saved = config.OPT
        config.OPT = config._OptLevel(str(level)) if hasattr(config, "_OptLevel") else level
        try:
            yield
        finally:
            config.OPT = saved


def declared_symbols(llvm_ir: str) -> list[str]:
    """Functions and globals an LLVM module uses but does not define (resolved when it is loaded)."""
    funcs = re.findall(r'^declare [^@]*@"?([^"(]+)"?\(', llvm_ir, re.M)
    globs = re.findall(r'^@"?([^"=\s]+)"? = external ', llvm_ir, re.M)
    return sorted(set(funcs) | set(globs))


@functools.cache
def _lean_pipeline():
    """Numba's nopython pipeline without the passes generated kernels never need (closures, with-blocks,
    literal unrolling, IR rewrites, inlining): straight-line loops over pointers and scalars. Nor SSA
    reconstruction: it rewrites every variable assigned twice (each `a if c else b` leaves one) in a pass
    over all blocks, a quarter of a kernel's compile time and more for large fused ones, while every such
    variable of a generated kernel keeps one type, so type inference needs no versions of it and LLVM's
    own SSA form gives the same machine code (compared on the suite's kernels: bench/HISTORY.md)."""
    from numba.core import compiler, typed_passes, untyped_passes
    from numba.core.compiler_machinery import PassManager

    class LeanKernelPipeline(compiler.CompilerBase):
        def define_pipelines(self):
            pm = PassManager("tgrad_kernel")
            for pass_ in (untyped_passes.TranslateByteCode, untyped_passes.FixupArgs,
                          untyped_passes.IRProcessing, typed_passes.NopythonTypeInference,
                          typed_passes.NoPythonSupportedFeatureValidation, typed_passes.IRLegalization,
                          typed_passes.AnnotateTypes, typed_passes.NativeLowering,
                          typed_passes.NoPythonBackend):
                pm.add_pass(pass_, pass_.__name__)
            pm.finalize()
            return [pm]

    return LeanKernelPipeline


def compile_native(source: str, fname: str, modname: str, storage: tuple[DType, ...], n_ints: int) -> dict:
    """Compile a kernel's source with Numba as a native function over raw pointers (then `n_ints` int64
    arguments), without the Python and C wrappers Numba adds for calls from Python (a third of the
    compile time). Returns what the disk cache keeps (function name, object code, the symbols it needs)
    and the loaded function: its Numba code library (which keeps the code alive) and address."""
    use_cpu_features()
    import numba
    from numba.core import compiler
    from numba.core import types as nt
    from numba.core.registry import cpu_target

    module = types.ModuleType(modname)
    sys.modules[modname] = module  # Numba looks functions' modules up by name
    exec(compile(source, f"<tgrad kernel {fname}>", "exec"), module.__dict__)
    pyfunc = module.__dict__[fname]
    options = {"nopython": True, "error_model": "numpy", "no_cpython_wrapper": True, "no_cfunc_wrapper": True}
    wanted = dict(pyfunc.numba_options)
    level = wanted.pop("opt", KERNEL_OPT)  # a LEVEL opt (opt/host.py): `@kernel(opt=3)`
    flags = cpu_target.options.parse_as_flags(compiler.Flags(), {**options, **wanted})
    flags.no_compile = True  # no Python-callable function object: tgrad calls the address
    args = [nt.CPointer(numba.from_dtype(d.np)) for d in storage] + [nt.int64] * n_ints
    with _numba_opt_level(level):
        cpu_target.typing_context.refresh()
        cpu_target.target_context.refresh()
        pipeline = compiler.Compiler if flags.auto_parallel.enabled else _lean_pipeline()
        cres = compiler.compile_extra(cpu_target.typing_context, cpu_target.target_context, pyfunc,
                                      tuple(args), nt.void, flags, {}, pipeline_class=pipeline)
        library, name = cres.library, cres.fndesc.llvm_func_name
        address = library.get_pointer_to_function(name)
        obj = library.serialize_using_object_code()[2][0]
    # the features the code was compiled for: not cpu_features() where Numba's code generator was made
    # before tgrad's first compile (another Numba function compiled first in this process)
    features = getattr(cpu_target.target_context.codegen(), "_tm_features", None)
    return {"name": name, "object": obj, "symbols": declared_symbols(library.get_llvm_str()),
            "library": library, "address": address, "features": features}


def on_disk(entry: dict) -> dict:
    """What the disk cache keeps of a compiled kernel (and what a compile worker sends back)."""
    return {k: entry[k] for k in ("name", "object", "symbols", "features")}


def cacheable(entry: dict) -> bool:
    """Whether a compiled kernel may go to the disk cache, whose key says it was compiled for
    cpu_features(): in a process whose Numba compiled something before tgrad set them, kernels compile
    for the host's defaults (256-bit vectors on AVX-512, slower: a test process once wrote such an entry
    and softmax ran slower from it; measured: bench/HISTORY.md), and are used there but not kept."""
    return entry.get("features") in (None, cpu_features())


def compile_object(source: str, fname: str, modname: str, storage: list[str], n_ints: int) -> dict:
    """What a compile worker (cpu/pool.py) returns: the disk-cache entry of one kernel."""
    return on_disk(compile_native(source, fname, modname, tuple(map(dtypes.from_any, storage)), n_ints))
