"""Finding a model's tensors by walking its attributes, state dicts, and safetensors files."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from tgrad.errors import ShapeError, TgradError
from tgrad.tensor import Tensor


class StateDictError(TgradError, KeyError):
    """load_state_dict: keys missing, unexpected or of the wrong shape."""

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
    for key, t in own.items():
        if key not in state:
            continue
        value = _to_numpy(state[key])
        if tuple(value.shape) != t.shape:
            raise ShapeError(f"load_state_dict: {key} has shape {tuple(value.shape)}, model has {t.shape}")
        t.assign(Tensor(value.astype(t.dtype.np), device=t.device)).realize()


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, Tensor):
        return value.numpy()
    if hasattr(value, "detach"):  # a torch tensor
        return value.detach().cpu().numpy()
    return np.asarray(value)


def safe_save(state: dict[str, Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Write tensors to a .safetensors file (readable by safetensors.torch.load_file and tinygrad)."""
    from safetensors.numpy import save_file

    save_file({k: np.array(_to_numpy(v), order="C") for k, v in state.items()}, str(path), metadata)


_SAFE_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": "bfloat16", "I64": np.int64,
                "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
                "U16": np.uint16, "U32": np.uint32, "U64": np.uint64}


def safe_load(path: str | Path, device: str | None = None) -> dict[str, Tensor]:
    """Read a .safetensors file into a dict of Tensors (file order kept), with the standard library and
    numpy: an 8-byte header length, a JSON header, then the data. bfloat16 tensors become float32."""
    import json

    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    out = {}
    for key, info in header.items():
        if info["dtype"] not in _SAFE_DTYPES:
            raise StateDictError(f"safe_load: {key} has dtype {info['dtype']}, which tgrad cannot read")
        begin, end = info["data_offsets"]
        data, dtype = raw[8 + n + begin : 8 + n + end], _SAFE_DTYPES[info["dtype"]]
        if dtype == "bfloat16":  # the high half of a float32
            arr = (np.frombuffer(data, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(data, dtype)
        out[key] = Tensor(arr.reshape(info["shape"]), device=device)
    return out


# torch.save's storage classes -> numpy dtypes; bfloat16 is widened to float32 when loaded
_TORCH_STORAGES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "BFloat16Storage": "bfloat16", "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}


def torch_load(path: str | Path, device: str | None = None) -> dict[str, Any]:
    """Read a PyTorch checkpoint (.pt / .pth written by torch.save, zip format) without importing torch:
    the pickle is read with the standard library, each tensor's storage with numpy. Returns what was
    saved (usually a state dict) with Tensors in place of torch tensors; bfloat16 becomes float32.
    The legacy (pre-1.6, non-zip) format is not supported."""
    import pickle
    import zipfile

    if not zipfile.is_zipfile(path):
        raise StateDictError(f"torch_load: {path} is not a zip checkpoint (the legacy torch.save format "
                             "is not supported; re-save it with a recent PyTorch)")
    with zipfile.ZipFile(path) as archive:
        pkl = next(n for n in archive.namelist() if n.endswith("data.pkl"))
        root = pkl[: -len("data.pkl")]

        def storage(dtype, key: str) -> np.ndarray:
            raw = archive.read(f"{root}data/{key}")
            if dtype == "bfloat16":  # the high half of a float32
                return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
            return np.frombuffer(raw, dtype)

        def rebuild(stored, offset, size, stride, *_):
            dtype, key = stored
            flat = storage(dtype, key)
            item = flat.itemsize
            strides = tuple(s * item for s in stride)
            view = np.lib.stride_tricks.as_strided(flat[offset:], tuple(size), strides)
            return Tensor(np.array(view), device=device)

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
                _, dtype, key, _location, _numel = pid  # ("storage", storage class, key, device, numel)
                return dtype, key

        with archive.open(pkl) as f:
            return Unpickler(f).load()


__all__ = ["get_state_dict", "get_parameters", "load_state_dict", "safe_save", "safe_load", "torch_load",
           "StateDictError"]
