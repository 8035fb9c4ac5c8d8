"""Data sets as Tensors: MNIST from its IDX files, and scikit-learn's 8x8 handwritten digits."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from tgrad import config
from tgrad.errors import TgradError
from tgrad.tensor import Tensor

MNIST_FILES = {
    "X_train": "train-images-idx3-ubyte",
    "Y_train": "train-labels-idx1-ubyte",
    "X_test": "t10k-images-idx3-ubyte",
    "Y_test": "t10k-labels-idx1-ubyte",
}
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class DatasetError(TgradError, FileNotFoundError):
    """A data set's files are missing or malformed; the message says where they should be."""


def read_idx(path: str | Path) -> np.ndarray:
    """Parse one IDX file (optionally gzip-compressed, detected by its magic bytes)."""
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DatasetError(f"{path} is not an IDX file (bad magic number {raw[:4].hex()})")
    ndim = raw[3]
    dims = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    data = np.frombuffer(raw, dtype, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise DatasetError(f"{path}: header says shape {dims} but the file holds {data.size} values")
    return data.reshape(dims).astype(dtype.newbyteorder("="))


def _find(folder: Path, name: str) -> Path | None:
    for candidate in (name, name + ".gz", name.replace("-idx", ".idx"), name.replace("-idx", ".idx") + ".gz"):
        if (folder / candidate).exists():
            return folder / candidate
    return None


def mnist(path: str | Path | None = None, device: str | None = None):
    """X_train (60000, 1, 28, 28) float32 in [0, 255], Y_train (60000,) int32, X_test, Y_test, read from
    the four standard IDX files (gzipped or not) in `path`, else in $TGRAD_DATA (or $TGRAD_DATA/mnist)."""
    if path is None:
        env = config.get("TGRAD_DATA")
        if not env:
            raise DatasetError(
                "mnist(): no data directory; pass mnist(path) or set TGRAD_DATA to a directory holding "
                f"{', '.join(f + '.gz' for f in MNIST_FILES.values())}"
            )
        path = Path(env) / "mnist" if (Path(env) / "mnist").is_dir() else Path(env)
    folder = Path(path)
    found = {key: _find(folder, name) for key, name in MNIST_FILES.items()}
    missing = [MNIST_FILES[k] for k, p in found.items() if p is None]
    if missing:
        raise DatasetError(
            f"mnist(): {', '.join(missing)} (or .gz) not found in {folder.resolve()}; download the MNIST "
            "IDX files there (e.g. from https://storage.googleapis.com/cvdf-datasets/mnist/)"
        )
    arrays = {k: read_idx(p) for k, p in found.items()}
    return (
        Tensor(arrays["X_train"].reshape(-1, 1, 28, 28).astype(np.float32), device=device),
        Tensor(arrays["Y_train"].astype(np.int32), device=device),
        Tensor(arrays["X_test"].reshape(-1, 1, 28, 28).astype(np.float32), device=device),
        Tensor(arrays["Y_test"].astype(np.int32), device=device),
    )


def digits(test_size: float = 0.2, seed: int = 0, device: str | None = None):
    """scikit-learn's load_digits (1797 real 8x8 handwritten digits, pixels 0..16) as
    X_train (N, 1, 8, 8) float32, Y_train (N,) int32, X_test, Y_test; a fixed-seed shuffled split."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise DatasetError("digits() needs scikit-learn: pip install scikit-learn") from e
    data = load_digits()
    x = data.images.astype(np.float32).reshape(-1, 1, 8, 8)
    y = data.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(len(y) * test_size))
    test, train = order[:n_test], order[n_test:]
    return (
        Tensor(x[train], device=device),
        Tensor(y[train], device=device),
        Tensor(x[test], device=device),
        Tensor(y[test], device=device),
    )


__all__ = ["mnist", "digits", "read_idx", "DatasetError", "MNIST_FILES"]
