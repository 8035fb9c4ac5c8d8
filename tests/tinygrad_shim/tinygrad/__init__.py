"""A stand-in `tinygrad` package for running tinygrad's own tests against tgrad.

It re-exports tgrad's objects under tinygrad's module names, plus test-infrastructure stand-ins
(helpers.getenv, Context, DEBUG, ...). It never implements a Tensor operation: an op tgrad lacks must
fail the test that uses it.
"""

import os

from tgrad import Tensor, Variable, dtypes
from tgrad.jit import TinyJit
from tinygrad import _internal, nn  # noqa: F401  (tinygrad's `from tinygrad import nn`)
from tinygrad.device import Device
from tinygrad.helpers import Context, GlobalCounters

# tinygrad.uop, tinygrad.engine, ...: stand-ins that fail when used (tests of internals are not counted)
_internal.install()

# the runner's int64 rule: rerun a failing case with tinygrad's default integer (see run.py)
if os.environ.get("TGRAD_SHIM_DEFAULT_INT"):
    dtypes.default_int = dtypes.from_any(os.environ["TGRAD_SHIM_DEFAULT_INT"])

__all__ = ["Tensor", "TinyJit", "Device", "dtypes", "Context", "GlobalCounters", "Variable"]
# UOp, ...: internals here
__getattr__ = _internal.module_getattr(__name__)
