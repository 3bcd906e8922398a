"""
``session/list`` across agents: each agent that lists sessions is asked in turn, one agent's
pages after another's, behind one opaque cursor of the bridge's (``protocol.wire.encode_cursor``:
which agent, and that agent's own cursor). The last page adds the sessions only the bridge
knows (restored from its store, or of agents that do not list).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from acp_bridge.config import remote
from acp_bridge.protocol import jsonrpc as rpc
from acp_bridge.protocol.capabilities import has_session_cap
from acp_bridge.protocol.jsonrpc import JsonRpcError, dumps
from acp_bridge.protocol.wire import decode_cursor, encode_cursor
from acp_bridge.sessions.table import SessionState, roots_of

if TYPE_CHECKING:
    from acp_bridge.engine.hub import Hub
    from acp_bridge.engine.links import AgentLink, ClientLink
    from acp_bridge.protocol.jsonrpc import JsonObject
    from acp_bridge.sessions.table import Session


class Listing:
    """``session/list`` for one bridge."""

    def __init__(self, hub: Hub) -> None:
        self._hub = hub

    async def session_list(self, client: ClientLink, msg: JsonObject, params: JsonObject) -> None:
        """``session/list`` merged across agents: one agent's pages after another's."""
        hub = self._hub
        try:
            listing = [a for a in hub.agents.values() if has_session_cap(a.capabilities, "list")]
            index, inner = (0, None)
            if params.get("cursor") is not None:
                index, inner = decode_cursor(params["cursor"])
            sessions: list[Any] = []
            next_cursor: str | None = None
            while index < len(listing):
                agent = listing[index]
                query: JsonObject = {}
                if "cwd" in params:
                    query["cwd"] = params["cwd"]
                if inner is not None:
                    query["cursor"] = inner
                page = await hub.internal_request(agent, "session/list", query)
                for info in page.get("sessions") or []:
                    if isinstance(info, dict) and isinstance(info.get("sessionId"), str):
                        session = hub.sessions.register(
                            agent.name, info["sessionId"], state=SessionState.LISTED
                        )
                        remote.map_listed_session(agent.config, info)
                        if not session.roots:
                            session.roots = roots_of(info)
                        info["sessionId"] = session.bridge_id
                        ours = _listed_meta(client, session)
                        if ours:  # a sub-agent's, tagged with its parent; owner, watchers
                            meta = info["_meta"] = dict(info.get("_meta") or {})
                            meta["acp_bridge"] = ours
                        sessions.append(info)
                inner = page.get("nextCursor") if isinstance(page.get("nextCursor"), str) else None
                if inner is None:
                    index += 1
                if inner is not None or (sessions and index < len(listing)):
                    next_cursor = encode_cursor(index, inner)
                    break
            if next_cursor is None:
                sessions += self._bridge_listed(client, listing, params.get("cwd"))
            answer: JsonObject = {"sessions": sessions}
            if next_cursor is not None:
                answer["nextCursor"] = next_cursor
            await client.send(dumps(rpc.result(msg["id"], answer)))
        except JsonRpcError as exc:
            await hub.reply_error(client, msg["id"], exc)

    def _bridge_listed(
        self, client: ClientLink, listing: list[AgentLink], cwd: object
    ) -> list[JsonObject]:
        """Sessions the bridge itself knows that no agent's own list covers (e.g. restored)."""
        listed = {a.name for a in listing}
        out: list[JsonObject] = []
        for session in self._hub.sessions:
            if session.state is SessionState.LISTED:
                continue
            if session.agent in listed and session.state is not SessionState.STORED:
                continue
            root = session.roots[0] if session.roots else None
            if isinstance(cwd, str) and root != cwd:
                continue
            info: JsonObject = {"sessionId": session.bridge_id, "cwd": root or "/"}
            if len(session.roots) > 1:
                info["additionalDirectories"] = list(session.roots[1:])
            info["_meta"] = {
                "acp_bridge": {
                    "agent": session.agent,
                    "state": session.state.value,
                    **_listed_meta(client, session),
                }
            }
            out.append(info)
        return out


def _listed_meta(client: ClientLink, session: Session) -> JsonObject:
    """
    What a listed session's ``_meta.acp_bridge`` says of it: its parent (a sub-agent's);
    to a client that knows the bridge's extensions, its owner (a connection's name, None:
    detached) and how many connections watch it.
    """
    ours: JsonObject = {}
    if session.parent is not None:
        ours["parent"] = session.parent
    if client.extensions:
        owner = session.client
        ours["owner"] = owner.name if owner is not None and not owner.closed else None
        ours["watchers"] = len(session.watchers) if session.watchers is not None else 0
    return ours


__all__ = ["Listing"]
