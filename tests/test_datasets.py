"""IDX parsing on files the test writes (this machine cannot download MNIST), and sklearn digits."""
import gzip
import struct

import numpy as np
import pytest

from tgrad.datasets import MNIST_FILES, DatasetError, digits, mnist, read_idx


def write_idx(path, array: np.ndarray, code: int = 0x08, compress: bool = False) -> None:
    header = bytes([0, 0, code, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    raw = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)


def fake_mnist(folder, compress: bool):
    rng = np.random.default_rng(0)
    arrays = {
        "X_train": rng.integers(0, 256, (5, 28, 28), dtype=np.uint8),
        "Y_train": rng.integers(0, 10, 5, dtype=np.uint8),
        "X_test": rng.integers(0, 256, (3, 28, 28), dtype=np.uint8),
        "Y_test": rng.integers(0, 10, 3, dtype=np.uint8),
    }
    for key, name in MNIST_FILES.items():
        write_idx(folder / (name + (".gz" if compress else "")), arrays[key], compress=compress)
    return arrays


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_from_idx_files(tmp_path, compress):
    arrays = fake_mnist(tmp_path, compress)
    X_train, Y_train, X_test, Y_test = mnist(tmp_path)  # noqa: N806
    assert X_train.shape == (5, 1, 28, 28) and X_test.shape == (3, 1, 28, 28)
    np.testing.assert_array_equal(X_train.numpy()[:, 0], arrays["X_train"])
    np.testing.assert_array_equal(Y_train.numpy(), arrays["Y_train"])
    np.testing.assert_array_equal(X_test.numpy()[:, 0], arrays["X_test"])
    np.testing.assert_array_equal(Y_test.numpy(), arrays["Y_test"])


def test_mnist_from_env(tmp_path, monkeypatch):
    (tmp_path / "mnist").mkdir()
    arrays = fake_mnist(tmp_path / "mnist", compress=True)
    monkeypatch.setenv("TGRAD_DATA", str(tmp_path))
    np.testing.assert_array_equal(mnist()[3].numpy(), arrays["Y_test"])


def test_mnist_missing_files_say_where(tmp_path, monkeypatch):
    with pytest.raises(DatasetError, match="t10k-labels-idx1-ubyte.*not found in " + str(tmp_path)):
        mnist(tmp_path)
    monkeypatch.delenv("TGRAD_DATA", raising=False)
    with pytest.raises(DatasetError, match="TGRAD_DATA"):
        mnist()


def test_read_idx_other_types_and_errors(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    write_idx(tmp_path / "f", a, code=0x0D)
    np.testing.assert_array_equal(read_idx(tmp_path / "f"), a)
    b = np.array([-5, 300, 70000], dtype=np.int32)
    write_idx(tmp_path / "i", b, code=0x0C, compress=True)
    np.testing.assert_array_equal(read_idx(tmp_path / "i"), b)
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(DatasetError, match="not an IDX file"):
        read_idx(tmp_path / "bad")
    (tmp_path / "short").write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">I", 10) + b"\x00" * 3)
    with pytest.raises(DatasetError, match="header says shape"):
        read_idx(tmp_path / "short")


def test_digits_split():
    from sklearn.datasets import load_digits

    X_train, Y_train, X_test, Y_test = digits()  # noqa: N806
    assert X_train.shape == (1438, 1, 8, 8) and X_test.shape == (359, 1, 8, 8)
    assert Y_train.shape == (1438,) and Y_test.shape == (359,)
    ref = load_digits()
    xs = np.concatenate([X_train.numpy(), X_test.numpy()]).reshape(-1, 64)
    ys = np.concatenate([Y_train.numpy(), Y_test.numpy()])
    order = np.lexsort(xs.T)
    ref_order = np.lexsort(ref.data.T)
    np.testing.assert_array_equal(xs[order], ref.data[ref_order])
    np.testing.assert_array_equal(ys[order], ref.target[ref_order])
    np.testing.assert_array_equal(digits()[3].numpy(), Y_test.numpy())  # fixed seed: same split
