"""The schedule cache (tgrad/schedule_cache.py): an eager step that rebuilds a graph of the same structure
reuses its schedule, and gives the same numbers as scheduling it again; graphs that differ in structure,
constants or buffer aliasing never share one."""

import numpy as np
import torch

from tgrad import Tensor, fuse, schedule_cache
from tgrad import graph as g
from tgrad.nn import Linear
from tgrad.nn.optim import Adam
from tgrad.nn.state import get_parameters


def _hits_misses():
    return schedule_cache.Stats.hits, schedule_cache.Stats.misses


def test_repeated_eager_training_steps_hit_and_match_torch(device):
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((8, 5)).astype(np.float32), rng.standard_normal((3, 8)).astype(np.float32)
    l1, l2 = Linear(5, 8), Linear(8, 3)
    l1.weight, l1.bias = Tensor(w1, requires_grad=True), Tensor(np.zeros(8, np.float32), requires_grad=True)
    l2.weight, l2.bias = Tensor(w2, requires_grad=True), Tensor(np.zeros(3, np.float32), requires_grad=True)
    opt = Adam(get_parameters([l1, l2]), lr=0.05)
    t1, t2 = torch.nn.Linear(5, 8), torch.nn.Linear(8, 3)
    with torch.no_grad():
        t1.weight[:], t2.weight[:] = torch.tensor(w1), torch.tensor(w2)
        t1.bias.zero_(), t2.bias.zero_()
    topt = torch.optim.Adam([*t1.parameters(), *t2.parameters()], lr=0.05)
    before = _hits_misses()
    for _ in range(6):
        x, y = rng.standard_normal((4, 5)).astype(np.float32), rng.integers(0, 3, 4)
        opt.zero_grad()
        loss = l2(l1(Tensor(x)).relu()).cross_entropy(Tensor(y))
        loss.backward()
        opt.step(loss)
        topt.zero_grad()
        tloss = torch.nn.functional.cross_entropy(t2(t1(torch.tensor(x)).relu()), torch.tensor(y))
        tloss.backward()
        topt.step()
        np.testing.assert_allclose(loss.numpy(), tloss.item(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(l1.weight.numpy(), t1.weight.detach().numpy(), rtol=1e-4, atol=1e-5)
    hits = _hits_misses()[0] - before[0]
    if device != "NUMPY":  # the reference evaluates graphs without schedules
        assert hits >= 4, "later steps did not reuse the first step's schedule"


def test_same_structure_other_constants_or_shapes_do_not_share(device):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for scale in (2.0, 3.0):
        np.testing.assert_array_equal((Tensor(x) * scale + 1).sum(1).numpy(), (x * scale + 1).sum(1))
    for shape in ((2, 3), (3, 2)):
        y = np.arange(6, dtype=np.float32).reshape(shape)
        np.testing.assert_array_equal((Tensor(y) * 2).sum(0).numpy(), (y * 2).sum(0))


def test_aliased_leaves_are_part_of_the_key():
    """a + b with two buffers, then with one buffer passed twice (and the reverse): each is right."""
    a = Tensor(np.arange(4, dtype=np.float32)).realize()
    b = Tensor(np.ones(4, np.float32)).realize()
    for x, y, want in ((a, b, np.arange(4) + 1), (a, a, np.arange(4) * 2), (b, a, np.arange(4) + 1)):
        np.testing.assert_array_equal((x * 1 + y).numpy(), want)


def test_cached_schedule_equals_a_fresh_one():
    w = Tensor(np.random.default_rng(1).standard_normal((6, 6)).astype(np.float32)).realize()

    def graph():
        x = Tensor(np.random.default_rng(2).standard_normal((3, 6)).astype(np.float32))
        return [((x @ w).relu().softmax(1) * 2).node]

    first = schedule_cache.schedule(graph())
    nodes = graph()
    cached, fresh = schedule_cache.schedule(nodes), fuse.schedule(nodes)
    assert [it.kernel for it in cached] == [it.kernel for it in fresh] == [it.kernel for it in first]
    assert [it.out for it in cached] == [it.out for it in fresh]
    assert [it.inputs for it in cached] == [it.inputs for it in fresh]


def test_node_cache_hash_conses_and_drops_dead_nodes():
    """Equal (op, sources, arg, ...) give one Node while it lives; the cache of them does not grow with
    every graph ever built (dead entries are dropped), and nodes built after a purge still hash-cons and
    compute the right values."""
    from tgrad import graph

    x = Tensor(np.arange(6, dtype=np.float32)).realize()
    a, b = x * 2.0 + 1.0, x * 2.0 + 1.0
    assert a.node is b.node and (x * 2.0).node is not (x * 3.0).node
    for i in range(3 * graph.Node._purge_at // 4 + 100):  # enough dead graphs to trigger purges
        _ = (x * float(i) - 1.0).exp()
    assert len(graph.Node._cache) <= graph.Node._purge_at
    c = x * 2.0 + 1.0
    assert c.node is a.node
    np.testing.assert_array_equal(c.numpy(), np.arange(6, dtype=np.float32) * 2 + 1)


def test_dtype_equality_is_by_name():
    from tgrad.dtype import DType, dtypes

    same = DType("float32", 4, "f", dtypes.float32.rank)
    assert same == dtypes.float32 and hash(same) == hash(dtypes.float32)
    assert dtypes.float32 != dtypes.float16 and dtypes.float32 != "float32"


def test_row_groups_of_a_cached_schedule_are_found_once(monkeypatch):
    """The driver keeps a cached schedule's row groups with it (they depend on its structure alone): the
    same structure again gets the groups that finding them again gives (runner, nodes, first item),
    without finding them; an assign's target among a group's nodes included."""
    from tgrad.device import get_runtime
    from tgrad.runtime.cpu import groups

    rt = get_runtime("CPU")
    found = []
    find = groups._row_groups
    monkeypatch.setattr(groups, "_row_groups", lambda items, rt: found.append(1) or find(items, rt))
    rng = np.random.default_rng(3)

    def graph():  # the same structure each time: new buffers
        p = Tensor(rng.standard_normal((64, 32)).astype(np.float32), device="CPU").realize()
        x = Tensor(rng.standard_normal((64, 32)).astype(np.float32), device="CPU")
        return [p.assign(p * 0.9 + x.softmax(1) * 0.1).node]

    first = schedule_cache.schedule(graph())
    assert groups._row_groups_of(first, rt)
    again = schedule_cache.schedule(graph())
    calls = len(found)
    kept = groups._row_groups_of(again, rt)
    assert len(found) == calls, "the groups were found again"
    fresh = find(again, rt)
    assert kept.keys() == fresh.keys()
    for last, (runner, nodes, start) in fresh.items():
        assert kept[last][0] is runner and kept[last][2] == start
        assert len(kept[last][1]) == len(nodes) and all(a is b for a, b in zip(kept[last][1], nodes))
    assert any(any(n is again[last].target for n in nodes) for last, (_, nodes, _) in kept.items())


def test_recursive_and_iterative_walks_agree_and_the_fallback_computes(monkeypatch):
    """graph.structure numbers the graph recursively (twice as fast) and falls back to its own stack where a
    graph is deeper than the recursion limit allows: both give the same key, nodes and buffer holders,
    stopping at realized nodes or walking through them, and the fallback computes."""
    rng = np.random.default_rng(0)
    xs, ws = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    x, w = Tensor(xs, requires_grad=True), Tensor(ws, requires_grad=True)
    mid = (x @ w).relu().realize()  # (it keeps its graph: gradients flow through it)
    out = ((mid * 2 - x.sum(1, keepdim=True)) + mid).softmax(-1)
    nodes = [out.node, x.node, (x * 2).node]
    for through in (False, True):
        rec = g._structure_recursive(nodes, through, None)
        it = g._structure_iterative(nodes, through, None)
        assert rec[0] == it[0] and rec[1] == it[1] and rec[2] == it[2] and rec[3] == it[3]
    stop, walk = g.structure(nodes)[1], g.structure(nodes, through=True)[1]
    assert len(walk) > len(stop)  # (through the realized matmul to its sources)
    assert g.structure([mid.node])[0][0][0][0] == g.LEAF
    # buffers numbered by first appearance: aliasing is part of the key
    a = Tensor(xs).realize()
    same, other = g.structure([(a + a).node])[0], g.structure([(a + Tensor(xs).realize()).node])[0]
    assert same != other

    def too_deep(*args):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(g, "_structure_recursive", too_deep)
    monkeypatch.setattr(schedule_cache, "_cache", type(schedule_cache._cache)())
    y = (Tensor(xs) @ Tensor(ws) + 1).numpy()
    np.testing.assert_allclose(y, xs @ ws + 1, rtol=1e-5, atol=1e-5)
