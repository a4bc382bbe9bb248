"""The A-Tree itself (A-Tree §4): a multi-rooted DAG of unique nodes, built on the host.

* **Nodes** (§4.1): an *l-node* per distinct predicate, an *i-node* per
  distinct subexpression, an *r-node* per distinct subscription
  expression; AND and OR are n-ary.  Node ids are given in creation
  order.
* **Expression ids** (§4.2.1): the expression-to-node table ``table``
  (the paper's H_en) maps an *expression id* to its node.  The paper
  hashes a predicate's literal and combines child ids arithmetically; we
  use the exact canonical key instead, so there is no collision to
  handle: a leaf's id is its predicate's key (attribute, operator,
  operand keys, IN-list / pattern id -- stable across segments and string
  dictionary growth), an operator's id is ``(operator, sorted child node
  ids)``.  Sorting makes the id insensitive to the order of AND, OR, XOR
  and XNOR children; AND and OR children are also de-duplicated (``x AND
  x`` is ``x`` under Kleene's logic), XOR and XNOR ones are not.
* **Reorganisation** (§4.2.2, Algorithm 2): an AND/OR expression is the
  set of its (flattened) children; existing nodes of the same operator
  whose child set lies inside it are picked greedily, largest uncovered
  part first (greedy set cover), and become its children in place of the
  children they cover.  The node stays keyed by its flat child set, so the
  same expression arriving in another grouping finds it.  Candidates are
  found by looking up the ids of the expression's sub-sets in ``table``
  (all of them up to :data:`SUBSET_ENUMERATION` children, pairs up to
  :data:`PAIR_ENUMERATION`, none beyond) -- only sub-sets whose children
  all are in some expression id of that size, as no other can be found.
* **Use counts** (§4.2.3, Algorithms 4-5): ``refs[n]`` is the paper's
  *useCount*: the subscriptions whose expression ``n`` is + the nodes
  made with ``n`` among their children (``born``: the children a node was
  made with, kept when Algorithm 3 or a splice changes them).  ``uses[n]``
  counts what links to ``n`` now: parents + subscriptions.  Insertion of
  an expression that exists only adds a use; deletion removes one and, at
  a useCount of zero, the node goes with its table entry and one useCount
  of each child it was made with (recursively).  A node whose useCount is
  zero may still be linked by a parent that took it in through Algorithm 3
  (its *adopter*, an AND/OR of its operator): as §4.2.4 says, that parent
  consumes the node's children in its place (the *splice*: ``a ∧ (b ∧ c)``
  is ``a ∧ b ∧ c``), then the node goes.  An insertion removes nodes too
  (a covered child, a binary chain made twice), only nodes nothing links:
  it never splices, as the compiled DAG's parent lists could not follow.
* **Self-adjustment** (§4.2.3, Algorithm 3): a new AND/OR node N becomes
  a child of every existing node P of its operator whose children include
  all of N's (found by intersecting the parent sets of N's children), in
  place of those children -- so the structure depends less on the order
  expressions arrive in (a node over a subset of another's children is
  reused whichever came first).  This needs parent sets (``parents``),
  kept only with ``self_adjust``; node ids are then no longer a
  topological order (P is older than N), which the flattening does not
  assume.

A matcher inserts its subscriptions' postfix programs with
:meth:`ATreeDag.insert_programs`, which reads them without making nested
expressions and interns a subexpression met before in the same programs
only once; :func:`program_expression` and :meth:`ATreeDag.insert` make the
same DAG one expression at a time.

A DAG is only ever changed while a matcher is being made: ``copy`` gives
the next matcher its own (a match in flight reads the flattened arrays of
the old one, never this).
"""

from __future__ import annotations

from itertools import chain, combinations, repeat

import numpy as np
from numba import njit

from gpu_kernels.opcodes import AND, LEAF, OR, XNOR, XOR

#: AND/OR expressions of at most this many children have every sub-set of
#: two or more children looked up for reorganisation (2^k lookups); wider
#: ones only their pairs (up to PAIR_ENUMERATION children)
SUBSET_ENUMERATION = 8
PAIR_ENUMERATION = 48

REMOVED = -1
_NO_PARENTS = frozenset()


class ATreeDag:
    """The host A-Tree: per node id its ``kind`` (LEAF/AND/OR/XOR/XNOR, or
    REMOVED), ``children`` (a tuple of node ids; a leaf's is empty),
    ``pred`` (a leaf's predicate key), ``uses`` and ``key`` (its expression
    id); ``table`` maps expression ids to node ids.

    ``sharing=False`` is the paper's "multitree not supporting sharing"
    (Figure 8): every insertion makes new nodes, leaves included.
    ``reorganize=False`` leaves out Algorithm 2, ``self_adjust=False``
    Algorithm 3.  ``binary=True`` is the paper's "binary tree index
    supporting sharing" (Figure 8): an AND/OR of more than two children is
    a right-leaning chain of two-child nodes (``a ∧ (b ∧ (c ∧ d))`` over the
    sorted children), each shared like any node."""

    def __init__(self, sharing: bool = True, reorganize: bool = True, self_adjust: bool = True,
                 binary: bool = False):
        self.sharing = bool(sharing)
        self.binary = bool(binary)
        self.reorganize = bool(reorganize) and self.sharing
        self.self_adjust = bool(self_adjust) and self.sharing
        #: node -> the set of its parents (with self_adjust only); sets are
        #: shared with the DAG this one was copied from until changed here
        self.parents: dict = {}
        self._owned: set = set()
        self.kind: list[int] = []
        self.children: list[tuple] = []
        self.pred: list = []
        self.uses: list[int] = []
        #: the paper's useCount (see the module doc) and, per node whose children changed since it was made,
        #: the children it was made with
        self.refs: list[int] = []
        self.born: dict = {}
        self.key: list = []
        self.table: dict = {}
        self.n_removed = 0
        #: (operator, size) -> every node id in an expression id of that
        #: operator and that many children (the sizes Algorithm 2 looks up);
        #: made from ``table`` when first needed, never shrunk (see _reorganized)
        self._key_members: dict | None = None

    def copy(self) -> "ATreeDag":
        """An independent copy (lists of immutable items: shallow copies suffice)."""
        new = object.__new__(type(self))
        new.sharing, new.reorganize, new.n_removed = self.sharing, self.reorganize, self.n_removed
        new.binary = self.binary
        new.self_adjust, new.parents, new._owned = self.self_adjust, dict(self.parents), set()
        new.kind, new.children, new.pred = list(self.kind), list(self.children), list(self.pred)
        new.uses, new.key, new.table = list(self.uses), list(self.key), dict(self.table)
        new.refs, new.born = list(self.refs), dict(self.born)
        new._key_members = None if self._key_members is None else \
            {size: set(members) for size, members in self._key_members.items()}
        return new

    def __len__(self) -> int:
        return len(self.kind) - self.n_removed

    # ------------------------------------------------------------ insertion
    def _new(self, kind: int, children: tuple, pred, key) -> int:
        node = len(self.kind)
        self.kind.append(kind)
        self.children.append(children)
        self.pred.append(pred)
        self.uses.append(0)
        self.refs.append(0)
        self.key.append(key)
        if key is not None:
            self.table[key] = node
            if self._key_members is not None:
                self._add_key_members(key)
        for child in children:
            self.uses[child] += 1
            self.refs[child] += 1
        if self.self_adjust:
            for child in set(children):
                self._parent_set(child).add(node)
        return node

    def _parent_set(self, node: int) -> set:
        """``parents[node]``, to change: copied first when it is still the
        set of the DAG this one was copied from (copy on write)."""
        found = self.parents.get(node)
        if found is None or node not in self._owned:
            found = self.parents[node] = set() if found is None else set(found)
            self._owned.add(node)
        return found

    def _intern(self, expr) -> int:
        """The node of ``expr`` (``("L", predicate key)`` or ``(op,
        [children])``), found or made; a node made here has the uses of its
        new parent links only (the caller adds the use that reaches it)."""
        if expr[0] == "L":
            return self._leaf(expr[1])
        op, parts = expr
        return self._combined(op, [self._intern(part) for part in parts])

    def _leaf(self, pred) -> int:
        """The l-node of the predicate key ``pred``, found or made."""
        key = ("L", pred) if self.sharing else None
        found = self.table.get(key) if key is not None else None
        return found if found is not None else self._new(LEAF, (), pred, key)

    def _combined(self, op: int, kids: list) -> int:
        """The node of operator ``op`` over the nodes ``kids`` (in any order), found or made."""
        if op == AND or op == OR:
            flat = tuple(sorted(set(kids)))
            if len(flat) == 1:               # x AND x = x: the child itself
                return flat[0]
        else:
            flat = tuple(sorted(kids))       # XOR / XNOR: commutative, not idempotent
        return self._operator(op, flat)

    def _operator(self, op: int, flat: tuple) -> int:
        """The node of operator ``op`` over the (sorted) child nodes ``flat``, found or made."""
        if self.binary and (op == AND or op == OR) and len(flat) > 2:
            # the right-leaning chain (flat[0], (flat[1], (... (flat[-2], flat[-1])))), made from its far end in
            # a loop: a node of a thousand children is a chain a thousand deep (no recursion per child)
            node = self._operator(op, flat[-2:])
            for first in reversed(flat[:-2]):
                rest = node
                node = self._operator(op, tuple(sorted((first, rest))))
                if self.uses[rest] == 0:     # the pair existed already: the chain made for it is unused
                    self._remove(rest)
            return node
        key = (op, flat) if self.sharing else None
        if key is not None:
            found = self.table.get(key)
            if found is not None:
                return found
        children = flat
        if self.reorganize and (op == AND or op == OR) and len(flat) > 2:
            children = self._reorganized(op, flat)
        node = self._new(op, children, None, key)
        if children is not flat:             # (all of ``flat`` linked: nothing to drop)
            self._drop_unused(flat, children)
        if self.self_adjust and (op == AND or op == OR):
            self._adjusted(node, op, flat)
        return node

    def _adjusted(self, node: int, op: int, flat: tuple) -> None:
        """Algorithm 3: every existing ``op`` node whose children include all
        of ``flat`` (and more) takes ``node`` in their place.  Such a node is
        no descendant of ``node`` (a descendant over a subset of its
        children cannot hold all of them), so no cycle arises."""
        wanted = set(flat)
        # such a node links each child of ``flat``: it is in the parent set of every one (intersected from
        # the smallest, so few parents are looked at; the paper scans the parents of one child)
        linked = list(map(self.parents.get, wanted, repeat(_NO_PARENTS)))
        for parent in min(linked, key=len).intersection(*linked):
            self._take_place(parent, node, op, wanted)

    def _take_place(self, parent: int, node: int, op: int, wanted: set) -> None:
        """Algorithm 3 at one existing node: ``parent``, when it is an ``op``
        node other than ``node`` whose children include all of ``wanted`` and
        more, links ``node`` in their place."""
        kids = self.children[parent]
        if parent == node or self.kind[parent] != op or len(kids) <= len(wanted) or not wanted.issubset(kids):
            return
        self.born.setdefault(parent, kids)
        self.children[parent] = tuple(sorted([c for c in kids if c not in wanted] + [node]))
        self.uses[node] += 1
        self._parent_set(node).add(parent)
        for child in wanted:
            self._parent_set(child).discard(parent)
            self.uses[child] -= 1           # still >= 1: ``node`` reaches every child of ``wanted``
            # (its useCount stays: ``parent`` was made with it, and deleting ``parent`` releases that)

    def _reorganized(self, op: int, flat: tuple) -> tuple:
        """Algorithm 2: existing ``op`` nodes over sub-sets of ``flat``,
        picked greedily by the most children still uncovered, replace the
        children they cover."""
        n = len(flat)
        if n <= SUBSET_ENUMERATION:
            sizes = range(n - 1, 1, -1)
        elif n <= PAIR_ENUMERATION:
            sizes = (2,)
        else:
            return flat
        if self._key_members is None:
            self._key_members = {}
            for key in self.table:
                self._add_key_members(key)
        candidates = []
        for size in sizes:
            # a sub-set can only be found if each of its children is in some expression id of its size: the
            # others are left out of the enumeration (the same finds, in the same order, with fewer lookups)
            members = self._key_members.get((op, size), ())
            eligible = [c for c in flat if c in members]
            for subset in combinations(eligible, size):
                found = self.table.get((op, subset))
                if found is not None and self.kind[found] == op:
                    candidates.append((subset, found))
        if not candidates:
            return flat
        uncovered = set(flat)
        chosen = []
        while uncovered:
            best, best_gain = None, 0        # as Algorithm 2: any overlap (the paper reuses P3 ^ P4 for P4)
            for subset, node in candidates:
                gain = sum(1 for c in subset if c in uncovered)
                if gain > best_gain:
                    best, best_gain = (subset, node), gain
            if best is None:
                break
            chosen.append(best[1])
            uncovered.difference_update(best[0])
        return tuple(sorted(chosen)) + tuple(sorted(uncovered))

    def _add_key_members(self, key) -> None:
        """``key``'s children into ``_key_members``, if it is an AND/OR id of a size Algorithm 2 looks up.
        Removals leave them there: a member that is no more only costs a lookup that finds nothing."""
        op, kids = key
        if (op == AND or op == OR) and 2 <= len(kids) < SUBSET_ENUMERATION:
            self._key_members.setdefault((op, len(kids)), set()).update(kids)

    def _drop_unused(self, flat: tuple, children: tuple) -> None:
        """Children made for an expression but covered by reorganisation
        (so never linked) are removed again: no node without a use stays."""
        linked = set(children)
        for child in flat:
            if child not in linked and self.uses[child] == 0:
                self._remove(child)

    def insert(self, expr) -> int:
        """Algorithm 4: the node of a subscription's expression, with one use
        more (a new r-node, or an existing node that now is one too)."""
        node = self._intern(expr)
        self.uses[node] += 1
        self.refs[node] += 1
        return node

    def insert_programs(self, positions, offsets, kinds, args, leaf_key) -> list:
        """:meth:`insert` of each position's postfix program (``kinds[offsets[p]:offsets[p + 1]]``,
        ``args`` alike: one segment's numpy arrays), in order: the nodes and ids
        ``insert(program_expression(...))`` gives, read straight from the program.

        In a postfix program every subexpression is a contiguous slice, and
        equal slices (the leaves' arguments are predicate ids of the one
        segment) are equal expressions.  W5's subscriptions share most of
        their subexpressions, so a slice interned before is looked up by its
        bytes instead of being walked and interned again.  That is exact:
        interning an expression a second time finds every node it found or
        made the first time (they keep their expression ids, reorganisation
        and self-adjustment change children only) and changes nothing -- as
        long as no node was removed (a binary chain or a covered child
        dropped, :meth:`_drop_unused`), which is why a removal forgets the
        slices seen and an interning that removed a node is not remembered.
        Without sharing every insertion makes new nodes: nothing is remembered."""
        kinds, args = np.asarray(kinds), np.asarray(args)
        kinds64, args64 = kinds.astype(np.int64), args.astype(np.int64)
        code = (args64 << 3) | kinds64       # one 8-byte word per instruction
        starts = subexpression_starts(np.asarray(offsets, np.int64), kinds64, args64)
        seen: dict = {}                      # slice bytes -> node
        removed = [self.n_removed]           # n_removed when ``seen`` was last valid

        def nodes_of(ends: list) -> list:
            """The nodes of the subexpressions whose last instructions are ``ends``."""
            nodes = []
            for end in ends:
                key = words[8 * first[end]:8 * end + 8]
                if self.n_removed != removed[0]:
                    seen.clear()
                    removed[0] = self.n_removed
                node = seen.get(key)
                if node is None:
                    removed_before = self.n_removed
                    op = ops[end]
                    if op == LEAF:
                        node = self._leaf(leaf_key(operand[end]))
                    else:
                        node = self._combined(op, nodes_of(parts(end, op)))
                    if self.sharing and self.n_removed == removed_before:
                        seen[key] = node
                nodes.append(node)
            return nodes

        def parts(end: int, op: int) -> list:
            """The last instructions of the operands of ``end``, left to right, AND
            inside AND and OR inside OR flattened (as :func:`program_expression`)."""
            ends = []
            at = end - 1
            for _ in range(operand[end] if op == AND or op == OR else 2):
                ends.append(at)
                at = first[at] - 1
            ends.reverse()
            if op != AND and op != OR:
                return ends
            flat = []
            for at in ends:
                if ops[at] == op:
                    flat.extend(parts(at, op))
                else:
                    flat.append(at)
            return flat

        roots = []
        for position in positions:
            start, stop = int(offsets[position]), int(offsets[position + 1])
            ops, operand = kinds[start:stop].tolist(), args[start:stop].tolist()
            words = code[start:stop].tobytes()
            if stop <= start or starts[start] < 0:
                raise ValueError("malformed postfix program")
            first = (starts[start:stop] - start).tolist()
            roots.append(nodes_of([len(ops) - 1])[0])
            self.uses[roots[-1]] += 1
            self.refs[roots[-1]] += 1
        return roots

    # ----------------------------------------------------------- reading it
    def csr(self, keys):
        """Per node (removed ones included): kind (int8), number of
        children, the children concatenated, and a leaf's predicate id by
        ``keys`` (:class:`~gpu_kernels.atree.build.PredicateKeys`; -1 for
        an operator, or a predicate not among them)."""
        pid_of_key = keys.pid_of_key()
        kinds = np.array(self.kind, np.int8)
        counts = np.fromiter(map(len, self.children), np.int64, len(kinds))
        child_idx = np.fromiter(chain.from_iterable(self.children), np.int64, int(counts.sum()))
        host_pid = np.fromiter((-1 if p is None else pid_of_key.get(p, -1) for p in self.pred), np.int64, len(kinds))
        return kinds, counts, child_idx, host_pid

    def kinds(self) -> np.ndarray:
        return np.array(self.kind, np.int8)

    def saved(self, keys) -> dict:
        """What :meth:`gpu_kernels.atree.build.ArrayDag.saved` gives, from the lists (of a compacted DAG)."""
        kind, child_len, child_idx, leaf_pid = self.csr(keys)
        key_len = np.fromiter((-1 if k is None else 0 if k[0] == "L" else len(k[1]) for k in self.key), np.int64,
                              len(kind))
        key_idx = np.fromiter(chain.from_iterable(k[1] for k in self.key if k is not None and k[0] != "L"),
                              np.int64, int(key_len[key_len > 0].sum()))
        born_len = np.fromiter((len(self.born[n]) if n in self.born else -1 for n in range(len(kind))), np.int64,
                               len(kind))
        born_idx = np.fromiter(chain.from_iterable(self.born[n] for n in sorted(self.born)), np.int64,
                               int(born_len[born_len > 0].sum()))
        return {"kind": kind, "uses": self.use_counts(), "leaf_pid": leaf_pid, "child_len": child_len,
                "child_idx": child_idx, "key_len": key_len, "key_idx": key_idx,
                "refs": np.array(self.refs, np.int64), "born_len": born_len, "born_idx": born_idx}

    def use_counts(self) -> np.ndarray:
        return np.array(self.uses, np.int64)

    # ------------------------------------------------------------- deletion
    def release_all(self, nodes) -> None:
        """:meth:`release` of each of ``nodes``."""
        for node in nodes:
            self.release(node)

    def release(self, node: int) -> None:
        """Algorithm 5 for a subscription whose expression is ``node``: one
        use less; at a useCount of zero the node goes (spliced into the
        parents that adopted it) and releases the children it was made with."""
        self.uses[node] -= 1
        self.refs[node] -= 1
        self._settle([node], splice=True)

    def _remove(self, node: int) -> None:
        """A node an insertion made but nothing links (and that nothing was made with) removed, and what it
        was made with released: no splice while inserting."""
        self._settle([node], splice=False)

    def _settle(self, stack: list, splice: bool) -> None:
        """The nodes of ``stack`` whose useCount is zero removed, in turn
        pushing what they link and were made with; one still linked is
        spliced into its adopters first (with ``splice``), else left."""
        while stack:
            n = stack.pop()
            if self.kind[n] == REMOVED or self.refs[n] > 0:
                continue
            if self.uses[n] > 0 and not (splice and self._spliced(n)):
                continue
            kids, born = self.children[n], self.born.get(n)
            self._forget(n)
            for child in kids:
                self.uses[child] -= 1
            for child in kids if born is None else born:
                self.refs[child] -= 1
            stack.extend(kids)
            if born is not None:
                stack.extend(born)

    def _spliced(self, node: int) -> bool:
        """§4.2.4: each parent still linking ``node`` (one that adopted it:
        Algorithm 3 links only a node of the parent's own operator) links
        ``node``'s children in its place; False, changing nothing, when a
        parent is of another operator (never, by construction: then the
        node stays)."""
        op, kids = self.kind[node], self.children[node]
        parents = sorted(self.parents.get(node, ())) if self.self_adjust else []
        if (op != AND and op != OR) or any(self.kind[p] != op for p in parents) or len(parents) != self.uses[node]:
            return False
        for parent in parents:
            old = self.children[parent]
            self.born.setdefault(parent, old)
            linked = set(old)
            new = [c for c in kids if c not in linked]
            self.children[parent] = tuple(sorted([c for c in old if c != node] + new))
            self.uses[node] -= 1
            for child in new:
                self.uses[child] += 1
                self._parent_set(child).add(parent)
        return True

    def _forget(self, node: int) -> None:
        if self.self_adjust:
            for child in set(self.children[node]):
                self._parent_set(child).discard(node)
            self.parents.pop(node, None)
        key = self.key[node]
        if key is not None and self.table.get(key) == node:
            del self.table[key]
        self.kind[node] = REMOVED
        self.children[node] = ()
        self.born.pop(node, None)
        self.pred[node] = None
        self.key[node] = None
        self.n_removed += 1

    # ------------------------------------------------------------ compaction
    def compacted(self, roots):
        """Node ids renumbered without the removed ones (in their order);
        returns ``(dag, new root ids)``."""
        # (two passes: self-adjustment links older parents to newer nodes, so a child's new id may come later)
        live = [n for n, kind in enumerate(self.kind) if kind != REMOVED]
        old_to_new = {n: i for i, n in enumerate(live)}
        new = type(self)(self.sharing, self.reorganize, self.self_adjust, self.binary)
        for n in live:
            new.kind.append(self.kind[n])
            new.children.append(tuple(old_to_new[c] for c in self.children[n]))
            new.pred.append(self.pred[n])
            new.uses.append(self.uses[n])
            new.refs.append(self.refs[n])
            if n in self.born:
                new.born[old_to_new[n]] = tuple(old_to_new[c] for c in self.born[n])
            key = self.key[n]
            if key is not None and key[0] != "L":
                # a reorganised node is keyed by its flat child set, whose unlinked members may be gone:
                # such a key names nodes no insertion can produce again, so it is dropped
                flat = [old_to_new.get(c) for c in key[1]]
                key = None if None in flat else (key[0], tuple(flat))
            new.key.append(key)
            if key is not None:
                new.table[key] = old_to_new[n]
        if self.self_adjust:
            for n, parents in self.parents.items():
                if n in old_to_new:
                    new.parents[old_to_new[n]] = {old_to_new[p] for p in parents}
                    new._owned.add(old_to_new[n])
        return new, [old_to_new[r] for r in roots]


@njit(cache=True, nogil=True)
def subexpression_starts(offsets, kinds, args):
    """Per instruction of every postfix program (``kinds[offsets[p]:offsets[p + 1]]``,
    ``args`` alike), the first instruction of the subexpression it ends (its
    own for a leaf); -1 at the start of a malformed program.  (Compiled: in
    Python this walk was a tenth of W5's DAG build.)"""
    first = np.empty(len(kinds), np.int64)
    stack = np.empty(len(kinds) + 1, np.int64)  # the operands' first instructions
    for p in range(len(offsets) - 1):
        start, stop = offsets[p], offsets[p + 1]
        depth = 0
        bad = False
        for at in range(start, stop):
            kind = kinds[at]
            if kind == LEAF:
                stack[depth] = at
                depth += 1
                first[at] = at
                continue
            arity = args[at] if kind == AND or kind == OR else 2
            if arity > depth or arity < 0:
                bad = True
                break
            begin = stack[depth - arity] if arity > 0 else at
            depth -= arity
            stack[depth] = begin
            depth += 1
            first[at] = begin
        if bad or depth != 1:
            if start < stop:
                first[start] = -1
    return first


def program_expression(kinds, args, leaf_key):
    """A postfix program (``kinds``, ``args``: LEAF pid / AND, OR arity /
    XOR, XNOR) as a nested expression for :meth:`ATreeDag.insert`, AND
    inside AND and OR inside OR flattened (n-ary operators, §4.1);
    ``leaf_key(pid)`` gives a predicate's key."""
    stack = []
    for kind, arg in zip(kinds, args):
        if kind == LEAF:
            stack.append(("L", leaf_key(arg)))
        elif kind == AND or kind == OR:
            parts = stack[len(stack) - arg:]
            del stack[len(stack) - arg:]
            flat = []
            for part in parts:
                if part[0] == kind:
                    flat.extend(part[1])
                else:
                    flat.append(part)
            stack.append((kind, flat))
        else:
            right = stack.pop()
            left = stack.pop()
            stack.append((kind, [left, right]))
    if len(stack) != 1:
        raise ValueError("malformed postfix program")
    return stack[0]


__all__ = ["ATreeDag", "program_expression", "REMOVED", "XOR", "XNOR"]
