"""Integer codes shared by the compiler (engine.compile) and the kernels.

Kept in one small module so that the meaning of every code lives in exactly
one place."""

# ---- predicate operators in the distinct-predicate table -------------------
EQ, NE, LT, LE, GT, GE = 0, 1, 2, 3, 4, 5
IN, NOT_IN = 6, 7
BETWEEN, NOT_BETWEEN = 8, 9
LIKE, NOT_LIKE, MATCHES, NOT_MATCHES = 10, 11, 12, 13
IS_NULL, IS_NOT_NULL = 14, 15
# list attributes (docs/language.md#list-attributes).  Like LIKE and MATCHES,
# their truth is not a comparison of one value: it is computed once per event
# list and batch (engine.events.list_truth) and read by key (`list_key`).
ONE_OF, NONE_OF, ALL_OF, NOT_ALL_OF = 16, 17, 18, 19
CONTAINS, NOT_CONTAINS = 20, 21          # `value IN attr`, `NOT value IN attr`
IS_EMPTY, IS_NOT_EMPTY = 22, 23          # decided by the entry's value: the list's distinct non-null elements
FIRST_LIST_OP, LAST_LIST_OP = ONE_OF, IS_NOT_EMPTY
N_OPS = 24

# ---- postfix program instructions ------------------------------------------
# LEAF pushes the truth of distinct predicate `arg`; AND/OR pop `arg` values;
# XOR/XNOR pop two.  Programs are built from negation normal form, so there
# is no NOT instruction: every negation is folded into a predicate.
LEAF, AND, OR, XOR, XNOR = 0, 1, 2, 3, 4

# ---- three-valued truth values (SQL / Kleene) ------------------------------
FALSE, TRUE, NULL = 0, 1, 2
