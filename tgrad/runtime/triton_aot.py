"""Compile Triton kernels ahead of time for real GPU targets (sm_80, sm_90, gfx942...), no GPU needed.

TGRAD_TRITON_TARGET=cuda:80,cuda:90,hip:gfx942 makes the TRITON runtime compile every kernel for these
targets too (checked in CI); `compile_for_target` reports code size and registers.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from tgrad import config, device, emit_triton
from tgrad.errors import KernelError, TgradError, numbered
from tgrad.fuse import Kernel
from tgrad.opt import DeviceProps, optimize
from tgrad.runtime.triton_source import load_source

# a GPU target compiled without the GPU: the opts of a data-centre GPU of 128 multiprocessors (H100: 132)
TARGET_PROPS = DeviceProps("TRITON", kind="triton", compute_units=128)


@dataclass(frozen=True)
class TargetBinary:
    """What compiling one kernel for one GPU target produced."""

    target: str  # "cuda:90", "hip:gfx942"
    asm_name: str  # "ptx" or "amdgcn"
    asm_bytes: int
    binary_bytes: int  # cubin / hsaco
    registers: int | None  # per thread (NVIDIA: from the cubin; AMD: VGPRs)


_target_cache: dict[tuple[str, str], TargetBinary] = {}


def parse_target(text: str):
    """'cuda:90' / 'cuda:80' / 'hip:gfx942' -> triton GPUTarget."""
    from triton.backends.compiler import GPUTarget

    backend, _, arch = text.strip().partition(":")
    if backend == "cuda" and arch.isdigit():
        return GPUTarget("cuda", int(arch), 32)
    if backend == "hip" and arch.startswith("gfx"):
        return GPUTarget("hip", arch, 64)
    raise TgradError(
        f"TGRAD_TRITON_TARGET: {text!r} is not cuda:<sm number> or hip:<gfx arch> (e.g. cuda:90,hip:gfx942)"
    )


def targets_from_env() -> list[str]:
    """The targets named by TGRAD_TRITON_TARGET (comma separated), e.g. ['cuda:80', 'hip:gfx942']."""
    return [t.strip() for t in config.get("TGRAD_TRITON_TARGET").split(",") if t.strip()]


def _cubin_registers(cubin: bytes) -> int | None:
    """Registers per thread from a cubin's .nv.info section (attribute EIATTR_REGCOUNT)."""
    try:
        shoff = int.from_bytes(cubin[0x28:0x30], "little")
        shentsize, shnum, shstrndx = (int.from_bytes(cubin[o : o + 2], "little") for o in (0x3A, 0x3C, 0x3E))
        headers = [cubin[shoff + i * shentsize : shoff + (i + 1) * shentsize] for i in range(shnum)]
        names_at = int.from_bytes(headers[shstrndx][0x18:0x20], "little")
        for h in headers:
            name_at = names_at + int.from_bytes(h[0:4], "little")
            if cubin[name_at : cubin.index(b"\0", name_at)] != b".nv.info":
                continue
            offset, size = int.from_bytes(h[0x18:0x20], "little"), int.from_bytes(h[0x20:0x28], "little")
            data, pos = cubin[offset : offset + size], 0
            while pos + 4 <= len(data):
                fmt, attr = data[pos], data[pos + 1]
                length = int.from_bytes(data[pos + 2 : pos + 4], "little")
                if fmt == 0x04 and attr == 0x2F:  # EIFMT_SVAL, EIATTR_REGCOUNT: (symbol, count)
                    return int.from_bytes(data[pos + 8 : pos + 12], "little")
                pos += 4 + (length if fmt == 0x04 else 0)
    except (IndexError, ValueError):
        return None
    return None


def _amdgcn_registers(asm: str) -> int | None:
    for line in asm.splitlines():
        if line.strip().startswith(".vgpr_count:"):
            return int(line.split(":")[1])
    return None


_worker = None


def _compile_worker():
    """A helper process that runs Triton's real compiler. It is needed where the interpreter is on:
    with TRITON_INTERPRET=1 at import, triton.language's own @jit functions (tl.sum, tl.max...) are
    interpreter objects, which the compiler cannot lower. The helper starts with TRITON_INTERPRET=0.
    (A plain subprocess, not multiprocessing: spawn would re-run the user's main script.)"""
    global _worker
    if _worker is None or _worker.poll() is not None:
        import subprocess

        env = config.child_environment(TRITON_INTERPRET="0")
        env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        code = "from tgrad.runtime.triton_aot import _serve; _serve()"
        pipe = subprocess.PIPE
        _worker = subprocess.Popen([sys.executable, "-c", code], stdin=pipe, stdout=pipe, env=env)
    return _worker


def _serve() -> None:
    """(the helper process) Answer pickled compile jobs from stdin on stdout, one at a time."""
    import pickle

    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything else printed goes to stderr
    jobs = sys.stdin.buffer
    while True:
        try:
            job = pickle.load(jobs)
        except EOFError:
            return
        pickle.dump(_compile_source(*job), replies)
        replies.flush()


def _run_job(job: tuple) -> tuple:
    import pickle

    worker = _compile_worker()
    pickle.dump(job, worker.stdin)
    worker.stdin.flush()
    return pickle.load(worker.stdout)


def _compile_source(source: str, fname: str, signature: dict, target: str, options: dict) -> tuple:
    """(in the helper process) ('ok', asm name, asm bytes, binary bytes, registers) or ('error', text)."""
    import triton
    from triton.compiler import ASTSource

    try:
        fn = load_source(source, fname, interpret=False)
        compiled = triton.compile(
            ASTSource(fn, signature, {}), target=parse_target(target), options=options
        )
    except Exception as e:
        return ("error", f"{type(e).__name__}: {e}")
    if target.startswith("cuda"):
        binary = compiled.asm["cubin"]
        return ("ok", "ptx", len(compiled.asm["ptx"]), len(binary), _cubin_registers(binary))
    asm = compiled.asm["amdgcn"]
    return ("ok", "amdgcn", len(asm), len(compiled.asm["hsaco"]), _amdgcn_registers(asm))


def compile_for_target(kernel: Kernel, target: str) -> TargetBinary:
    """Compile a kernel (GPU block sizes) with Triton's real compiler for `target`; no GPU needed.
    Raises KernelError with the kernel's name, its Triton source and the compiler's message."""
    parse_target(target)
    program = emit_triton.render(optimize(kernel.with_opts(()), TARGET_PROPS))
    source, num_warps = program.source, program.launch["num_warps"]
    options = emit_triton.launch_options(program)
    key = (source, target)
    hit = _target_cache.get(key)
    if hit is not None:
        return hit
    signature = {"out": emit_triton.SIG_NAME[kernel.out_dtype]}
    signature.update({f"in{i}": emit_triton.SIG_NAME[d] for i, d in enumerate(kernel.in_dtypes)})
    names = [kernel.name]
    if program.scratch:  # a split reduce: its first function too
        signature["part"] = emit_triton.SIG_NAME[program.scratch[0][1]]
        names.insert(0, kernel.name + "_part")
    for name in names:  # the result kept is the kernel's own function's
        result = _run_job((source, name, signature, target, options))
        if result[0] == "error":
            message = f"kernel {name} does not compile for {target}: {result[1]}"
            raise KernelError(f"{message}\n{numbered(source)}")
    info = TargetBinary(target, *result[1:])
    if device.DEBUG >= 4:
        print(
            f"  {kernel.name} {target}: {info.asm_name} {info.asm_bytes} bytes, binary {info.binary_bytes} "
            f"bytes, {info.registers} registers, {num_warps} warps",
            file=sys.stderr,
        )
    _target_cache[key] = info
    return info
