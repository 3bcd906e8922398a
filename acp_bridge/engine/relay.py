"""
The relay's hot path: an agent's stdout read, a whole read scanned at once, and the
``session/update`` lines of known sessions relayed to their clients without a coroutine.

A run of one session's plain updates (found by :mod:`acp_bridge.protocol.scan`) goes as one
slice (:meth:`Relay.relay_run`: one queue entry, one history chunk, one journal note, no
decode); other updates one by one (:meth:`Relay.relay_update`). Every other line is handed to
``FromAgent.line``: updates that must wait for room or be held, notifications, answers, the
agent's own requests. See docs/performance.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import trio

from acp_bridge.engine.watchers import fan_out, offer_notice
from acp_bridge.protocol import scan
from acp_bridge.protocol.framing import LineDecoder, Oversize
from acp_bridge.protocol.jsonrpc import (
    SETUP_UPDATES,
    JsonObject,
    JsonRpcError,
    dumps,
    loads,
    rewrite_run_session_id,
    rewrite_session_id,
)
from acp_bridge.protocol.notices import NOTICE, wants_notices
from acp_bridge.protocol.wire import set_seq, stamp_run
from acp_bridge.runtime import pipes
from acp_bridge.sessions.table import Session, SessionState, track_setup

if TYPE_CHECKING:
    from acp_bridge.engine.from_agent import FromAgent
    from acp_bridge.engine.hub import Hub
    from acp_bridge.engine.links import AgentLink

#: Agents' readers share a budget of lines per scheduler round: each reader with lines to
#: handle lets the other tasks run after its share (``READ_ROUND_LINES`` over the readers
#: busy at that moment, at least ``READER_TURN_MIN``). So one flooding agent relays in long
#: turns (few writes, little scheduling), and fifty of them in short ones: either way, a
#: round of the scheduler, which every hop of another session's round trip waits for, holds
#: about the same work. A run longer than a turn is cut at the turn.
READ_ROUND_LINES: Final = 128
READER_TURN_MIN: Final = 4
#: (module constants: an enum member looked up through its class is a lookup more per update)
_LOADING: Final = SessionState.LOADING
_RUN: Final = scan.RUN
_LINE: Final = scan.LINE


class Relay:
    """
    Each agent's reader, and the relay of its updates.

    Args:
        hub: the shared state.
        from_agent: takes every line the relay does not (:meth:`FromAgent.line`).
    """

    def __init__(self, hub: Hub, from_agent: FromAgent) -> None:
        # The hot path's objects, copied here: one attribute lookup each per update. (The
        # hub's tracer and journal are given at construction and never replaced.)
        self._sessions = hub.sessions
        self._counters = hub.counters
        self._tracer = hub.tracer
        self._journal = hub.journal
        self._config = hub.config
        self._line = from_agent.line
        #: agents' readers handling lines right now (see ``READ_ROUND_LINES``)
        self._busy_readers = 0

    async def reader(
        self, agent: AgentLink, stream: trio.abc.ReceiveStream, eof: trio.Event
    ) -> None:
        """Read one life of an agent's stdout until EOF (then ``eof`` is set)."""
        cap = self._config.bridge.max_line_bytes
        decoder = LineDecoder(max_line_bytes=cap)
        handle = self._line
        relay = self.relay_update
        scan_block = scan.scan
        chunk = pipes.READ_BUFFER_BYTES
        try:
            while data := await stream.receive_some(chunk):
                marker, block = decoder.feed_block(data)
                if marker is not None:
                    await handle(agent, marker)
                if block:
                    self._busy_readers += 1
                    try:
                        turn = self._reader_turn()
                        # The whole read at once: its lines found and the plain updates
                        # among them told apart at C speed; a run of one session's plain
                        # updates is relayed as one slice (docs/performance.md), at most
                        # a turn's worth at a time.
                        for segment in scan_block(block, cap, turn):
                            kind = segment[0]
                            if kind == _RUN:
                                _, start, end, count, sid = segment
                                while count > turn:
                                    # (a run longer than the turn: its first part now, the
                                    # rest after the others had their turn)
                                    cut = _after_lines(block, start, turn)
                                    await self._relay_part(agent, sid, block, start, cut, turn)
                                    await trio.lowlevel.cancel_shielded_checkpoint()
                                    start, count = cut, count - turn
                                    turn = self._reader_turn()
                                await self._relay_part(agent, sid, block, start, end, count)
                                turn -= count
                            else:
                                if kind == _LINE:
                                    line = block[segment[1] : segment[2]]
                                    # (most other lines are updates that need a look)
                                    if not relay(agent, line):
                                        await handle(agent, line)
                                else:
                                    await handle(agent, Oversize(segment[1]))
                                turn -= 1
                            if turn <= 0:
                                # One read can hold hundreds of lines: let the others in
                                # (no line of the read is dropped on cancellation).
                                await trio.lowlevel.cancel_shielded_checkpoint()
                                turn = self._reader_turn()
                    finally:
                        self._busy_readers -= 1
                if decoder.discarding is not None and agent.failure is None:
                    # A line past the cap: stopped now, not when (or if) the line ends.
                    cap = self._config.bridge.max_line_bytes
                    agent.fail(
                        f"it is writing a line over max_line_bytes ({cap}): "
                        f"{decoder.discarding} bytes so far"
                    )
                # (No turn to give here: the next read gives it, as every stream's read
                # yields, even a pipe's with data waiting: an agent that never stops writing
                # never holds the others up.)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            eof.set()
        rest = decoder.feed_eof()
        if rest is not None:
            agent.log.warning("agent_partial_line_at_exit")

    async def _relay_part(
        self, agent: AgentLink, sid: str, block: bytes, start: int, end: int, count: int
    ) -> None:
        """
        Relay a run: as one slice (:meth:`relay_run`), or as much of it as the client's queue
        takes, then its next line the usual way (which waits for room), and so on; each
        line the usual way when a slice cannot do.
        """
        while count:
            done = self.relay_run(agent, sid, block, start, end, count)
            if done < 0:  # (not as a slice: each line the usual way)
                for line in block[start:end].split(b"\n")[:-1]:
                    if not self.relay_update(agent, line):
                        await self._line(agent, line)
                return
            if done == count:
                return
            if done:
                start, count = _after_lines(block, start, done), count - done
            nl = block.index(b"\n", start)
            line = block[start:nl]
            if not self.relay_update(agent, line):
                await self._line(agent, line)  # (waits for room in the client's queue)
            start, count = nl + 1, count - 1

    def _reader_turn(self) -> int:
        """Lines a busy agent reader handles before it lets the others run."""
        return max(READER_TURN_MIN, READ_ROUND_LINES // max(1, self._busy_readers))

    def relay_run(
        self, agent: AgentLink, sid: str, block: bytes, start: int, end: int, count: int
    ) -> int:
        """
        The hot path for a run the scan found: ``count`` plain updates of the agent's session
        ``sid``, the whole lines ``block[start:end]``, relayed as one slice (one queue
        entry, one history extension, one journal note) without decoding them. Returns how
        many were relayed: ``count``; fewer (maybe 0) when the client's queue has room for
        only so many (the first of them were); -1, with nothing done, when the lines need
        more than that (a session id that cannot be rewritten on the bytes, a sub-agent's
        watch, a trace, an unknown session): each line then takes :meth:`relay_update`'s way,
        as if there were no run. A client that asked for ``seq`` gets the run's lines
        stamped (:func:`~acp_bridge.protocol.wire.stamp_run`).
        """
        session = self._sessions.find(agent.name, sid)
        if (
            session is None
            or session.watch is not None
            or session.watchers is not None  # (each watcher gets each line: fan_out)
            or self._tracer is not None
        ):
            return -1
        client = session.client
        if client is not None and not client.closed:
            room = client.room()
            if room < count:
                if room <= 0:
                    return 0
                end = _after_lines(block, start, room)
                count = room
        data = block if start == 0 and end == len(block) else block[start:end]
        if session.rewrite:
            rewritten = rewrite_run_session_id(data, count, session.agent_id, session.bridge_id)
            if rewritten is None:
                return -1
            data = rewritten
        self._counters["from_agent"] += count
        history = session.history
        first = 0  # (the run's first number; 0: not numbered, an agent's own load replay)
        if history is not None and session.state is not _LOADING:
            first = history.extend(data, count) - count + 1
            if self._journal is not None:
                self._journal.updated(session.bridge_id, history)
        if client is not None:
            # A client that asked for the numbers gets them stamped on each line (decoded and
            # encoded: still one queue entry and one history chunk for the run).
            client.put_run(stamp_run(data, first) if client.want_seq else data, count, session)
        return count

    def relay_update(self, agent: AgentLink, line: bytes | Oversize) -> bool:
        """
        The hot path: relay a ``session/update`` of a known session to a client that has room
        (or record it for a detached one) without awaiting. False leaves the line untouched
        for :meth:`line` (anything else, or an update that must wait or be held).
        """
        if type(line) is not bytes or b'"session/update"' not in line:
            return False
        try:
            msg = loads(line)
        except JsonRpcError:
            return False
        if (
            type(msg) is not dict
            or msg.get("method") != "session/update"
            or "id" in msg
            or msg.get("jsonrpc") != "2.0"
        ):
            return False
        params = msg.get("params")
        if type(params) is not dict:
            return False
        sid = params.get("sessionId")
        session = self._sessions.find(agent.name, sid) if type(sid) is str else None
        if session is None:
            return False
        update = params.get("update")
        # (inline, not is_notice(): a call more per update on the hot path)
        if type(update) is dict and update.get("sessionUpdate") == NOTICE:
            self.relay_notice(agent, session, msg, params, line)
            return True
        client = session.client
        if client is not None and not client.closed and not client.has_room():
            return False
        self._counters["from_agent"] += 1
        if self._tracer is not None:
            self._tracer(f"agent:{agent.name}", "in", line)
        data = self.record_update(session, msg, params, line)
        watch = session.watch
        if watch is not None and not watch(params):
            return True  # a sub-agent's, which its client does not see
        if client is not None:
            if client.want_seq:
                data = dumps(msg)
            client.put_update(data, session)
        return True

    def relay_notice(
        self, agent: AgentLink, session: Session, msg: JsonObject, params: JsonObject, line: bytes
    ) -> None:
        """
        An agent's own ``notice``: relayed unchanged (its session id rewritten if need be) to
        the owner and the watchers that take notices and have room, else dropped (ACP: an
        agent must not rely on a notice being seen). Never recorded: a notice is not session
        history.
        """
        self._counters["from_agent"] += 1
        if self._tracer is not None:
            self._tracer(f"agent:{agent.name}", "in", line)
        client = session.client
        if (
            client is None
            or client.closed
            or not wants_notices(client.capabilities)
            or not client.has_room()
            or (session.watch is not None and not session.watch({}))
        ):
            client = None
        watchers = session.watchers
        if client is None and watchers is None:
            return
        if session.rewrite:  # (rare: re-encoded, no byte-level rewrite needed)
            params["sessionId"] = session.bridge_id
            data = dumps(msg)
        else:
            data = line + b"\n"
        if client is not None:
            client.put_update(data, session)
        if watchers is not None:
            offer_notice(session, watchers, data)

    def record_update(
        self, session: Session, msg: JsonObject, params: JsonObject, line: bytes
    ) -> bytes:
        """
        Rewrite the session id if needed, number and record the update (history, journal),
        track setup changes; the bytes to relay (unchanged when no rewrite is needed). With
        ``_meta.acp_bridge.seq`` stamped in ``msg`` for a client that opted in.
        """
        if session.rewrite:
            params["sessionId"] = session.bridge_id
            rewritten = rewrite_session_id(line, session.agent_id, session.bridge_id)
            data = dumps(msg) if rewritten is None else rewritten + b"\n"
        else:
            data = line + b"\n"
        history = session.history
        seq = 0
        if history is not None and session.state is not _LOADING:
            # (An agent's own load replay repeats what the journal has: not recorded again.)
            seq = history.append(data)
            if self._journal is not None:
                self._journal.updated(session.bridge_id, history)
        update = params.get("update")
        if type(update) is dict:
            kind = update.get("sessionUpdate")
            if type(kind) is str and kind in SETUP_UPDATES:
                track_setup(session, update)
        if session.watchers is not None:
            fan_out(session, session.watchers, msg, params, data, seq)
        client = session.client
        if client is not None and client.want_seq:
            set_seq(params, seq)
        return data


def _after_lines(block: bytes, start: int, count: int) -> int:
    """The index just past the ``count``-th line of ``block`` from ``start``."""
    find = block.index
    for _ in range(count):
        start = find(b"\n", start) + 1
    return start


__all__ = ["READER_TURN_MIN", "READ_ROUND_LINES", "Relay"]
