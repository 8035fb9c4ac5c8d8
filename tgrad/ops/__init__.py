"""Tensor's op groups, one mixin class per module (as tinygrad keeps them); tensor.py's Tensor is made of
them and holds the core (construction, data out, autograd, dtype). A mixin reaches the Tensor class through
type(self) (tensor.py imports these modules, so they cannot import it).

elementwise  ElementwiseOps: arithmetic with broadcasting, comparisons and logic, operators, in place
math         MathOps: unary math and activations
reduce       ReduceOps: reductions, softmax and its kin, sort and topk, cumulative ops
movement     MovementOps: views (reshape, permute, pad, shrink, cat, split...), tril/triu, diagonal
indexing     IndexingOps: __getitem__/__setitem__, gather, scatter, masked ops, takes and their host steps;
             writes into disk tensors
linalg       LinalgOps: matmul, einsum, linear
nn           NNOps: convolutions and their gradients, pooling, interpolation, norms, dropout, attention
losses       LossOps: cross_entropy, nll_loss, binary cross-entropy, mse, l1, smooth l1
helpers      what the mixins share: axis and shape arguments, broadcasting, node builders
numerics     pow, division, fmod and floor division as PyTorch computes them; series near 0
"""
