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
