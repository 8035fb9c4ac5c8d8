"""tgrad's exceptions. Each names what was wrong and what to do."""


class TgradError(Exception):
    """Base class of every error tgrad raises on purpose."""


class ShapeError(TgradError, ValueError):
    pass


class DTypeError(TgradError, TypeError):
    pass


class DeviceError(TgradError, RuntimeError):
    pass


class AutogradError(TgradError, RuntimeError):
    pass


class JitError(TgradError, RuntimeError):
    pass


class KernelError(TgradError, RuntimeError):
    """A generated kernel failed to compile or to run; the message carries its name and source."""


def numbered(source: str) -> str:
    """Source text with line numbers, for error messages."""
    return "\n".join(f"{i + 1:4d} | {line}" for i, line in enumerate(source.splitlines()))
