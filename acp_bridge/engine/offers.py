"""
The MCP servers of every agent session the bridge opens (docs/subagents.md, "How an agent
reaches it"; docs/protocol.md, "MCP servers over ACP"): what the ``mcpServers`` of a
``session/new``, ``load``, ``resume`` or ``fork`` become on their way to an agent.

- The bridge's own ``acp-bridge`` server (the sub-agent tools): ``acp`` over the agent's own
  pipe when it advertises ``mcpCapabilities.acp`` (no port, no token on the wire; an agent
  behind a launcher or ssh gets it too), else HTTP on the loopback listener, else stdio
  through ``acp-bridge mcp``.
- A client's ``acp`` servers: passed on to an agent that speaks ``mcp/message``, each under
  an id of the agent's connection (``mcp.acp``); re-exported on the loopback listener to one
  that speaks only HTTP MCP (its own token, bound to the session); dropped for any other.

What a request offered is an :class:`Offer` on its forwarded entry; when the agent answers,
:meth:`Offers.opened` binds its tokens and ids to the session, or withdraws them. The
:class:`~acp_bridge.engine.subagents.Subagents` build this and own the children; this owns
the MCP endpoint (the listener, made at the first session that needs it).
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Final

import attrs
import structlog

from acp_bridge.config import remote
from acp_bridge.engine.mcp_acp import Export
from acp_bridge.mcp.acp import acp_flavour, is_acp_server
from acp_bridge.sessions.tree import tools_for

if TYPE_CHECKING:
    from acp_bridge.config.model import AgentConfig
    from acp_bridge.engine.hub import Hub
    from acp_bridge.engine.links import AgentLink, ClientLink
    from acp_bridge.engine.mcp_acp import McpOverAcp, OwnCall
    from acp_bridge.mcp.server import McpEndpoint
    from acp_bridge.mcp.tools import SubagentHost
    from acp_bridge.protocol.jsonrpc import JsonObject
    from acp_bridge.sessions.table import Forwarded, Session

logger = structlog.get_logger("acp_bridge.subagents")

#: The requests that open (or reopen) an agent session: each is offered the servers.
OFFERED: Final = frozenset({"session/new", "session/load", "session/resume", "session/fork"})
#: The name of the bridge's own server (a client's entry of that name is not passed on).
OWN_NAME: Final = "acp-bridge"
#: Where the remote end of an ssh agent's forward to the listener is drawn from, afresh at each
#: launch: above Linux's default ephemeral range (32768-60999), so it is never the listener's
#: own port when the "remote" host is this machine, nor an outgoing connection's there. Taken
#: anyway: ssh exits 255 (ExitOnForwardFailure), a start error naming the host; the restart
#: draws again.
REMOTE_PORTS: Final = range(61000, 65536)


@attrs.define(eq=False)
class Offer:
    """
    What a forwarded request offered its agent, to bind or withdraw when it answers.

    Attributes:
        agent: the agent's name.
        token: the bridge's own server's token (None: not offered).
        exports: the clients' servers re-exported to it, with their tokens.
        declared: ids were declared on the agent's connection (``mcp.acp``) for it.
    """

    agent: str
    token: str | None = None
    exports: list[tuple[Export, str]] = attrs.Factory(list)
    declared: bool = False


class Offers:
    """
    The MCP servers offered to the sessions the bridge opens, and the endpoint behind them.

    Args:
        hub: the shared state (the sub-agent settings, the tree's depths, the nursery).
        mcp: MCP over ACP: the ids of ``acp`` servers on each agent's connection, a client's
            servers called for a re-export, the bridge's own server called over ACP.
        host: what the sub-agent tools run on (the sub-agents that build this).
    """

    def __init__(self, hub: Hub, mcp: McpOverAcp, host: SubagentHost) -> None:
        self._hub = hub
        self._config = hub.config.subagents
        self._mcp = mcp
        self._host = host
        self._endpoint: McpEndpoint | None = None

    @property
    def endpoint(self) -> McpEndpoint:
        """The MCP endpoint, made at the first session offered it (not before: an editor's
        ``initialize`` does not wait for the HTTP stack to be imported)."""
        if self._endpoint is None:
            from acp_bridge.mcp.server import McpEndpoint

            self._endpoint = McpEndpoint(self._host, clients=self._mcp)
        return self._endpoint

    @property
    def started(self) -> McpEndpoint | None:
        """The endpoint, if one was made (nothing to revoke otherwise)."""
        return self._endpoint

    # ------------------------------------------------------------------ offering

    async def offer(
        self,
        agent: AgentLink,
        method: str,
        params: JsonObject,
        session: Session | None,
        client: ClientLink | None,
    ) -> Offer | None:
        """
        The ``mcpServers`` of a request that opens an agent session (a client's, ``client``'s;
        a child's are offered by :meth:`offer_child`), made what ``agent`` takes: the client's
        ``acp`` servers, then the bridge's own server unless disabled or unreachable. None: not
        a request that opens a session.
        """
        if method not in OFFERED:
            return None
        offer = Offer(agent.name)
        await self._client_servers(agent, params, client, offer)
        if self._config.enabled:
            own_session = session if method != "session/fork" else None
            depth = 0 if own_session is None else self._hub.tree.depth(own_session.bridge_id)
            await self._own_server(agent, params, depth, offer)
        return offer

    async def offer_child(self, agent: AgentLink, params: JsonObject, depth: int) -> Offer:
        """The bridge's own server for a child's ``session/new`` (``depth``: the child's)."""
        offer = Offer(agent.name)
        await self._own_server(agent, params, depth, offer)
        return offer

    async def offer_bound(
        self, agent: AgentLink, params: JsonObject, session: Session, client: ClientLink
    ) -> None:
        """A load of the bridge's own (a session restored after a restart): offered, bound."""
        offer = await self.offer(agent, "session/load", params, session, client)
        if offer is not None:
            self.bind(offer, session, replace=True)

    async def _own_server(
        self, agent: AgentLink, params: JsonObject, depth: int, offer: Offer
    ) -> None:
        servers = params.get("mcpServers")
        kept = [s for s in servers if _not_ours(s)] if isinstance(servers, list) else []
        tools = tools_for(depth, self._config.max_depth)
        if acp_flavour(agent.capabilities, reaches_loopback=False) == "acp":
            # Over the agent's own pipe: no listener, no token on the wire.
            try:
                offer.token = self.endpoint.mint(tools)
            except OverflowError as exc:
                logger.warning("mcp_server_not_offered", error=str(exc))
                return
            server_id = self._mcp.router.declare(agent, None, "", offer=offer, grant=offer.token)
            offer.declared = True
            params["mcpServers"] = [*kept, {"type": "acp", "name": OWN_NAME, "serverId": server_id}]
            return
        if not self.reaches(agent) or not await self._listening():
            return
        try:
            offer.token = self.endpoint.mint(tools)
        except OverflowError as exc:
            logger.warning("mcp_server_not_offered", error=str(exc))
            return
        mcp = agent.capabilities.get("mcpCapabilities")
        http = isinstance(mcp, dict) and mcp.get("http") is True
        entry = self.endpoint.server_entry(offer.token, http=http, url=self._url_for(agent))
        params["mcpServers"] = [*kept, entry]

    async def _client_servers(
        self, agent: AgentLink, params: JsonObject, client: ClientLink | None, offer: Offer
    ) -> None:
        """The client's ``acp`` servers, made what ``agent`` takes (see the module)."""
        servers = params.get("mcpServers")
        if not isinstance(servers, list) or not any(_acp(s) for s in servers):
            return
        flavour = acp_flavour(agent.capabilities, reaches_loopback=self.reaches(agent))
        if flavour == "http" and not await self._listening():
            flavour = None
        kept: list[object] = []
        for server in servers:
            if not _acp(server):
                kept.append(server)
            elif not is_acp_server(server) or client is None or flavour is None:
                name = server.get("name") if isinstance(server, dict) else None
                logger.warning("stripped_setup", agent=agent.name, stripped=f"acp server {name!r}")
            elif flavour == "acp":
                server_id = self._mcp.router.declare(agent, client, server["serverId"], offer=offer)
                offer.declared = True
                kept.append({**server, "serverId": server_id})
            else:
                export = Export(client, server["serverId"])
                token = self.endpoint.mint_export(export)
                offer.exports.append((export, token))
                kept.append(self.endpoint.export_entry(server, token, url=self._url_for(agent)))
        params["mcpServers"] = kept

    async def _listening(self) -> bool:
        assert self._hub.nursery is not None
        try:
            await self.endpoint.start(self._hub.nursery)
        except (OSError, RuntimeError) as exc:
            logger.warning("mcp_server_not_offered", error=str(exc))
            return False
        return True

    def _url_for(self, agent: AgentLink) -> str | None:
        """Where ``agent`` reaches the listener: an ssh agent through its forward."""
        if agent.config.ssh is None:
            return None
        port = self.endpoint.forwarded.get(agent.name)
        return None if port is None else self.endpoint.url_at(port)

    # ------------------------------------------------------------------ binding

    def opened(self, entry: Forwarded, session: Session | None) -> None:
        """A forwarded request that was offered servers ended: bound to its session, or gone."""
        offer = entry.extra
        if not isinstance(offer, Offer):
            return
        if session is None:
            self.withdraw(offer)
            return
        # A load or resume: the agent took the session up again with these; the older go.
        self.bind(offer, session, replace=entry.method in ("session/load", "session/resume"))

    def bind(self, offer: Offer, session: Session, *, replace: bool) -> None:
        """``offer``'s session is ``session``: its tokens bound, its ids the session's."""
        sid = session.bridge_id
        if replace and self._endpoint is not None:
            self._endpoint.revoke_session(sid)  # (one token per session: bounded)
        tokens = [token for _, token in offer.exports]
        if offer.token is not None:
            tokens.append(offer.token)
        for token in tokens:
            try:
                self.endpoint.bind(token, sid)
            except (KeyError, ValueError):
                logger.warning("mcp_token_not_bound", session=sid)
        for export, _ in offer.exports:
            export.session = sid
        if offer.declared or replace:
            agent = self._hub.agents[offer.agent]
            self._mcp.router.bind(agent, offer, sid, replace=replace)

    def withdraw(self, offer: Offer) -> None:
        """The session ``offer`` was for did not open: its tokens and ids go."""
        if self._endpoint is not None:
            for token in [offer.token, *(t for _, t in offer.exports)]:
                if token is not None:
                    self._endpoint.revoke(token)
        if offer.declared:
            self._mcp.router.drop_offer(self._hub.agents[offer.agent], offer)

    # ------------------------------------------------------------------ the own server over ACP

    def acp_call(self, own: OwnCall) -> None:
        """An agent called the bridge's own server over ACP: run in a task of its own."""
        if not self._hub.stopping:
            self._hub.spawn(self._acp_call, own)

    async def _acp_call(self, own: OwnCall) -> None:
        assert isinstance(own.grant, str)  # (the token its route was declared with)
        with own.scope:
            outcome = await self.endpoint.acp_call(own.grant, own.method, own.params)
            self._mcp.answer_own(own, outcome)

    # ------------------------------------------------------------------ reaching the listener

    def reaches(self, agent: AgentLink) -> bool:
        """
        ``agent`` can reach the loopback listener: a local one; an ssh one whose connection
        forwards a port to it (:meth:`launch_config`) and that speaks http MCP (a stdio entry
        would need ``acp-bridge`` installed on the far side). A launcher's engine forwards
        nothing. (Over ACP it needs no listener at all.)
        """
        if agent.config.ssh is None:
            return agent.config.launcher is None
        mcp = agent.capabilities.get("mcpCapabilities")
        http = isinstance(mcp, dict) and mcp.get("http") is True
        return http and agent.name in self.endpoint.forwarded

    async def launch_config(self, config: AgentConfig) -> AgentConfig:
        """
        What an agent is launched with: an ssh agent's connection forwards a remote loopback
        port (drawn from :data:`REMOTE_PORTS`) to the MCP listener, started now since the
        forward names its port, and the listener accepts that port in ``Host``. Not forwarded
        (disabled, no listener): its sessions are not offered the server over HTTP.
        """
        if config.ssh is None or not self._config.enabled:
            return config
        assert self._hub.nursery is not None
        try:
            await self.endpoint.start(self._hub.nursery)
        except (OSError, RuntimeError) as exc:
            logger.warning("mcp_server_not_forwarded", agent=config.name, error=str(exc))
        port = self.endpoint.port
        if port is None:
            self.endpoint.forwarded.pop(config.name, None)
            return config
        far = secrets.choice(REMOTE_PORTS)
        self.endpoint.allow_port(config.name, far)
        return attrs.evolve(config, ssh=remote.forward_to_bridge(config.ssh, far, port))


def _acp(server: object) -> bool:
    return isinstance(server, dict) and server.get("type") == "acp"


def _not_ours(server: object) -> bool:
    """An ``mcpServers`` entry that is not the bridge's own (a client cannot plant one)."""
    return not (isinstance(server, dict) and server.get("name") == OWN_NAME)


__all__ = ["OFFERED", "OWN_NAME", "REMOTE_PORTS", "Offer", "Offers"]
