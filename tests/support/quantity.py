"""`resource.Quantity` in plain Python: parsing, value comparison, canonical form. The reference
implementation the Rust one (`nodeagent._native.quantity_*`, which production calls) is
property-tested against (tests/unit/core/test_quantity.py); it follows
`k8s.io/apimachinery/pkg/api/resource` with exact `Fraction` arithmetic. Parsing rounds the
magnitude up to nano precision, as upstream does. `check_quantity_syntax` applies the grammar
alone (format and suffix, not the value's range).

Deliberate deviations from upstream, shared with the Rust implementation: DecimalSI and
DecimalExponent values of magnitude 2^127 nanos (about 1.7e29) or more are rejected as out of
range (BinarySI values are capped at 2^63-1 as upstream does); exponents must fit an int32
(upstream truncates them silently); DecimalSI values from 1000E (10^21) are spelled with an
exponent (`1e21`), as upstream would store them whole (its own DecimalSI spelling drops the suffix
beyond E, which changes the value: `1000E` is stored as `1`).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from fractions import Fraction

__all__ = [
    "ERR_FORMAT",
    "ERR_RANGE",
    "ERR_SUFFIX",
    "Format",
    "Quantity",
    "QuantityError",
    "canonical",
    "canonicalize",
    "check_quantity_syntax",
    "compare",
    "parse_quantity",
    "value_key",
]

# --- quantities --------------------------------------------------------------------------------

NANO = 10**9
MAX_NANOS = 2**127 - 1
BINARY_CAP = (2**63 - 1) * NANO

ERR_FORMAT = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
ERR_SUFFIX = "unable to parse quantity's suffix"
ERR_RANGE = "quantity out of range (magnitude must stay below 1.7e29)"

_DIGITS = frozenset("0123456789")
_SUFFIX_LETTERS = frozenset("eEinumkKMGTP")
_DEC_SUFFIXES = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_DEC_BY_EXP = {e: s for s, e in _DEC_SUFFIXES.items()}
_BIN_SUFFIXES = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
_INT32 = range(-(2**31), 2**31)


class Format(enum.Enum):
    BINARY_SI = "BinarySI"
    DECIMAL_SI = "DecimalSI"
    DECIMAL_EXPONENT = "DecimalExponent"


class QuantityError(ValueError):
    """A string that is not a valid quantity; the message names the string and the rule."""

    def __init__(self, text: str, rule: str) -> None:
        self.text = text
        self.rule = rule
        super().__init__(f'invalid quantity "{text}": {rule}')


@dataclass(frozen=True, slots=True)
class Quantity:
    nanos: int
    format: Format

    @property
    def value(self) -> Fraction:
        return Fraction(self.nanos, NANO)


def _interpret(text: str, suffix: str) -> tuple[int, int, Format]:
    """(base, exponent, format) of a suffix."""
    if suffix in _DEC_SUFFIXES:
        return 10, _DEC_SUFFIXES[suffix], Format.DECIMAL_SI
    if suffix in _BIN_SUFFIXES[1:]:
        return 2, 10 * _BIN_SUFFIXES.index(suffix), Format.BINARY_SI
    if len(suffix) > 1 and suffix[0] in "eE":
        rest = suffix[1:]
        digits = rest[1:] if rest[0] in "+-" else rest
        if digits and all(c in _DIGITS for c in digits):
            exponent = int(rest)
            if exponent in _INT32:
                return 10, exponent, Format.DECIMAL_EXPONENT
    raise QuantityError(text, ERR_SUFFIX)


def _magnitude_nanos(text: str, digits: str, frac_len: int, base: int, exponent: int) -> int:
    """ceil(|value| * 1e9) for value = int(digits) / 10**frac_len * base**exponent."""
    dec_exp = 9 - frac_len + (exponent if base == 10 else 0)
    # Decide the extremes without building huge integers: int(digits) >= 10**(len-1), and a
    # binary factor is below 10**19.
    if len(digits) - 1 + dec_exp >= 39:
        raise OverflowError
    if dec_exp < 0 and -dec_exp > len(digits) + 20:
        return 1
    value = Fraction(int(digits)) * Fraction(10) ** dec_exp
    if base == 2:
        value *= 2**exponent
    nanos = math.ceil(value)
    if nanos > MAX_NANOS:
        raise OverflowError
    return nanos


# What kube-apiserver trims around a quantity it decodes from JSON (`Quantity.UnmarshalJSON`
# takes Go's `strings.TrimSpace` of the raw text between the quotes): Unicode white space, less
# the control characters JSON escapes (an escaped tab reaches it as backslash and 't').
TRIMMED_SPACE = (
    " \x85\xa0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + ("\u2028\u2029\u202f\u205f\u3000")
)


def _scan(text: str) -> tuple[bool, str, str, tuple[int, int, Format]] | None:
    """(negative, whole digits, fraction digits, interpreted suffix) of a quantity string, or
    None for a zero written without digits after its zeros ("0", "+", "-00"); raises
    QuantityError for a format or suffix error. White space around it is trimmed, as the
    server trims it."""
    text = text.strip(TRIMMED_SPACE)
    if not text:
        raise QuantityError(text, ERR_FORMAT)
    pos, end = 0, len(text)
    negative = text[0] == "-"
    if text[0] in "+-":
        pos = 1
    while pos < end and text[pos] == "0":
        pos += 1
    if pos == end:
        return None
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    whole = text[start:pos]
    fraction = ""
    if pos < end and text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        fraction = text[start:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_LETTERS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos < end:
        raise QuantityError(text, ERR_FORMAT)
    return negative, whole, fraction, _interpret(text, text[suffix_start:])


def check_quantity_syntax(text: str) -> None:
    """Raises QuantityError unless `text` follows the quantity grammar (sign, number, suffix or
    exponent); the value's range is not checked (`parse_quantity` does)."""
    _scan(text)


def parse_quantity(text: str) -> Quantity:
    """Parses like upstream `resource.ParseQuantity`; raises QuantityError."""
    zero = Quantity(0, Format.DECIMAL_SI)
    text = text.strip(TRIMMED_SPACE)
    scanned = _scan(text)
    if scanned is None:
        return zero
    negative, whole, fraction, (base, exponent, fmt) = scanned

    fraction = fraction.rstrip("0")
    digits = (whole + fraction).lstrip("0")
    if not digits:
        return zero
    try:
        nanos = _magnitude_nanos(text, digits, len(fraction), base, exponent)
    except OverflowError:
        if fmt is not Format.BINARY_SI:
            raise QuantityError(text, ERR_RANGE) from None
        nanos = BINARY_CAP
    if fmt is Format.BINARY_SI:
        nanos = min(nanos, BINARY_CAP)
        if nanos < NANO:
            fmt = Format.DECIMAL_SI
    return Quantity(-nanos if negative else nanos, fmt)


def _format(q: Quantity, fmt: Format) -> str:
    if q.nanos == 0:
        return "0"
    if fmt is Format.BINARY_SI and (abs(q.nanos) < 1024 * NANO or q.nanos % NANO):
        fmt = Format.DECIMAL_SI
    sign = "-" if q.nanos < 0 else ""
    magnitude = abs(q.nanos)
    if fmt is Format.BINARY_SI:
        whole, power = magnitude // NANO, 0
        while whole % 1024 == 0:
            whole //= 1024
            power += 1
        return f"{sign}{whole}{_BIN_SUFFIXES[power]}"
    mantissa, exp = magnitude, -9
    while mantissa % 10 == 0:
        mantissa //= 10
        exp += 1
    while exp % 3:
        mantissa *= 10
        exp -= 1
    if fmt is Format.DECIMAL_EXPONENT or exp > 18:
        # Beyond E a suffix would not exist: kube-apiserver drops it and stores another value
        # (1000E is stored as 1), so such a value is spelled with an exponent, stored as sent.
        return f"{sign}{mantissa}" + (f"e{exp}" if exp else "")
    return f"{sign}{mantissa}{_DEC_BY_EXP[exp]}"


def canonical(q: Quantity) -> str:
    """The spelling upstream's `Quantity.String()` gives a freshly computed value."""
    return _format(q, q.format)


def value_key(q: Quantity) -> str:
    """A spelling unique to the value, whatever the format."""
    return _format(q, Format.DECIMAL_SI)


def canonicalize(text: str) -> str:
    return canonical(parse_quantity(text))


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 comparing two quantity strings by value."""
    x, y = parse_quantity(a).nanos, parse_quantity(b).nanos
    return (x > y) - (x < y)
