"""String codes under a grown dictionary, for structures that keep codes.

A string operand's kernel code is ``2r + 1`` for the dictionary string of
rank ``r`` (code-point order), and an event string outside the dictionary
falls in a gap, ``2k`` (docs/architecture.md#the-compiled-index).  New
strings move the codes above them but never the old strings' order, so a
structure that holds codes -- A-PCM's bounds, PS-Tree's space boundaries,
the predicate rows of both -- stays right once its codes are mapped: a new
string falls in a gap, where every old predicate is constant.
"""

from __future__ import annotations

import numpy as np


def string_code_map(old_order, new_rank) -> np.ndarray:
    """Old string code -> new code, for a dictionary that grew: the old
    dictionary's string of rank ``r`` (code ``2r + 1``, id ``old_order[r]``)
    has code ``2 new_rank[id] + 1`` now.  Monotone -- the old strings keep
    their order -- so a tabled attribute's elementary intervals keep their
    rows under the new codes (a new string falls in a gap, where every old
    predicate is constant)."""
    old_order = np.asarray(old_order, np.int64)
    return (2 * np.asarray(new_rank, np.int64)[old_order] + 1).astype(np.float64)


def recoded_values(values: np.ndarray, is_string: np.ndarray, code_map: np.ndarray) -> np.ndarray:
    """``values`` with the old string codes (odd integers below ``2 len(code_map)``)
    where ``is_string`` replaced by ``code_map``'s."""
    values = np.asarray(values, np.float64)
    odd = is_string & np.isfinite(values) & (values >= 1) & (values < 2 * len(code_map)) & (values % 2 == 1)
    out = values.copy()
    out[odd] = code_map[((values[odd] - 1) // 2).astype(np.int64)]
    return out


def recoded_rows(rows, string_attr: np.ndarray, code_map: np.ndarray):
    """Predicate ``rows`` (coded under an older dictionary) with their string
    operands in the codes ``code_map`` gives (see :func:`string_code_map`)."""
    attr = np.asarray(rows.attr, np.int64)
    is_string = np.zeros(len(attr), bool)
    known = attr < len(string_attr)
    is_string[known] = np.asarray(string_attr)[attr[known]] != 0
    set_attr = np.repeat(attr, np.diff(rows.set_offsets))
    set_string = np.zeros(len(set_attr), bool)
    set_known = set_attr < len(string_attr)
    set_string[set_known] = np.asarray(string_attr)[set_attr[set_known]] != 0
    return rows._replace(lo=recoded_values(rows.lo, is_string, code_map),
                         hi=recoded_values(rows.hi, is_string, code_map),
                         set_values=recoded_values(rows.set_values, set_string, code_map))


__all__ = ["recoded_rows", "recoded_values", "string_code_map"]
