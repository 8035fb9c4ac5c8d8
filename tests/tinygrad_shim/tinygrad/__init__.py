"""A stand-in `tinygrad` package for running tinygrad's own tests against tgrad.

It re-exports tgrad's objects under tinygrad's module names, plus test-infrastructure stand-ins
(helpers.getenv, Context, DEBUG, ...). It never implements a Tensor operation: an op tgrad lacks must
fail the test that uses it.
"""

import os

from tgrad import Tensor, dtypes
from tgrad.jit import TinyJit
from tinygrad.device import Device

# the runner's int64 rule: rerun a failing case with tinygrad's default integer (see run.py)
if os.environ.get("TGRAD_SHIM_DEFAULT_INT"):
    dtypes.default_int = dtypes.from_any(os.environ["TGRAD_SHIM_DEFAULT_INT"])

__all__ = ["Tensor", "TinyJit", "Device", "dtypes"]
