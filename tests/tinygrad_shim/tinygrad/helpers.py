"""Test-infrastructure stand-ins from tinygrad.helpers (environment flags, Context, counters)."""

from __future__ import annotations

import contextlib
import functools
import operator
import os
import sys
import tempfile
from types import SimpleNamespace
from typing import TypeVar

from tgrad import Tensor, dtypes
from tinygrad._internal import module_getattr

T = TypeVar("T")
OSX, WIN = sys.platform == "darwin", sys.platform == "win32"


def getenv(key: str, default=0):
    """An environment variable converted to the type of `default` (tinygrad's helper)."""
    return type(default)(os.environ.get(key, default))


DEBUG = getenv("DEBUG", 0)
IMAGE = getenv("IMAGE", 0)
CI = os.environ.get("CI", "") != ""
# tinygrad's DEV describes the backend stack (interface, renderer); tgrad has none of those variants
DEV = SimpleNamespace(interface="", renderer="", device=os.environ.get("DEVICE", "CPU"))


@contextlib.contextmanager
def Context(**kwargs):  # noqa: N802 - tinygrad's name
    """Sets the named flags as environment variables for the block (NOOPT=1 reaches tgrad this way);
    TRAINING sets tgrad's Tensor.training, DEFAULT_FLOAT / DEFAULT_INT its dtypes.default_*."""
    old = {k: os.environ.get(k) for k in kwargs}
    os.environ.update({k: str(v) for k, v in kwargs.items()})
    attrs = {"TRAINING": (Tensor, "training", bool),
             "DEFAULT_FLOAT": (dtypes, "default_float", dtypes.from_any),
             "DEFAULT_INT": (dtypes, "default_int", dtypes.from_any)}
    saved = {k: getattr(*attrs[k][:2]) for k in kwargs if k in attrs}
    for k in saved:
        owner, name, convert = attrs[k]
        setattr(owner, name, convert(kwargs[k]))
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for k, v in saved.items():
            setattr(*attrs[k][:2], v)


class ContextVar:
    """A flag Context can set (read from the environment each time, as Context writes it there)."""

    def __init__(self, key: str, default):
        self.key, self.default = key, default

    @property
    def value(self):
        return type(self.default)(os.environ.get(self.key, self.default))

    def __bool__(self) -> bool:
        return bool(self.value)

    def __ge__(self, other) -> bool:
        return self.value >= other

    def __gt__(self, other) -> bool:
        return self.value > other

    def tolist(self, namespace) -> list:
        """The named dtypes (EMULATED_DTYPES="half,long"); tgrad emulates none of them on request."""
        return [getattr(namespace, n) for n in str(self.value).split(",") if n]


JIT = ContextVar("JIT", 1)
EMULATED_DTYPES = ContextVar("EMULATED_DTYPES", "")


def temp(x: str, append_user: bool = False) -> str:
    return os.path.join(tempfile.gettempdir(), x)


def prod(xs, start=1):
    return functools.reduce(operator.mul, xs, start)


def all_same(items) -> bool:
    return all(x == items[0] for x in items)


class GlobalCounters:
    """Kernel counters; tgrad counts launches in tgrad.device.Stats."""

    kernel_count = 0
    global_ops = 0
    global_mem = 0

    @staticmethod
    def reset() -> None:
        GlobalCounters.kernel_count = GlobalCounters.global_ops = GlobalCounters.global_mem = 0


# any other name tinygrad.helpers has is an internal (see _internal.py)
__getattr__ = module_getattr(__name__)
