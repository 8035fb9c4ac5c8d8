"""The DISK device (tinygrad's `disk:`, runtime/disk.py): memory-mapped files, views of contiguous ranges,
copies to and from compute devices, writes; safe_load from a mapping with its header checked. Values are
compared with numpy's view of the same bytes, and with safetensors / PyTorch."""

import gc
import json
import os
import pathlib
import zipfile

import numpy as np
import pytest
import torch

from tgrad import Tensor, dtypes
from tgrad.device import DEVICES, Device, default_device
from tgrad.errors import DeviceError, DiskError, DTypeError, ShapeError
from tgrad.nn.state import StateDictError, load_state_dict, safe_load, safe_save, torch_load

safetensors_torch = pytest.importorskip("safetensors.torch")


def _file(tmp_path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_empty_creates_the_file_and_writes_reach_it(tmp_path):
    path = str(tmp_path / "w")
    t = Tensor.empty(4, 5, dtype=dtypes.float32, device=f"disk:{path}")
    assert t.device == f"DISK:{path}" and os.path.getsize(path) == 80
    t.assign(Tensor.ones(4, 5))
    want = np.ones((4, 5), np.float32)
    assert pathlib.Path(path).read_bytes() == want.tobytes()
    t[1] = Tensor.arange(5).float()
    with pytest.raises(DiskError, match="non-contiguous"):  # a view that is not one range of the file
        t[2:4, 1:2] = [[7.0], [8.0]]
    t[2:4] = Tensor([[[7.0] * 5]])  # a leading 1 is dropped, then broadcast (PyTorch's setitem)
    want[1], want[2:4] = np.arange(5), 7.0
    np.testing.assert_array_equal(t.numpy(), want)
    assert pathlib.Path(path).read_bytes() == want.tobytes()
    t[3].assign(2)  # a value broadcast to the view
    want[3] = 2
    np.testing.assert_array_equal(np.fromfile(path, np.float32).reshape(4, 5), want)
    bigger = Tensor.empty(30, dtype=dtypes.float32, device=f"disk:{path}")  # extends the file with zeros
    assert os.path.getsize(path) == 120
    grown = np.concatenate([want.reshape(-1), np.zeros(10, np.float32)])
    np.testing.assert_array_equal(bigger.numpy(), grown)


def test_views_are_numpy_views_of_the_bytes(tmp_path):
    raw = bytes(range(256)) * 2
    path = _file(tmp_path, "b", raw)
    t = Tensor.empty(16, 32, dtype=dtypes.uint8, device=f"disk:{path}")
    ref = np.frombuffer(raw, np.uint8).reshape(16, 32)
    cases = {
        "row": (t[1], ref[1]),
        "rows": (t[2:5].reshape(-1), ref[2:5].reshape(-1)),
        "bitcast then row": (t.bitcast(dtypes.uint16)[1], ref.view(np.uint16)[1]),
        "row then bitcast": (t[1].bitcast(dtypes.uint16), ref[1].view(np.uint16)),
        "shrink": (t.shrink(((3, 4), None)), ref[3:4]),
        "float32 of a range": (t[4, 8:24].bitcast(dtypes.float32), ref[4, 8:24].view(np.float32)),
        "int64 rows": (t[6:8].reshape(2, 4, 8).bitcast(dtypes.int64),
                       ref[6:8].reshape(2, 4, 8).view(np.int64)),
        "negative index": (t[-1, -4:], ref[-1, -4:]),
        "empty": (t[3:3], ref[3:3]),
    }
    for name, (ours, want) in cases.items():
        assert ours.device.startswith("DISK:") and ours.shape == want.shape, name
        np.testing.assert_array_equal(ours.numpy(), want, err_msg=name)
        np.testing.assert_array_equal(ours.to("NUMPY").numpy(), want, err_msg=name)
    with pytest.raises(ShapeError):  # 3 bytes are not whole float16 elements (a RuntimeError, as tinygrad)
        t[0, :3].bitcast(dtypes.float16)


def test_compute_and_strided_views_raise(tmp_path):
    raw = np.arange(12, dtype=np.int32).tobytes()
    path = _file(tmp_path, "c", raw)
    t = Tensor(pathlib.Path(path), dtype=dtypes.int32).reshape(3, 4)
    for name, fn, match in [
        ("add", lambda: t + 1, "computes nothing"), ("sum", lambda: t.sum(), "computes nothing"),
        ("cast", lambda: t.cast(dtypes.float32), "CAST"), ("neg", lambda: -t, "computes nothing"),
        ("transpose", lambda: t.T, "non-contiguous view is not supported"),
        ("step", lambda: t[:, ::2], "non-contiguous view is not supported"),
        ("flip", lambda: t.flip(0), "non-contiguous view is not supported"),
        ("column", lambda: t[:, 1], "non-contiguous view is not supported"),
        ("gather", lambda: t[Tensor([0, 2])], "advanced indexing"),
        ("list index", lambda: t[[0, 2]], "advanced indexing"),
        ("strided write", lambda: t.__setitem__((slice(None), 0), 5), "non-contiguous"),
        ("gather write", lambda: t.__setitem__((Tensor([0, 2]), Tensor([1, 3])), 99), "advanced indexing"),
        ("host data", lambda: t + np.ones(4, np.int32), "host data"),
    ]:
        with pytest.raises(DiskError, match=match) as info:
            fn()
        assert isinstance(info.value, NotImplementedError) and isinstance(info.value, RuntimeError), name
        assert "test_disk.py" in str(info.value), name  # the user's line
    assert pathlib.Path(path).read_bytes() == raw  # nothing was written


def test_copies_to_and_from_every_device(device, tmp_path):
    rng = np.random.default_rng(0)
    values = {"f32": rng.standard_normal((3, 5)).astype(np.float32), "i32": np.arange(-6, 6, dtype=np.int32),
              "u8": np.arange(250, 256, dtype=np.uint8), "bool": np.array([True, False, True])}
    for name, want in values.items():
        path = str(tmp_path / name)
        on_disk = Tensor(want, device=device).to(f"disk:{path}")
        assert pathlib.Path(path).read_bytes() == want.tobytes(), name
        back = on_disk.to(device)
        assert back.device == device and back.dtype == on_disk.dtype
        np.testing.assert_array_equal(back.numpy(), want, err_msg=name)
        np.testing.assert_array_equal((back[1:] == Tensor(want[1:], device=device)).numpy(), True)
        other = Tensor.empty(*want.shape, dtype=on_disk.dtype, device=f"disk:{path}.copy")
        other.assign(on_disk)  # disk to disk
        assert pathlib.Path(f"{path}.copy").read_bytes() == want.tobytes()


def test_path_tensors(tmp_path):
    data = np.arange(100, dtype=np.uint8)
    path = pathlib.Path(_file(tmp_path, "p", data.tobytes()))
    t = Tensor(path)
    assert (t.shape, t.dtype, t.device) == ((100,), dtypes.uint8, f"DISK:{path}")
    np.testing.assert_array_equal(t.numpy(), data)
    on_cpu = Tensor(path, device="CPU")
    assert on_cpu.device == "CPU"
    np.testing.assert_array_equal(on_cpu.numpy(), data)
    np.testing.assert_array_equal(Tensor(path, dtype=dtypes.int16).numpy(), data.view(np.int16))
    np.testing.assert_array_equal(t[16:18].tolist(), [16, 17])
    assert Tensor(pathlib.Path(_file(tmp_path, "e", b""))).shape == (0,)
    with pytest.raises(FileNotFoundError):
        Tensor(tmp_path / "missing")
    with pytest.raises(ShapeError, match="whole number"):
        Tensor(path, dtype=dtypes.float64)  # 100 bytes are not float64s


def test_disk_is_not_a_compute_device(tmp_path, monkeypatch):
    import tests.conftest as conftest

    assert "DISK" not in DEVICES and "DISK" not in conftest.ALL.split(",")
    assert Device.canonicalize(f"disk:{tmp_path}/x") == f"DISK:{tmp_path}/x"
    assert Device.canonicalize(f"DISK:{tmp_path}/./x") == f"DISK:{tmp_path}/x"
    with pytest.raises(DeviceError, match="names its file"):
        Device.canonicalize("disk")
    monkeypatch.setenv("DEVICE", f"disk:{tmp_path}/x")
    with pytest.raises(DeviceError, match="compute device"):
        default_device()


def _state(tmp_path) -> tuple[str, dict]:
    torch.manual_seed(0)
    state = {"a": torch.randn(512, 1024), "b": torch.randn(512, 1024),
             "i": torch.arange(7, dtype=torch.int32),
             "h": torch.randn(3, 2).bfloat16(), "z": torch.zeros(0, 4)}
    path = str(tmp_path / "m.safetensors")
    safetensors_torch.save_file(state, path)
    return path, state


def test_safe_load_matches_safetensors(device, tmp_path):
    path, state = _state(tmp_path)
    host = device in dtypes.HOST_DEVICES
    mapped = safe_load(path, "disk")
    if not host:  # no bfloat16 there: a clear error (safe_load(path, device) gives float32 instead)
        with pytest.raises(DTypeError, match="bfloat16"):
            mapped["h"].to(device)
    copied = {k: v.to(device) if host or k != "h" else safe_load(path, device)[k] for k, v in mapped.items()}
    for loaded in (safe_load(path, device), copied):
        for key, value in state.items():
            assert loaded[key].shape == tuple(value.shape)
            want = value.float().numpy() if key == "h" else value.numpy()
            np.testing.assert_array_equal(loaded[key].numpy(), want)
    assert safe_load(path, device)["h"].dtype == (dtypes.bfloat16 if host else dtypes.float32)


def _mapped_rss(path: str) -> int:
    """Bytes of `path`'s mappings resident in this process (Linux's /proc/self/smaps)."""
    total, inside = 0, False
    for line in pathlib.Path("/proc/self/smaps").read_text().splitlines():
        if line[:1].isdigit() or line[:1] in "abcdef" and "-" in line.split()[0]:
            inside = line.rstrip().endswith(path)
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux's /proc/self/smaps")
def test_safe_load_reads_only_what_is_used(tmp_path):
    path, state = _state(tmp_path)
    loaded = safe_load(path, "disk")
    mapping = Device[f"DISK:{path}"].mapping
    assert isinstance(mapping, np.memmap)
    assert all(t.device == f"DISK:{path}" and np.shares_memory(t.node.buffer.data, mapping)
               for k, t in loaded.items() if k != "z")
    assert _mapped_rss(path) < 1 << 20  # nothing read yet
    np.testing.assert_array_equal(loaded["b"].to("NUMPY").numpy(), state["b"].numpy())
    size = state["b"].numel() * 4
    assert size <= _mapped_rss(path) < size + (1 << 20)  # "b" and not "a" (2 MiB each)
    class Model:
        def __init__(self):
            self.a = Tensor.zeros(512, 1024, device="NUMPY")
    model = Model()
    load_state_dict(model, {"a": loaded["a"]})
    np.testing.assert_array_equal(model.a.numpy(), state["a"].numpy())


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux's /proc/self/smaps")
def test_safe_load_to_a_device_does_not_keep_the_file_resident(device, tmp_path):
    """Loading into a compute device copies each tensor and drops its pages of the mapping, so a large
    checkpoint is not held twice (file pages and copies) at the peak; the values stay the file's, and
    disk views of the same file read them again."""
    path, state = _state(tmp_path)
    views = safe_load(path, "disk")  # (keeps the mapping alive across the load)
    loaded = safe_load(path, device)
    assert _mapped_rss(path) < 1 << 20
    for key in ("a", "b"):
        np.testing.assert_array_equal(loaded[key].numpy(), state[key].numpy())
        np.testing.assert_array_equal(views[key].to("NUMPY").numpy(), state[key].numpy())
    src = np.arange(6, dtype=np.float32)
    t = Tensor(src, dtype=dtypes.float32, device=device)  # (one copy: still not a view of the array)
    src[0] = 100
    assert t.numpy()[0] == 0


def _bad_file(tmp_path, header: dict, data: bytes) -> str:
    text = json.dumps(header).encode()
    return _file(tmp_path, "bad.safetensors", len(text).to_bytes(8, "little") + text + data)


@pytest.mark.parametrize("case", ["past end", "overlap", "backwards", "count", "dtype", "truncated", "short",
                                  "header length", "not json"])
def test_safe_load_checks_the_header(tmp_path, case):
    good = {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "y": {"dtype": "I32", "shape": [2, 1], "data_offsets": [8, 16]}}
    data = np.arange(4, dtype=np.float32).tobytes()
    key = "y"
    if case == "past end":
        good["y"]["data_offsets"], good["y"]["shape"] = [8, 24], [4]
    elif case == "overlap":
        good["y"]["data_offsets"] = [4, 12]
    elif case == "backwards":
        good["y"]["data_offsets"] = [16, 8]
    elif case == "count":
        good["y"]["shape"] = [3]
    elif case == "dtype":
        good["y"]["dtype"] = "F128"
    path = _bad_file(tmp_path, good, data)
    if case == "truncated":
        pathlib.Path(path).write_bytes(pathlib.Path(path).read_bytes()[:-3])
    elif case == "short":
        pathlib.Path(path).write_bytes(b"\x10\x00")
        key = None
    elif case == "header length":
        raw = pathlib.Path(path).read_bytes()
        pathlib.Path(path).write_bytes((10**6).to_bytes(8, "little") + raw[8:])
        key = None
    elif case == "not json":
        raw = pathlib.Path(path).read_bytes()
        pathlib.Path(path).write_bytes(raw[:8] + b"{" * (len(raw) - 8))
        key = None
    with pytest.raises(Exception):  # noqa: B017 - the reference refuses the file too, its own way
        safetensors_torch.load_file(path)
    with pytest.raises(StateDictError) as info:
        safe_load(path)
    assert path in str(info.value) and (key is None or key in str(info.value)), str(info.value)


def test_safe_save_over_a_mapped_file_keeps_loaded_values(tmp_path):
    path = str(tmp_path / "s.safetensors")
    safe_save({"w": Tensor([1.0, 2.0, 3.0])}, path)
    mapped = safe_load(path, "disk")
    safe_save({"w": Tensor([9.0, 9.0, 9.0, 9.0])}, path)  # a new file renamed into place
    np.testing.assert_array_equal(mapped["w"].numpy(), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(safe_load(path, "disk")["w"].numpy(), [9.0] * 4)


def test_a_mapping_goes_with_its_last_tensor(tmp_path):
    t = Tensor([1.0, 2.0]).to(f"disk:{tmp_path}/x")
    view, runtime = t[1:], Device[t.device]
    del t
    gc.collect()
    assert isinstance(runtime.mapping, np.memmap)  # the view holds it
    np.testing.assert_array_equal(view.numpy(), [2.0])
    del view
    gc.collect()
    assert runtime.mapping is None  # (a deleted file's space is given back)


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_torch_load_maps_stored_storages(tmp_path, monkeypatch, compression):
    torch.manual_seed(0)
    a = torch.randn(100)
    state = {"a": a, "tail": a[5:], "t": torch.randn(3, 4).t(), "h": torch.randn(5).bfloat16(),
             "i": torch.arange(6).reshape(2, 3)}
    path = tmp_path / "ckpt.pt"
    torch.save(state, path)
    if compression != zipfile.ZIP_STORED:  # the same members, compressed: read, not mapped
        with zipfile.ZipFile(path) as src:
            members = [(n, src.read(n)) for n in src.namelist()]
        with zipfile.ZipFile(path, "w", compression) as out:
            for name, data in members:
                out.writestr(name, data)
    monkeypatch.setattr(pathlib.Path, "read_bytes", lambda self: pytest.fail("read the whole file"))
    if compression == zipfile.ZIP_STORED:  # storages come from the mapping, never read as members
        monkeypatch.setattr(zipfile.ZipFile, "read", lambda *a: pytest.fail("read a stored member"))
    loaded = torch_load(path, "NUMPY")
    for key, value in state.items():
        want = value.float().numpy() if key == "h" else value.numpy()
        np.testing.assert_array_equal(loaded[key].numpy(), want, err_msg=key)
