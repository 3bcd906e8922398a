"""The attach shim's session book, without I/O: what it tracks, and how it takes sessions back."""

from __future__ import annotations

from typing import Any

from acp_bridge.attach.sessions import Load, Request, SessionBook, Tracked
from acp_bridge.protocol.jsonrpc import loads


def opened(book: SessionBook, method: str, params: dict[str, Any]) -> Request:
    """An editor request as AttachCore builds it, noted by the book on its way out."""
    sid = params.get("sessionId")
    request = Request(method, sid if isinstance(sid, str) else None)
    book.opening(request, params)
    return request


def ok(result: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "result": {} if result is None else result}


def failed(message: str = "no such session") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "error": {"code": -32002, "message": message}}


def new_session(book: SessionBook, sid: str, **params: Any) -> None:
    book.answered(opened(book, "session/new", {"cwd": "/w", **params}), ok({"sessionId": sid}))


def meta(**fields: Any) -> dict[str, Any]:
    return {"_meta": {"acp_bridge": fields}}


def logs(lines: list[bytes]) -> list[tuple[str, str | None, str]]:
    """(level, sessionId, message) of each ``_acp_bridge/log`` line."""
    out = []
    for line in lines:
        msg = loads(line)
        assert msg["method"] == "_acp_bridge/log"
        params = msg["params"]
        out.append((params["level"], params.get("sessionId"), params["data"]["message"]))
    return out


def test_a_created_session_is_tracked_with_what_it_was_opened_with():
    book = SessionBook(10)
    servers = [{"name": "m", "command": "m", "args": []}]
    new_session(book, "s1", mcpServers=servers, **meta(agent="b"))
    book.answered(opened(book, "session/fork", {"sessionId": "s1"}), ok({"sessionId": "s2"}))
    new = opened(book, "session/new", {"cwd": "/x"})
    book.answered(new, failed())
    book.answered(opened(book, "session/new", {}), ok({"sessionId": 7}))  # not a session id
    assert book.sessions == {
        "s1": Tracked("/w", servers, "b", last_seq=0, confirmed=True),
        "s2": Tracked(None, [], None, last_seq=0, confirmed=True),
    }


def test_a_closed_or_deleted_session_is_forgotten_once_the_bridge_agrees():
    book = SessionBook(10)
    for sid in ("s1", "s2", "s3"):
        new_session(book, sid)
    book.answered(opened(book, "session/close", {"sessionId": "s1"}), ok())
    book.answered(opened(book, "session/delete", {"sessionId": "s2"}), ok())
    book.answered(opened(book, "session/close", {"sessionId": "s3"}), failed())
    assert list(book.sessions) == ["s3"]


def test_past_the_bound_new_sessions_are_not_tracked_but_known_ones_still_are():
    book = SessionBook(1)
    new_session(book, "s1")
    new_session(book, "s2")
    assert list(book.sessions) == ["s1"]
    load = opened(book, "session/load", {"sessionId": "s2", "cwd": "/w"})
    assert not load.provisional  # nothing to undo: it was not tracked
    load = opened(book, "session/load", {"sessionId": "s1", "cwd": "/v", **meta(after_seq=3)})
    assert load.provisional
    assert book.sessions["s1"] == Tracked("/v", [], None, last_seq=3, confirmed=False)


def test_a_load_follows_its_session_provisionally_until_its_answer_confirms_it():
    book = SessionBook(10)
    load = opened(book, "session/load", {"sessionId": "s1", "cwd": "/w", **meta(after_seq=4)})
    assert book.sessions["s1"] == Tracked("/w", [], None, last_seq=4, confirmed=False)
    assert book.take_back([]) == []  # not the editor's until the bridge said yes
    book.answered(load, ok(meta(lastSeq=9)))
    assert book.sessions["s1"] == Tracked("/w", [], None, last_seq=9, confirmed=True)
    assert not load.provisional
    book.undo(load)  # settled: nothing left to undo
    assert "s1" in book.sessions


def test_a_load_or_resume_that_fails_puts_the_previous_tracking_back():
    book = SessionBook(10)
    new_session(book, "s1")
    book.update({"sessionId": "s1", "update": {}, **meta(seq=5)})
    before = book.sessions["s1"]
    resume = opened(book, "session/resume", {"sessionId": "s1", "cwd": "/v"})
    assert book.sessions["s1"] == Tracked("/v", [], None, last_seq=5, confirmed=False)
    book.answered(resume, failed())
    assert book.sessions["s1"] is before
    load = opened(book, "session/load", {"sessionId": "s2", "cwd": "/w"})
    book.undo(load)  # e.g. its connection was lost before the answer
    book.undo(load)
    assert list(book.sessions) == ["s1"]
    assert book.sessions["s1"] is before


def test_sessions_are_taken_back_by_load_after_their_last_seq_or_else_by_resume():
    book = SessionBook(10)
    new_session(book, "s1", mcpServers=[], **meta(agent="b"))
    book.update({"sessionId": "s1", "update": {}, **meta(seq=7)})
    # Resumed by the editor, never seen before, and quiet since: no seq to replay after.
    resume = opened(book, "session/resume", {"sessionId": "s2", "cwd": None})
    book.answered(resume, ok())
    assert book.sessions["s2"].last_seq is None
    out: list[bytes] = []
    assert book.take_back(out) == [
        Load(
            "s1",
            "session/load",
            {
                "sessionId": "s1",
                "mcpServers": [],
                "cwd": "/w",
                **meta(agent="b", after_seq=7, journal_replay=True),
            },
        ),
        Load("s2", "session/resume", {"sessionId": "s2", "mcpServers": []}),
    ]
    ((level, sid, message),) = logs(out)
    assert (level, sid) == ("warning", "s2")
    assert "without replay" in message
    book.update({"sessionId": "s2", "update": {}, **meta(seq=3)})
    (_, again) = book.take_back([])
    assert again.method == "session/load"
    assert again.params["_meta"]["acp_bridge"]["after_seq"] == 3


def test_a_watched_session_is_taken_back_as_a_watcher_with_its_flags():
    """Taken back with ``watch`` (and ``approve``) again, never from its owner; without
    ``journal_replay``, since only a live session is watched. A load without ``watch`` later
    (the editor takes it over) makes it the editor's own."""
    book = SessionBook(10)
    ours = meta(watch=True, approve=True, after_seq=2)
    load = opened(book, "session/load", {"sessionId": "s1", "cwd": "/w", **ours})
    book.answered(load, ok(meta(lastSeq=6, watch=True, owner="ws:1")))
    resume = opened(book, "session/resume", {"sessionId": "s2", **meta(watch=True)})
    book.answered(resume, ok(meta(lastSeq=3, watch=True)))
    book.update({"sessionId": "s1", "update": {}, **meta(seq=7)})
    taken = book.take_back([])
    assert [(t.method, t.params["_meta"]["acp_bridge"]) for t in taken] == [
        ("session/load", {"watch": True, "approve": True, "after_seq": 7}),
        ("session/load", {"watch": True, "after_seq": 3}),
    ]
    over = opened(book, "session/load", {"sessionId": "s1", "cwd": "/w", **meta(after_seq=7)})
    book.answered(over, ok(meta(lastSeq=7)))
    (own, _) = book.take_back([])
    assert own.params["_meta"]["acp_bridge"] == {"after_seq": 7, "journal_replay": True}


def test_the_editors_own_prompts_are_not_echoed_by_a_replay():
    book = SessionBook(10)
    new_session(book, "s1")
    prompt = {"sessionId": "s1", "update": {"sessionUpdate": "user_message_chunk"}}
    chunk = {"sessionId": "s1", "update": {"sessionUpdate": "agent_message_chunk"}, **meta(seq=2)}
    assert book.update(prompt)  # live: another client's prompt, say
    book.opened()
    book.take_back([])
    assert not book.update({**prompt, **meta(seq=1)})
    assert book.sessions["s1"].last_seq == 1  # noted even when not relayed
    assert book.update(chunk)
    assert book.sessions["s1"].last_seq == 2
    assert book.update({**prompt, "sessionId": "s9"})  # not ours to judge
    book.live()
    assert book.update(prompt)
    book.take_back([])
    book.lost()
    assert book.update(prompt)


def test_a_session_the_bridge_will_not_give_back_is_dropped_and_the_editor_told():
    book = SessionBook(10)
    for sid in ("s1", "s2", "s3"):
        new_session(book, sid)
    book.take_back([])
    assert logs(book.taken_back("s1", failed("gone"))) == [
        ("error", "s1", "after reconnecting, this session could not be taken back: gone")
    ]
    assert logs(book.taken_back("s2", ok(meta(lastSeq=8, complete=False)))) == [
        (
            "warning",
            "s2",
            "updates of this session were lost while disconnected (the bridge's history no "
            "longer held them): resync required",
        )
    ]
    assert book.taken_back("s3", ok(meta(lastSeq=4))) == []
    assert list(book.sessions) == ["s2", "s3"]
    assert (book.sessions["s2"].last_seq, book.sessions["s3"].last_seq) == (8, 4)


def test_only_requests_of_a_session_taken_back_move_to_the_new_connection():
    """Load, resume and close are answered by the bridge at once: theirs are lost."""
    book = SessionBook(10)
    new_session(book, "s1")
    new_session(book, "s2")
    prompt = Request("session/prompt", "s1")
    book.opened()
    book.take_back([])
    assert not book.moved(prompt)  # not back yet
    book.taken_back("s1", ok())
    book.taken_back("s2", failed())
    assert book.moved(prompt)
    assert book.moved(Request("session/set_mode", "s1"))
    for method in ("session/load", "session/resume", "session/close"):
        assert not book.moved(Request(method, "s1"))
    assert not book.moved(Request("session/prompt", "s2"))
    assert not book.moved(Request("session/list", None))
    book.opened()  # the next connection takes them back anew
    assert not book.moved(prompt)
