"""ASTs that share nodes (an application building its rules in code reuses
one object for a subexpression many rules name; ABE-Gen's ASTs do the
same): ``add_many`` checks and compiles each distinct node once per batch
(`engine.expr.AstChecks`, `engine.compile.compile_expressions`), and the
index it builds is the one the same expressions without sharing build."""

import numpy as np
import pytest

from engine import ExpressionTooLarge, Index, ParseError
from engine.expr import MAX_NESTING, MAX_NODES, And, AstChecks, Not, Op, Or, Pred, Xnor, Xor
from engine.parse import parse
from engine.workloads import abe_gen



def _segment(index):
    index.merge()
    return index._state.main


def _same_segment(a, b):
    assert np.array_equal(a.sub_ids, b.sub_ids)
    assert np.array_equal(a.prog_offsets, b.prog_offsets)
    assert np.array_equal(a.prog_kind, b.prog_kind)
    assert np.array_equal(a.prog_arg, b.prog_arg)
    for x, y in zip(a.predicates.key_columns(), b.predicates.key_columns()):
        assert np.array_equal(x, y)
    assert a.max_depth == b.max_depth


def _distinct(asts) -> int:
    seen, stack = set(), list(asts)
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, (And, Or)):
            stack.extend(node.children)
        elif isinstance(node, Not):
            stack.append(node.child)
        elif isinstance(node, (Xor, Xnor)):
            stack.extend((node.left, node.right))
    return len(seen)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_abe_gen_asts_are_its_texts_and_share_their_subexpressions(seed):
    w = abe_gen(2000, 5, seed=seed)
    texts = w.subscriptions["expression"].to_pylist()
    assert len(w.asts) == len(texts) == 2000
    assert all(parse(text) == ast for text, ast in zip(texts, w.asts))
    parsed = [parse(text) for text in texts]
    # one object wherever the texts repeat a subexpression: far fewer nodes than the parsed texts hold
    assert _distinct(w.asts) < 0.5 * _distinct(parsed)


@pytest.mark.parametrize("algorithm", ["scan", "atree", "opindex"])
def test_shared_asts_build_the_index_their_unshared_copies_build(algorithm):
    # NOT over shared nodes that also come un-negated elsewhere (ABE-Gen: 10 % NOT), XOR/XNOR, IN, BETWEEN
    w = abe_gen(1500, 60, dims=40, cardinality=12, seed=5)
    texts = w.subscriptions["expression"].to_pylist()
    ids = w.subscriptions["sub_id"].to_pylist()
    shared, unshared = Index(algorithm=algorithm), Index(algorithm=algorithm)
    shared.add_many(ids, w.asts)
    unshared.add_many(ids, [parse(text) for text in texts])     # the same route, nothing shared
    _same_segment(_segment(shared), _segment(unshared))
    a = shared.match_batch(w.events, output="arrow")
    b = unshared.match_batch(w.events, output="arrow")
    assert a.equals(b) and a.num_rows > 0


def test_a_node_shared_under_not_and_plain_compiles_both_ways():
    x = Or((Pred("a", Op.EQ, (1,)), Pred("b", Op.GT, (2,))))
    y = Xor(x, Pred("c", Op.IS_NULL))
    asts = [x, Not(x), And((x, Not(y))), Not(And((y, Not(x)))), y, Not(Not(x))]
    index = Index(algorithm="scan")
    index.add_many(range(len(asts)), asts)
    copies = Index(algorithm="scan")
    copies.add_many(range(len(asts)), [parse(t) for t in (
        "a = 1 OR b > 2", "NOT (a = 1 OR b > 2)", "(a = 1 OR b > 2) AND NOT ((a = 1 OR b > 2) XOR c IS NULL)",
        "NOT (((a = 1 OR b > 2) XOR c IS NULL) AND NOT (a = 1 OR b > 2))", "(a = 1 OR b > 2) XOR c IS NULL",
        "NOT NOT (a = 1 OR b > 2)")])
    _same_segment(_segment(index), _segment(copies))
    events = [{"a": 1}, {"a": 0, "b": 3}, {"a": 0, "b": 0}, {"a": 0, "b": 0, "c": 5}, {"c": 1}, {}]
    for event in events:
        assert index.match(event).tolist() == copies.match(event).tolist()


def test_nesting_is_measured_through_nodes_met_in_earlier_expressions():
    deep = Pred("a", Op.EQ, (1,))
    for _ in range(MAX_NESTING - 5):
        deep = Not(deep)
    wrapped = deep
    for _ in range(10):
        wrapped = And((wrapped, Pred("b", Op.EQ, (2,))))
    index = Index(algorithm="scan")
    with pytest.raises(ExpressionTooLarge, match="levels deep"):
        index.add_many([1, 2], [deep, wrapped])     # deep passes alone; wrapped is 10 levels deeper
    assert len(index) == 0
    index.add_many([1], [deep])
    assert len(index) == 1


def test_size_counts_shared_subtrees_once_per_path_across_a_batch():
    node = Pred("a", Op.EQ, (1,))
    levels = []
    while True:
        node = And((node, node))
        levels.append(node)
        if 2 ** (len(levels) + 1) - 1 > MAX_NODES:
            break
    index = Index(algorithm="scan")
    with pytest.raises(ExpressionTooLarge, match="nodes once its shared subtrees are repeated"):
        index.add_many(range(len(levels)), levels)  # each level but the last passes, then is known
    assert len(index) == 0


def test_a_bad_shared_node_fails_where_first_met_and_is_checked_again_after():
    bad = Pred("a", Op.MATCHES, ("(",))             # not an RE2 pattern
    good = Pred("b", Op.EQ, (1,))
    checks = AstChecks()
    assert checks(And((good, good))) == [good]       # each predicate once
    assert checks.shared
    for _ in range(2):                               # a failed AST marks nothing as checked
        with pytest.raises(ParseError, match="invalid RE2 pattern"):
            checks(Or((good, bad)))
    index = Index(algorithm="scan")
    with pytest.raises(ParseError, match="invalid RE2 pattern"):
        index.add_many([1, 2, 3], [good, And((good, bad)), bad])
    assert len(index) == 0


def test_no_sharing_is_told_apart_from_sharing():
    checks = AstChecks()
    checks(parse("a = 1 AND (b = 2 OR c = 3)"))
    checks(parse("a = 1 AND (b = 2 OR c = 3)"))      # equal, not the same objects
    assert not checks.shared
    p = Pred("a", Op.EQ, (1,))
    checks(And((p, Pred("b", Op.EQ, (2,)))))
    assert not checks.shared
    checks(Or((p, Pred("c", Op.EQ, (3,)))))           # p again, in another expression
    assert checks.shared


def test_a_cycle_is_refused_whatever_was_met_before():
    inner = Or((Pred("a", Op.EQ, (1,)), Pred("b", Op.EQ, (2,))))
    looped = And((inner, Pred("c", Op.EQ, (3,))))
    object.__setattr__(looped, "children", (inner, looped))    # frozen dataclass, forced into a cycle
    checks = AstChecks()
    checks(inner)
    with pytest.raises(ValueError, match="cannot contain itself"):
        checks(looped)


def test_a_failed_check_keeps_no_measure_of_its_nodes():
    # their ids may name other objects once the failed AST is freed: a stale depth would refuse a shallow AST
    deep = Pred("a", Op.EQ, (1,))
    for _ in range(MAX_NESTING):
        deep = Not(deep)
    checks = AstChecks()
    ok = And((Pred("b", Op.EQ, (2,)), Pred("c", Op.EQ, (3,))))
    checks(ok)
    kept = (dict(checks.depths), dict(checks.sizes))
    with pytest.raises(ExpressionTooLarge):
        checks(Not(deep))
    with pytest.raises(ParseError):
        checks(And((ok, Pred("d", Op.MATCHES, ("(",)))))
    assert (checks.depths, checks.sizes) == kept


@pytest.mark.parametrize("share", [True, False])
def test_a_family_clash_across_expressions_reads_as_two_adds_word_it(share):
    p = Pred("x", Op.EQ, (1,))
    rows = [p, And((p if share else Pred("x", Op.EQ, (1,)), Pred("x", Op.EQ, ("a",))))]
    with pytest.raises(Exception) as in_one_call:
        Index(algorithm="scan").add_many([0, 1], rows)
    two = Index(algorithm="scan")
    two.add(0, "x = 1")
    with pytest.raises(Exception) as in_two_calls:
        two.add(1, "x = 1 AND x = 'a'")
    assert type(in_one_call.value) is type(in_two_calls.value)
    assert str(in_one_call.value) == str(in_two_calls.value) == \
        "subscription 1: 'x' is numeric, but = compares it with a string literal 'a'"


def test_subclasses_of_the_node_classes_compile_as_their_bases():
    # the compiler tells node classes apart by identity (fast), falling back to isinstance for a subclass an
    # application defines: the program must be its base class's, shared or not
    class Rule(And):
        pass

    class Either(Or):
        pass

    class Flag(Pred):
        pass

    shared = Either((Flag("a", Op.EQ, (1,)), Not(Flag("b", Op.GT, (2,)))))
    asts = [Rule((shared, Pred("c", Op.EQ, (3,)))), Rule((Pred("c", Op.EQ, (3,)), shared)),
            Xor(shared, Flag("d", Op.LT, (4,)))]
    texts = ["(a = 1 OR NOT b > 2) AND c = 3", "c = 3 AND (a = 1 OR NOT b > 2)", "(a = 1 OR NOT b > 2) XOR (d < 4)"]
    got, want = Index(algorithm="scan"), Index(algorithm="scan")
    got.add_many(range(3), asts)
    want.add_many(range(3), [parse(t) for t in texts])
    _same_segment(_segment(got), _segment(want))
    events = [{"a": 1, "c": 3}, {"b": 1, "c": 3, "d": 5}, {"a": 0, "b": 3, "d": 1}, {"a": 1, "d": 1}]
    assert [m.tolist() for m in got.match_batch(events)] == [m.tolist() for m in want.match_batch(events)]
