import json
import logging

import pytest

from nodeagent.log import StructuredFormatter, get_logger


def _record(caplog: pytest.LogCaptureFixture) -> logging.LogRecord:
    assert len(caplog.records) == 1
    return caplog.records[0]


def test_text_format_has_priority_prefix_and_fields(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    get_logger("nodeagent.test").warning("watch failed", resource="configmaps", error="boom now")
    line = StructuredFormatter("text").format(_record(caplog))
    assert line.startswith("<4>")
    assert " warning nodeagent.test " in line
    assert line.endswith('resource=configmaps error="boom now"')


def test_json_format_is_one_object(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    get_logger("nodeagent.test").info("hello", n=3)
    line = StructuredFormatter("json", priority_prefix=False).format(_record(caplog))
    doc = json.loads(line)
    assert doc["msg"] == "hello" and doc["n"] == 3 and doc["level"] == "info"


def test_tracebacks_stay_on_one_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    try:
        raise ValueError("bad")
    except ValueError:
        get_logger("nodeagent.test").exception("failed")
    line = StructuredFormatter("text").format(_record(caplog))
    assert line.startswith("<3>") and "\n" not in line and "ValueError" in line
