"""structlog setup: JSON lines or console text, on stderr or a file, never on stdout."""

from __future__ import annotations

import datetime
import io
import json
import sys

import pytest

from acp_bridge.observe.log import configure_logging, get_logger, reset_logging
from acp_bridge.observe.redact import Redactor


@pytest.fixture(autouse=True)
def _reset_structlog():
    """Every test starts and ends with structlog's defaults, so other tests are unaffected."""
    reset_logging()
    yield
    reset_logging()


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_json_event_is_one_line_with_event_level_timestamp_and_logger(capsys):
    """A JSON event is one line with event, level, a UTC ISO timestamp and the bound logger."""
    out = io.StringIO()
    configure_logging(fmt="json", stream=out)
    get_logger("acp_bridge.test").info("agent_spawned", agent="demo", pid=42)

    [line] = lines(out)
    event = json.loads(line)
    assert event["event"] == "agent_spawned"
    assert event["level"] == "info"
    assert event["logger"] == "acp_bridge.test"
    assert (event["agent"], event["pid"]) == ("demo", 42)
    stamp = datetime.datetime.fromisoformat(event["timestamp"])
    assert stamp.utcoffset() == datetime.timedelta(0)
    assert capsys.readouterr() == ("", "")


def test_default_stream_is_stderr_never_stdout(capsys):
    """Without a stream or file, events go to stderr; stdout stays clean for the protocol."""
    configure_logging(fmt="json")
    get_logger("x").warning("peer_overloaded")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert json.loads(captured.err)["event"] == "peer_overloaded"


def test_stdout_is_refused():
    """Asking to log to stdout is an error rather than a corrupted protocol stream."""
    with pytest.raises(ValueError, match="stdout"):
        configure_logging(stream=sys.stdout)


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        ("debug", ["debug_event", "info_event", "warning_event", "error_event"]),
        ("info", ["info_event", "warning_event", "error_event"]),
        ("WARNING", ["warning_event", "error_event"]),
        ("error", ["error_event"]),
    ],
)
def test_level_filters(level, expected):
    """Events below the configured level are dropped."""
    out = io.StringIO()
    configure_logging(level=level, fmt="json", stream=out)
    log = get_logger("x")
    log.debug("debug_event")
    log.info("info_event")
    log.warning("warning_event")
    log.error("error_event")
    assert [json.loads(line)["event"] for line in lines(out)] == expected


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"level": "verbose"}, "unknown log level"), ({"fmt": "xml"}, "unknown log format")],
)
def test_bad_arguments(kwargs, match):
    """Unknown levels and formats are rejected up front."""
    with pytest.raises(ValueError, match=match):
        configure_logging(stream=io.StringIO(), **kwargs)


def test_auto_is_json_when_not_a_terminal():
    """With fmt auto, a stream that is not a TTY gets JSON lines."""
    out = io.StringIO()
    configure_logging(stream=out)
    get_logger("x").info("hello")
    assert json.loads(out.getvalue())["event"] == "hello"


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_is_console_on_a_terminal():
    """With fmt auto, a terminal gets human-readable console lines."""
    out = FakeTTY()
    configure_logging(stream=out)
    get_logger("x").info("hello", agent="demo")
    [line] = lines(out)
    assert "hello" in line
    assert "demo" in line
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


def test_console_forced_without_colors_on_a_pipe():
    """fmt console on a non-terminal writes plain text, without ANSI escapes."""
    out = io.StringIO()
    configure_logging(fmt="console", stream=out)
    get_logger("x").info("hello")
    [line] = lines(out)
    assert "hello" in line
    assert "\x1b[" not in line


def test_exception_is_structured_in_json():
    """log.exception() renders the traceback as data in the JSON line."""
    out = io.StringIO()
    configure_logging(fmt="json", stream=out)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        get_logger("x").exception("agent_crashed")
    [line] = lines(out)
    event = json.loads(line)
    assert event["event"] == "agent_crashed"
    assert event["exception"][0]["exc_type"] == "RuntimeError"


def test_file_output_appends_and_is_closed_on_reset(tmp_path, capsys):
    """With file, events are appended there (not to stderr or stdout)."""
    path = tmp_path / "bridge.log"
    path.write_text("earlier\n")
    configure_logging(fmt="json", file=str(path))
    get_logger("x").info("first")
    configure_logging(fmt="json", file=str(path))  # reconfiguring closes the first handle
    get_logger("x").info("second")
    reset_logging()
    content = path.read_text().splitlines()
    assert content[0] == "earlier"
    assert [json.loads(line)["event"] for line in content[1:]] == ["first", "second"]
    assert capsys.readouterr() == ("", "")


def test_logger_created_before_configuration_follows_it():
    """A module-level logger made at import time writes where configure_logging says."""
    log = get_logger("early")
    out = io.StringIO()
    configure_logging(fmt="json", stream=out)
    log.bind(session_id="s1").info("bound")
    event = json.loads(out.getvalue())
    assert (event["logger"], event["session_id"]) == ("early", "s1")


def test_the_redactor_given_masks_its_secrets_in_every_event():
    """Secrets the redactor learns (even after configuration) read *** in strings and JSON."""
    redactor = Redactor()
    out = io.StringIO()
    configure_logging(fmt="json", stream=out, redactor=redactor)
    redactor.add("sk-secret-value-42")
    get_logger("x").warning(
        "leak", text="a sk-secret-value-42 b", data={"k": ["sk-secret-value-42"]}
    )
    [line] = lines(out)
    assert json.loads(line)["text"] == "a *** b"
    assert json.loads(line)["data"] == {"k": ["***"]}


def test_without_a_redactor_nothing_is_masked():
    """Logging alone knows no secrets: the bridge's redactor is given by whoever runs it."""
    out = io.StringIO()
    configure_logging(fmt="json", stream=out)
    get_logger("x").warning("plain", text="sk-secret-value-42")
    assert json.loads(lines(out)[0])["text"] == "sk-secret-value-42"
