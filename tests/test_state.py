"""State dicts and safetensors files, checked against PyTorch's safetensors loader and state_dict."""
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tgrad import Tensor
from tgrad.errors import ShapeError
from tgrad.nn import BatchNorm2d, Conv2d, Linear
from tgrad.nn.state import (
    StateDictError,
    get_parameters,
    get_state_dict,
    load_state_dict,
    safe_load,
    safe_save,
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
    with pytest.raises(ShapeError, match=r"layers.0.weight has shape \(3, 5\), model has \(3, 4\)"):
        load_state_dict(net, sd)


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
