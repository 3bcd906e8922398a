"""The demo agent's script, pure: what a prompt asks for, the text helpers, the command line.

Plain synchronous tests; ``test_demo_agent.py`` plays the same scripts over the wire.
"""

from __future__ import annotations

import os

import pytest

from acp_bridge.demo.script import (
    MAX_COUNT,
    MAX_PIECES,
    Count,
    DemoOptions,
    Echo,
    Fail,
    ReadFile,
    ShowEnv,
    WriteFile,
    count_pieces,
    env_line,
    file_pieces,
    parse_demo_args,
    parse_script,
    resolve_path,
    split_words,
)

CWD = os.path.abspath(os.sep + "work-demo")


@pytest.mark.parametrize(
    ("text", "script"),
    [
        ("hello", Echo()),
        ("please fail now", Fail()),
        ("failure is not a keyword", Echo()),
        ("write notes.txt hello world", WriteFile("notes.txt", "hello world")),
        ("/write a.txt\nline 1\nline 2", WriteFile("a.txt", "line 1\nline 2")),
        ("WRITE b.txt", WriteFile("b.txt", "")),
        ("read notes.txt", ReadFile("notes.txt")),
        ("already done", Echo()),
        ("count 3", Count(3)),
        ("count 99999999999", Count(MAX_COUNT)),
        ("go slow", Count(50)),
        ("fail to write x.txt", Fail()),
        ("write x.txt then read y.txt", WriteFile("x.txt", "then read y.txt")),
        ("env SSH_CONNECTION", ShowEnv("SSH_CONNECTION")),
        ("count 2 env HOME", Count(2)),
        ("environment HOME", Echo()),
    ],
)
def test_parse_script_picks_the_first_keyword_in_precedence_order(text, script):
    """Keywords are whole words, case-insensitive: fail > write > read > count > slow."""
    assert parse_script(text) == script


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("notes.txt", os.path.join(CWD, "notes.txt")),
        ("sub/../b.txt", os.path.join(CWD, "b.txt")),
        ("../escape.txt", None),
        (os.path.abspath(os.sep + "etc"), None),
        (".", None),
    ],
)
def test_resolve_path_stays_under_the_session_cwd(name, expected):
    """Relative names resolve under cwd; anything that lands outside it is refused."""
    assert resolve_path(CWD, name) == expected


@pytest.mark.parametrize("text", ["", "one", "You said:  two  spaces ", " lead", "a\nb\n"])
def test_split_words_round_trips(text):
    """Joining the pieces gives the text back."""
    assert "".join(split_words(text)) == text


def test_split_words_is_bounded():
    """A long text is at most MAX_PIECES pieces, the tail as one piece."""
    text = "w " * (MAX_PIECES * 3)
    pieces = split_words(text)
    assert len(pieces) == MAX_PIECES
    assert "".join(pieces) == text


def test_count_pieces():
    """Numbered chunks read "1 2 3" when joined."""
    assert count_pieces(3) == ["1 ", "2 ", "3"]
    assert count_pieces(0) == []


def test_parse_demo_args():
    """The CLI options map onto DemoOptions; the defaults stream at a human pace."""
    assert parse_demo_args([]) == DemoOptions()
    assert DemoOptions().chunk_delay == 0.02
    options = parse_demo_args(
        ["--chunk-delay", "0", "--name", "x", "--session-prefix", "p-", "--no-load"]
    )
    assert options == DemoOptions(chunk_delay=0, name="x", session_prefix="p-", load_session=False)


def test_env_line_shows_a_variable_but_hides_secret_looking_ones():
    environ = {"SSH_CONNECTION": "127.0.0.1 5 127.0.0.1 22", "API_KEY": "sk-1", "E": ""}
    assert env_line("SSH_CONNECTION", environ) == "SSH_CONNECTION=127.0.0.1 5 127.0.0.1 22"
    assert env_line("API_KEY", environ) == "API_KEY=***"
    assert env_line("E", environ) == "E="
    assert env_line("MISSING", environ) == "MISSING is not set"


def test_file_pieces_name_the_file_then_stream_its_lines_bounded():
    """A file comes back as "NAME:" then its lines; a long one in at most MAX_PIECES lines,
    the tail as one piece, nothing lost."""
    assert file_pieces("a.txt", "one\ntwo") == ["a.txt:\n", "one\n", "two"]
    assert file_pieces("e.txt", "") == ["e.txt:\n"]
    content = "line\n" * (MAX_PIECES * 3)
    pieces = file_pieces("big.txt", content)
    assert len(pieces) == MAX_PIECES + 1
    assert "".join(pieces) == "big.txt:\n" + content
