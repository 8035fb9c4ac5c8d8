"""Errors name the kernel and show its source when generated code fails; every tgrad error ends with the
user's line."""
import numpy as np
import pytest

from tgrad import Tensor, emit_numba
from tgrad.errors import KernelError, TgradError


def test_kernel_build_failure_names_kernel_and_source(monkeypatch, tmp_path):
    monkeypatch.setenv("TGRAD_CACHE", str(tmp_path))
    monkeypatch.setattr(emit_numba, "render", lambda kernel, fname=None, parallel=None: "def broken(:\n")
    x = Tensor(np.ones((7, 13), np.float32), device="CPU")
    with pytest.raises(KernelError) as info:
        (x * 3 + 1).realize()
    message = str(info.value)
    assert "kernel E_7_13 failed to build" in message
    assert "   1 | " in message and "def broken(:" in message   # numbered source
    assert "test_errors.py" in message                        # the user's line


def test_every_tgrad_error_is_a_tgrad_error_with_the_user_line():
    with pytest.raises(TgradError) as info:
        Tensor.ones(2, 3).reshape(4, 2)
    assert "cannot reshape" in str(info.value) and "test_errors.py" in str(info.value)
