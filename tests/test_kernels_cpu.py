"""Kernel-level tests of the CPU kernels against plain NumPy."""

from __future__ import annotations

import numpy as np

from gpu_kernels import compaction


def test_parallel_and_serial_compaction_agree_with_nonzero():
    rng = np.random.default_rng(5)
    hits = (rng.random((700, 3000)) < 0.01).astype(np.uint8)   # above PARALLEL_CELLS
    assert hits.size >= compaction.PARALLEL_CELLS
    want_rows, want_cols = np.nonzero(hits[:650])
    rows, cols = compaction.compact_hits(hits, 650, 10)
    assert rows.tolist() == (want_rows + 10).tolist() and cols.tolist() == want_cols.tolist()
    small_rows, small_cols = compaction.compact_hits(hits[:3], 3, 0)
    want_rows, want_cols = np.nonzero(hits[:3])
    assert small_rows.tolist() == want_rows.tolist() and small_cols.tolist() == want_cols.tolist()


def test_parallel_predicate_dedup_equals_the_serial_one():
    """Predicate de-duplication on every core (hash partitions) gives the
    serial table's exact answer: distinct rows numbered by first
    appearance, every row mapped to its distinct row, -0.0 equal to 0.0."""
    from engine.compile import _factorize_predicates, _factorize_predicates_parallel, distinct_rows

    rng = np.random.default_rng(1)
    n = 150_000
    attr = rng.integers(0, 60, n).astype(np.int32)
    op = rng.integers(0, 5, n).astype(np.int8)
    lo = rng.integers(-3, 40, n).astype(np.float64)
    lo[lo == 0] = np.where(rng.random(int((lo == 0).sum())) < 0.5, -0.0, 0.0)
    hi = np.where(op == 4, lo + rng.integers(0, 3, n), 0.0)
    aux = rng.integers(0, 3, n).astype(np.int64)
    columns = [attr, op, (lo + 0.0).view(np.int64), (hi + 0.0).view(np.int64), aux]
    first_s, inverse_s = _factorize_predicates(*columns)
    first_p, inverse_p = _factorize_predicates_parallel(*columns)
    assert np.array_equal(first_s, first_p) and np.array_equal(inverse_s, inverse_p)
    assert np.all(np.diff(first_p) > 0) and len(first_p) < n // 2
    keys = np.stack([attr, op, lo + 0.0, hi, aux], axis=1)
    assert np.array_equal(keys[first_p[inverse_p]], keys)           # each row maps to an equal row
    assert len(np.unique(keys[first_p], axis=0)) == len(first_p)    # and distinct rows differ
    first_d, inverse_d = distinct_rows((attr, op, lo, hi, aux))     # the public entry point takes this path
    assert np.array_equal(first_d, first_s) and np.array_equal(inverse_d, inverse_s)
