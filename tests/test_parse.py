"""The expression language (docs/language.md#grammar): what `engine.parse.parse` builds
from text, every error it reports (with position and what was expected), and
the printer `to_text` that writes ASTs back as text."""

from __future__ import annotations

import gc
import math
import re
import time

import lark
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import ExpressionTooLarge, ParseError
from engine.expr import MAX_NESTING, And, Not, Op, Or, Pred, Xnor, Xor, predicates, to_nnf
from engine.parse import (_END, _LARK, KEYWORDS, _BadToken, _piece_tokens, _text_tokens, parse, parse_many,
                          to_text)
from tests.strategies import expressions


def P(attr, op, *values):
    return Pred(attr, op, tuple(values))


A, B, C, D = (P(name, Op.EQ, 1) for name in "abcd")


def error_of(text) -> ParseError:
    with pytest.raises(ParseError) as info:
        parse(text)
    return info.value


# ---------------------------------------------------------------- operators and keywords

@pytest.mark.parametrize("symbol, op", [
    ("=", Op.EQ), ("!=", Op.NE), ("<>", Op.NE), ("<", Op.LT), ("<=", Op.LE), (">", Op.GT), (">=", Op.GE),
])
@pytest.mark.parametrize("spacing", ["{a} {op} {v}", "{a}{op}{v}", "{a}\t{op}\n{v}"])
def test_comparison_operators(symbol, op, spacing):
    assert parse(spacing.format(a="price", op=symbol, v="5")) == P("price", op, 5)


@pytest.mark.parametrize("text, expected", [
    ("a IN (1, 2, 3)", P("a", Op.IN, 1, 2, 3)),
    ("a in ('x')", P("a", Op.IN, "x")),
    ("a NOT IN (1)", P("a", Op.NOT_IN, 1)),
    ("a not In ('x', 'y')", P("a", Op.NOT_IN, "x", "y")),
    ("a BETWEEN 1 AND 9", P("a", Op.BETWEEN, 1, 9)),
    ("a between -1.5 and 2", P("a", Op.BETWEEN, -1.5, 2)),
    ("a NOT BETWEEN 'a' AND 'b'", P("a", Op.NOT_BETWEEN, "a", "b")),
    ("a Not Between 1 aNd 2", P("a", Op.NOT_BETWEEN, 1, 2)),
    ("a LIKE 'x%'", P("a", Op.LIKE, "x%")),
    ("a like '_'", P("a", Op.LIKE, "_")),
    ("a NOT LIKE '%y'", P("a", Op.NOT_LIKE, "%y")),
    ("a nOT lIKE ''", P("a", Op.NOT_LIKE, "")),
    ("a MATCHES '^a+b?$'", P("a", Op.MATCHES, "^a+b?$")),
    ("a matches 'x|y'", P("a", Op.MATCHES, "x|y")),
    ("a IS NULL", P("a", Op.IS_NULL)),
    ("a is null", P("a", Op.IS_NULL)),
    ("a IS NOT NULL", P("a", Op.IS_NOT_NULL)),
    ("a Is Not Null", P("a", Op.IS_NOT_NULL)),
    ("a = TRUE", P("a", Op.EQ, True)),
    ("a = false", P("a", Op.EQ, False)),
    ("a IN (TRUE, fAlSe)", P("a", Op.IN, True, False)),
])
def test_predicate_forms(text, expected):
    assert parse(text) == expected


@pytest.mark.parametrize("spelling", ["AND", "and", "And", "aNd"])
def test_and_is_case_insensitive(spelling):
    assert parse(f"a = 1 {spelling} b = 1") == And((A, B))


@pytest.mark.parametrize("word, expected", [
    ("OR", Or((A, B))), ("or", Or((A, B))), ("Or", Or((A, B))),
    ("XOR", Xor(A, B)), ("xor", Xor(A, B)), ("xOr", Xor(A, B)),
    ("XNOR", Xnor(A, B)), ("xnor", Xnor(A, B)), ("XnOr", Xnor(A, B)),
])
def test_connectives_are_case_insensitive(word, expected):
    assert parse(f"a = 1 {word} b = 1") == expected


@pytest.mark.parametrize("spelling", ["NOT", "not", "NoT"])
def test_not_is_case_insensitive(spelling):
    assert parse(f"{spelling} a = 1") == Not(A)


def test_boolean_literals_differ_from_numbers():
    assert parse("a = TRUE") != parse("a = 1")
    assert type(parse("a = TRUE").values[0]) is bool
    assert type(parse("a = 1").values[0]) is int


# ---------------------------------------------------------------- precedence and associativity

@pytest.mark.parametrize("text, expected", [
    ("a = 1 OR b = 1 AND c = 1", Or((A, And((B, C))))),
    ("a = 1 AND b = 1 OR c = 1", Or((And((A, B)), C))),
    ("a = 1 XOR b = 1 AND c = 1", Xor(A, And((B, C)))),
    ("a = 1 AND b = 1 XNOR c = 1", Xnor(And((A, B)), C)),
    ("a = 1 OR b = 1 XOR c = 1", Or((A, Xor(B, C)))),
    ("a = 1 XOR b = 1 OR c = 1", Or((Xor(A, B), C))),
    ("NOT a = 1 AND b = 1", And((Not(A), B))),
    ("NOT a = 1 OR b = 1", Or((Not(A), B))),
    ("NOT (a = 1 AND b = 1)", Not(And((A, B)))),
    ("NOT NOT a = 1", Not(Not(A))),
    ("(a = 1 OR b = 1) AND c = 1", And((Or((A, B)), C))),
    ("a = 1 AND (b = 1 OR c = 1) AND d = 1", And((A, Or((B, C)), D))),
    ("a = 1 XOR b = 1 XOR c = 1", Xor(Xor(A, B), C)),
    ("a = 1 XNOR b = 1 XOR c = 1", Xor(Xnor(A, B), C)),
    ("a = 1 XOR b = 1 XNOR c = 1 XOR d = 1", Xor(Xnor(Xor(A, B), C), D)),
    ("a = 1 XOR (b = 1 XOR c = 1)", Xor(A, Xor(B, C))),
    ("a = 1 AND b = 1 AND c = 1", And((A, B, C))),
    ("a = 1 OR b = 1 OR c = 1 OR d = 1", Or((A, B, C, D))),
    ("a = 1 OR b = 1 AND c = 1 OR d = 1", Or((A, And((B, C)), D))),
    ("a BETWEEN 1 AND 2 AND b = 1", And((P("a", Op.BETWEEN, 1, 2), B))),
    ("a NOT IN (1) AND NOT a IN (1)", And((P("a", Op.NOT_IN, 1), Not(P("a", Op.IN, 1))))),
    ("(((a = 1)))", A),
])
def test_precedence_and_associativity(text, expected):
    assert parse(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("(a = 1 AND b = 1) AND c = 1", And((A, B, C))),
    ("a = 1 AND (b = 1 AND c = 1)", And((A, B, C))),
    ("(a = 1 AND b = 1) AND (c = 1 AND d = 1)", And((A, B, C, D))),
    ("((a = 1 OR b = 1)) OR c = 1", Or((A, B, C))),
    ("a = 1 OR (b = 1 OR (c = 1 OR d = 1))", Or((A, B, C, D))),
    # Only chains of the same connective merge.
    ("(a = 1 OR b = 1) AND (c = 1 OR d = 1)", And((Or((A, B)), Or((C, D))))),
    ("NOT (a = 1 AND b = 1) AND c = 1", And((Not(And((A, B))), C))),
])
def test_same_connective_chains_are_flattened(text, expected):
    assert parse(text) == expected


def test_long_chains_and_deep_nesting_parse_in_linear_time():
    n = 20_000
    start = time.perf_counter()
    chain = parse(" AND ".join(f"a{i} = {i}" for i in range(n)))
    nested = parse("(" * n + "a = 1" + ")" * n)
    negated = parse("NOT " * MAX_NESTING + "a = 1")
    with pytest.raises(ExpressionTooLarge):
        parse("NOT " * n + "a = 1")
    assert time.perf_counter() - start < 20   # quadratic chains would take minutes
    assert isinstance(chain, And) and len(chain.children) == n
    assert chain.children[-1] == P(f"a{n - 1}", Op.EQ, n - 1)
    assert nested == A
    depth = 0
    while isinstance(negated, Not):
        negated, depth = negated.child, depth + 1
    assert depth == MAX_NESTING and negated == A


# ---------------------------------------------------------------- identifiers and strings

@pytest.mark.parametrize("text, attr", [
    ("a = 1", "a"),
    ("_x = 1", "_x"),
    ("A.b_2.c = 1", "A.b_2.c"),
    ("notable = 1", "notable"),
    ("and_or = 1", "and_or"),
    ("in.x = 1", "in.x"),
    ('"a b" = 1', "a b"),
    ('"and" = 1', "and"),
    ('"NULL" = 1', "NULL"),
    ('"x""y" = 1', 'x"y'),
    ('"""" = 1', '"'),
    ('"it\'s" = 1', "it's"),
    ('"é ü" = 1', "é ü"),
    ('"line\nbreak" = 1', "line\nbreak"),
    ('"1st" = 1', "1st"),
])
def test_attribute_names(text, attr):
    assert parse(text) == P(attr, Op.EQ, 1)


@pytest.mark.parametrize("text, value", [
    ("s = 'plain'", "plain"),
    ("s = ''", ""),
    ("s = 'it''s'", "it's"),
    ("s = ''''", "'"),
    ("s = 'a''''b'", "a''b"),
    ("s = 'say \"hi\"'", 'say "hi"'),
    ("s = 'a AND b = 1'", "a AND b = 1"),
    ("s = '  spaces  inside '", "  spaces  inside "),
    ("s = 'two\nlines'", "two\nlines"),
    ("s = 'é€😀'", "é€😀"),
    ("s = '(,)'", "(,)"),
    ("s = '\x00'", "\x00"),
    ("s = 'a\x00b\x00'", "a\x00b\x00"),
])
def test_string_literals(text, value):
    assert parse(text) == P("s", Op.EQ, value)


def test_strings_with_spaces_in_every_position():
    assert parse("s IN ('a b', 'c') AND t LIKE '% x %' AND u MATCHES 'a b|c' AND v BETWEEN ' ' AND '  '") == And((
        P("s", Op.IN, "a b", "c"), P("t", Op.LIKE, "% x %"), P("u", Op.MATCHES, "a b|c"),
        P("v", Op.BETWEEN, " ", "  ")))


@pytest.mark.parametrize("word", KEYWORDS)
@pytest.mark.parametrize("case", [str.upper, str.lower, str.title])
def test_keywords_are_reserved_unless_quoted(word, case):
    with pytest.raises(ParseError):
        parse(f"{case(word)} = 1")
    assert parse(f'"{case(word)}" = 1') == P(case(word), Op.EQ, 1)


# ---------------------------------------------------------------- numbers

@pytest.mark.parametrize("literal, value, kind", [
    ("0", 0, int), ("-0", 0, int), ("+5", 5, int), ("-12", -12, int), ("007", 7, int),
    ("9007199254740992", 2 ** 53, int), ("-9007199254740992", -2 ** 53, int),
    ("1.5", 1.5, float), (".5", 0.5, float), ("5.", 5.0, float), ("5.0", 5.0, float),
    ("-.25", -0.25, float), ("+0.75", 0.75, float),
    ("1e3", 1000.0, float), ("1E3", 1000.0, float), ("1e+3", 1000.0, float), ("2.5e-3", 0.0025, float),
    ("-1.5E+2", -150.0, float), (".5e1", 5.0, float), ("5.e1", 50.0, float),
    ("1e308", 1e308, float), ("1e-400", 0.0, float), ("12345678901234567890.0", 12345678901234567890.0, float),
])
def test_numbers(literal, value, kind):
    (parsed,) = parse(f"n = {literal}").values
    assert type(parsed) is kind and parsed == value


@pytest.mark.parametrize("literal, value", [
    # int() refuses more than 4300 digits: leading zeros of any length are fine
    ("0" * 5000 + "1", 1), ("-" + "0" * 5000 + "7", -7), ("+" + "0" * 5000, 0),
    ("0" * 5000 + "9007199254740992", 2 ** 53), ("-" + "0" * 100_000 + "9007199254740992", -2 ** 53),
    # floats of any length are rounded to the nearest float64
    ("0." + "0" * 5000 + "1e5000", 0.1), ("1" * 300 + ".0", float("1" * 300)),
    ("1" + "0" * 5000 + "e-5000", 1.0), ("0" * 5000 + ".5", 0.5), ("0e" + "9" * 5000, 0.0),
    ("1e-" + "9" * 5000, 0.0), ("4.9e-324", 5e-324), ("1.7976931348623157e308", 1.7976931348623157e308),
])
def test_numbers_of_any_length(literal, value):
    (parsed,) = parse(f"n = {literal}").values
    assert type(parsed) is type(value) and parsed == value


def test_negative_zero_keeps_its_sign():
    (value,) = parse("n = -0.0").values
    assert value == 0 and math.copysign(1, value) == -1


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("text, line, column, message, expected", [
    # unbalanced parentheses
    ("(a = 1", 1, 7, "unexpected end of input", ("')'",)),
    ("a = 1)", 1, 6, "unexpected ')'", ("end of input",)),
    ("(a = 1 AND (b = 2 OR c = 3)", 1, 28, "unexpected end of input", ("')'",)),
    ("a = 1 AND ()", 1, 12, "unexpected ')'", ("attribute", "'('", "NOT")),
    # missing operands
    ("a = ", 1, 5, "unexpected end of input", ("literal",)),
    ("a = 1 AND", 1, 10, "unexpected end of input", ("attribute", "'('", "NOT")),
    ("a = 1 OR OR b = 1", 1, 10, "unexpected 'OR'", ("attribute",)),
    ("= 1", 1, 1, "unexpected '='", ("attribute",)),
    ("a BETWEEN 1", 1, 12, "unexpected end of input", ("AND",)),
    ("a IN (1,)", 1, 9, "unexpected ')'", ("literal",)),
    ("a IS NOT", 1, 9, "unexpected end of input", ("NULL",)),
    # unknown operators
    ("a === 1", 1, 3, "unknown operator '==='", ("comparison operator", "IN")),
    ("a ~ 1", 1, 3, "unknown operator '~'", ("comparison operator", "BETWEEN")),
    ("a => 1", 1, 3, "unknown operator '=>'", ("comparison operator",)),
    ("a = 1 && b = 1", 1, 7, "unexpected character '&'", ("AND", "OR")),
    ("a NOT = 1", 1, 7, "unexpected '='", ("IN", "BETWEEN", "LIKE")),
    ("a LIKE 5", 1, 8, "unexpected '5'", ("string",)),
    # empty IN list
    ("a IN ()", 1, 7, "empty IN list", ("literal",)),
    ("a NOT IN (  )", 1, 13, "empty IN list", ("literal",)),
    # NaN and infinities
    ("a = NaN", 1, 5, "NaN and infinite literals are not allowed", ("literal",)),
    ("a = inf", 1, 5, "NaN and infinite literals are not allowed", ("literal",)),
    ("a IN (1, -Infinity)", 1, 10, "NaN and infinite literals are not allowed", ("literal",)),
    ("a = 1e999", 1, 5, "infinite", ("finite number",)),
    ("a BETWEEN 0 AND -1.5e400", 1, 17, "infinite", ("finite number",)),
    # integers beyond float64's exact range
    ("a = 9007199254740993", 1, 5, "2**53", ("integer of magnitude at most 2**53",)),
    ("a = -9007199254740993", 1, 5, "not exactly representable as a float64",
     ("integer of magnitude at most 2**53",)),
    ("a IN (1, " + "9" * 5000 + ")", 1, 10, "2**53", ("integer of magnitude at most 2**53",)),
    ("a = " + "0" * 5000 + "9007199254740993", 1, 5, "2**53", ("integer of magnitude at most 2**53",)),
    ("a = -" + "0" * 5000 + "1" + "0" * 5000, 1, 5, "2**53", ("integer of magnitude at most 2**53",)),
    ("a = 1" + "0" * 309 + ".0", 1, 5, "infinite", ("finite number",)),
    ("a = 0." + "0" * 5000 + "1e5400", 1, 5, "infinite", ("finite number",)),
    ("a = 1e" + "9" * 5000, 1, 5, "infinite", ("finite number",)),
    ("a = -1.8e308", 1, 5, "infinite", ("finite number",)),
    # text that is not valid Unicode: the column is the lone surrogate's
    ("s = 'x\ud800'", 1, 7, "string is not valid Unicode: it holds the lone surrogate '\\ud800'",
     ("valid Unicode text",)),
    ("s IN ('ok', '\udfff')", 1, 14, "lone surrogate '\\udfff'", ("valid Unicode text",)),
    ("s LIKE '%\udc00%'", 1, 10, "string is not valid Unicode", ("valid Unicode text",)),
    ("s MATCHES '\ud83d\ude00'", 1, 12, "lone surrogate '\\ud83d'", ("valid Unicode text",)),
    ("s BETWEEN 'a' AND 'it''s \ud800'", 1, 26, "string is not valid Unicode", ("valid Unicode text",)),
    ('"na\udc80me" = 1', 1, 4, "quoted attribute name is not valid Unicode", ("valid Unicode text",)),
    ("a = 1\nOR \"x y\" = 'two words \ud800'", 2, 23, "string is not valid Unicode", ("valid Unicode text",)),
    ("a = 1 AND \ud800 = 1", 1, 11, "unexpected character '\\ud800'", ("attribute",)),
    # invalid RE2 patterns
    ("s MATCHES '('", 1, 11, "invalid RE2 pattern", ("valid RE2 pattern",)),
    ("a = 1 AND s MATCHES '(a)\\1'", 1, 21, "invalid RE2 pattern", ("valid RE2 pattern",)),
    ("s MATCHES '(?=x)' OR b = 1", 1, 11, "invalid RE2 pattern", ("valid RE2 pattern",)),
    # empty and whitespace-only text
    ("", 1, 1, "empty expression", ("attribute", "'('", "NOT")),
    ("   ", 1, 4, "empty expression", ("attribute",)),
    ("\n\n", 3, 1, "empty expression", ("attribute",)),
    # lexical errors
    ("a = 'open", 1, 5, "unterminated string literal", ("literal",)),
    ('"open = 1', 1, 1, "unterminated quoted attribute name", ("attribute",)),
    ('"" = 1', 1, 1, "empty attribute name", ("attribute",)),
    ("a = 1 $", 1, 7, "unexpected character '$'", ("end of input",)),
    ("é = 1", 1, 1, "unexpected character 'é'", ("attribute",)),
    ("a = 1 AND and = 2", 1, 11, "unexpected 'and'", ("attribute",)),
    ("a = 1 b = 2", 1, 7, "unexpected 'b'", ("AND", "OR", "XOR", "XNOR", "')'", "end of input")),
    ("a = 1.2.3", 1, 8, "unexpected '.3'", ("AND",)),
])
def test_malformed_expressions(text, line, column, message, expected):
    error = error_of(text)
    assert (error.line, error.column) == (line, column), str(error)
    assert message in str(error)
    assert set(expected) <= set(error.expected), error.expected
    assert error.text == text
    assert f"line {line}, column {column}" in str(error)


def test_first_error_in_the_text_wins():
    # A syntax error is reported before a bad literal or character later on.
    assert error_of("a === 1 AND b = 1e999 $").column == 3
    assert error_of("a = 1e999 AND b ~ 1").column == 5


def test_expected_lists_every_alternative_once():
    assert error_of("a").expected == ("comparison operator", "NOT", "IN", "BETWEEN", "LIKE", "MATCHES", "IS", "ONE",
                                      "NONE", "ALL")
    assert error_of("5").expected == ("NOT", "IN")
    assert error_of("a = 1 (").expected == ("')'", "AND", "OR", "XOR", "XNOR", "end of input")


def test_invalid_regex_is_not_logged(capfd):
    error_of("s MATCHES '['")
    assert capfd.readouterr() == ("", "")


@pytest.mark.parametrize("value", [None, b"a = 1", 5, ["a = 1"], P("a", Op.EQ, 1)])
def test_non_str_input_is_a_type_error(value):
    with pytest.raises(TypeError, match="must be a str"):
        parse(value)


def test_positions_on_later_lines():
    text = "a = 1\nAND b IN (1, 2)\n  AND c ~ 3"
    error = error_of(text)
    assert (error.line, error.column) == (3, 9)
    assert "unknown operator '~'" in str(error)
    error = error_of("a = 'two\nlines' AND\n\n   b =\n")
    assert (error.line, error.column) == (5, 1)
    assert error.expected == ("literal",)
    error = error_of("a = 1 AND\r\n  b IS NOT NULL AND (\r\n c = 1 OR )")
    assert (error.line, error.column) == (3, 11)
    assert "unexpected ')'" in str(error)


# ---------------------------------------------------------------- printing

@pytest.mark.parametrize("node, text", [
    (And((Or((A, B)), C)), "(a = 1 OR b = 1) AND c = 1"),
    (Or((And((A, B)), C)), "a = 1 AND b = 1 OR c = 1"),
    (Xor(Xor(A, B), C), "a = 1 XOR b = 1 XOR c = 1"),
    (Xor(A, Xnor(B, C)), "a = 1 XOR (b = 1 XNOR c = 1)"),
    (Or((Xor(A, B), C)), "a = 1 XOR b = 1 OR c = 1"),
    (Xor(Or((A, B)), C), "(a = 1 OR b = 1) XOR c = 1"),
    (Xnor(And((A, B)), Not(C)), "a = 1 AND b = 1 XNOR NOT c = 1"),
    (Not(And((A, B))), "NOT (a = 1 AND b = 1)"),
    (Not(Not(A)), "NOT NOT a = 1"),
    (And((Not(A), Xor(B, C))), "NOT a = 1 AND (b = 1 XOR c = 1)"),
    (P("a", Op.NE, 2.5), "a != 2.5"),
    (P("a", Op.EQ, 1e20), "a = 1e+20"),
    (P("a", Op.LT, -0.5), "a < -0.5"),
    (P("a", Op.GE, True), "a >= TRUE"),
    (P("a", Op.IN, 1, "x", False), "a IN (1, 'x', FALSE)"),
    (P("a", Op.NOT_BETWEEN, -1, 1), "a NOT BETWEEN -1 AND 1"),
    (P("a", Op.NOT_LIKE, "it's"), "a NOT LIKE 'it''s'"),
    (P("a", Op.IS_NOT_NULL), "a IS NOT NULL"),
    (P("and", Op.IS_NULL), '"and" IS NULL'),
    (P("True", Op.IS_NULL), '"True" IS NULL'),
    (P("a b", Op.EQ, 1), '"a b" = 1'),
    (P('x"y', Op.EQ, 1), '"x""y" = 1'),
    (P("9lives", Op.EQ, 1), '"9lives" = 1'),
    (P("s", Op.NOT_MATCHES, "^a"), "s NOT MATCHES '^a'"),
])
def test_to_text(node, text):
    assert to_text(node) == text


def test_not_matches_has_its_own_syntax_and_round_trips():
    node = And((P("s", Op.NOT_MATCHES, "^a"), B))
    assert parse(to_text(node)) == node
    assert to_nnf(parse("NOT s MATCHES '^a' AND b = 1")) == to_nnf(node) == node
    assert parse("s not   matches '^a'") == P("s", Op.NOT_MATCHES, "^a")
    with pytest.raises(ParseError, match="invalid RE2 pattern"):
        parse("s NOT MATCHES '('")


def test_the_text_takes_the_columnar_forms_operator_spellings():
    # every operator name of the columnar form (engine.columnar.OP_NAMES) is text syntax too
    from engine.columnar import OP_NAMES
    operand = {"in": " (1, 2)", "not in": " (1, 2)", "between": " 1 AND 2", "not between": " 1 AND 2",
               "like": " 'x%'", "not like": " 'x%'", "matches": " 'x'", "not matches": " 'x'", "is null": "",
               "is not null": "", "one of": " (1, 2)", "none of": " (1, 2)", "all of": " (1, 2)", "is empty": "",
               "is not empty": ""}
    # the list forms the text writes otherwise: `NOT a ALL OF (...)`, `1 IN a`, `1 NOT IN a`
    written = {"not all of": ("NOT a all of (1, 2)", Op.NOT_ALL_OF), "contains": ("1 in a", Op.CONTAINS),
               "not contains": ("1 not in a", Op.NOT_CONTAINS)}
    for name, (text, op) in written.items():
        assert OP_NAMES[name] is op
        assert to_nnf(parse(text)).op is op
    for name, op in OP_NAMES.items():
        if name in written:
            continue
        assert parse(f"a {name}{operand.get(name, ' 1')}").op is op, name
        assert parse(f"a {name.upper()}{operand.get(name, ' 1')}").op is op, name


@pytest.mark.parametrize("node, error", [
    (P("a", Op.EQ, math.nan), ValueError),
    (P("a", Op.EQ, -math.inf), ValueError),
    (P("a", Op.IN), ValueError),
    (P("", Op.EQ, 1), ValueError),
    (P("a", Op.EQ, None), TypeError),
    (And((A,)), ValueError),
    ("a = 1", TypeError),
])
def test_to_text_refuses_what_has_no_text(node, error):
    with pytest.raises(error):
        to_text(node)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expressions())
def test_round_trip(node):
    text = to_text(node)
    assert parse(text) == node
    assert to_text(parse(text)) == text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expressions(with_not_matches=True))
def test_round_trip_with_not_matches_up_to_nnf(node):
    assert to_nnf(parse(to_text(node))) == to_nnf(node)


def _paren_pairs(text):
    stack, pairs = [], []
    for i, char in enumerate(text):
        if char == "(":
            stack.append(i)
        elif char == ")":
            pairs.append((stack.pop(), i))
    return pairs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expressions())
def test_printed_parentheses_are_all_needed(node):
    # The strategies' literals and names contain no parentheses.
    text = to_text(node)
    for opening, closing in _paren_pairs(text):
        without = text[:opening] + " " + text[opening + 1:closing] + " " + text[closing + 1:]
        try:
            assert parse(without) != node, without
        except ParseError:
            pass


attribute_names = st.text(min_size=1, max_size=12)
literals = st.one_of(
    st.booleans(),
    st.integers(-2 ** 53, 2 ** 53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)


@settings(max_examples=400, deadline=None)
@given(attribute_names, st.sampled_from([Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE]), literals)
def test_any_name_and_literal_round_trips_exactly(attr, op, value):
    parsed = parse(to_text(P(attr, op, value)))
    assert parsed.attr == attr and parsed.op is op
    (back,) = parsed.values
    assert type(back) is type(value)
    assert repr(back) == repr(value)   # floats bit for bit, including -0.0


@settings(max_examples=200, deadline=None)
@given(attribute_names, st.lists(literals, min_size=1, max_size=5), st.text(max_size=10))
def test_lists_and_patterns_round_trip(attr, values, pattern):
    in_list = P(attr, Op.NOT_IN, *values)
    like = P(attr, Op.LIKE, pattern)
    assert parse(to_text(Or((in_list, like)))) == Or((in_list, like))


# ---------------------------------------------------------------- batches

def test_parse_many():
    texts = ["a = 1", "b = 1 OR c = 1", "a = 1"]
    nodes = parse_many(texts)
    assert nodes == [parse(text) for text in texts]
    assert nodes[0] is nodes[2]
    assert parse_many(iter(["a = 1"])) == [A]


def test_parse_many_restores_the_garbage_collector():
    assert gc.isenabled()
    parse_many(["a = 1"])
    assert gc.isenabled()
    with pytest.raises(ParseError):
        parse_many(["a ="])
    assert gc.isenabled()
    gc.disable()
    try:
        parse_many(["a = 1"])
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_parse_many_says_which_text_failed():
    with pytest.raises(ParseError) as info:
        parse_many(["a = 1", "b = 1", "c =="])
    assert "in expression 2 of the batch" in info.value.__notes__
    with pytest.raises(ExpressionTooLarge) as info:
        parse_many(["a = 1", "NOT " * (MAX_NESTING + 1) + "b = 1"])
    assert "in expression 1 of the batch" in info.value.__notes__
    with pytest.raises(TypeError, match="expression 1"):
        parse_many(["a = 1", None])


# ---------------------------------------------------------------- robustness

def _lark_reference(text):
    """Lark's own runtime (contextual lexer, its parser loop) over the same
    grammar and transformer: None where it rejects the text."""
    try:
        return _LARK.parse(text)
    except (lark.exceptions.LarkError, _BadToken):
        return None


_FRAGMENTS = [
    "a", "b1", "x.y", '"q t"', '""', '"and"', '"', "AND", "and", "Or", "XOR", "xnor", "NOT", "not",
    "IN", "in", "BETWEEN", "LIKE", "MATCHES", "IS", "NULL", "TRUE", "false", "(", ")", ",",
    "=", "!=", "<>", "<", "<=", ">", ">=", "==", "~", "!", "-", ".", "1", "-2", "3.5", ".5", "5.", "1e3",
    "1e999", "9007199254740993", "NaN", "inf", "'s'", "'it''s'", "'x y'", "'('", "'", "''", "$", "é",
]


def _any_case(word):
    return st.lists(st.booleans(), min_size=len(word), max_size=len(word)).map(
        lambda upper: "".join(c.upper() if u else c.lower() for c, u in zip(word, upper)))


_attr_texts = st.sampled_from(["a", "b.c", "_d9", '"e f"', '"and"', '"q""q"'])
_literal_texts = st.sampled_from(["1", "-2", "+0.5", ".5", "5.", "1e3", "-2.5E-2", "'x'", "''", "'it''s'", "'a b'",
                                  "TRUE", "false"])
_pattern_texts = st.sampled_from(["'a%'", "'_'", "'^a|b$'", "'x y'"])
_predicate_texts = st.one_of(
    st.tuples(_attr_texts, st.sampled_from(["=", "==", "!=", "<>", "<", "<=", ">", ">="]), _literal_texts),
    st.tuples(_attr_texts, _any_case("NOT IN") | _any_case("IN"),
              st.lists(_literal_texts, min_size=1, max_size=3).map(lambda vs: "(" + ", ".join(vs) + ")")),
    st.tuples(_attr_texts, _any_case("BETWEEN") | _any_case("NOT BETWEEN"), _literal_texts, _any_case("AND"),
              _literal_texts),
    st.tuples(_attr_texts, _any_case("LIKE") | _any_case("NOT LIKE") | _any_case("MATCHES") | _any_case("NOT MATCHES"),
              _pattern_texts),
    st.tuples(_attr_texts, _any_case("IS NULL") | _any_case("IS NOT NULL")),
).map(" ".join)
#: well-formed expressions in every spelling, and with one character
#: deleted or one fragment inserted: errors at every position
expression_texts = st.recursive(_predicate_texts, lambda children: st.one_of(
    st.tuples(children, st.sampled_from(["AND", "or", "XOR", "xnor"]), children).map(" ".join),
    children.map(lambda text: f"({text})"),
    st.tuples(_any_case("NOT"), children).map(" ".join),
), max_leaves=6)
mutated_expression_texts = st.builds(
    lambda text, at, fragment, delete: text[:at] + fragment + text[at + delete:],
    expression_texts, st.integers(0, 80), st.sampled_from(_FRAGMENTS + [""]), st.integers(0, 1))

grammarish_text = st.lists(
    st.tuples(st.sampled_from(_FRAGMENTS), st.sampled_from(["", " ", "  ", "\n", "\t"])),
    max_size=25,
).map(lambda parts: "".join(fragment + gap for fragment, gap in parts))


@settings(max_examples=600, deadline=1000)
@given(st.one_of(grammarish_text, mutated_expression_texts, st.text(max_size=60)))
def test_any_text_parses_or_raises_parse_error(text):
    try:
        node = parse(text)
    except ParseError as error:
        assert 1 <= error.line <= text.count("\n") + 1
        assert 1 <= error.column <= len(text.split("\n")[error.line - 1]) + 1
        assert error.expected
    else:
        assert parse(to_text(node)) == node


#: AND chains of predicates, what `parse` reads straight off the tokens
#: (engine.parse._conjunction_terms), whole and mutated
conjunction_texts = st.lists(_predicate_texts, min_size=1, max_size=8).flatmap(
    lambda preds: st.lists(_any_case("AND"), min_size=len(preds) - 1, max_size=len(preds) - 1).map(
        lambda ands: " ".join(p + (f" {a}" if k < len(ands) else "") for k, (p, a) in
                              enumerate(zip(preds, ands + [""])))))
mutated_conjunction_texts = st.builds(
    lambda text, at, fragment, delete: text[:at] + fragment + text[at + delete:],
    conjunction_texts, st.integers(0, 80), st.sampled_from(_FRAGMENTS + [""]), st.integers(0, 1))


@settings(max_examples=600, deadline=1000)
@given(st.one_of(grammarish_text, expression_texts, mutated_expression_texts, conjunction_texts,
                 mutated_conjunction_texts))
def test_same_results_as_lark_own_runtime(text):
    try:
        node = parse(text)
    except ParseError:
        node = None
    assert node == _lark_reference(text)


@settings(max_examples=400, deadline=1000)
@given(st.one_of(conjunction_texts, mutated_conjunction_texts))
def test_the_conjunction_shortcut_gives_the_tables_answer_and_errors(text):
    import engine.parse as module

    def outcome(fn):
        try:
            node = fn(text)
        except ParseError as error:
            return ("error", str(error), error.line, error.column, error.expected)
        return ("node", node, tuple(type(v) for p in predicates(node) for v in p.values))

    fast = outcome(parse)
    saved = module._conjunction_terms
    module._conjunction_terms = lambda tokens: None     # the table-driven parser alone
    try:
        tables = outcome(parse)
    finally:
        module._conjunction_terms = saved
    assert fast == tables       # the same node, literal types included (1, 1.0 and TRUE are equal in Python)


@pytest.mark.parametrize("text", [
    " " * 200_000,
    "a = 1 AND" + " " * 200_000,
    "a = '" + "x" * 200_000,
    "'" * 100_001,
    '"' * 100_001 + " = 1",
    "a IN (" + "1, " * 50_000,
    "(" * 100_000,
    "$" * 100_000,
    "a = " + "9" * 100_000,
])
def test_pathological_inputs_finish_quickly(text):
    start = time.perf_counter()
    with pytest.raises(ParseError):
        parse(text)
    assert time.perf_counter() - start < 20


def test_error_positions_match_the_text():
    # The column points at the offending token itself.
    for text, token in [("a = 1 AND b ~ 2", "~"), ("x IN (1, 2", ""), ("p = 1 OR q = 'open", "'open"),
                        ("a = 1\n  OR NOT\n   )", ")")]:
        error = error_of(text)
        line = text.split("\n")[error.line - 1]
        assert line[error.column - 1:].startswith(token) if token else error.column == len(line) + 1


def test_keyword_spellings_are_ascii_only():
    # re's IGNORECASE would take U+017F for "s" and U+212A for "k".
    for text in ["a \u0131s NULL", "a I\u017f NULL", "a = 1 \u212aND b = 1", "a LI\u212aE 'x'"]:
        with pytest.raises(ParseError):
            parse(text)
        assert _lark_reference(text) is None


@settings(max_examples=600, deadline=None)
@given(st.one_of(grammarish_text, mutated_expression_texts, st.text(max_size=40)))
def test_splitting_at_whitespace_finds_the_same_tokens(text):
    # `parse` tokenizes each whitespace-separated piece on its own unless a
    # piece holds a bad token; that must give the tokens of the whole text.
    pieces = [_piece_tokens(piece) for piece in text.split()]
    if None not in pieces:
        from_pieces = [token for piece in pieces for token in piece] + [_END]
        assert [(kind, type(value), value) for kind, value in from_pieces] == \
            [(kind, type(value), value) for kind, value in _text_tokens(text)]


def test_token_memo_does_not_change_results():
    text = "a = 1 AND s = 'x' AND s IN ('x', 'y z')"
    first = parse(text)
    assert parse(text) == first == _lark_reference(text)
    assert re.sub(r"\s+", " ", to_text(first)) == "a = 1 AND s = 'x' AND s IN ('x', 'y z')"


def test_the_parsers_predicate_constructor_makes_the_dataclasss_object():
    from dataclasses import fields

    from engine.parse import _new_pred
    for attr, op, values in [("a", Op.EQ, (1,)), ("s", Op.IN, ("x", "y")), ("n", Op.IS_NULL, ()),
                             ("b", Op.BETWEEN, (True, False))]:
        made, reference = _new_pred(attr, op, values), Pred(attr, op, values)
        assert type(made) is Pred and made == reference and hash(made) == hash(reference)
        assert [getattr(made, f.name) for f in fields(Pred)] == [getattr(reference, f.name) for f in fields(Pred)]
        with pytest.raises(AttributeError):        # still frozen
            made.attr = "z"
