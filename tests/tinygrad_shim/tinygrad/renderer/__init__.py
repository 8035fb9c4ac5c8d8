"""Renderer stubs: tinygrad's tests only ask a renderer which dtypes it supports."""

from tgrad import dtypes
from tgrad.device import Device


class Renderer:
    def __init__(self, device: str = "CPU"):
        self.device = device

    def supported_dtypes(self) -> list:
        """Every dtype tgrad has on the device (float16 computes in float32 on some devices; the tests
        accept that)."""
        return [dt for dt in (*dtypes.all, *dtypes.fp8s) if Device[self.device].supports(dt)]
