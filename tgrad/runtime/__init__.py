"""One runtime per device: `cpu` (Numba), `numpy` (the reference), `opencl` (CL, QCOM), `metal`,
`webgpu`, `triton` (CUDA, AMD, TRITON; `triton_aot` compiles for GPU targets without a GPU).

Each module defines a `tgrad.device.Runtime` subclass; `tgrad.device.RUNTIMES` names them, and a module
is imported only when its device is first opened.
"""
