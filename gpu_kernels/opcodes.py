"""Integer codes shared by the compiler (engine.compile) and the kernels.

Kept in one small module so that the meaning of every code lives in exactly
one place."""

# ---- predicate operators in the distinct-predicate table -------------------
EQ, NE, LT, LE, GT, GE = 0, 1, 2, 3, 4, 5
IN, NOT_IN = 6, 7
BETWEEN, NOT_BETWEEN = 8, 9
LIKE, NOT_LIKE, MATCHES, NOT_MATCHES = 10, 11, 12, 13
IS_NULL, IS_NOT_NULL = 14, 15

# ---- postfix program instructions ------------------------------------------
# LEAF pushes the truth of distinct predicate `arg`; AND/OR pop `arg` values;
# XOR/XNOR pop two.  Programs are built from negation normal form, so there
# is no NOT instruction: every negation is folded into a predicate.
LEAF, AND, OR, XOR, XNOR = 0, 1, 2, 3, 4

# ---- three-valued truth values (SQL / Kleene) ------------------------------
FALSE, TRUE, NULL = 0, 1, 2
