"""The kernel optimizer, one for every device: a scheduled Kernel plus opts (data, opts.py), chosen by a
heuristic from the device's properties (heuristic.py); contraction.py recognises matmul-shaped kernels.
`Runtime.runner` calls `optimize(kernel, runtime.props)` before the emitter renders the kernel."""

from tgrad.opt.heuristic import optimize
from tgrad.opt.limits import fit_loops, loop_iterations
from tgrad.opt.opts import DeviceProps, Opt, OptOps, find, upcasts

__all__ = ["optimize", "fit_loops", "loop_iterations", "DeviceProps", "Opt", "OptOps", "find", "upcasts"]
