"""
Status and metrics of a running daemon: ``GET /status``, ``GET /metrics``, ``acp-bridge status``.

:func:`render_metrics` turns :meth:`Bridge.status` into the Prometheus text exposition
format (version 0.0.4); :func:`format_status` into the summary ``acp-bridge status`` prints.
Both are pure. :func:`main_status` is the command: one blocking HTTP request to the daemon
named by the configuration, bounded by :data:`REQUEST_TIMEOUT`.

No trio here: the command runs no event loop, and the rendering is shared with ``faces.ws.py``.
"""

from __future__ import annotations

import http.client
import json
import ssl
import sys
import urllib.parse
from typing import TYPE_CHECKING, Final, TypeVar

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterable, Sequence

    from acp_bridge.config.model import Config
    from acp_bridge.protocol.jsonrpc import JsonObject

__all__ = [
    "METRICS_CONTENT_TYPE",
    "StatusError",
    "fetch_status",
    "format_status",
    "main_status",
    "render_metrics",
    "status_url",
]

#: The Content-Type of ``/metrics``.
METRICS_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
#: Seconds ``acp-bridge status`` waits for the daemon (connect, then the answer).
REQUEST_TIMEOUT: Final = 5.0
#: The largest ``/status`` answer read.
MAX_STATUS_BYTES: Final = 64 * 1024 * 1024
_DIRECTIONS: Final = ("from_client", "to_client", "from_agent", "to_agent")


# --- /metrics ----------------------------------------------------------------------------------


def render_metrics(status: JsonObject) -> str:
    """The Prometheus text exposition (0.0.4) of a :meth:`Bridge.status` snapshot. Pure."""
    counters: dict[str, int] = status.get("counters", {})
    agents: list[JsonObject] = status.get("agents", [])
    out: list[str] = []
    _family(
        out,
        "acp_bridge_messages_total",
        "counter",
        "JSON-RPC messages that crossed the bridge, by direction.",
        [((("direction", d),), counters.get(d, 0)) for d in _DIRECTIONS],
    )
    errors = sorted(
        (int(key.partition(":")[2]), value)
        for key, value in counters.items()
        if key.startswith("error:") and _is_int(key.partition(":")[2])
    )
    _family(
        out,
        "acp_bridge_errors_total",
        "counter",
        "Errors the bridge answered itself, by JSON-RPC error code.",
        [((("code", str(code)),), value) for code, value in errors],
    )
    approvals = sorted(
        (*key.partition(":")[::2], value) for key, value in status.get("approvals", {}).items()
    )
    _family(
        out,
        "acp_bridge_approvals_total",
        "counter",
        "Permission requests settled, by decision and by who decided.",
        [
            ((("decision", decision), ("source", source)), value)
            for decision, source, value in approvals
        ],
    )
    _family(
        out,
        "acp_bridge_agent_restarts_total",
        "counter",
        "Times an agent was started again after its first start.",
        [((("agent", a["name"]),), a.get("restarts", 0)) for a in agents],
    )
    _family(
        out,
        "acp_bridge_agent_up",
        "gauge",
        "1 when the agent is running and initialized, else 0.",
        [((("agent", a["name"]),), int(a.get("state") == "ready")) for a in agents],
    )
    _family(
        out,
        "acp_bridge_sessions",
        "gauge",
        "Sessions the bridge knows (attached or detached).",
        [((), len(status.get("sessions", [])))],
    )
    _family(
        out,
        "acp_bridge_connections",
        "gauge",
        "Client connections open.",
        [((), len(status.get("connections", [])))],
    )
    depths = [
        ((("link", f"client:{c['name']}"),), c.get("queueDepth", 0))
        for c in status.get("connections", [])
    ] + [((("link", f"agent:{a['name']}"),), a.get("queueDepth", 0)) for a in agents]
    _family(
        out,
        "acp_bridge_queue_depth",
        "gauge",
        "Messages queued for a peer and not yet written.",
        depths,
    )
    memory: dict[str, int] = status.get("memory") or {}
    _family(
        out,
        "acp_bridge_memory_bytes",
        "gauge",
        "Memory of the bridge process: resident, glibc's heap in use and kept free, the "
        "sessions' replay histories.",
        [
            ((("kind", kind),), memory[key] * 1024)
            for key, kind, _ in _MEMORY_FIGURES
            if isinstance(memory.get(key), int)
        ],
    )
    if isinstance(memory.get("pythonBlocks"), int):
        _family(
            out,
            "acp_bridge_python_allocated_blocks",
            "gauge",
            "Blocks handed out by Python's small-object allocator (live objects).",
            [((), memory["pythonBlocks"])],
        )
    return "\n".join(out) + "\n"


#: /status's memory figures in KiB: (key, the metric's kind, the status line's label; the
#: histories' part of that line also gives their number of updates)
_MEMORY_FIGURES = (
    ("rssKiB", "resident", "resident"),
    ("heapInUseKiB", "heap_in_use", "heap in use"),
    ("heapFreeKiB", "heap_free", "heap kept free"),
    ("historyKiB", "history", "histories"),
)


def _family(
    out: list[str],
    name: str,
    kind: str,
    help_text: str,
    samples: Iterable[tuple[tuple[tuple[str, str], ...], int]],
) -> None:
    out.append(f"# HELP {name} {_escape_help(help_text)}")
    out.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        if labels:
            text = ",".join(f'{key}="{_escape_label(str(val))}"' for key, val in labels)
            out.append(f"{name}{{{text}}} {int(value)}")
        else:
            out.append(f"{name} {int(value)}")


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


# --- acp-bridge status -------------------------------------------------------------------------


def format_status(status: JsonObject, *, url: str = "") -> str:
    """The readable summary of a :meth:`Bridge.status` snapshot. Pure."""
    lines = [f"acp-bridge {url}".rstrip() + f"  (default agent: {status.get('defaultAgent')})"]
    agents: list[JsonObject] = status.get("agents", [])
    lines.append(f"agents ({len(agents)}):")
    for a in agents:
        pid = a.get("pid")
        lines.append(
            f"  {a['name']:<16} {a.get('state', '?'):<9} pid {pid if pid is not None else '-':<8}"
            f" restarts {a.get('restarts', 0):<3} sessions {a.get('sessions', 0):<3}"
            f" queue {a.get('queueDepth', 0):<4} pending {a.get('pendingRequests', 0)}"
            f"  on {a.get('runsOn', 'local')}"
        )
    sessions: list[JsonObject] = status.get("sessions", [])
    lines.append(f"sessions ({len(sessions)}):")
    for depth, s in session_tree(sessions, lambda s: s["sessionId"], lambda s: s.get("parent")):
        connection = s.get("connection") or "(detached)"
        name = "  " * (depth - 1) + "└ " + s["sessionId"] if depth else s["sessionId"]
        watchers = s.get("watchers") or 0
        lines.append(
            f"  {name:<24} agent {s.get('agent', '?'):<12} {s.get('state', '?'):<9}"
            f" connection {connection:<14} pending approvals {s.get('pendingApprovals', 0)}"
            + (f" watchers {watchers}" if watchers else "")
        )
    connections: list[JsonObject] = status.get("connections", [])
    lines.append(f"connections ({len(connections)}):")
    for c in connections:
        lines.append(
            f"  {c['name']:<16} {c.get('transport', '?'):<5} queue {c.get('queueDepth', 0):<4}"
            f" pending requests {c.get('pendingRequests', 0)}"
        )
    counters: dict[str, int] = status.get("counters", {})
    lines.append("messages: " + ", ".join(f"{d} {counters.get(d, 0)}" for d in _DIRECTIONS))
    errors = {k.partition(":")[2]: v for k, v in counters.items() if k.startswith("error:")}
    if errors:
        lines.append("errors: " + ", ".join(f"{code}={n}" for code, n in sorted(errors.items())))
    approvals: dict[str, int] = status.get("approvals", {})
    if approvals:
        lines.append(
            "approvals: " + ", ".join(f"{key}={n}" for key, n in sorted(approvals.items()))
        )
    memory: dict[str, int] = status.get("memory") or {}
    parts = [f"{label} {_mib(memory[key])}" for key, _, label in _MEMORY_FIGURES if key in memory]
    if "historyKiB" in memory:
        parts[-1] += f" in {memory.get('historyEntries', 0):,} updates"
    if parts:
        lines.append("memory: " + ", ".join(parts))
    return "\n".join(lines)


T = TypeVar("T")


def session_tree(
    items: Sequence[T], key: Callable[[T], str], parent: Callable[[T], str | None]
) -> list[tuple[int, T]]:
    """
    ``items`` in tree order with their depths: each parent followed by its children (in
    their own order), a child whose parent is not among them at the top. Pure.
    """
    ids = {key(item) for item in items}
    children: dict[str | None, list[T]] = {}
    for item in items:
        above = parent(item)
        children.setdefault(above if above in ids else None, []).append(item)
    out: list[tuple[int, T]] = []
    stack = [(0, item) for item in reversed(children.pop(None, []))]
    while stack:  # (iterative: a tree is at most max_depth deep, but a store may say anything)
        depth, item = stack.pop()
        out.append((depth, item))
        stack += [(depth + 1, c) for c in reversed(children.pop(key(item), []))]
    # Parents that lead round in a circle (a damaged store): shown at the top, not lost.
    out += [(0, item) for rest in children.values() for item in rest]
    return out


def _mib(kib: int) -> str:
    return f"{kib / 1024:.1f} MiB"


class StatusError(Exception):
    """The daemon could not be asked (not running, refused the token, answered nonsense)."""


def status_url(config: Config, url: str | None = None) -> str:
    """
    Where ``/status`` is: from ``url`` (``http(s)://`` or the ``ws(s)://`` endpoint; any path
    is replaced), else from the config's ``[websocket]`` host and port. Pure.
    """
    if url is None:
        ws = config.websocket
        scheme = "https" if ws.tls_cert is not None else "http"
        host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(ws.host, ws.host)
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"{scheme}://{host}:{ws.port}/status"
    parts = urllib.parse.urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    if scheme not in ("http", "https") or not parts.netloc:
        raise StatusError(f"not a daemon URL: {url!r} (expected http://HOST:PORT or ws://...)")
    return urllib.parse.urlunsplit((scheme, parts.netloc, "/status", "", ""))


def fetch_status(
    url: str,
    token: str,
    *,
    ssl_context: ssl.SSLContext | None = None,
    timeout: float = REQUEST_TIMEOUT,
) -> JsonObject:
    """
    ``GET url`` with the bearer token; the decoded JSON. Blocking, bounded by ``timeout``.

    Raises:
        StatusError: no daemon answers, it refused, or the answer is not a status.
    """
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(host, port, timeout=timeout, context=ssl_context)
    else:
        connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request(
            "GET", parts.path or "/status", headers={"Authorization": f"Bearer {token}"}
        )
        response = connection.getresponse()
        body = response.read(MAX_STATUS_BYTES)
    except ConnectionRefusedError:
        raise StatusError(f"no daemon at {url}: is `acp-bridge serve` running?") from None
    except TimeoutError:
        raise StatusError(f"{url}: no answer within {timeout:g}s") from None
    except (OSError, http.client.HTTPException) as exc:
        raise StatusError(f"{url}: {exc}") from None
    finally:
        connection.close()
    if response.status == 401:
        raise StatusError(f"{url}: the token was refused (401): check --token-file")
    if response.status != 200:
        why = body.decode("utf-8", "replace").strip()[:200]
        raise StatusError(f"{url}: HTTP {response.status} {why}".rstrip())
    try:
        status = json.loads(body)
    except ValueError:
        raise StatusError(f"{url}: the answer is not JSON") from None
    if not isinstance(status, dict):
        raise StatusError(f"{url}: the answer is not a status object")
    return status


def _token_for(config: Config, token_file: str | None) -> str:
    """``--token-file``, else the config's token or token file, else the generated one."""
    from acp_bridge.config.model import ConfigError
    from acp_bridge.faces.token import (
        TokenError,
        check_token,
        existing_token,
        read_named_token_file,
    )

    try:
        if token_file is not None:
            return read_named_token_file(token_file)
        found, path = existing_token(config)
        if found is None:
            raise StatusError(
                f"no token file at {path}: is `acp-bridge serve` running? (or give --token-file)"
            )
        return check_token(
            found.decode("utf-8", "replace"), path or f"{config.source}: websocket.token"
        )
    except (ConfigError, TokenError) as exc:
        raise StatusError(str(exc)) from None


def _ssl_context(config: Config) -> ssl.SSLContext:
    """Trust the daemon's own certificate (from the config) besides the system's."""
    context = ssl.create_default_context()
    if config.websocket.tls_cert is not None:
        context.load_verify_locations(config.websocket.tls_cert)
    return context


def main_status(args: argparse.Namespace) -> int:
    """``acp-bridge status``: the running daemon's agents, sessions and queues; 1 if unreachable."""
    from acp_bridge.config.model import Config, ConfigError, load_config

    try:
        config = load_config(args.config) if args.config else Config(agents={})
    except ConfigError as exc:
        print(f"acp-bridge status: {exc}", file=sys.stderr)
        return 2
    try:
        url = status_url(config, args.url)
        token = _token_for(config, args.token_file)
        context = _ssl_context(config) if url.startswith("https:") else None
        status = fetch_status(url, token, ssl_context=context)
    except StatusError as exc:
        print(f"acp-bridge status: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        print(format_status(status, url=url.removesuffix("/status")))
    return 0
