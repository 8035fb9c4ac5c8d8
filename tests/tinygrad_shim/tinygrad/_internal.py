"""Stand-ins for tinygrad internals (UOp, Ops, schedulers, renderers, ...) so its test files import.

A tinygrad submodule the shim lacks (`tinygrad.uop.ops`, `tinygrad.engine.jit`, ...) imports as a module
whose every attribute is an `Internal` class: subclassing it works (test files define renderer subclasses
at import), anything else raises `InternalNotInShim` naming it: calling it, reading an attribute of an
instance, and `bool()` (so a `skipIf(INTERNAL_FLAG)` fails loudly instead of skipping). Tests that use
tinygrad internals are excluded from the counts by run.py; one that is not fails on these.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class InternalNotInShim(NotImplementedError):
    pass


class _InternalMeta(type):
    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return internal(f"{cls.__qualname__}.{name}")

    def __bool__(cls):
        raise InternalNotInShim(f"tinygrad internal {cls.__qualname__} is not in the shim")


def _refuse(self, *args, **kwargs):
    raise InternalNotInShim(f"tinygrad internal {type(self).__qualname__} is not in the shim")


def internal(name: str) -> type:
    """A class standing for the tinygrad internal `name` (see the module docstring)."""
    return _InternalMeta(name, (), {"__init__": _refuse, "__qualname__": name, "__module__": "tinygrad"})


class _InternalModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = internal(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds every `tinygrad.*` module that the shim's own package does not have."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("tinygrad.") or fullname.split(".")[1].startswith("_"):
            return None
        parent = sys.modules.get(fullname.rsplit(".", 1)[0])
        own = importlib.machinery.PathFinder.find_spec(fullname, getattr(parent, "__path__", None))
        if own is not None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _InternalModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())


def module_getattr(module_name: str):
    """A module-level __getattr__: names a shim module lacks become internals (see the docstring)."""

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return internal(f"{module_name}.{name}")

    return __getattr__
