"""Finding a model's tensors by walking its attributes, state dicts, and safetensors files."""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from tgrad.device import Device, get_runtime
from tgrad.dtype import DType, dtypes, from_bytes, to_bytes
from tgrad.errors import ShapeError, TgradError
from tgrad.tensor import Tensor


class StateDictError(TgradError, KeyError, RuntimeError):
    """load_state_dict: keys missing or unexpected (a RuntimeError too, as PyTorch raises)."""

    def __str__(self) -> str:  # KeyError would print the message with quotes
        return str(self.args[0])


def get_state_dict(obj: Any, prefix: str = "", seen: set | None = None) -> dict[str, Tensor]:
    """Every Tensor reachable through attributes, lists, tuples and dicts, keyed like PyTorch
    ('layers.0.weight'). Each tensor appears once, under the first name found."""
    seen = set() if seen is None else seen
    if isinstance(obj, Tensor):
        if id(obj) in seen:
            return {}
        seen.add(id(obj))
        return {prefix.rstrip("."): obj}
    if id(obj) in seen:
        return {}
    out: dict[str, Tensor] = OrderedDict()
    if isinstance(obj, (list, tuple)):
        seen.add(id(obj))
        for i, v in enumerate(obj):
            out.update(get_state_dict(v, f"{prefix}{i}.", seen))
    elif isinstance(obj, dict):
        seen.add(id(obj))
        for k, v in obj.items():
            out.update(get_state_dict(v, f"{prefix}{k}.", seen))
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        seen.add(id(obj))
        for k, v in vars(obj).items():
            if not k.startswith("_"):
                out.update(get_state_dict(v, f"{prefix}{k}.", seen))
    return out


def get_parameters(obj: Any) -> list[Tensor]:
    """The tensors of get_state_dict(obj) as a list (running statistics included, as in tinygrad)."""
    return list(get_state_dict(obj).values())


def load_state_dict(obj: Any, state: dict[str, Any], strict: bool = True) -> None:
    """Copy values into obj's tensors (in place, with assign). Values may be Tensors, numpy arrays or
    torch tensors. With strict, missing or unexpected keys raise a StateDictError naming them; a wrong
    shape always raises a ShapeError naming the key."""
    own = get_state_dict(obj)
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append(f"missing keys: {', '.join(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {', '.join(unexpected)}")
        raise StateDictError(
            "load_state_dict: " + "; ".join(parts) + " (pass strict=False to load the keys that match)"
        )
    values = {key: _to_numpy(state[key]) for key in own if key in state}
    wrong = [f"Shape mismatch in layer `{key}`: Expected shape {own[key].shape}, but found {tuple(v.shape)}"
             " in state dict." for key, v in values.items() if tuple(v.shape) != own[key].shape]
    if wrong:  # (tinygrad's words) checked before any value is copied: a failed load changes nothing
        raise ShapeError("load_state_dict: " + " ".join(wrong))
    for key, value in values.items():
        t = own[key]
        t.assign(Tensor(value.astype(t.dtype.np), device=t.device)).realize()


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, Tensor):
        return value.numpy()
    if hasattr(value, "detach"):  # a torch tensor (numpy has no bfloat16: through float32, exactly)
        value = value.detach().cpu()
        return (value.float() if str(value.dtype) == "torch.bfloat16" else value).numpy()
    return np.asarray(value)


def _dtype_of(value: Any) -> DType:
    if isinstance(value, Tensor):
        return value.dtype
    if hasattr(value, "detach"):
        return dtypes.from_any(value.dtype)
    return dtypes.from_any(np.asarray(value).dtype)


_SAFE_DTYPES = {"F64": dtypes.float64, "F32": dtypes.float32, "F16": dtypes.float16, "BF16": dtypes.bfloat16,
                "I64": dtypes.int64, "I32": dtypes.int32, "I16": dtypes.int16, "I8": dtypes.int8,
                "U8": dtypes.uint8, "BOOL": dtypes.bool, "U16": dtypes.uint16, "U32": dtypes.uint32,
                "U64": dtypes.uint64}


def safe_save(state: dict[str, Any], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Write tensors (Tensors, numpy arrays or torch tensors) to a .safetensors file, readable by
    safetensors.torch.load_file and tinygrad: an 8-byte header length, a JSON header padded to 8 bytes,
    then the data, little-endian. bfloat16 is stored as BF16 (2 bytes each)."""
    codes = {dt: code for code, dt in _SAFE_DTYPES.items()}
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    chunks, offset = [], 0
    for key, value in state.items():
        dtype = _dtype_of(value)
        values = _to_numpy(value)
        data = to_bytes(values, dtype).tobytes()  # native order: little-endian on every host tgrad runs on
        header[key] = {"dtype": codes[dtype], "shape": list(values.shape),
                       "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    # written to a new file renamed into place: tensors safe_load mapped from the old file keep its bytes
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(chunks))
    os.replace(tmp, path)


def _host_dtype(dtype: DType, device: str | None) -> DType:
    """dtype, or float32 for bfloat16 on a device without it (the values are exact in float32)."""
    if dtype == dtypes.bfloat16 and not Device[Device.canonicalize(device)].supports(dtype):
        return dtypes.float32
    return dtype


def safe_load(path: str | Path, device: str | None = None) -> dict[str, Tensor]:
    """Read a .safetensors file into a dict of Tensors (file order kept). The file is memory-mapped (the
    DISK device, runtime/disk.py), never read whole: device="disk" returns the tensors as views of the
    file, each read only when copied (.to(device), load_state_dict); any other device (None: the
    default one) gets a copy of each. BF16 tensors load as bfloat16 (as float32 on devices without
    bfloat16). The header is checked first: a StateDictError names the file and the key of a tensor
    whose dtype, shape or byte range is wrong, or that lies past the end of a truncated file."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little")
        if len(head) < 8 or 8 + n > size:
            raise StateDictError(f"safe_load: {path} is {size} bytes, too short for its header "
                                 f"({'no 8-byte header length' if len(head) < 8 else f'{n} bytes'}): "
                                 "a truncated or not a safetensors file")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise StateDictError(f"safe_load: {path}: the header is not JSON ({e})") from e
    if not isinstance(header, dict):
        raise StateDictError(f"safe_load: {path}: the header is not a JSON object")
    header.pop("__metadata__", None)
    ranges = {key: _checked_entry(path, key, info, size - 8 - n) for key, info in header.items()}
    order = sorted(ranges, key=lambda k: ranges[k][:2])
    for before, after in zip(order, order[1:]):
        if ranges[after][0] < ranges[before][1]:
            raise StateDictError(f"safe_load: {path}: the bytes of {after} ({list(ranges[after][:2])}) "
                                 f"overlap those of {before} ({list(ranges[before][:2])})")
    disk = str(device).split(":")[0].upper() == "DISK" if device is not None else False
    data = Tensor.empty(size, dtype=dtypes.uint8, device=f"disk:{path}")
    out = {}
    for key, (begin, end, dtype, shape) in ranges.items():
        view = data[8 + n + begin : 8 + n + end].bitcast(dtype).reshape(shape)
        if not disk:  # the mapped bytes as values (a view for most dtypes): copied once, into the device
            mapped = view.node.buffer
            view = Tensor(from_bytes(mapped.data, dtype).reshape(shape), device=device,
                          dtype=_host_dtype(dtype, device)).realize()
            get_runtime(data.device).release(mapped)  # (the copy is made: the file's pages can go)
        out[key] = view
    return out


def _checked_entry(path: Path, key: str, info: Any, nbytes: int) -> tuple[int, int, DType, tuple[int, ...]]:
    """(begin, end, dtype, shape) of a header entry, checked against the data's `nbytes` bytes."""
    where = f"safe_load: {path}: {key}"
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
        raise StateDictError(f"{where}: the header entry {info!r} has no dtype, shape and data_offsets")
    if info["dtype"] not in _SAFE_DTYPES:
        raise StateDictError(f"{where} has dtype {info['dtype']}, which tgrad cannot read "
                             f"(known: {', '.join(_SAFE_DTYPES)})")
    dtype, shape, offsets = _SAFE_DTYPES[info["dtype"]], info["shape"], info["data_offsets"]
    ints = lambda xs: isinstance(xs, list) and all(type(x) is int and x >= 0 for x in xs)  # noqa: E731
    if not ints(shape):
        raise StateDictError(f"{where}: the shape {shape!r} is not a list of non-negative ints")
    if not ints(offsets) or len(offsets) != 2 or offsets[0] > offsets[1]:
        raise StateDictError(f"{where}: data_offsets {offsets!r} is not [begin, end] with begin <= end")
    begin, end = offsets
    if end > nbytes:
        raise StateDictError(f"{where}: its bytes [{begin}, {end}) run past the end of the data ({nbytes} "
                             "bytes after the header): a truncated file or a wrong header")
    if end - begin != math.prod(shape) * dtype.itemsize:
        need = math.prod(shape) * dtype.itemsize
        raise StateDictError(f"{where}: shape {shape} of {dtype.name} needs {need} bytes, its "
                             f"data_offsets give {end - begin}")
    return begin, end, dtype, tuple(shape)


# torch.save's storage classes
_TORCH_STORAGES = {
    "FloatStorage": dtypes.float32, "DoubleStorage": dtypes.float64, "HalfStorage": dtypes.float16,
    "BFloat16Storage": dtypes.bfloat16, "LongStorage": dtypes.int64, "IntStorage": dtypes.int32,
    "ShortStorage": dtypes.int16, "CharStorage": dtypes.int8, "ByteStorage": dtypes.uint8,
    "BoolStorage": dtypes.bool,
}
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # the first pickle of a legacy torch.save file


def torch_load(path: str | Path, device: str | None = None) -> dict[str, Any]:
    """Read a PyTorch checkpoint (.pt / .pth written by torch.save) without importing torch: the pickle is
    read with the standard library, each tensor's storage with numpy. Returns what was saved (usually a
    state dict) with Tensors in place of torch tensors (bfloat16 stays bfloat16, float32 on devices without
    it). Both formats: zip (PyTorch >= 1.6) and legacy (`_use_new_zipfile_serialization=False`: pickles,
    then each storage's element count as 8 bytes and its raw bytes)."""
    storages: dict[str, np.ndarray] = {}  # key -> the storage's values, flat
    kinds: dict[str, DType] = {}  # key -> dtype, from the persistent ids

    def rebuild(stored, offset, size, stride, *_):
        dtype, key = stored
        flat = storages.get(key)
        if flat is None:  # the legacy format's first pass: storages come after the pickle
            return None
        item = flat.itemsize
        view = np.lib.stride_tricks.as_strided(flat[offset:], tuple(size), tuple(s * item for s in stride))
        return Tensor(np.array(view), device=device, dtype=_host_dtype(dtype, device))

    class Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str):
            if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
                return rebuild
            if module == "torch._utils" and name == "_rebuild_parameter":
                return lambda data, *_: data
            if module == "torch" and name in _TORCH_STORAGES:
                return _TORCH_STORAGES[name]
            if module == "collections" and name == "OrderedDict":
                return OrderedDict
            raise StateDictError(f"torch_load: cannot load {module}.{name} from {path}")

        def persistent_load(self, pid):
            # ("storage", storage class, key, device, numel[, view metadata]): the dtype and the key
            kinds[str(pid[2])] = pid[1]
            return pid[1], str(pid[2])

    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            pkl = next(n for n in archive.namelist() if n.endswith("data.pkl"))
            root = pkl[: -len("data.pkl")]
            with archive.open(pkl) as f:
                Unpickler(f).load()  # learns the storages it needs
            mapping = np.memmap(path, np.uint8, mode="r")
            for key, dtype in kinds.items():
                storages[key] = from_bytes(_zip_member(archive, f"{root}data/{key}", mapping), dtype)
            with archive.open(pkl) as f:
                return Unpickler(f).load()
    f = io.BytesIO(Path(path).read_bytes())
    try:
        magic = pickle.load(f)
    except Exception:
        magic = None
    if magic != _LEGACY_MAGIC:
        raise StateDictError(f"torch_load: {path} is neither a zip nor a legacy torch.save checkpoint")
    pickle.load(f), pickle.load(f)  # the protocol version, sys_info
    start = f.tell()
    Unpickler(f).load()  # the object, without its storages: learns their keys and dtypes
    for key in pickle.load(f):  # the storage keys, in the order their data follows
        numel = int.from_bytes(f.read(8), "little")
        dtype = kinds[str(key)]
        storages[str(key)] = from_bytes(np.frombuffer(f.read(numel * dtype.itemsize), np.uint8), dtype)
    f.seek(start)
    return Unpickler(f).load()


def _zip_member(archive: zipfile.ZipFile, name: str, mapping: np.ndarray) -> np.ndarray:
    """A zip member's bytes: where it is stored uncompressed (torch.save stores every storage so) a view of
    the file's mapping (its local header, 30 bytes, a name and an extra field, comes first), read only
    where a tensor uses it; else the member read and decompressed."""
    info = archive.getinfo(name)
    start = info.header_offset
    local = mapping[start : start + 30].tobytes()
    if info.compress_type != zipfile.ZIP_STORED or len(local) < 30 or local[:4] != b"PK\x03\x04":
        return np.frombuffer(archive.read(name), np.uint8)
    start += 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
    if start + info.file_size > mapping.size:
        raise StateDictError(f"torch_load: {archive.filename}: {name} runs past the end of the file "
                             "(truncated?)")
    return mapping[start : start + info.file_size]


__all__ = ["get_state_dict", "get_parameters", "load_state_dict", "safe_save", "safe_load", "torch_load",
           "StateDictError"]
