"""The hot ops that build their common case from graph nodes (linear, cross_entropy) build exactly the
nodes of their Tensor-op definitions (the graph is hash-consed: the same objects), so kernels, values and
gradients cannot differ between the two routes."""

import numpy as np

from tgrad import Tensor
from tgrad.ops import losses


def test_cross_entropys_node_route_builds_its_tensor_routes_nodes():
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((6, 4)).astype(np.float32), requires_grad=True)
    y = Tensor(np.array([0, 3, 1, -100, 2, 1]))
    fast = x.cross_entropy(y)
    logp = x.log_softmax(1)
    tc, cls = losses._class_positions(y, 4, -100, 2)
    loss = -(tc.unsqueeze(1) != cls).where(0, logp).sum(1)
    keep = y != -100
    loss = keep.where(loss, 0)
    readable = loss.sum() * keep.sum().cast(loss.dtype).reciprocal()
    assert fast.node is readable.node
