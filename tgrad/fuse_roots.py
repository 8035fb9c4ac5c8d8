"""Which nodes of a lazy graph become kernel outputs ("are realized"): the fusion rules of fuse.py's
docstring, as `kernel_roots(outputs)`; fuse.py lowers each root's kernel."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from tgrad.graph import ALU, EXPENSIVE, MOVEMENT, Node, Op, prod


def _walk(roots: list[Node]) -> list[Node]:
    """Unrealized nodes reachable from roots, sources before users."""
    order, seen = [], set()
    stack = [(r, False) for r in roots]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if node in seen or node.realized:
            continue
        seen.add(node)
        stack.append((node, True))
        stack.extend((s, False) for s in node.srcs)
    return order


def kernel_body(root: Node, realize: set[Node]) -> dict[Node, bool]:
    """Nodes computed inside root's kernel (root included), each with whether some path from the root
    to it goes through a movement op."""
    out: dict[Node, bool] = {}
    stack = [(root, False)]
    while stack:
        node, moved = stack.pop()
        if node in out and (out[node] or not moved):
            continue
        out[node] = moved
        srcs = node.srcs[1:] if node.op is Op.ASSIGN else node.srcs
        # a reshape keeps the row-major order, so a reduce under reshapes still lines up with the output
        moved = moved or (node.op in MOVEMENT and node.op is not Op.RESHAPE)
        for s in srcs:
            if not s.realized and s not in realize and s.op is not Op.CONST:
                stack.append((s, moved))
    return out


def _top_reduces(root: Node, realize: set[Node]) -> set[Node]:
    """The reduces of root's kernel that are not under another reduce."""
    out, seen, stack = set(), set(), [root]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op is Op.REDUCE:
            out.add(n)
            continue
        srcs = n.srcs[1:] if n.op is Op.ASSIGN else n.srcs
        stack.extend(s for s in srcs if not s.realized and s not in realize)
    return out


@dataclass(frozen=True)
class FuseTuning:
    """The sizes kernel_roots decides by (a device's DeviceProps.fuse): where a value is computed once, in a
    kernel of its own, instead of inside every kernel that reads it (a pass over memory against recomputing
    per element). Measured on the CPU (bench/HISTORY.md); a device whose compute is cheap against its
    memory may recompute more."""

    recompute_elements: int = 1 << 16  # an expand of at least this many elements is "big"
    recompute_ops: int = 8  # ALU ops and loads a big expand may recompute for every element
    shared_operand_ops: int = 3  # ... for a matmul operand that two kernels read through a big expand


DEFAULT = FuseTuning()  # (the device's DeviceProps.fuse where the driver schedules; tests may leave it out)


def _alu_work(node: Node, realize: set[Node], limit: int) -> int:
    """ALU ops and loads (one per buffer read) computed for one element of node in its kernel, through
    movement ops (not through reduces or nodes realized or to be realized); stops counting at limit.
    Loads count: a conv's input gradient read through the windows of its input recomputed a relu mask
    and a BatchNorm backward from 11 buffers for each of the 9 window positions (several times slower than
    computing them once; measured: bench/HISTORY.md)."""
    count, stack, seen = 0, [node], set()
    while stack and count < limit:
        n = stack.pop()
        if n in seen or n.op is Op.CONST:
            continue
        seen.add(n)
        if n.realized or n in realize or n.op is Op.REDUCE:
            count += n.base.realized or n in realize  # a load
            continue
        count += n.op in ALU and n.op is not Op.CAST
        stack.extend(n.srcs[1:] if n.op is Op.ASSIGN else n.srcs)
    return count


def _elementwise_closure(node: Node) -> list[Node]:
    """Nodes under node reached through elementwise ops and reshapes only (reduces included, not passed)."""
    out, stack, seen = [], [node], set()
    while stack:
        n = stack.pop()
        if n in seen or n.realized:
            continue
        seen.add(n)
        out.append(n)
        if n.op in ALU or n.op is Op.RESHAPE or n.op is Op.DETACH:
            stack.extend(n.srcs)
    return out


def kernel_roots(outputs: list[Node], t: FuseTuning = DEFAULT) -> list[Node]:
    roots = []
    for out in outputs:
        base = out.base
        if not base.realized and base not in roots:
            roots.append(base)
    nodes = _walk(roots)
    forced = set(roots) | {n for n in nodes if n.op is Op.ASSIGN}
    # Tensor.contiguous(): its copy is a kernel of its own
    forced |= {n.srcs[0] for n in nodes if n.op is Op.DETACH and n.arg == "contiguous"
               and not n.srcs[0].realized}
    realize = set(forced)
    # a value that goes through a movement op (other than reshape) after a reduce is realized where the
    # movement starts, so the reduce's elementwise epilogue is computed once, in the reduce's kernel
    # and expensive elementwise work (exp, log, division...) is not recomputed for every element of a
    # big expand (softmax(x) @ v computes the softmax once, then the matmul)
    for n in nodes:
        if n.op in MOVEMENT and n.op is not Op.RESHAPE:
            x = n.srcs[0]
            while x.op is Op.RESHAPE:
                x = x.srcs[0]
            if x.realized or x.op is Op.CONST:
                continue
            closure = _elementwise_closure(x)
            if (
                n.op is Op.EXPAND
                and prod(n.shape) >= t.recompute_elements
                and (any(c.op in EXPENSIVE for c in closure) or _alu_work(x, realize, t.recompute_ops)
                     >= t.recompute_ops)
            ):
                forced.add(x)
                realize.add(x)
            elif any(c.op is Op.REDUCE for c in closure):
                realize.add(x)
    while True:
        seen_in: dict[Node, int] = defaultdict(int)
        grow = set()
        for r in realize:
            body = kernel_body(r, realize)
            reduces = [n for n in body if n.op is Op.REDUCE]
            for n in reduces:
                seen_in[n] += 1
            # a reduce seen through a movement op (expand-after-reduce...) is its own kernel
            grow.update(n for n in reduces if body[n] and n is not r)
            top = _top_reduces(r, realize)
            if len(top) > 1:  # two independent reduces: both become kernels, r combines them
                grow.update(top)
            else:  # one kernel holds one reduce: those under it become kernels
                grow.update(n for n in reduces if n not in top)
        grow.update(n for n, k in seen_in.items() if k > 1)
        grow -= realize
        if not grow:
            break
        realize |= grow
    # an epilogue realized for its reduce's sake is pointless once that reduce became its own kernel:
    # it is recomputed (elementwise) where it is used instead
    realize -= {n for n in realize - forced if not any(b.op is Op.REDUCE for b in kernel_body(n, realize))}
    # ...unless a big expand reads it (a conv's windows over a computed gradient): computed once, then
    chains = _under_big_expands(nodes, t)
    for *_, x in chains:
        if (not x.realized and x not in realize and x.op is not Op.CONST
                and _alu_work(x, realize, t.recompute_ops) >= t.recompute_ops):
            realize.add(x)
    _compute_shared_once(nodes, realize, {x for chain in chains for x in chain}, t)
    # order: sources first (the _walk order is topological)
    return [n for n in nodes if n in realize]


def _under_big_expands(nodes: list[Node], t: FuseTuning) -> list[list[Node]]:
    """For each expand of `recompute_elements` or more elements: the nodes it reads through, from its source
    down through movement ops to the value they move (the last)."""
    chains = []
    for n in nodes:
        if n.op is Op.EXPAND and prod(n.shape) >= t.recompute_elements:
            chain = [n.srcs[0]]
            while chain[-1].op in MOVEMENT:
                chain.append(chain[-1].srcs[0])
            chains.append(chain)
    return chains


def _compute_shared_once(nodes: list[Node], realize: set[Node], expanded: set[Node], t: FuseTuning) -> None:
    """Adds to `realize` the values (elementwise, maybe through movement ops) that two or more kernels would
    each recompute for every element of a big shape, where that costs: `recompute_ops` or more ALU ops and
    loads with index arithmetic of their own (a pool's windows, a permute: gathers that do not vectorize),
    or `shared_operand_ops` or more for a value read through a big expand (a matmul's computed operand, made
    again by each matmul's prologue). The users' side first, or below it a value of the same shape more
    kernels read, to which it adds little work (a max_pool's gradient, not that gradient scaled by
    BatchNorm's backward). The MNIST CNN step recomputed a pool's gradient in 5 kernels, its windows in 3,
    and the GPT step the concatenated q/k/v gradient in both of its matmuls: both steps' kernels ran faster
    with those computed once; plain elementwise work (GELU's) recomputed is cheaper than a pass over
    memory (the GPT step's kernels were slower with it computed once). A pass takes every such value not
    under another one it took, then the kernels are counted again (counting again after each value made
    an 8-layer GPT step's scheduling much slower; measured: bench/HISTORY.md). `expanded`: the nodes big
    expands read through (_under_big_expands)."""
    for _ in range(8):  # passes: each takes values none of which is under another, then counts again
        counts: dict[Node, int] = defaultdict(int)
        for r in realize:
            for n in kernel_body(r, realize):
                counts[n] += n is not r

        def shared(n: Node, counts=counts) -> bool:
            # a reshape is not taken: its source is (the same elements, read through the reshape as a view);
            # taking the reshape made a copy kernel once a later pass took the source for another reader
            if (counts[n] < 2 or not (n.op in ALU or n.op in MOVEMENT) or n.op is Op.RESHAPE
                    or prod(n.shape) < t.recompute_elements):
                return False
            if n in expanded:
                return _alu_work(n, realize, t.shared_operand_ops) >= t.shared_operand_ops
            return _alu_work(n, realize, t.recompute_ops) >= t.recompute_ops and _moves(n, realize)

        taken: set[Node] = set()  # this pass's values and what their kernels compute
        for pick in reversed(nodes):
            if pick in taken or not shared(pick):
                continue
            while below := [s for s in pick.srcs if s.shape == pick.shape and counts[s] > counts[pick] and
                            s not in taken and shared(s) and
                            _alu_work(pick, realize | {s}, t.recompute_ops) < t.recompute_ops]:
                pick = below[0]
            realize.add(pick)
            taken.update(kernel_body(pick, realize))
        if not taken:
            return


def _moves(node: Node, realize: set[Node]) -> bool:
    """Whether node's own work (up to realized values and reduces) goes through a movement op other than
    a reshape or an expand: index arithmetic in its loads."""
    stack, seen = [node], set()
    while stack:
        x = stack.pop()
        if x in seen or x.realized or (x in realize and x is not node) or x.op in (Op.CONST, Op.REDUCE):
            continue
        seen.add(x)
        if x.op in MOVEMENT and x.op not in (Op.RESHAPE, Op.EXPAND):
            return True
        stack.extend(x.srcs)
    return False
