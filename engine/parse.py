"""Expression text -> AST, and AST -> text (docs/language.md#grammar).

This module owns the text syntax of a subscription: the grammar, the
conversion of literals, every syntax error a caller can provoke, and the
printer that writes an AST back as text that parses to the same AST.

The grammar is a lark LALR(1) grammar.  Lark builds the parse table, and the
rule callbacks come from one transformer (`_ASTBuilder`) passed to the
``Lark`` constructor, so no parse tree is ever built.  Lark's own runtime
(contextual lexer plus its token-by-token parser loop) parses about 3,000
seven-predicate conjunctions a second, far too slow for bulk loads, so
`parse` drives the very same lark-built table and callbacks with a tight loop
of its own.  Its tokens come from splitting the text at whitespace and looking
each piece up in a memo (attribute names, keywords, operators and common
values repeat across a workload); a piece seen for the first time goes
through one regular expression.  ``_LARK.parse`` stays usable as the
reference the tests compare against.  The loop reads lark's table through
``Lark.parser.parser._parse_table`` (lark 1.x); `_build_tables` checks the
shape it relies on when the module is imported.

Keywords are reserved: an attribute spelled like a keyword (``"and"``,
``"Null"``) must be double-quoted.  Integers must be exactly representable
as float64 (magnitude at most 2**53), because the kernels compare numbers as
doubles; leading zeros are allowed, at any length.  A number with a dot or
an exponent is rounded to the nearest float64 (``1e-400`` is 0.0), and one
that overflows is refused: NaN and infinite literals do not exist in the
language.  Text that is not valid Unicode (a lone surrogate in a string or
a quoted name) is refused, and so is text nested deeper than
`engine.expr.MAX_NESTING` (`ExpressionTooLarge`), so that no recursive code
ever sees it.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
import operator
import re
from typing import Iterable

from lark import Lark
from lark.parsers.lalr_analysis import Shift

from engine.errors import ExpressionTooLarge, ParseError
from engine.expr import (MAX_NESTING, And, Node, Not, Op, Or, Pred, Xnor, Xor, check_nesting, lone_surrogate,
                         pattern_error, shortened)

__all__ = ["KEYWORDS", "conjunction_terms", "parse", "parse_many", "to_text"]

#: reserved words, matched case-insensitively; an attribute with one of these
#: names has to be written double-quoted.
KEYWORDS = ("OR", "XOR", "XNOR", "AND", "NOT", "IN", "BETWEEN", "LIKE", "MATCHES",
            "IS", "NULL", "ONE", "NONE", "ALL", "OF", "EMPTY", "TRUE", "FALSE")

_MAX_EXACT_INT = 2 ** 53

_WORD_END = r"(?![A-Za-z0-9_.])"
_IDENT = r"[A-Za-z_][A-Za-z0-9_.]*"
_QUOTED_IDENT = r'"[^"]*(?:""[^"]*)*"'
_STRING = r"'[^']*(?:''[^']*)*'"
_NUMBER = r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
_COMPARISON = r"<=|>=|<>|!=|==|=|<|>"


def _any_case(word: str) -> str:
    # Not the `i` flag: under it Python's re also takes "\u017f" for "s" and
    # "\u212a" for "k", and keywords are ASCII.
    return "".join(f"[{letter.upper()}{letter.lower()}]" for letter in word)


# Terminals: ATTR (plain or quoted attribute), LITERAL (number, string or
# boolean), PATTERN (the string after LIKE) and REGEX (the string after
# MATCHES) are separate so that an error says which one was expected.
# AND and OR chains are collected left to right into one list each, so that a
# chain of n terms is built in O(n), not O(n^2).
_GRAMMAR = r"""
?start: or_expr

?or_expr: xor_expr
    | or_chain                              -> or_
or_chain: xor_expr OR xor_expr              -> or_start
    | or_chain OR xor_expr                  -> or_more

?xor_expr: and_expr
    | xor_expr XOR and_expr                 -> xor
    | xor_expr XNOR and_expr                -> xnor

?and_expr: not_expr
    | and_chain                             -> and_
and_chain: not_expr AND not_expr            -> and_start
    | and_chain AND not_expr                -> and_more

?not_expr: NOT not_expr                     -> not_
    | LPAR or_expr RPAR                     -> paren
    | ATTR CMP LITERAL                      -> comparison
    | ATTR IN LPAR in_list RPAR             -> in_
    | ATTR NOT IN LPAR in_list RPAR         -> not_in
    | ATTR BETWEEN LITERAL AND LITERAL      -> between
    | ATTR NOT BETWEEN LITERAL AND LITERAL  -> not_between
    | ATTR LIKE PATTERN                     -> like
    | ATTR NOT LIKE PATTERN                 -> not_like
    | ATTR MATCHES REGEX                    -> matches
    | ATTR NOT MATCHES REGEX                -> not_matches
    | ATTR IS NULL                          -> is_null
    | ATTR IS NOT NULL                      -> is_not_null
    | ATTR ONE OF LPAR in_list RPAR         -> one_of
    | ATTR NONE OF LPAR in_list RPAR        -> none_of
    | ATTR ALL OF LPAR in_list RPAR         -> all_of
    | LITERAL IN ATTR                       -> contains
    | LITERAL NOT IN ATTR                   -> not_contains
    | ATTR IS EMPTY                         -> is_empty
    | ATTR IS NOT EMPTY                     -> is_not_empty

in_list: LITERAL                            -> list_start
    | in_list COMMA LITERAL                 -> list_more

LPAR: "("
RPAR: ")"
COMMA: ","
CMP: /%(comparison)s/
ATTR: /(?!(?:%(keywords)s)%(word_end)s)%(ident)s|%(quoted_ident)s/
LITERAL: /%(number)s|%(string)s|(?:%(true)s|%(false)s)%(word_end)s/
PATTERN: /%(string)s/
REGEX: /%(string)s/
%(keyword_terminals)s
%%ignore /\s+/
""" % dict(
    comparison=_COMPARISON, ident=_IDENT, quoted_ident=_QUOTED_IDENT, number=_NUMBER,
    string=_STRING, word_end=_WORD_END, keywords="|".join(map(_any_case, KEYWORDS)),
    true=_any_case("TRUE"), false=_any_case("FALSE"),
    keyword_terminals="\n".join(f"{word}: /{_any_case(word)}{_WORD_END}/" for word in KEYWORDS
                                if word not in ("TRUE", "FALSE")),
)

_COMPARISON_OPS = {"=": Op.EQ, "==": Op.EQ, "!=": Op.NE, "<>": Op.NE, "<": Op.LT, "<=": Op.LE, ">": Op.GT, ">=": Op.GE}


class _BadToken(Exception):
    """A token that cannot be accepted.  ``expected`` is empty for a lexical
    error (the parser state then says what was expected), and names the
    acceptable values when the token is well formed but its value is not
    allowed (an integer beyond 2**53, an infinite number, a bad RE2 pattern,
    a lone surrogate).  ``at`` is how far into the token the culprit is."""

    def __init__(self, message: str, expected: tuple[str, ...] = (), at: int = 0):
        super().__init__(message)
        self.message = message
        self.expected = expected
        self.at = at


# ---------------------------------------------------------------- tokens and literals

def _number(token: str) -> int | float:
    if "." in token or "e" in token or "E" in token:
        value = float(token)
        if math.isinf(value):
            raise _BadToken(f"number {shortened(token)} overflows to infinity as a float64; "
                            "infinite literals are not allowed", ("finite number",))
        return value
    # Only the significant digits go to int(), which refuses more than 4300
    # digits: leading zeros may run on at any length, and more than 16
    # significant digits are beyond 2**53 anyway.
    digits = token.lstrip("+-").lstrip("0")
    if len(digits) <= 16:
        value = int(digits or "0")
        if value <= _MAX_EXACT_INT:
            return -value if token[0] == "-" else value
    raise _BadToken(f"integer {shortened(token)} exceeds 2**53 in magnitude and is not exactly "
                    "representable as a float64", ("integer of magnitude at most 2**53",))


def _valid_unicode(token: str, what: str) -> None:
    at = lone_surrogate(token)
    if at is not None:
        raise _BadToken(f"{what} is not valid Unicode: it holds the lone surrogate {token[at]!r}",
                        ("valid Unicode text",), at)


def _string(token: str) -> str:
    _valid_unicode(token, "string")
    value = token[1:-1]
    return value.replace("''", "'") if "''" in value else value


def _attr_name(token: str) -> str:
    if token[0] != '"':
        return token
    name = token[1:-1]
    if not name:
        raise _BadToken("empty attribute name", ("attribute",))
    _valid_unicode(token, "quoted attribute name")
    return name.replace('""', '"') if '""' in name else name


def _literal(token: str) -> int | float | str | bool:
    first = token[0]
    if first == "'":
        return _string(token)
    if first in "tT":
        return True
    if first in "fF":
        return False
    return _number(token)


def _regex(pattern: str) -> str:
    reason = pattern_error("regex", pattern)     # (the error goes into the ParseError, not onto stderr)
    if reason is not None:
        raise _BadToken(f"invalid RE2 pattern {shortened(repr(pattern))}: {reason}", ("valid RE2 pattern",))
    return pattern


def _like(pattern: str) -> str:
    reason = pattern_error("like", pattern)
    if reason is not None:
        raise _BadToken(f"LIKE pattern {shortened(repr(pattern))} does not compile to RE2: {reason}",
                        ("a LIKE pattern RE2 can compile",))
    return pattern



# ---------------------------------------------------------------- AST building

def _chain_append(chain: list, node: Node, cls: type) -> list:
    # A parenthesised chain of the same connective joins its parent chain:
    # ``(a AND b) AND c`` is And((a, b, c)).
    if node.__class__ is cls:
        chain.extend(node.children)
    else:
        chain.append(node)
    return chain


class _ASTBuilder:
    """The lark transformer.  Rule methods take the list of children; the
    terminal methods convert lark's tokens (only lark's own lexer calls them:
    `parse` converts tokens itself, with the same helpers)."""

    @staticmethod
    def ATTR(token):
        return _attr_name(str(token))   # a plain str, not lark's Token

    LITERAL = staticmethod(_literal)
    PATTERN = staticmethod(_string)
    REGEX = staticmethod(_string)
    CMP = staticmethod(_COMPARISON_OPS.__getitem__)

    @staticmethod
    def or_start(c):
        return _chain_append(_chain_append([], c[0], Or), c[2], Or)

    @staticmethod
    def or_more(c):
        return _chain_append(c[0], c[2], Or)

    @staticmethod
    def or_(c):
        return Or(tuple(c[0]))

    @staticmethod
    def and_start(c):
        return _chain_append(_chain_append([], c[0], And), c[2], And)

    @staticmethod
    def and_more(c):
        return _chain_append(c[0], c[2], And)

    @staticmethod
    def and_(c):
        return And(tuple(c[0]))

    @staticmethod
    def xor(c):
        return Xor(c[0], c[2])

    @staticmethod
    def xnor(c):
        return Xnor(c[0], c[2])

    @staticmethod
    def not_(c):
        return Not(c[1])

    @staticmethod
    def paren(c):
        return c[1]

    @staticmethod
    def comparison(c):
        return Pred(c[0], c[1], (c[2],))

    @staticmethod
    def in_(c):
        return Pred(c[0], Op.IN, tuple(c[3]))

    @staticmethod
    def not_in(c):
        return Pred(c[0], Op.NOT_IN, tuple(c[4]))

    @staticmethod
    def between(c):
        return Pred(c[0], Op.BETWEEN, (c[2], c[4]))

    @staticmethod
    def not_between(c):
        return Pred(c[0], Op.NOT_BETWEEN, (c[3], c[5]))

    @staticmethod
    def like(c):
        return Pred(c[0], Op.LIKE, (_like(c[2]),))

    @staticmethod
    def not_like(c):
        return Pred(c[0], Op.NOT_LIKE, (_like(c[3]),))

    @staticmethod
    def matches(c):
        return Pred(c[0], Op.MATCHES, (_regex(c[2]),))

    @staticmethod
    def not_matches(c):
        return Pred(c[0], Op.NOT_MATCHES, (_regex(c[3]),))

    @staticmethod
    def is_null(c):
        return Pred(c[0], Op.IS_NULL, ())

    @staticmethod
    def is_not_null(c):
        return Pred(c[0], Op.IS_NOT_NULL, ())

    @staticmethod
    def one_of(c):
        return Pred(c[0], Op.ONE_OF, tuple(c[4]))

    @staticmethod
    def none_of(c):
        return Pred(c[0], Op.NONE_OF, tuple(c[4]))

    @staticmethod
    def all_of(c):
        return Pred(c[0], Op.ALL_OF, tuple(c[4]))

    @staticmethod
    def contains(c):
        return Pred(c[2], Op.CONTAINS, (c[0],))

    @staticmethod
    def not_contains(c):
        return Pred(c[3], Op.NOT_CONTAINS, (c[0],))

    @staticmethod
    def is_empty(c):
        return Pred(c[0], Op.IS_EMPTY, ())

    @staticmethod
    def is_not_empty(c):
        return Pred(c[0], Op.IS_NOT_EMPTY, ())

    @staticmethod
    def list_start(c):
        return [c[0]]

    @staticmethod
    def list_more(c):
        c[0].append(c[2])
        return c[0]


_LARK = Lark(_GRAMMAR, parser="lalr", lexer="contextual", transformer=_ASTBuilder(),
             maybe_placeholders=False)


# ---------------------------------------------------------------- the table-driven parser
#
# Token kinds are small ints.  A quoted string is one kind (STRING) that the
# table accepts wherever lark's grammar has LITERAL, PATTERN or REGEX; the
# grammar never allows two of those in one state, which `_build_tables`
# checks.  BAD is a kind no state accepts: the tokenizer turns what it cannot
# accept into a BAD token, so that a syntax error earlier in the text is
# still reported first.

_KIND_NAMES = ("ATTR", "LITERAL", "STRING", "CMP", "LPAR", "RPAR", "COMMA",
               *(word for word in KEYWORDS if word not in ("TRUE", "FALSE")), "$END", "BAD")
_KIND = {name: kind for kind, name in enumerate(_KIND_NAMES)}
_KINDS_OF_TERMINAL = {"LITERAL": ("LITERAL", "STRING"), "PATTERN": ("STRING",), "REGEX": ("STRING",)}

#: what an error message calls each terminal, in the order they are listed
_TERMINAL_DESCRIPTIONS = {
    "ATTR": "attribute", "LITERAL": "literal", "PATTERN": "string", "REGEX": "string",
    "CMP": "comparison operator", "LPAR": "'('", "RPAR": "')'", "COMMA": "','",
    **{word: word for word in ("NOT", "IN", "BETWEEN", "LIKE", "MATCHES", "IS", "NULL", "AND", "OR", "XOR", "XNOR",
                               "ONE", "NONE", "ALL", "OF", "EMPTY")},
    "$END": "end of input",
}


# The tables are flat lists indexed by ``state + kind`` (actions) and
# ``state + nonterminal`` (gotos), where a state is numbered by a multiple of
# `_WIDTH`: one subscript per lookup in the parser loop.  An action is a state
# to shift to (>= 0), ``~rule`` to reduce by rule (< 0), or `_ERROR`.
_WIDTH = 32


def _build_tables(lark: Lark):
    parse_table = lark.parser.parser._parse_table
    count = len(parse_table.states)
    assert sorted(parse_table.states) == list(range(count)) and len(_KIND_NAMES) <= _WIDTH
    nonterminals: dict[str, int] = {}
    rules: list = []
    rule_index: dict = {}
    error = count * _WIDTH   # no state has this number
    actions = [error] * (count * _WIDTH)
    gotos = [error] * (count * _WIDTH)
    expected: list[tuple[str, ...]] = []
    transformer = lark.options.transformer
    for state in range(count):
        terminals = set()
        for symbol, (action, target) in parse_table.states[state].items():
            if symbol in _TERMINAL_DESCRIPTIONS:
                terminals.add(symbol)
                if action is Shift:
                    code = target * _WIDTH
                else:
                    if target not in rule_index:
                        rule_index[target] = len(rules)
                        size = len(target.expansion)
                        identity = target.options.expand1 and not target.alias and size == 1
                        callback = None if identity else getattr(transformer, target.alias or target.origin.name)
                        rules.append((size, nonterminals.setdefault(target.origin.name, len(nonterminals)),
                                      callback))
                    code = ~rule_index[target]
                for kind_name in _KINDS_OF_TERMINAL.get(symbol, (symbol,)):
                    slot = state * _WIDTH + _KIND[kind_name]
                    assert actions[slot] == error, (state, symbol)
                    actions[slot] = code
            else:
                assert action is Shift
                gotos[state * _WIDTH + nonterminals.setdefault(symbol, len(nonterminals))] = target * _WIDTH
        expected.append(tuple(dict.fromkeys(
            description for terminal, description in _TERMINAL_DESCRIPTIONS.items() if terminal in terminals)))
    assert len(nonterminals) <= _WIDTH
    start = parse_table.start_states["start"] * _WIDTH
    accept = parse_table.end_states["start"] * _WIDTH
    # Lark stops when the start symbol is reduced with $END as lookahead;
    # shifting $END there instead ends the token loop in the accepting state.
    assert actions[accept + _KIND["$END"]] == error
    actions[accept + _KIND["$END"]] = accept
    return start, error, actions, gotos, tuple(rules), expected


_START, _ERROR, _ACTIONS, _GOTOS, _RULES, _EXPECTED = _build_tables(_LARK)


def _expected_in(state: int) -> tuple[str, ...]:
    return _EXPECTED[state // _WIDTH]


# Whitespace, then one token; the final `.` turns any other character into a
# one-character token (rejected later) and `\Z` yields an empty token at the
# end, so every match attempt succeeds and tokenizing is linear.
_TOKEN_RE = re.compile(
    rf"\s*({_STRING}|{_QUOTED_IDENT}|{_IDENT}|{_NUMBER}|<=|>=|<>|!=|==|.|\Z)", re.DOTALL)
_tokenize = _TOKEN_RE.findall

_BAD = _KIND["BAD"]
_END = (_KIND["$END"], None)
_FIXED_TOKENS = {
    "": _END,
    "(": (_KIND["LPAR"], None), ")": (_KIND["RPAR"], None), ",": (_KIND["COMMA"], None),
    **{symbol: (_KIND["CMP"], op) for symbol, op in _COMPARISON_OPS.items()},
}
_KEYWORD_TOKENS = {
    **{word: (_KIND[word], None) for word in KEYWORDS if word not in ("TRUE", "FALSE")},
    "TRUE": (_KIND["LITERAL"], True), "FALSE": (_KIND["LITERAL"], False),
}
_WORD_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_NUMBER_START = frozenset("0123456789+-.")


def _classify(token: str) -> tuple[int, object]:
    """(kind, value) of one token; what cannot be accepted is a BAD token
    whose value is the `_BadToken` saying why."""
    fixed = _FIXED_TOKENS.get(token)
    if fixed is not None:
        return fixed
    first = token[0]
    try:
        if first in _WORD_START:
            return _KEYWORD_TOKENS.get(token.upper()) or (_KIND["ATTR"], token)
        # A lone quote, sign or dot is the tokenizer's one-character fallback.
        if first == "'" and len(token) > 1:
            return _KIND["STRING"], _string(token)
        if first == '"' and len(token) > 1:
            return _KIND["ATTR"], _attr_name(token)
        if first in _NUMBER_START and (len(token) > 1 or first.isdigit()):
            return _KIND["LITERAL"], _number(token)
    except _BadToken as bad:
        return _BAD, bad
    if first == "'":
        return _BAD, _BadToken("unterminated string literal")
    if first == '"':
        return _BAD, _BadToken("unterminated quoted attribute name")
    return _BAD, _BadToken(f"unexpected character {first!r}")


# Tokens never span whitespace, except quoted strings and names, so `parse`
# splits the text at whitespace (fast, in C) and looks each piece up here:
# piece -> its tokens' (kind, value) pairs.  A piece whose tokens include a
# BAD one (an unterminated quote: perhaps a string with a space in it) is not
# stored, and its text is tokenized whole instead.
_PIECES_LIMIT = 1 << 16
_chain = itertools.chain.from_iterable
_starmap = itertools.starmap
_pieces: dict[str, tuple[tuple[int, object], ...]] = {}


def _piece_tokens(piece: str) -> tuple[tuple[int, object], ...] | None:
    tokens = []
    for token in _tokenize(piece)[:-1]:   # the last token is the end of the piece
        kind_value = _classify(token)
        if kind_value[0] == _BAD:
            return None
        tokens.append(kind_value)
    if len(_pieces) >= _PIECES_LIMIT:
        _pieces.clear()
    tokens = _pieces[piece] = tuple(tokens)
    return tokens


def _text_tokens(text: str) -> list[tuple[int, object]]:
    """The tokens of the whole text, up to the end or the first BAD one
    (the parser never reads past that).  After trailing whitespace the
    regex finds the end twice; the first one is the end."""
    tokens = []
    for token in _tokenize(text):
        kind_value = _classify(token)
        tokens.append(kind_value)
        if kind_value[0] == _BAD or kind_value == _END:
            break
    return tokens


_object_new = object.__new__
_set_attr, _set_op, _set_values = Pred.attr.__set__, Pred.op.__set__, Pred.values.__set__
_set_children = And.children.__set__


def _new_pred(attr: str, op: Op, values: tuple) -> Pred:
    """``Pred(attr, op, values)`` through its slots' own setters: a frozen
    dataclass's ``__init__`` assigns each field through
    ``object.__setattr__``, which makes it the largest cost of parsing a
    conjunction (0.6 us of about 1.4 a predicate).  The same object
    (tests/test_parse.py compares them field by field)."""
    pred = _object_new(Pred)
    _set_attr(pred, attr)
    _set_op(pred, op)
    _set_values(pred, values)
    return pred


def _tokens(text: str) -> list[tuple[int, object]]:
    """The text's tokens, ending in `_END` or at the first BAD one.  The
    lookups and the concatenation run in C (map, chain): most pieces of a
    workload's texts have been seen before."""
    try:
        tokens = list(_chain(map(_pieces.get, text.split())))
    except TypeError:     # a piece seen for the first time (None)
        found = []
        for piece in text.split():
            piece_tokens = _pieces.get(piece) or _piece_tokens(piece)
            if piece_tokens is None:
                return _text_tokens(text)
            found.append(piece_tokens)
        tokens = list(_chain(found))
    tokens.append(_END)
    return tokens


def parse(text: str) -> Node:
    """Parse one expression (docs/language.md#grammar) into its AST.

    Raises `ParseError` (with 1-based ``line`` and ``column`` of the offending
    character and the ``expected`` alternatives) for any malformed text,
    `ExpressionTooLarge` for text nested deeper than
    `engine.expr.MAX_NESTING`, and `TypeError` for anything that is not a
    ``str``.  The parser loop never recurses, whatever the text.

    Examples
    --------
    >>> parse("a <> 1 AND b IN ('x', 'y')") == And((Pred("a", Op.NE, (1,)), Pred("b", Op.IN, ("x", "y"))))
    True
    """
    if not isinstance(text, str):
        raise TypeError(f"an expression must be a str, not {type(text).__name__}")
    tokens = _tokens(text)
    terms = _conjunction_terms(tokens)
    if terms is not None:
        if len(terms) == 1:
            return _new_pred(*terms[0])
        node = _object_new(And)         # (as _new_pred does: And(children), without its __init__)
        _set_children(node, tuple(_starmap(_new_pred, terms)))
        return node
    actions, gotos, rules, error = _ACTIONS, _GOTOS, _RULES, _ERROR
    state = _START
    states = [state]
    values: list = []
    stream = iter(tokens)
    try:
        for kind, value in stream:
            action = actions[state + kind]
            while action < 0:
                size, symbol, callback = rules[~action]
                if callback is None:
                    state = states[-1] = gotos[states[-2] + symbol]
                else:
                    children = values[-size:]
                    del values[-size:]
                    del states[-size:]
                    values.append(callback(children))
                    state = gotos[states[-1] + symbol]
                    states.append(state)
                action = actions[state + kind]
            if action == error:
                raise _syntax_error(text, len(tokens) - operator.length_hint(stream) - 1, states, kind, value)
            state = action
            states.append(state)
            values.append(value)
    except _BadToken as bad:
        # Raised by a rule callback (an invalid MATCHES pattern).  A rule is
        # reduced on the token after its last one, which is the culprit.
        raise _token_error(text, len(tokens) - operator.length_hint(stream) - 2,
                           bad.message, bad.expected) from None
    node = values[0]
    # Every node of the AST takes at least one token, so only a text of more
    # tokens than that can be nested too deep: short texts skip the walk.
    if len(tokens) > MAX_NESTING:
        check_nesting(node)
    return node


_ATTR, _LITERAL, _STRING_KIND, _CMP = _KIND["ATTR"], _KIND["LITERAL"], _KIND["STRING"], _KIND["CMP"]
_LPAR, _RPAR, _COMMA = _KIND["LPAR"], _KIND["RPAR"], _KIND["COMMA"]
_AND, _NOT, _IN, _BETWEEN, _LIKE, _MATCHES, _IS, _NULL = (
    _KIND[word] for word in ("AND", "NOT", "IN", "BETWEEN", "LIKE", "MATCHES", "IS", "NULL"))
_END_KIND = _KIND["$END"]


def _conjunction_terms(tokens: list) -> list[tuple[str, Op, tuple]] | None:
    """The predicates, as ``(attr, op, values)``, of a text that is one
    predicate or an AND chain of predicates -- what most subscriptions are --
    read straight off its tokens, or None for anything else (a connective
    but AND, NOT before a predicate, parentheses, an error), which the
    table-driven parser then reads.  `parse` makes of them exactly the nodes
    that parser's rule callbacks would (tests/test_parse.py checks both on
    random texts), skipping the table lookups and the reductions, two thirds
    of the time of a plain conjunction; `conjunction_terms` hands them to
    the columnar form (engine.columnar.texts_as_columns) without any node."""
    terms = []
    i = 0
    try:
        while True:
            kind, attr = tokens[i]
            if kind != _ATTR:
                return None
            kind, op = tokens[i + 1]
            if kind == _CMP:
                kind, value = tokens[i + 2]
                if kind != _LITERAL and kind != _STRING_KIND:
                    return None
                terms.append((attr, op, (value,)))
                i += 3
            else:
                negated = kind == _NOT
                if negated:
                    kind = tokens[i + 2][0]
                    i += 1
                if kind == _IN:
                    if tokens[i + 2][0] != _LPAR:
                        return None
                    values = []
                    j = i + 3
                    while True:
                        kind, value = tokens[j]
                        if kind != _LITERAL and kind != _STRING_KIND:
                            return None
                        values.append(value)
                        kind = tokens[j + 1][0]
                        j += 2
                        if kind == _RPAR:
                            break
                        if kind != _COMMA:
                            return None
                    terms.append((attr, Op.NOT_IN if negated else Op.IN, tuple(values)))
                    i = j
                elif kind == _BETWEEN:
                    (k_lo, low), (k_and, _), (k_hi, high) = tokens[i + 2], tokens[i + 3], tokens[i + 4]
                    if k_and != _AND or k_lo not in (_LITERAL, _STRING_KIND) or k_hi not in (_LITERAL, _STRING_KIND):
                        return None
                    terms.append((attr, Op.NOT_BETWEEN if negated else Op.BETWEEN, (low, high)))
                    i += 5
                elif kind == _LIKE or kind == _MATCHES:
                    operand_kind, pattern = tokens[i + 2]
                    if operand_kind != _STRING_KIND:
                        return None
                    if kind == _LIKE:
                        op = Op.NOT_LIKE if negated else Op.LIKE
                        pattern = _like(pattern)
                    else:
                        op = Op.NOT_MATCHES if negated else Op.MATCHES
                        pattern = _regex(pattern)
                    terms.append((attr, op, (pattern,)))
                    i += 3
                elif kind == _IS and not negated:
                    kind = tokens[i + 2][0]
                    if kind == _NULL:
                        terms.append((attr, Op.IS_NULL, ()))
                        i += 3
                    elif kind == _NOT and tokens[i + 3][0] == _NULL:
                        terms.append((attr, Op.IS_NOT_NULL, ()))
                        i += 4
                    else:
                        return None
                else:
                    return None
            kind = tokens[i][0]
            if kind == _END_KIND:
                break
            if kind != _AND:
                return None
            i += 1
    except (IndexError, _BadToken):      # cut short, or a bad pattern: the full parser says where and why
        return None
    return terms


def conjunction_terms(texts: Iterable) -> list[list[tuple[str, Op, tuple]] | None]:
    """Per text, ``[(attr, op, values), ...]`` when it is one predicate or an
    AND chain of predicates (the literals converted and checked as `parse`
    does), else None -- for any other text, valid or not (`parse` then says
    what it is or what is wrong with it), and for anything not a str."""
    return [_conjunction_terms(_tokens(text)) if text.__class__ is str else None for text in texts]


def parse_many(texts: Iterable[str]) -> list[Node]:
    """Parse every text; equal texts share one AST (ASTs are immutable).

    The cyclic garbage collector is paused meanwhile: ASTs hold no cycles,
    and the collections that millions of new, long-lived objects trigger
    would take a quarter of the time.  A `ParseError` or
    `ExpressionTooLarge` carries a note saying which text of the batch
    failed.
    """
    parsed: dict[str, Node] = {}
    nodes = []
    with collector_paused():
        for number, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"expression {number} of the batch is a {type(text).__name__}, not a str")
            node = parsed.get(text)
            if node is None:
                try:
                    node = parsed[text] = parse(text)
                except (ParseError, ExpressionTooLarge) as error:
                    error.add_note(f"in expression {number} of the batch")
                    raise
            nodes.append(node)
    return nodes


@contextlib.contextmanager
def collector_paused():
    """Pause the cyclic garbage collector while many ASTs are made: they
    hold no cycles, and the collections that millions of new, long-lived
    objects trigger would take a quarter of the time."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


# ---------------------------------------------------------------- errors

_OPERATOR_RUN = re.compile(r"[=<>!~^&|*/%]+")
_NOT_A_NUMBER = re.compile(rf"[+-]?(?:nan|inf(?:inity)?){_WORD_END}", re.IGNORECASE)


def _position(text: str, offset: int) -> tuple[int, int]:
    line_start = text.rfind("\n", 0, offset) + 1
    return text.count("\n", 0, offset) + 1, offset - line_start + 1


def _token_error(text: str, index: int, message: str, expected: tuple[str, ...]) -> ParseError:
    *_, match = itertools.islice(_TOKEN_RE.finditer(text), index + 1)
    offset = match.start(1)
    line, column = _position(text, offset)
    return ParseError(message, text=text, line=line, column=column, expected=expected)


def _syntax_error(text: str, index: int, states: list, kind: int, value) -> ParseError:
    """The error for token ``index`` (of kind ``kind``), which no action of
    the state on top of ``states`` accepts."""
    matches = list(itertools.islice(_TOKEN_RE.finditer(text), index + 1))
    offset = matches[index].start(1)
    token = matches[index].group(1)
    expected = _expected_in(states[-1])
    operator_run = _OPERATOR_RUN.match(text, offset)
    previous = matches[index - 1] if index else None
    if kind == _BAD and value.expected:
        message, expected = value.message, value.expected
        offset += value.at
    elif (operator_run and previous is not None and previous.end(1) == offset
          and _classify(previous.group(1))[0] == _KIND["CMP"]):
        # `a == 1`, `a => 1`: one unknown operator, not two known ones.
        offset = previous.start(1)
        message = f"unknown operator {text[offset:operator_run.end()]!r}"
        expected = _expected_in(states[-2])
    elif operator_run and "comparison operator" in expected:
        message = f"unknown operator {operator_run.group()!r}"
    elif "literal" in expected and _NOT_A_NUMBER.match(text, offset):
        message = "NaN and infinite literals are not allowed"
    elif (kind == _KIND["RPAR"] and index >= 2 and matches[index - 1].group(1) == "("
          and matches[index - 2].group(1).upper() == "IN"):
        message = "empty IN list"
    elif kind == _BAD:
        message = value.message
    elif kind == _KIND["$END"]:
        message = "unexpected end of input" if index else "empty expression"
    else:
        message = f"unexpected {shortened(token)!r}"
    line, column = _position(text, offset)
    return ParseError(message, text=text, line=line, column=column, expected=expected)


# ---------------------------------------------------------------- printing

# Binding strength of each construct when printed; a child weaker than its
# context is parenthesised.
_OR_LEVEL, _XOR_LEVEL, _AND_LEVEL, _NOT_LEVEL = 1, 2, 3, 4
_PLAIN_ATTR = re.compile(_IDENT)
_RESERVED = frozenset(KEYWORDS)


def _attr_text(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"attribute name must be a non-empty str, not {name!r}")
    if _PLAIN_ATTR.fullmatch(name) and name.upper() not in _RESERVED:
        return name
    return '"' + name.replace('"', '""') + '"'


def _literal_text(value) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} has no literal: NaN and infinite literals are not allowed")
        return repr(float(value))           # (a NumPy float64 is a float whose repr is 'np.float64(...)')
    if isinstance(value, str):
        return "'" + str(value).replace("'", "''") + "'"
    raise TypeError(f"not a literal: {value!r} ({type(value).__name__})")


_LIST_SET_WORDS = {Op.ONE_OF: "ONE OF", Op.NONE_OF: "NONE OF", Op.ALL_OF: "ALL OF"}


def _pred_text(pred: Pred) -> str:
    attr, op, values = _attr_text(pred.attr), pred.op, pred.values
    if op in _LIST_SET_WORDS or op is Op.NOT_ALL_OF:
        if not values:
            raise ValueError(f"{op.value} needs at least one value: {pred!r}")
        text = f"{attr} {_LIST_SET_WORDS[Op.ALL_OF if op is Op.NOT_ALL_OF else op]} " \
               f"({', '.join(map(_literal_text, values))})"
        return "NOT " + text if op is Op.NOT_ALL_OF else text
    if op in (Op.CONTAINS, Op.NOT_CONTAINS):
        (value,) = values
        return f"{_literal_text(value)} {'NOT IN' if op is Op.NOT_CONTAINS else 'IN'} {attr}"
    if op in (Op.IN, Op.NOT_IN):
        if not values:
            raise ValueError(f"{op.value} needs at least one value: {pred!r}")
        return f"{attr} {op.value} ({', '.join(map(_literal_text, values))})"
    if op in (Op.BETWEEN, Op.NOT_BETWEEN):
        low, high = values
        return f"{attr} {op.value} {_literal_text(low)} AND {_literal_text(high)}"
    if op in (Op.IS_NULL, Op.IS_NOT_NULL, Op.IS_EMPTY, Op.IS_NOT_EMPTY):
        return f"{attr} {op.value}"
    (value,) = values
    return f"{attr} {op.value} {_literal_text(value)}"


def _node_text(node: Node, context: int) -> str:
    """``node`` as text, in a position that binds at least as tight as ``context``."""
    if isinstance(node, Pred):
        return _pred_text(node)
    if isinstance(node, Not):
        level, text = _NOT_LEVEL, "NOT " + _node_text(node.child, _NOT_LEVEL)
    elif isinstance(node, And):
        level = _AND_LEVEL
        text = " AND ".join(_node_text(child, _AND_LEVEL + 1) for child in node.children)
    elif isinstance(node, Or):
        level = _OR_LEVEL
        text = " OR ".join(_node_text(child, _OR_LEVEL + 1) for child in node.children)
    elif isinstance(node, (Xor, Xnor)):
        level = _XOR_LEVEL
        keyword = " XOR " if isinstance(node, Xor) else " XNOR "
        # left-associative: a connective of the same level is bare on the left only
        text = _node_text(node.left, _XOR_LEVEL) + keyword + _node_text(node.right, _XOR_LEVEL + 1)
    else:
        raise TypeError(f"not an expression node: {node!r}")
    if isinstance(node, (And, Or)) and len(node.children) < 2:
        raise ValueError(f"{type(node).__name__} needs at least two children: {node!r}")
    return text if level >= context else f"({text})"


def to_text(node: Node) -> str:
    """The text of ``node``; ``parse(to_text(node)) == node`` for every AST
    `parse` returns.  Parentheses appear only where precedence needs them.

    ``Pred(a, Op.NOT_MATCHES, (r,))`` is written ``a NOT MATCHES r``.

    Examples
    --------
    >>> to_text(And((Pred("a", Op.EQ, (1,)), Or((Pred("b", Op.LT, (2.5,)), Pred("and", Op.IS_NULL))))))
    'a = 1 AND (b < 2.5 OR "and" IS NULL)'

    Raises `ExpressionTooLarge` for an AST nested deeper than
    `engine.expr.MAX_NESTING`, which `parse` would refuse.
    """
    check_nesting(node)
    return _node_text(node, _OR_LEVEL)
