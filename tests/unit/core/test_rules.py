"""Typed constraints: one declaration in the field's type, the same rule whether msgspec decodes
the value or the settings were built in code, and the error names the field and the rule."""

from __future__ import annotations

import math
from typing import Annotated

import msgspec
import pytest

from nodeagent.config.loader import translate_validation_error
from nodeagent.core.errors import ConfigError
from nodeagent.core.rules import NonNegative, check_constraints, constraint_rule, finite


class Table(msgspec.Struct, kw_only=True):
    grace: NonNegative = 1.0
    rate: Annotated[float, finite(ge=0.5)] = 1.0
    plain: float = 1.0


class Config(msgspec.Struct, kw_only=True):
    table: Table = msgspec.field(default_factory=Table)


BAD = [("grace", -1.0), ("grace", math.inf), ("grace", math.nan), ("rate", 0.25)]
RULES = {"grace": "must be a finite number >= 0", "rate": "must be a finite number >= 0.5"}


@pytest.mark.parametrize(("field", "value"), BAD)
def test_decoding_and_building_in_code_refuse_alike(field: str, value: float) -> None:
    raw = {"table": {field: value}}
    with pytest.raises(msgspec.ValidationError) as decoded:
        msgspec.convert(raw, Config)
    error = translate_validation_error(decoded.value, raw, Config)
    assert (error.field, error.rule) == (f"table.{field}", RULES[field])
    assert error.value == value or math.isnan(value)
    with pytest.raises(ConfigError) as built:
        check_constraints(Table(**{field: value}), "table")
    assert (built.value.field, built.value.rule) == (f"table.{field}", RULES[field])


def test_values_within_pass_and_unconstrained_fields_have_no_rule() -> None:
    check_constraints(Table(grace=0.0, rate=0.5, plain=-math.inf), "table")
    msgspec.convert({"table": {"grace": 0, "rate": 1e300}}, Config)
    assert constraint_rule(Table, "plain") is None
    assert constraint_rule(Table, "grace") == RULES["grace"]


def test_a_wrong_type_keeps_msgspecs_message() -> None:
    raw = {"table": {"grace": "soon"}}
    with pytest.raises(msgspec.ValidationError) as decoded:
        msgspec.convert(raw, Config)
    error = translate_validation_error(decoded.value, raw, Config)
    assert (error.field, error.rule) == ("table.grace", "expected float, got str")
