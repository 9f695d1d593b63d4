"""Untrusted text (a plugin's name, an error it sent) cannot drive a terminal or forge log lines:
every control character is shown as an escape, in both log formats and in `escape_control`."""

import json
import logging

import pytest

from nodeagent.log import StructuredFormatter, escape_control, get_logger

HOSTILE = "evil\x1b[2J\rname\x07\x7f\x9b31m\nforged=1\u202etxt"
UNSAFE = ["\x1b", "\r", "\n", "\x07", "\x7f", "\x9b", "\u202e"]


def _safe(text: str) -> bool:
    return not any(c in text for c in UNSAFE)


def test_escape_control_shows_every_control_character() -> None:
    assert escape_control(HOSTILE) == ("evil\\x1b[2J\\rname\\x07\\x7f\\x9b31m\\nforged=1\\u202etxt")
    assert escape_control("plain name, ünïcode ok") == "plain name, ünïcode ok"
    assert escape_control("a\x00b\tc\u2028d") == "a\\x00b\\tc\\u2028d"


def test_escape_control_can_keep_layout_newlines() -> None:
    assert escape_control("row\x1b1\nrow\r2\n", keep="\n") == "row\\x1b1\nrow\\r2\n"


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("prefix", [True, False])
def test_log_lines_escape_message_and_every_field(
    caplog: pytest.LogCaptureFixture, fmt: str, prefix: bool
) -> None:
    caplog.set_level(logging.INFO)
    get_logger("nodeagent.test").warning(
        f"plugin {HOSTILE} rejected", plugin=HOSTILE, error=f"bad: {HOSTILE}", bare="x\x1by"
    )
    (record,) = caplog.records
    line = StructuredFormatter(fmt, priority_prefix=prefix).format(record)  # type: ignore[arg-type]
    assert _safe(line), repr(line)
    assert line.count("\n") == 0
    if fmt == "json":
        doc = json.loads(line.removeprefix("<4>"))
        assert doc["plugin"] == HOSTILE  # nothing lost: a JSON reader gets the text back
        assert doc["msg"] == f"plugin {HOSTILE} rejected"
    else:
        assert "bare=x\\x1by" in line  # a bare value, escaped
        assert "\\u001b[2J" in line and "\\u009b31m" in line  # quoted values, JSON-escaped


def test_escaped_text_log_line_keeps_its_fields_parseable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    get_logger("nodeagent.test").info("registered", name="a\rb", type="ReporterPlugin")
    (record,) = caplog.records
    line = StructuredFormatter("text", priority_prefix=False).format(record)
    assert line.endswith("name=a\\rb type=ReporterPlugin")


def test_status_table_escapes_what_plugins_sent() -> None:
    from nodeagent.service import cli_view

    doc = {"ready": True, "components": [{"name": "plugins", "ready": True, "reason": HOSTILE}]}
    plugins = [
        {"name": HOSTILE, "type": "ReporterPlugin", "state": "registered", "last_error": HOSTILE}
    ]
    text = cli_view.render(doc, plugins)
    assert _safe(text.replace("\n", "")), repr(text)
    row = next(line for line in text.splitlines() if line.startswith("evil"))
    assert row.startswith("evil\\x1b[2J name\\x07\\x7f\\x9b31m forged=1\\u202etxt  ReporterPlugin")
