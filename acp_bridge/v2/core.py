"""
The ACP v2 face's decisions, pure: one v2 connection's translation, both ways, in front of the
bridge's v1 (docs/v2.md).

A :class:`V2Connection` takes each message of the v2 client (:meth:`V2Connection.from_client`)
and each message the bridge sends the connection's internal v1 link
(:meth:`V2Connection.from_bridge`) and says what goes where: a :class:`Step` of v1 messages
for the bridge and v2 messages for the client. It keeps what the translation needs:

- the v2 client's requests under the face's own ids (``v2:N``) on the v1 side, with what each
  answer becomes;
- per session: the open message run (one minted ``messageId`` per run of chunks of one kind),
  the prompt turn (acknowledged at once with the user's ``messageId``; ``running``,
  ``requires_action`` while a permission waits, ``idle`` with the stop reason), prompts held
  while a turn runs, the plan's id, the mode option, and a replay (``session/resume`` with
  ``replayFrom: start``) whose chunk runs become whole-message upserts.

Bounds: at most ``MAX_HELD`` prompts are held per connection (past it a prompt is refused
-32600); held prompts are answered -32800 by ``session/cancel``, ``session/close`` and
``$/cancel_request``.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import TYPE_CHECKING, Any, Final

import attrs

from acp_bridge.protocol.jsonrpc import (
    JsonObject,
    JsonRpcError,
    JsonRpcId,
    error,
    notification,
    request,
    result,
)
from acp_bridge.v2 import shapes

if TYPE_CHECKING:
    from collections.abc import Callable

#: prompts a connection may have held (sent while their session's turn runs) at once
MAX_HELD: Final = 64
#: the prefix of the ids of the face's requests to the bridge
ID_PREFIX: Final = "v2:"
#: in the face's id of a prompt (``v2:<connection>.p<n>``)
PROMPT_MARK: Final = "p"
#: v2 requests the face forwards under the same method (after translating params)
SESSION_REQUESTS: Final = frozenset({"session/close", "session/delete"})


@attrs.define
class Step:
    """What one message causes: v1 messages to the bridge, v2 messages to the client."""

    to_bridge: list[JsonObject] = attrs.field(factory=list)
    to_client: list[JsonObject] = attrs.field(factory=list)


@attrs.define
class _Asked:
    """A request the face sent the bridge: what its answer becomes."""

    method: str
    #: the v2 client's id; None: the face's own (a prompt, acknowledged already)
    client_id: JsonRpcId
    session: str | None = None
    #: session/load standing for a resume: "start" (a replay) or "none" (the replay dropped)
    replay: str | None = None
    #: session/set_mode standing for the mode option: the value asked for
    value: str | None = None


@attrs.define
class _Held:
    client_id: JsonRpcId
    params: JsonObject


@attrs.define
class SessionState:
    """One session as this connection's v2 client sees it."""

    #: the open run: its v1 chunk kind and its message id
    run_kind: str | None = None
    run_id: str | None = None
    #: a turn is under way (a prompt forwarded, not answered)
    running: bool = False
    held: deque[_Held] = attrs.field(factory=deque)
    #: permission requests shown and not answered
    asking: set[JsonRpcId] = attrs.field(factory=set)
    plan_id: str | None = None
    #: the v2 config options, the mode option included (kept to report a mode change)
    options: list[JsonObject] = attrs.field(factory=list)
    #: the ``mode`` option stands for v1 session modes (set with ``session/set_mode``)
    v1_modes: bool = False
    #: "start": a replay's chunks are gathered into whole messages; "none": dropped
    replay: str | None = None
    replay_content: list[Any] = attrs.field(factory=list)


class V2Connection:
    """The translation state of one v2 connection (see the module)."""

    def __init__(self, prefix: str = "m") -> None:
        #: message ids are ``f"{prefix}-{n}"``: give each connection its own prefix
        self._prefix = prefix
        self._ids = itertools.count(1)
        self._messages = itertools.count(1)
        self._asked: dict[str, _Asked] = {}
        #: the v2 client's id → the face's id, while the answer is owed
        self._by_client: dict[JsonRpcId, str] = {}
        self.sessions: dict[str, SessionState] = {}
        #: permission request id (the bridge's) → its session
        self._asking: dict[JsonRpcId, str] = {}
        self._held_count = 0
        self._updates = SessionUpdates(self.mint)

    def mint(self) -> str:
        return f"{self._prefix}-{next(self._messages)}"

    def _ask(self, step: Step, method: str, params: JsonObject, asked: _Asked) -> None:
        # The connection's prefix keeps the ids apart from another connection's: the bridge
        # hands the answers owed to a connection that lost a session to the one taking it
        # back (attach's reconnect), and those must not be taken for this one's.
        # A prompt's id is marked: the connection taking its session back carries its turn on.
        mark = PROMPT_MARK if method == "session/prompt" else ""
        our_id = f"{ID_PREFIX}{self._prefix}.{mark}{next(self._ids)}"
        self._asked[our_id] = asked
        if asked.client_id is not None:
            self._by_client[asked.client_id] = our_id
        step.to_bridge.append(request(our_id, method, params))

    # -- the client's messages -------------------------------------------------------------

    def from_client(self, msg: JsonObject) -> Step:
        """One message of the v2 client (decoded, a JSON-RPC object)."""
        step = Step()
        method = msg.get("method")
        if not isinstance(method, str):
            self._client_response(msg, step)
            return step
        params = msg.get("params")
        params = params if isinstance(params, dict) else {}
        if "id" not in msg:
            self._client_notification(method, params, step)
            return step
        client_id = msg["id"]
        try:
            self._client_request(client_id, method, params, step)
        except JsonRpcError as exc:
            step.to_client.append(error(client_id, exc))
        return step

    def _client_request(
        self, client_id: JsonRpcId, method: str, params: JsonObject, step: Step
    ) -> None:
        sid = params.get("sessionId")
        if method == "initialize":
            self._ask(step, method, shapes.initialize_to_v1(params), _Asked(method, client_id))
        elif method == "auth/login":
            v1 = {k: v for k, v in params.items() if k in ("methodId", "_meta")}
            self._ask(step, "authenticate", v1, _Asked(method, client_id))
        elif method == "auth/logout":
            self._ask(step, "logout", {}, _Asked(method, client_id))
        elif method == "session/new":
            v1 = shapes.setup_to_v1(params)
            self._ask(step, method, v1, _Asked(method, client_id))
        elif method == "session/list":
            v1 = {
                k: v for k, v in params.items() if k in ("cwd", "cursor", "_meta") and v is not None
            }
            self._ask(step, method, v1, _Asked(method, client_id))
        elif method == "session/resume":
            self._resume(client_id, params, step)
        elif not isinstance(sid, str):
            if method.startswith("_"):
                self._ask(step, method, params, _Asked(method, client_id))
                return
            raise JsonRpcError.method_not_found(method)
        elif method in SESSION_REQUESTS:
            self._ask(step, method, {"sessionId": sid}, _Asked(method, client_id, sid))
        elif sid not in self.sessions:
            raise JsonRpcError(
                -32002,
                f"session {sid!r} is not open on this connection (new or resume it first)",
                {"sessionId": sid},
            )
        elif method == "session/prompt":
            self._prompt(client_id, sid, params, step)
        elif method == "session/set_config_option":
            self._set_option(client_id, sid, params, step)
        elif method.startswith("_"):
            self._ask(step, method, params, _Asked(method, client_id, sid))
        else:
            raise JsonRpcError.method_not_found(method)

    def _resume(self, client_id: JsonRpcId, params: JsonObject, step: Step) -> None:
        sid = params.get("sessionId")
        if not isinstance(sid, str):
            raise JsonRpcError.invalid_params("sessionId: expected a string")
        replay_from = params.get("replayFrom")
        if replay_from is None:
            replay = "none"
        elif isinstance(replay_from, dict) and replay_from.get("type") == "start":
            replay = "start"
        else:
            raise JsonRpcError.invalid_params("replayFrom: unknown cursor (only start is served)")
        # A bridge session/load: served from its history or journal for every agent, and
        # from the agent's own load when the session is only in the store.
        v1 = shapes.setup_to_v1(params, session_id=sid)
        meta = v1.get("_meta")
        meta = dict(meta) if isinstance(meta, dict) else {}
        meta["acp_bridge"] = {"journal_replay": True}
        v1["_meta"] = meta
        state = self.sessions.setdefault(sid, SessionState())
        state.replay = replay
        state.replay_content = []
        state.run_kind = state.run_id = None
        self._ask(step, "session/load", v1, _Asked("session/resume", client_id, sid, replay))

    def _prompt(self, client_id: JsonRpcId, sid: str, params: JsonObject, step: Step) -> None:
        prompt = params.get("prompt")
        if not isinstance(prompt, list) or not prompt:
            raise JsonRpcError.invalid_params("prompt: expected a non-empty array")
        state = self.sessions[sid]
        if state.running or state.held:
            if self._held_count >= MAX_HELD:
                raise JsonRpcError.invalid_request(
                    f"{MAX_HELD} prompts are already held on this connection"
                )
            self._held_count += 1
            state.held.append(_Held(client_id, params))
            return
        self._start_prompt(client_id, sid, params, step)

    def _start_prompt(self, client_id: JsonRpcId, sid: str, params: JsonObject, step: Step) -> None:
        """The prompt goes in now: acknowledged with its message id, the turn running."""
        state = self.sessions[sid]
        message_id = self.mint()
        step.to_client.append(result(client_id, {"messageId": message_id}))
        user = {
            "sessionUpdate": "user_message",
            "messageId": message_id,
            "content": params["prompt"],
        }
        step.to_client.append(_update(sid, user))
        step.to_client.append(_update(sid, {"sessionUpdate": "state_update", "state": "running"}))
        state.running = True
        state.run_kind = state.run_id = None
        v1 = {"sessionId": sid, "prompt": params["prompt"]}
        _copy_meta(params, v1)
        self._ask(step, "session/prompt", v1, _Asked("session/prompt", None, sid))

    def _set_option(self, client_id: JsonRpcId, sid: str, params: JsonObject, step: Step) -> None:
        config_id, value = params.get("configId"), params.get("value")
        if config_id == shapes.MODE_CONFIG_ID and self.sessions[sid].v1_modes:
            if not isinstance(value, str):
                raise JsonRpcError.invalid_params("value: expected a mode id")
            v1: JsonObject = {"sessionId": sid, "modeId": value}
            asked = _Asked("set_mode", client_id, sid, value=value)
            self._ask(step, "session/set_mode", v1, asked)
            return
        v1 = {"sessionId": sid, "configId": config_id, "value": value}
        if "type" in params and params["type"] != "id":
            v1["type"] = params["type"]
        self._ask(step, "session/set_config_option", v1, _Asked("set_option", client_id, sid))

    def _client_notification(self, method: str, params: JsonObject, step: Step) -> None:
        if method == "session/cancel":
            sid = params.get("sessionId")
            if isinstance(sid, str) and sid in self.sessions:
                self._drop_held(self.sessions[sid], step)
            step.to_bridge.append(notification(method, params))
        elif method == "$/cancel_request":
            wanted = params.get("requestId")
            if self._cancel_held(wanted, step):
                return
            our_id = self._by_client.get(wanted) if isinstance(wanted, (int, str)) else None
            if our_id is not None:
                step.to_bridge.append(notification(method, {"requestId": our_id}))
        else:
            step.to_bridge.append(notification(method, params))

    def _client_response(self, msg: JsonObject, step: Step) -> None:
        """The client's answer to a request the bridge sent (a permission, most often)."""
        rid = msg.get("id")
        sid = self._asking.pop(rid, None) if isinstance(rid, (int, str)) else None
        if sid is not None:
            self._answered(sid, rid, step)
        step.to_bridge.append(msg)

    def _answered(self, sid: str, rid: JsonRpcId, step: Step) -> None:
        """A permission request of ``sid`` settled: back to running when none waits."""
        state = self.sessions.get(sid)
        if state is None:
            return
        state.asking.discard(rid)
        if not state.asking and state.running:
            step.to_client.append(
                _update(sid, {"sessionUpdate": "state_update", "state": "running"})
            )

    def _drop_held(self, state: SessionState, step: Step) -> None:
        while state.held:
            held = state.held.popleft()
            self._held_count -= 1
            step.to_client.append(error(held.client_id, JsonRpcError.cancelled("prompt withdrawn")))

    def _cancel_held(self, client_id: object, step: Step) -> bool:
        for state in self.sessions.values():
            for held in state.held:
                if held.client_id == client_id:
                    state.held.remove(held)
                    self._held_count -= 1
                    step.to_client.append(
                        error(held.client_id, JsonRpcError.cancelled("prompt withdrawn"))
                    )
                    return True
        return False

    # -- the bridge's messages -------------------------------------------------------------

    def from_bridge(self, msg: JsonObject) -> Step:
        """One message the bridge sent the connection's v1 link."""
        step = Step()
        method = msg.get("method")
        if not isinstance(method, str):
            self._bridge_response(msg, step)
        elif "id" in msg:
            self._bridge_request(msg, method, step)
        elif method == "session/update":
            self._update(msg, step)
        elif method in ("$/cancel_request", "_acp_bridge/permission_resolved"):
            params = msg.get("params")
            params = params if isinstance(params, dict) else {}
            rid = params.get("requestId")
            sid = self._asking.pop(rid, None) if isinstance(rid, (int, str)) else None
            if sid is not None:
                self._answered(sid, rid, step)
            step.to_client.append(msg)
        elif method.startswith("_"):
            step.to_client.append(msg)
        # (any other v1 notification has no v2 counterpart: dropped)
        return step

    def _bridge_request(self, msg: JsonObject, method: str, step: Step) -> None:
        params = msg.get("params")
        params = params if isinstance(params, dict) else {}
        if method == "session/request_permission":
            sid = params.get("sessionId")
            state = self.sessions.get(sid) if isinstance(sid, str) else None
            if state is not None and isinstance(sid, str):
                if not state.asking:
                    step.to_client.append(
                        _update(sid, {"sessionUpdate": "state_update", "state": "requires_action"})
                    )
                state.asking.add(msg["id"])
                self._asking[msg["id"]] = sid
            step.to_client.append(request(msg["id"], method, shapes.permission_to_v2(params)))
        elif method.startswith("_"):
            step.to_client.append(msg)
        else:
            # fs/*, terminal/* and the rest of v1's client methods are gone in v2.
            step.to_bridge.append(
                error(msg["id"], JsonRpcError.method_not_found(method, "not in ACP v2"))
            )

    def _bridge_response(self, msg: JsonObject, step: Step) -> None:
        our_id = msg.get("id")
        asked = self._asked.pop(our_id, None) if isinstance(our_id, str) else None
        if asked is None:
            return  # (an answer owed to another connection's request: nothing to map it to)
        if asked.client_id is not None:
            self._by_client.pop(asked.client_id, None)
        if asked.method == "session/prompt":
            assert asked.session is not None
            self._turn_ended(asked.session, msg, step)
            return
        failure = msg.get("error")
        if isinstance(failure, dict):
            if asked.method == "session/resume" and asked.session is not None:
                state = self.sessions.get(asked.session)
                if state is not None:
                    state.replay = None
            step.to_client.append({"jsonrpc": "2.0", "id": asked.client_id, "error": failure})
            return
        answer = msg.get("result")
        answer = answer if isinstance(answer, dict) else {}
        step.to_client.append(result(asked.client_id, self._answer(asked, answer, step)))

    def _answer(self, asked: _Asked, answer: JsonObject, step: Step) -> JsonObject:
        method, sid = asked.method, asked.session
        if method == "initialize":
            return shapes.initialize_to_v2(answer)
        if method == "session/new":
            new_id = answer.get("sessionId")
            out: JsonObject = {"sessionId": new_id}
            state = SessionState()
            _set_options(state, answer)
            if isinstance(new_id, str):
                self.sessions[new_id] = state
            if state.options:
                out["configOptions"] = state.options
            return _copy_meta(answer, out)
        if method == "session/list":
            raw = answer.get("sessions")
            infos = [
                i for i in map(shapes.session_info_to_v2, raw if isinstance(raw, list) else []) if i
            ]
            listed: JsonObject = {"sessions": infos}
            if isinstance(answer.get("nextCursor"), str):
                listed["nextCursor"] = answer["nextCursor"]
            return listed
        if method == "session/resume":
            assert sid is not None
            state = self.sessions.setdefault(sid, SessionState())
            self._updates.flush_replay(sid, state, step)
            state.replay = None
            state.run_kind = state.run_id = None
            if self._adopt(sid, state, answer):
                # (v2: the current state before the answer; a running turn must be said.)
                step.to_client.append(
                    _update(sid, {"sessionUpdate": "state_update", "state": "running"})
                )
            if _set_options(state, answer):
                return {"configOptions": state.options}
            return {}
        if method in SESSION_REQUESTS:
            if sid is not None:
                gone = self.sessions.pop(sid, None)
                if gone is not None:
                    self._drop_held(gone, step)
            return {}
        if method == "set_mode":
            assert sid is not None
            state = self.sessions[sid]
            state.options = _with_value(state.options, shapes.MODE_CONFIG_ID, asked.value)
            return {"configOptions": state.options}
        if method == "set_option":
            assert sid is not None
            options = shapes.config_options_to_v2(answer)
            self.sessions[sid].options = options
            return {"configOptions": options}
        if method in ("auth/login", "auth/logout"):
            return {}
        return answer

    def _adopt(self, sid: str, state: SessionState, answer: JsonObject) -> bool:
        """
        Prompts another v2 connection sent, whose answers now come here (the bridge's
        ``pending`` ids, as when attach reconnects): their turn goes on, and ends, on this one.
        Whether there was one.
        """
        meta = answer.get("_meta")
        ours = meta.get("acp_bridge") if isinstance(meta, dict) else None
        pending = ours.get("pending") if isinstance(ours, dict) else None
        for rid in pending if isinstance(pending, list) else []:
            if (
                isinstance(rid, str)
                and rid.startswith(ID_PREFIX)
                and f".{PROMPT_MARK}" in rid
                and rid not in self._asked
            ):
                self._asked[rid] = _Asked("session/prompt", None, sid)
                state.running = True
        return state.running

    def _turn_ended(self, sid: str, msg: JsonObject, step: Step) -> None:
        state = self.sessions.get(sid)
        step.to_client.append(_update(sid, shapes.stop_to_v2(msg)))
        if state is None:
            return
        state.running = False
        state.run_kind = state.run_id = None
        if state.held:
            held = state.held.popleft()
            self._held_count -= 1
            self._start_prompt(held.client_id, sid, held.params, step)

    # -- updates ---------------------------------------------------------------------------

    def _update(self, msg: JsonObject, step: Step) -> None:
        params = msg.get("params")
        if not isinstance(params, dict):
            return
        sid, update = params.get("sessionId"), params.get("update")
        if not isinstance(sid, str) or not isinstance(update, dict):
            return
        state = self.sessions.get(sid)
        if state is None:
            return  # (not a session of this connection's v2 client)
        kind = update.get("sessionUpdate")
        if state.replay == "none":
            return
        if state.replay == "start":
            self._updates.replayed(sid, state, kind, update, step)
            return
        out = self._updates.translate(sid, state, kind, update)
        if out is not None:
            step.to_client.append(_update(sid, out, params))


class SessionUpdates:
    """A session's v1 updates as v2: message ids for chunk runs, plans, modes, replays."""

    def __init__(self, mint: Callable[[], str]) -> None:
        self.mint = mint

    def translate(
        self, sid: str, state: SessionState, kind: object, update: JsonObject
    ) -> JsonObject | None:
        if isinstance(kind, str) and kind in shapes.MESSAGE_KINDS:
            given = update.get("messageId")
            if isinstance(given, str):
                message_id = given
            elif state.run_kind == kind and state.run_id is not None:
                message_id = state.run_id
            else:
                message_id = self.mint()
            state.run_kind, state.run_id = kind, message_id
            out = {"sessionUpdate": kind, "messageId": message_id, "content": update.get("content")}
            return _copy_meta(update, out)
        state.run_kind = state.run_id = None
        if kind == "plan":
            if state.plan_id is None:
                state.plan_id = f"{self.mint()}-plan"
            entries = update.get("entries")
            plan = {
                "type": "items",
                "planId": state.plan_id,
                "entries": entries if isinstance(entries, list) else [],
            }
            return _copy_meta(update, {"sessionUpdate": "plan_update", "plan": plan})
        if kind == "current_mode_update":
            mode = update.get("currentModeId")
            if not isinstance(mode, str) or not any(
                o.get("configId") == shapes.MODE_CONFIG_ID for o in state.options
            ):
                return None
            state.options = _with_value(state.options, shapes.MODE_CONFIG_ID, mode)
            return {"sessionUpdate": "config_option_update", "configOptions": state.options}
        out = shapes.plain_update_to_v2(update)
        if kind == "config_option_update":
            state.options = list(out.get("configOptions") or [])
        return out

    def replayed(
        self, sid: str, state: SessionState, kind: object, update: JsonObject, step: Step
    ) -> None:
        """A replayed update: chunk runs gathered into whole messages (upserts by id)."""
        if isinstance(kind, str) and kind in shapes.MESSAGE_KINDS:
            if state.run_kind != kind:
                self.flush_replay(sid, state, step)
                state.run_kind, state.run_id = kind, self.mint()
            state.replay_content.append(update.get("content"))
            return
        self.flush_replay(sid, state, step)
        out = self.translate(sid, state, kind, update)
        if out is not None:
            step.to_client.append(_update(sid, out))

    def flush_replay(self, sid: str, state: SessionState, step: Step) -> None:
        if state.run_kind is not None and state.run_id is not None and state.replay_content:
            whole = {
                "sessionUpdate": shapes.MESSAGE_KINDS[state.run_kind],
                "messageId": state.run_id,
                "content": state.replay_content,
            }
            step.to_client.append(_update(sid, whole))
        state.replay_content = []
        state.run_kind = state.run_id = None


def _update(sid: str, update: JsonObject, params: JsonObject | None = None) -> JsonObject:
    out: JsonObject = {"sessionId": sid, "update": update}
    if params is not None:
        _copy_meta(params, out)
    return notification("session/update", out)


def _copy_meta(source: JsonObject, target: JsonObject) -> JsonObject:
    meta = source.get("_meta")
    if isinstance(meta, dict):
        target["_meta"] = meta
    return target


def _set_options(state: SessionState, answer: JsonObject) -> bool:
    """A v1 setup answer's options (its modes as the ``mode`` option) into ``state``."""
    options = shapes.config_options_to_v2(answer)
    if not options:
        return False
    state.options = options
    state.v1_modes = any(o.get("configId") == shapes.MODE_CONFIG_ID for o in options) and (
        shapes.modes_to_option(answer.get("modes")) is not None
    )
    return True


def _with_value(options: list[JsonObject], config_id: str, value: str | None) -> list[JsonObject]:
    if value is None:
        return options
    return [{**o, "currentValue": value} if o.get("configId") == config_id else o for o in options]


__all__ = [
    "ID_PREFIX",
    "MAX_HELD",
    "PROMPT_MARK",
    "SessionState",
    "SessionUpdates",
    "Step",
    "V2Connection",
]
