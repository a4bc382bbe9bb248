"""No silent waits (issue 16): ``engine.warmup()`` builds, merges and
matches every algorithm once; builds, merges and derivations are logged
through ``logging``; text ``add_many`` shows a progress bar on request or
once it runs long."""

from __future__ import annotations

import logging

import engine
from engine import Index
from engine import index as index_module


def test_warmup_runs_every_algorithm_and_returns_their_times():
    took = engine.warmup(backend="cpu")
    assert set(took) == set(engine.ALGORITHMS) and all(t > 0 for t in took.values())
    assert set(engine.warmup(["betree"], "cpu")) == {"betree"}


def test_the_warm_up_set_holds_every_operator_and_connective():
    """Every kernel of an algorithm is compiled by the warm-up only if its
    expressions reach every operator (after NOT is folded in), every
    connective, and list values as well as single ones."""
    from engine.expr import And, Not, Op, Or, Xnor, Xor, _children, predicates, to_nnf
    from engine.parse import parse
    from engine.warm_up import EVENTS, EXPRESSIONS
    nodes = [parse(text) for text in EXPRESSIONS]
    ops = {p.op for node in nodes for p in predicates(node)} | {p.op for node in nodes for p in predicates(to_nnf(node))}
    assert ops == set(Op)

    def kinds(node):
        yield type(node)
        for child in _children(node):
            yield from kinds(child)
    assert {And, Or, Not, Xor, Xnor} <= {k for node in nodes for k in kinds(node)}
    assert any(isinstance(v, list) and v for e in EVENTS for v in e.values())
    assert any(v == [] for e in EVENTS for v in e.values())


def test_builds_merges_and_derivations_are_logged(caplog):
    caplog.set_level(logging.INFO, logger="engine")
    idx = Index(algorithm="opindex")
    idx.add_many([1, 2], ["a = 1", "b > 2"])
    idx.merge()
    idx.match({})
    idx.add(3, "c = 'x'")
    idx.merge()
    idx.match({})
    text = caplog.text
    assert "merge: 2 subscriptions (2 added, 0 removed)" in text
    assert "opindex/cpu index built over 2 subscriptions" in text
    assert "opindex/cpu index derived at a merge (1 added) over 3 subscriptions" in text


def test_text_add_many_shows_progress_on_request_only(capsys, monkeypatch):
    idx = Index(algorithm="scan")
    idx.add_many(list(range(50)), [f"a = {i}" for i in range(50)], progress=True)
    assert "add_many" in capsys.readouterr().err and len(idx) == 50
    idx.add_many(list(range(50, 60)), [f"a = {i}" for i in range(10)], progress=False)
    assert capsys.readouterr().err == ""
    # automatic: only once it has run PROGRESS_AFTER_S (and, as tqdm decides, on a terminal)
    monkeypatch.setattr(index_module, "PROGRESS_AFTER_S", 3600.0)
    idx.add_many(list(range(60, 70)), [f"a = {i}" for i in range(10)])
    assert capsys.readouterr().err == ""


def test_a_long_a_tree_build_shows_progress_on_a_terminal(capsys, monkeypatch):
    # the A-Tree's insertion takes seconds at a million expressions (minutes in the Python DAG of the
    # ablations), so a bar appears once a second has gone by -- on a terminal (tqdm's rule; pytest's capture
    # is none, so it is forced here)
    import tqdm as tqdm_module
    from engine.algorithms import atree
    monkeypatch.setattr(index_module, "PROGRESS_AFTER_S", 0.0)
    shown = tqdm_module.tqdm
    monkeypatch.setattr(tqdm_module, "tqdm", lambda *args, **kwargs: shown(*args, **{**kwargs, "disable": False}))
    idx = Index(algorithm="atree")
    idx.add_many(list(range(40)), [f"a = {i} OR b = {i}" for i in range(40)], progress=False)
    idx.merge()
    idx.match({})
    assert "A-Tree insert" in capsys.readouterr().err
    idx = Index(algorithm="atree", options={"binary": True})        # (the Python DAG's insertion)
    idx.add_many(list(range(40)), [f"a = {i} OR b = {i}" for i in range(40)], progress=False)
    idx.merge()
    idx.match({})
    assert "A-Tree insert" in capsys.readouterr().err
    assert list(atree._progress(range(3))) == [0, 1, 2]
