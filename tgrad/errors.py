"""tgrad's exceptions. Each names what was wrong and what to do."""


class TgradError(Exception):
    """Base class of every error tgrad raises on purpose; the message ends with the tgrad call the user
    made and the user's line: "(in Tensor.reshape, at file:line: code)"."""

    def __init__(self, message: str):
        where = user_frame()
        super().__init__(f"{message}\n  ({where})" if where else message)


def user_frame() -> str:
    """'in <tgrad function the user called>, at file:line: code' of the innermost frame outside the
    tgrad package (the user's line); '' when every frame is inside tgrad."""
    import linecache
    import os
    import sys

    package = os.path.dirname(os.path.abspath(__file__))
    frame, entry = sys._getframe(2), None
    while frame is not None:
        name = frame.f_code.co_filename
        path = name if name.startswith("<") else os.path.abspath(name)
        if not path.startswith(package + os.sep):
            code = linecache.getline(path, frame.f_lineno).strip()
            called = f"in {_op_name(entry, package)}, " if entry is not None else ""
            return f"{called}at {path}:{frame.f_lineno}: {code}"
        entry = frame.f_code
        frame = frame.f_back
    return ""


def user_stacklevel() -> int:
    """warnings.warn's stacklevel that names the innermost frame outside the tgrad package (the user's
    line), for a warn() called in the function that computes it."""
    import os
    import sys

    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _op_name(code, package: str) -> str:
    """The qualified name of a tgrad function; a method of the op mixins in tgrad/ops/ (ElementwiseOps.add)
    is named as the Tensor method the user called (Tensor.add)."""
    import os

    name = getattr(code, "co_qualname", code.co_name)
    in_ops = os.path.dirname(os.path.abspath(code.co_filename)) == os.path.join(package, "ops")
    owner, dot, method = name.partition(".")
    return f"Tensor.{method}" if in_ops and dot and owner.endswith("Ops") else name


class ShapeError(TgradError, ValueError, RuntimeError):
    """Shapes that do not fit. Also a RuntimeError, which PyTorch raises for the same mistakes."""


class IndexRangeError(ShapeError, IndexError):
    """An axis or an index out of range; an IndexError, like PyTorch's."""


class ArgumentError(TgradError, ValueError, RuntimeError):
    """A bad argument value (a mode or reduction name, a count); a RuntimeError too, like PyTorch's."""


class PatternError(ArgumentError, AssertionError):
    """A malformed einops pattern (rearrange): also an AssertionError, as tinygrad's asserts raise."""


class SamplingError(ArgumentError, AssertionError):
    """A bad multinomial argument or distribution: a RuntimeError as PyTorch's, and an AssertionError, as
    tinygrad's asserts raise."""


class ModeError(ArgumentError, NotImplementedError):
    """An unknown mode name (F.pad's mode): NotImplementedError, as PyTorch raises."""


class ValueOverflowError(TgradError, OverflowError, RuntimeError):
    """A value that the requested dtype cannot hold (tgrad refuses instead of wrapping silently); also a
    RuntimeError, which PyTorch raises for it."""


class DTypeError(TgradError, TypeError, RuntimeError):
    """A dtype that does not fit; also a RuntimeError, which PyTorch raises for dtype mismatches."""


class DeviceError(TgradError, RuntimeError):
    pass


class DiskError(DeviceError, NotImplementedError):
    """An op a disk tensor (runtime/disk.py: a file's bytes) cannot do: compute, or a view that is not one
    contiguous range of the file. A NotImplementedError (a RuntimeError too), as tinygrad raises."""


class OutOfMemoryError(DeviceError, MemoryError):
    """A tensor that does not fit: more bytes than the device's memory, or than the largest buffer it
    allocates. A MemoryError, and a RuntimeError as PyTorch's torch.OutOfMemoryError; names the op, the
    shape, dtype and bytes. Raised before anything is computed where the size is known to be too big, so
    nothing is half-written and the process goes on."""


def byte_size(nbytes: int) -> str:
    """'3.64 TiB (4000000000000 bytes)': a byte count for error messages."""
    size, unit = float(nbytes), "bytes"
    for name in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024:
            break
        size, unit = size / 1024, name
    return f"{nbytes} bytes" if unit == "bytes" else f"{size:.2f} {unit} ({nbytes} bytes)"


class AutogradError(TgradError, RuntimeError):
    pass


class JitError(TgradError, RuntimeError):
    pass


class DistributedError(TgradError, ValueError):
    """Ranks of a distributed job disagree (parameter lists), or a distributed call got a bad argument."""


class GraphDepthError(TgradError, RecursionError):
    """A lazy graph too deep to schedule or compile (a chain of ops longer than Python's recursion limit
    allows): realize() parts of it first."""


class KernelError(TgradError, RuntimeError):
    """A generated kernel failed to compile or to run; the message carries its name and source."""


def numbered(source: str) -> str:
    """Source text with line numbers, for error messages."""
    return "\n".join(f"{i + 1:4d} | {line}" for i, line in enumerate(source.splitlines()))
