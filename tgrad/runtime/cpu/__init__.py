"""The CPU device: kernels rendered by tgrad/emit_numba.py, compiled by Numba to native functions.

runtime.py   CPURuntime: compile (cached in memory and on disk), buffers, launches, row groups and pairs
compile.py   Numba compilation of one kernel's source to object code (used by the workers too)
pool.py      compile worker processes for a schedule's new kernels; the thread count
threads.py   native worker threads that run a kernel's outer loop in ranges, and batched replays' records
batch.py     TinyJit's replay of a run of CPU launches in one native call
blas.py      BLAS calls (numpy.matmul on strided views) and the direct / tiered convolutions
gemm.py      a convolution's matmul pieces as compiled functions calling BLAS's gemm
numba_rt.py  helpers the generated kernels call (math, intrinsics for register tiles)
memory.py    host memory: big blocks reused once nothing can read them
"""
