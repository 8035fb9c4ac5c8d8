"""The kernel optimizer, one for every device: a scheduled Kernel plus opts (data, opts.py), chosen by a
heuristic from the device's properties (heuristic.py; the CPU's rules in host.py); contraction.py
recognises matmul-shaped kernels for Triton's tl.dot.
`Runtime.runner` calls `optimize(kernel, runtime.props)` before the emitter renders the kernel."""

from tgrad.opt.heuristic import optimize
from tgrad.opt.limits import fit_loops, loop_iterations
from tgrad.opt.opts import Contract, DeviceProps, HostTuning, Opt, OptOps, find, upcasts

__all__ = ["optimize", "fit_loops", "loop_iterations", "Contract", "DeviceProps", "HostTuning", "Opt",
           "OptOps", "find", "upcasts"]
