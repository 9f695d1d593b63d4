"""Quantity parsing and canonical form: upstream examples on the Python reference and the Rust
implementation, and hypothesis equivalence of the two on random strings."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent import _native
from nodeagent.plugins.handler import InvalidMessage
from nodeagent.plugins.inventory_shape import validate_inventory_message
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2
from tests.support.quantity import (
    ERR_FORMAT,
    ERR_RANGE,
    ERR_SUFFIX,
    Format,
    QuantityError,
    canonicalize,
    check_quantity_syntax,
    compare,
    parse_quantity,
    value_key,
)

EXAMPLES = [
    ("1024Mi", "1Gi"),
    ("1000M", "1G"),
    ("1.5Gi", "1536Mi"),
    (".001Ki", "1024m"),
    ("1.5", "1500m"),
    ("1000m", "1"),
    ("1000", "1k"),
    ("1073741824", "1073741824"),
    ("1e3", "1e3"),
    ("0", "0"),
    ("-0", "0"),
    ("0Gi", "0"),
    ("-1.5", "-1500m"),
    ("-1024Mi", "-1Gi"),
    ("-1000", "-1k"),
    ("+5", "5"),
    ("1.5e3", "1500"),
    ("1E", "1E"),
    ("1E3", "1e3"),
    ("100e-3", "100e-3"),
    ("1e-3", "1e-3"),
    ("0.5Ki", "512"),
    ("1.000000000001", "1000000001n"),
    (".000000000001Ki", "2n"),
    ("0.0000000001", "1n"),
    ("-0.0000000001", "-1n"),
    ("8Ei", "9223372036854775807"),
    ("7Ei", "7Ei"),
    ("1000E", "1e21"),  # what kube-apiserver stores whole (it stores "1000E" as "1")
    ("1500E", "1500E"),
    ("999E", "999E"),
    ("12345678901234567890", "12345678901234567890"),
    ("1.", "1"),
    (".", "0"),
    ("-", "0"),
]


@pytest.mark.parametrize(("text", "expected"), EXAMPLES)
def test_canonical_form_python(text: str, expected: str) -> None:
    assert canonicalize(text) == expected


@pytest.mark.parametrize(("text", "expected"), EXAMPLES)
def test_canonical_form_rust(text: str, expected: str) -> None:
    assert _native.quantity_canonical(text) == expected


INVALID = [
    ("", ERR_FORMAT),
    ("abc", ERR_FORMAT),
    ("1.2.3", ERR_FORMAT),
    # White space around a quantity is trimmed (as kube-apiserver trims it), not inside it,
    # nor a tab: JSON escapes it, and the server then reads a backslash.
    ("1 2", ERR_FORMAT),
    ("1\t", ERR_FORMAT),
    ("1Ki5", ERR_SUFFIX),
    ("1Kb", ERR_FORMAT),
    ("1K", ERR_SUFFIX),
    ("1e", ERR_SUFFIX),
    ("1e+", ERR_SUFFIX),
    ("1ee3", ERR_SUFFIX),
    ("1e2147483648", ERR_SUFFIX),
    ("1e40", ERR_RANGE),
    ("200000000000000000000E", ERR_RANGE),
    ("\u0661", ERR_FORMAT),  # an Arabic-Indic digit is not a digit here
]


@pytest.mark.parametrize(("text", "rule"), INVALID)
def test_invalid_quantities_name_the_string_and_rule(text: str, rule: str) -> None:
    with pytest.raises(QuantityError) as exc:
        parse_quantity(text)
    assert exc.value.rule == rule
    assert str(exc.value) == f'invalid quantity "{text}": {rule}'
    with pytest.raises(ValueError, match="invalid quantity") as rexc:
        _native.quantity_parse(text)
    assert str(rexc.value) == str(exc.value)


def test_values_compare_semantically() -> None:
    assert compare("1Gi", "1073741824") == 0
    assert compare("1000m", "1") == 0
    assert compare("1G", "1Gi") == -1
    assert compare("-1", "0") == -1
    assert _native.quantity_cmp("1Gi", "1073741824") == 0
    assert _native.quantity_cmp("2", "1999m") == 1
    assert parse_quantity("1.5Gi").value == Fraction(3 * 2**29)
    assert value_key(parse_quantity("1Gi")) == value_key(parse_quantity("1073741824"))


def test_formats() -> None:
    assert parse_quantity("1Ki").format is Format.BINARY_SI
    assert parse_quantity("1k").format is Format.DECIMAL_SI
    assert parse_quantity("1e3").format is Format.DECIMAL_EXPONENT
    # A binary value below one is shown as DecimalSI, as upstream does.
    assert parse_quantity(".0001Ki").format is Format.DECIMAL_SI
    assert _native.quantity_parse("1Ki") == (1024 * 10**9, "BinarySI")


# Strings that exercise every branch of the grammar, plus arbitrary text.
_piece = st.sampled_from(
    ["", "-", "+", "0", "00", "1", "5", "9", "12", "999", "1024", "123456789", ".", ".5", ".001"]
)
_frac = st.sampled_from(["", ".", ".0", ".5", ".25", ".000000000001", ".1000", ".999999999999"])
_suffix = st.sampled_from(
    [
        *("", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"),
        *("e3", "e-3", "E+6", "e0", "e30", "e-40", "e2147483647", "e99999999999", "K", "Kix", "e"),
    ]
)
_grammar = st.builds(lambda a, b, c, d: a + b + c + d, _piece, _piece, _frac, _suffix)
_text = st.one_of(_grammar, st.text(alphabet="0123456789.+-eEinumkKMGTP x", max_size=12))


def _py(text: str) -> tuple[int, str] | str:
    try:
        q = parse_quantity(text)
    except QuantityError as exc:
        return str(exc)
    return (q.nanos, q.format.value)


def _rs(text: str) -> tuple[int, str] | str:
    try:
        return _native.quantity_parse(text)
    except ValueError as exc:
        return str(exc)


@settings(max_examples=1500, deadline=None)
@given(_text)
def test_rust_parse_and_canonical_equal_python(text: str) -> None:
    assert _rs(text) == _py(text)
    if isinstance(_py(text), tuple):
        canon = canonicalize(text)
        assert _native.quantity_canonical(text) == canon
        # The canonical form keeps the value and is a fixed point.
        assert parse_quantity(canon).nanos == parse_quantity(text).nanos
        assert canonicalize(canon) == canon


@settings(max_examples=500, deadline=None)
@given(_grammar, _grammar)
def test_rust_compare_equals_python(a: str, b: str) -> None:
    if isinstance(_py(a), str) or isinstance(_py(b), str):
        return
    assert _native.quantity_cmp(a, b) == compare(a, b)


def _message_check_accepts(text: str) -> bool:
    inventory = device_pb2.Inventory()
    device = inventory.pools.add(name="pool").devices.add(name="dev")
    device.capacity["memory"].value = text
    try:
        validate_inventory_message(inventory)
    except InvalidMessage:
        return False
    return True


@pytest.mark.parametrize("text", ["+", "-", ".", "-0.", "1e2147483648", "1Kix", "1e40"])
def test_the_plugin_message_check_uses_this_grammar(text: str) -> None:
    """The native message check once had its own regular expression, which rejected zeros
    written as "+" or "." (valid upstream) and let through exponents no parser accepts."""
    try:
        check_quantity_syntax(text)
        valid = True
    except QuantityError:
        valid = False
    assert _message_check_accepts(text) is valid


@settings(max_examples=500, deadline=None)
@given(_text)
def test_the_message_check_rejects_only_what_the_parser_rejects_for_its_grammar(text: str) -> None:
    """What the message check lets through, the publisher parses, or rejects as out of range
    only (for one device, not the whole message)."""
    if _message_check_accepts(text):
        result = _py(text)
        assert isinstance(result, tuple) or result.endswith(ERR_RANGE)
    else:
        assert isinstance(_py(text), str)
