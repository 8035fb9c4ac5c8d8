"""State dicts, safetensors files and torch.save checkpoints, checked against PyTorch's safetensors loader,
state_dict and torch.save (both formats)."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tgrad import Tensor, dtypes
from tgrad.errors import ShapeError
from tgrad.nn import BatchNorm2d, Conv2d, Linear
from tgrad.nn.state import (
    StateDictError,
    get_parameters,
    get_state_dict,
    load_state_dict,
    safe_load,
    safe_save,
    torch_load,
)


class Net:
    def __init__(self):
        self.conv = Conv2d(1, 2, 3)
        self.bn = BatchNorm2d(2)
        self.layers = [Linear(4, 3), Linear(3, 2, bias=False)]


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 2, 3)
        self.bn = torch.nn.BatchNorm2d(2)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 3), torch.nn.Linear(3, 2, bias=False)])


def test_state_dict_keys_match_torch():
    sd = get_state_dict(Net())
    tsd = TorchNet().state_dict()
    assert list(sd) == list(tsd)
    assert {k: v.shape for k, v in sd.items()} == {k: tuple(v.shape) for k, v in tsd.items()}
    assert len(get_parameters(Net())) == len(tsd)


def test_shared_tensor_listed_once():
    a = Linear(2, 2)

    class Tied:
        def __init__(self):
            self.first, self.second = a, a

    assert list(get_state_dict(Tied())) == ["first.weight", "first.bias"]


def test_load_torch_state_dict_into_model():
    tnet = TorchNet()
    net = Net()
    load_state_dict(net, tnet.state_dict())
    np.testing.assert_array_equal(net.conv.weight.numpy(), tnet.conv.weight.detach().numpy())
    np.testing.assert_array_equal(net.layers[1].weight.numpy(), tnet.layers[1].weight.detach().numpy())
    assert net.conv.weight.requires_grad


def test_load_state_dict_errors():
    net = Net()
    sd = {k: v.numpy() for k, v in get_state_dict(net).items()}
    bad = dict(sd)
    del bad["bn.bias"]
    bad["extra.weight"] = np.zeros(2)
    with pytest.raises(StateDictError, match=r"missing keys: bn.bias.*unexpected keys: extra.weight"):
        load_state_dict(net, bad)
    load_state_dict(net, bad, strict=False)  # loads what matches
    sd["layers.0.weight"] = np.zeros((3, 5), np.float32)
    # the key and both shapes, in tinygrad's words (its test_load_state_dict_shape_mismatch); nothing loaded
    sd["bn.weight"] = np.ones(7, np.float32)
    before = {k: v.numpy().copy() for k, v in get_state_dict(net).items()}
    want = (r"Shape mismatch in layer `bn.weight`: Expected shape \(2,\), but found \(7,\) in state dict. "
            r"Shape mismatch in layer `layers.0.weight`: Expected shape \(3, 4\), but found \(3, 5\) in "
            r"state dict.")
    with pytest.raises(ShapeError, match=want):
        load_state_dict(net, sd)
    for k, v in get_state_dict(net).items():
        np.testing.assert_array_equal(v.numpy(), before[k])


def test_safetensors_round_trip_with_torch(tmp_path):
    net = Net()
    sd = get_state_dict(net)
    safe_save(sd, tmp_path / "net.safetensors")
    loaded = load_file(str(tmp_path / "net.safetensors"))
    assert sorted(loaded) == sorted(sd)
    for k, v in sd.items():
        np.testing.assert_array_equal(loaded[k].numpy(), v.numpy())
    nbt = loaded["bn.num_batches_tracked"]
    assert nbt.dtype == torch.int64 and nbt.ndim == 0
    # and a file written by PyTorch loads into tgrad
    tsd = {k: v.contiguous() for k, v in TorchNet().state_dict().items()}
    tsd["half"] = torch.arange(6, dtype=torch.float16).reshape(2, 3)
    save_file(tsd, str(tmp_path / "torch.safetensors"))
    back = safe_load(tmp_path / "torch.safetensors")
    assert isinstance(back["conv.weight"], Tensor)
    for k, v in tsd.items():
        np.testing.assert_array_equal(back[k].numpy(), v.numpy())
    assert back["half"].dtype.name == "float16"
    del back["half"]
    load_state_dict(net, back)
    np.testing.assert_array_equal(net.conv.bias.numpy(), tsd["conv.bias"].numpy())


def _bits(t) -> np.ndarray:
    """The raw bytes of a torch tensor or a tgrad Tensor (bfloat16 as its 2 bytes)."""
    if isinstance(t, Tensor):
        return t.bitcast(dtypes.uint8).numpy() if t.dtype != dtypes.bool else t.numpy().view(np.uint8)
    return t.contiguous().view(torch.uint8).numpy() if t.dtype != torch.bool else t.numpy().view(np.uint8)


def _write_safetensors(path, tensors: dict) -> bytes:
    """A .safetensors file built by hand from torch tensors' bytes (the format's spec, no library)."""
    names = {
        torch.bfloat16: "BF16",
        torch.float16: "F16",
        torch.float32: "F32",
        torch.int64: "I64",
        torch.bool: "BOOL",
        torch.int8: "I8",
    }
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for key, t in tensors.items():
        raw = _bits(t).tobytes()
        header[key] = {
            "dtype": names[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)
    return data


def _read_safetensors(path) -> dict:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    return {
        k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0] : 8 + n + v["data_offsets"][1]])
        for k, v in header.items()
    }


def test_safetensors_bfloat16_and_half_bits(device, tmp_path):
    edges = [0.0, -0.0, 1.0 + 2**-7, -3.0e38, float("inf"), -float("inf"), 1e-40, 0.1]
    tensors = {
        "bf16": torch.tensor(edges).bfloat16().reshape(2, 4),
        "half": torch.tensor([0.5, -0.0, 65504.0, 6e-8, float("inf")]).half(),
        "f32": torch.tensor(edges),
        "i64": torch.tensor([2**30, -1]),
        "bool": torch.tensor([True, False]),
        "empty": torch.zeros(0, 3).bfloat16(),
    }
    _write_safetensors(tmp_path / "hand.safetensors", tensors)
    loaded = safe_load(tmp_path / "hand.safetensors")
    host = device in dtypes.HOST_DEVICES
    assert loaded["bf16"].dtype == (dtypes.bfloat16 if host else dtypes.float32)  # float32 holds them exactly
    assert loaded["half"].dtype == dtypes.float16 and loaded["bool"].dtype == dtypes.bool
    for key, t in tensors.items():
        assert loaded[key].shape == tuple(t.shape), key
        if host or t.dtype != torch.bfloat16:
            np.testing.assert_array_equal(_bits(loaded[key]), _bits(t), err_msg=key)
        np.testing.assert_array_equal(
            loaded[key].numpy(), t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy(), err_msg=key
        )
    # saved back: the same dtypes and bytes (BF16 stays BF16 where the device has bfloat16)
    safe_save(loaded, tmp_path / "back.safetensors")
    back = _read_safetensors(tmp_path / "back.safetensors")
    for key, t in tensors.items():
        code, shape, raw = back[key]
        if not host and t.dtype == torch.bfloat16:
            assert code == "F32" and raw == t.float().numpy().tobytes()
            continue
        assert (code, shape) == (
            {"bf16": "BF16", "half": "F16", "f32": "F32", "i64": "I64", "bool": "BOOL", "empty": "BF16"}[key],
            list(t.shape),
        ), key
        assert raw == _bits(t).tobytes(), key
    # PyTorch's safetensors reads our file, and we read its
    theirs = load_file(str(tmp_path / "back.safetensors"))
    if host:
        assert theirs["bf16"].dtype == torch.bfloat16
        np.testing.assert_array_equal(_bits(theirs["bf16"]), _bits(tensors["bf16"]))
    save_file(tensors, str(tmp_path / "torch.safetensors"))
    ours = safe_load(tmp_path / "torch.safetensors")
    for key, t in tensors.items():
        np.testing.assert_array_equal(
            ours[key].numpy(), t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy(), err_msg=key
        )
    # torch bfloat16 tensors (numpy has none) can be saved and loaded into a model directly
    safe_save({"w": tensors["bf16"]}, tmp_path / "w.safetensors")
    assert _read_safetensors(tmp_path / "w.safetensors")["w"][::2] == (
        "BF16",
        _bits(tensors["bf16"]).tobytes(),
    )


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_torch_load_both_formats(device, tmp_path, zip_format):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) / 7
    bf = (torch.randn(3, 5, generator=torch.Generator().manual_seed(0)) * 1e3).bfloat16()
    state = {
        "f32": base,
        "transposed": base.T,  # strided view
        "slice": base[1:3, ::2],  # offset and steps into the same storage
        "same_storage": base.view(24)[5:],
        "half": torch.tensor([0.5, -0.0, 65504.0, float("inf")]).half(),
        "bf16": bf,
        "bf16_view": bf.T[1:],
        "i64": torch.tensor([[2**30, -3], [7, 0]]),
        "bool": torch.tensor([True, False, True]),
        "i8": torch.tensor([-128, 127], dtype=torch.int8),
        "nested": {"list": [torch.tensor([1.0, 2.0]), 3], "scalar": torch.tensor(5.0)},
    }
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    state["model"] = model.state_dict()
    torch.save(state, tmp_path / "ckpt.pt", _use_new_zipfile_serialization=zip_format)
    loaded = torch_load(tmp_path / "ckpt.pt")
    host = device in dtypes.HOST_DEVICES

    def check(ours, theirs, key):
        if isinstance(theirs, dict):
            assert list(ours) == list(theirs), key
            for k in theirs:
                check(ours[k], theirs[k], f"{key}.{k}")
        elif isinstance(theirs, list):
            for i, (a, b) in enumerate(zip(ours, theirs)):
                check(a, b, f"{key}[{i}]")
        elif isinstance(theirs, torch.Tensor):
            assert isinstance(ours, Tensor) and ours.shape == tuple(theirs.shape) and ours.device == device, (
                key
            )
            if theirs.dtype == torch.bfloat16:
                assert ours.dtype == (dtypes.bfloat16 if host else dtypes.float32), key
                np.testing.assert_array_equal(ours.numpy(), theirs.float().numpy(), err_msg=key)
                if host:
                    np.testing.assert_array_equal(_bits(ours), _bits(theirs), err_msg=key)
            else:
                assert ours.dtype == dtypes.from_any(theirs.dtype), key
                np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=key)
        else:
            assert ours == theirs, key

    check(loaded, state, "state")
