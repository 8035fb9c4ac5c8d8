"""`Device` as tinygrad's tests use it: tgrad's registry, with a renderer description per device."""

from __future__ import annotations

from tgrad import dtypes
from tgrad.device import Device as _tgrad_device
from tinygrad.renderer import Renderer


class _Compiled:
    """What `Device["CPU"]` gives tinygrad's tests: the device's runtime and a renderer stub."""

    def __init__(self, name: str):
        self.name = name
        self.runtime = _tgrad_device[name]
        self.renderer = Renderer(name)


class _DeviceShim:
    @property
    def DEFAULT(self) -> str:  # noqa: N802 - tinygrad's name
        return _tgrad_device.DEFAULT

    def canonicalize(self, name: str | None) -> str:
        return _tgrad_device.canonicalize(name)

    def __getitem__(self, name: str) -> _Compiled:
        return _Compiled(_tgrad_device.canonicalize(name))


Device = _DeviceShim()
__all__ = ["Device", "dtypes"]


from tinygrad._internal import module_getattr  # noqa: E402

__getattr__ = module_getattr(__name__)
