"""Test-infrastructure stand-ins from tinygrad.helpers (environment flags, Context, counters)."""

from __future__ import annotations

import contextlib
import os
from types import SimpleNamespace


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
    """Sets the named flags as environment variables for the block (NOOPT=1 reaches tgrad this way)."""
    old = {k: os.environ.get(k) for k in kwargs}
    os.environ.update({k: str(v) for k, v in kwargs.items()})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class GlobalCounters:
    """Kernel counters; tgrad counts launches in tgrad.device.Stats."""

    kernel_count = 0
    global_ops = 0
    global_mem = 0

    @staticmethod
    def reset() -> None:
        GlobalCounters.kernel_count = GlobalCounters.global_ops = GlobalCounters.global_mem = 0
