"""tgrad/config.py: variables are read when used, an empty one counts as unset, 0 turns a switch off."""
import subprocess
import sys

import pytest

from tgrad import config


def test_values_defaults_and_switches(monkeypatch):
    monkeypatch.delenv("TGRAD_HOST_CACHE_MB", raising=False)
    assert config.get("TGRAD_HOST_CACHE_MB") == "1024"
    monkeypatch.setenv("TGRAD_HOST_CACHE_MB", " 64 ")
    assert config.get("TGRAD_HOST_CACHE_MB") == "64"
    monkeypatch.setenv("JIT", "")
    assert config.on("JIT") and not config.is_set("JIT")  # empty: the default (on)
    monkeypatch.setenv("JIT", "0")
    assert not config.on("JIT")
    monkeypatch.delenv("NOOPT", raising=False)
    assert not config.on("NOOPT")
    monkeypatch.setenv("NOOPT", "1")
    assert config.on("NOOPT")
    with pytest.raises(KeyError):  # a name missing from the table is a bug in tgrad, not a default
        config.get("TGRAD_NO_SUCH_KNOB")


def test_put_sets_and_removes(monkeypatch):
    monkeypatch.delenv("OPENBLAS_THREAD_TIMEOUT", raising=False)
    config.put("OPENBLAS_THREAD_TIMEOUT", "4")
    assert config.get("OPENBLAS_THREAD_TIMEOUT") == "4" and config.is_set("OPENBLAS_THREAD_TIMEOUT")
    config.put("OPENBLAS_THREAD_TIMEOUT", None)
    config.put("OPENBLAS_THREAD_TIMEOUT", None)  # removing an unset variable is fine
    assert not config.is_set("OPENBLAS_THREAD_TIMEOUT")


def test_device_flags_pick_the_default_device():
    code = "from tgrad import Device; print(Device.DEFAULT)"
    env = config.child_environment(NUMPY="1", DEVICE="")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "NUMPY"
    env = config.child_environment(NUMPY="1", DEVICE="cpu")  # DEVICE wins
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "CPU"
