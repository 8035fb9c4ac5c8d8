"""The suite's `sweep` marker (tests/conftest.py): off SWEEP_DEVICES a parameter product shrinks to a
diagonal that still has every value of every parameter, and only sweeps shrink. Its `spread` marker: every
case still runs on SWEEP_DEVICES and on one other device, and every other device runs some."""

import itertools
import types

import pytest

from tests.conftest import (
    SWEEP_DEVICES,
    _cases,
    _flat_case,
    _group_tests,
    _on_diagonal,
    _spread_keeps,
    pytest_configure_node,
)


@pytest.mark.parametrize("sizes", [(9, 3), (2, 6), (3, 2, 2), (4,), (5, 5)])
def test_the_diagonal_has_every_value_of_every_parameter(sizes):
    product = list(itertools.product(*map(range, sizes)))
    kept = [case for case in product if _on_diagonal(dict(enumerate(case)), dict(enumerate(sizes)))]
    assert len(kept) == max(sizes)
    for p, n in enumerate(sizes):
        assert {case[p] for case in kept} == set(range(n))


def _item(params: dict, marks: list) -> types.SimpleNamespace:
    spec = types.SimpleNamespace(params=params)
    return types.SimpleNamespace(callspec=spec, iter_markers=lambda name: marks)


def test_cases_finds_each_marks_case_by_identity():
    kws = [dict(), dict(stride=2), dict(stride=2)]  # equal values, different cases
    shapes = [(1, 2), (3, 4)]
    marks = [pytest.mark.parametrize("kw", kws).mark,
             pytest.mark.parametrize("shape,n", [(shapes[0], 1), pytest.param(shapes[1], 2)]).mark]
    indices, sizes = _cases(_item({"kw": kws[2], "shape": shapes[1], "n": 2}, marks))
    assert indices == {0: 2, 1: 1} and sizes == {0: 3, 1: 2}


def test_conv_sweep_keeps_every_option_on_every_device():
    """test_conv2d_gradients is a sweep: CL, WEBGPU and TRITON still run each conv option (and each size)."""
    assert set(SWEEP_DEVICES) == {"NUMPY", "CPU"}
    from tests import test_conv_grad

    marks = list(reversed(test_conv_grad.test_conv2d_gradients.pytestmark))
    marks = [m for m in marks if m.name == "parametrize"]
    kws, sizes = marks[0].args[1], marks[1].args[1]
    assert any(m.name == "sweep" for m in test_conv_grad.test_conv2d_gradients.pytestmark)
    kept = [(kw, size) for kw in kws for size in sizes
            if _on_diagonal(*_cases(_item({"kw": kw, "size": size}, marks)))]
    assert len(kept) == len(kws)
    assert all(any(k is kw for k, _ in kept) for kw in kws)
    assert all(any(s is size for _, s in kept) for size in sizes)


@pytest.mark.parametrize("devices", [["NUMPY", "CPU", "CL", "TRITON", "WEBGPU"], ["CPU", "WEBGPU"],
                                     ["CL", "TRITON"]])
@pytest.mark.parametrize("cases", [1, 2, 3, 11])
def test_spread_runs_each_case_on_one_other_device(devices, cases):
    others = [d for d in devices if d not in SWEEP_DEVICES]
    for d in devices:
        kept = [k for k in range(cases) if _spread_keeps(k, d, devices)]
        if d in SWEEP_DEVICES:
            assert kept == list(range(cases))
        elif cases >= len(others):
            assert kept, d
    for k in range(cases):
        assert sum(_spread_keeps(k, d, devices) for d in others) == (1 if others else 0)
    # a device the run was not asked for (a test that names its own) is not dropped
    assert _spread_keeps(0, "METAL", devices)


def test_flat_case_numbers_a_product_once_each():
    sizes = {0: 3, 1: 4}
    flats = {_flat_case({0: i, 1: j}, sizes) for i in range(3) for j in range(4)}
    assert flats == set(range(12))


def test_spread_tests_are_marked():
    from tests import test_linalg_decomp, test_optim

    for fn in (test_optim.test_eager_steps_see_a_changed_hyperparameter,
               test_linalg_decomp.test_newton_schulz_matches_torch):
        assert any(m.name == "spread" for m in fn.pytestmark)


class _PluginManager:
    def __init__(self, xdist: bool):
        self.xdist = xdist

    def hasplugin(self, name: str) -> bool:
        return self.xdist and name == "xdist"


def _config(dist: str | None, xdist: bool = True, workerinput: dict | None = None) -> types.SimpleNamespace:
    option = types.SimpleNamespace(dist=dist, loadgroup=False)
    config = types.SimpleNamespace(option=option, pluginmanager=_PluginManager(xdist),
                                   getoption=lambda name, default=None: getattr(option, name, default))
    if workerinput is not None:
        config.workerinput = workerinput
    return config


def test_xdist_groups_stay_on_one_worker_unless_told_otherwise():
    """`-n N` (pytest-xdist's `--dist load`) becomes `loadgroup`, which keeps tests marked xdist_group on
    one worker (test_big_tensors.py's 2 GB tensors); an explicit mode and a run without xdist stay; a
    worker told so by the controller marks its items with their group."""
    modes = (("load", "loadgroup"), ("loadscope", "loadscope"), ("no", "no"), ("loadgroup", "loadgroup"))
    for dist, want in modes:
        config = _config(dist)
        _group_tests(config)
        assert config.option.dist == want
    config = _config("load", xdist=False)
    _group_tests(config)
    assert config.option.dist == "load"
    for told in (True, False):
        worker = _config("no", workerinput={"tgrad_loadgroup": told})
        _group_tests(worker)
        assert worker.option.loadgroup is told and worker.option.dist == "no"
    node = types.SimpleNamespace(config=_config("loadgroup"), workerinput={})
    pytest_configure_node(node)
    assert node.workerinput == {"tgrad_loadgroup": True}
