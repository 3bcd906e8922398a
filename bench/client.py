"""
A minimal ACP v1 client for the benchmark: NDJSON over pipes, or JSON text frames over a
WebSocket it speaks itself (RFC 6455 over a plain socket: handshake, masked sends, unmasked
receives, ping → pong), with blocking I/O and no event loop.

Deliberately small and fast, so that what the benchmark measures is what sits between this
client and the agent. Every message received is decoded with :func:`json.loads` (a real
client has to look at each one); nothing else is done with it beyond counting.
"""

from __future__ import annotations

import base64
import collections
import json
import os
import select
import socket
import struct
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess

READ_SIZE = 1 << 18
_dumps = json.JSONEncoder(separators=(",", ":")).encode
_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # the C scanner: json.loads minus its Python layers


def decode(text: str) -> Any:
    """One JSON message (as :func:`json.loads`, a little faster on a hot loop)."""
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        return json.loads(text)  # raises the proper error
    if end != len(text):
        return json.loads(text)
    return value


class ConnectionEnded(Exception):
    """The peer closed the connection (EOF, or a WebSocket close frame)."""


class Timeout(Exception):
    """Nothing arrived before the deadline."""


class Transport:
    """
    Raw bytes both ways over two file descriptors (pipes or one socket), non-blocking writes.

    A write that cannot complete reads what is waiting meanwhile, so a client sending a burst
    of requests never deadlocks with a peer that is itself blocked writing to it.
    """

    def __init__(self, rfd: int, wfd: int) -> None:
        self.rfd = rfd
        self.wfd = wfd
        os.set_blocking(wfd, False)
        self._early: list[bytes] = []

    def write(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.wfd, view) :]
                continue
            except BlockingIOError:
                pass
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout("write timed out")
            readable, _, _ = select.select([self.rfd], [self.wfd], [], left)
            if readable:
                self._early.append(self._read_now())

    def read(self, deadline: float) -> bytes:
        if self._early:
            data = b"".join(self._early)
            self._early.clear()
            return data
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([self.rfd], [], [], left)[0]:
            raise Timeout("read timed out")
        return self._read_now()

    def _read_now(self) -> bytes:
        try:
            data = os.read(self.rfd, READ_SIZE)
        except BlockingIOError:
            return b""
        except ConnectionResetError:
            data = b""
        if not data:
            raise ConnectionEnded("end of stream")
        return data


class LineFraming:
    """NDJSON: one message per line."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self._partial = b""

    def send(self, text: str, deadline: float) -> None:
        self.transport.write(text.encode() + b"\n", deadline)

    def receive(self, deadline: float) -> list[str]:
        data = self._partial + self.transport.read(deadline)
        end = data.rfind(b"\n")
        if end < 0:
            self._partial = data
            return []
        self._partial = data[end + 1 :]
        return [line for line in data[:end].decode().split("\n") if line.strip()]


class WebSocketFraming:
    """RFC 6455 frames, client side: text messages out (masked), text messages in."""

    def __init__(self, transport: Transport, leftover: bytes) -> None:
        self.transport = transport
        self._buf = leftover
        self._fragments: list[bytes] = []

    def _frame(self, opcode: int, payload: bytes) -> bytes:
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        mask = os.urandom(4)
        if n:
            key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
            payload = (int.from_bytes(payload, "big") ^ key).to_bytes(n, "big")
        return head + mask + payload

    def send(self, text: str, deadline: float) -> None:
        self.transport.write(self._frame(0x1, text.encode()), deadline)

    def receive(self, deadline: float) -> list[str]:
        out: list[str] = []
        while not out:
            buf = self._buf + self.transport.read(deadline)
            pos, size = 0, len(buf)
            while size - pos >= 2:
                b0, b1 = buf[pos], buf[pos + 1]
                n = b1 & 0x7F
                head = 2
                if n == 126:
                    if size - pos < 4:
                        break
                    n = struct.unpack_from("!H", buf, pos + 2)[0]
                    head = 4
                elif n == 127:
                    if size - pos < 10:
                        break
                    n = struct.unpack_from("!Q", buf, pos + 2)[0]
                    head = 10
                if b1 & 0x80:
                    raise ConnectionError("the server masked a frame")
                end = pos + head + n
                if end > size:
                    break
                payload = buf[pos + head : end]
                pos = end
                opcode = b0 & 0x0F
                if opcode in (0x1, 0x2, 0x0):
                    if not b0 & 0x80:
                        self._fragments.append(payload)
                        continue
                    if self._fragments:
                        payload = b"".join([*self._fragments, payload])
                        self._fragments.clear()
                    if opcode != 0x2:  # binary frames carry no ACP message
                        out.append(payload.decode())
                elif opcode == 0x9:
                    self.transport.write(self._frame(0xA, payload), deadline)
                elif opcode == 0x8:
                    self._buf = b""
                    code = struct.unpack_from("!H", payload)[0] if len(payload) >= 2 else 1005
                    raise ConnectionEnded(f"websocket closed: {code} {payload[2:].decode()}")
            self._buf = buf[pos:]
        return out


def websocket_connect(url: str, token: str, deadline: float) -> tuple[socket.socket, bytes]:
    """Open ``ws://HOST:PORT/PATH`` with a bearer token; return the socket and bytes after 101."""
    assert url.startswith("ws://"), url
    hostport, _, path = url[len("ws://") :].partition("/")
    host, _, port = hostport.rpartition(":")
    sock = socket.create_connection(
        (host, int(port)), timeout=max(0.1, deadline - time.monotonic())
    )
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"Authorization: Bearer {token}\r\n\r\n"
    )
    sock.sendall(request.encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionEnded("closed during the websocket handshake")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0]
    if b" 101 " not in status + b" ":
        raise ConnectionError(f"websocket upgrade refused: {status.decode(errors='replace')}")
    sock.setblocking(False)
    return sock, rest


class Client:
    """
    JSON-RPC over one framing: numbered requests, an inbox of raw messages not yet looked at.

    Agent → client requests are answered with an error (the flood agent never sends any).
    """

    def __init__(self, framing: LineFraming | WebSocketFraming) -> None:
        self.framing = framing
        self._ids = iter(range(1, 1 << 62))
        self.inbox: collections.deque[str] = collections.deque()

    def send(self, msg: dict[str, Any], deadline: float) -> None:
        self.framing.send(_dumps(msg), deadline)

    def request(self, method: str, params: dict[str, Any], deadline: float) -> int:
        req_id = next(self._ids)
        self.send({"jsonrpc": "2.0", "id": req_id, "method": method, "params": params}, deadline)
        return req_id

    def next_message(self, deadline: float) -> dict[str, Any]:
        inbox = self.inbox
        while not inbox:
            inbox.extend(self.framing.receive(deadline))
        msg: dict[str, Any] = decode(inbox.popleft())
        return msg

    def wait_response(self, req_id: int, deadline: float) -> dict[str, Any]:
        """Messages until the response to ``req_id`` (others are dropped); raise on an error."""
        while True:
            msg = self.next_message(deadline)
            if msg.get("id") == req_id and "method" not in msg:
                if "error" in msg:
                    raise RuntimeError(f"request {req_id} failed: {msg['error']}")
                result: dict[str, Any] = msg["result"]
                return result

    def call(self, method: str, params: dict[str, Any], deadline: float) -> dict[str, Any]:
        return self.wait_response(self.request(method, params, deadline), deadline)

    def initialize(self, deadline: float) -> dict[str, Any]:
        return self.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}}, deadline)

    def new_session(self, cwd: str, deadline: float, *, agent: str | None = None) -> str:
        params: dict[str, Any] = {"cwd": cwd, "mcpServers": []}
        if agent is not None:
            params["_meta"] = {"acp_bridge": {"agent": agent}}
        sid: str = self.call("session/new", params, deadline)["sessionId"]
        return sid

    def flood(self, session_id: str, n: int, deadline: float) -> tuple[int, float]:
        """Prompt ``flood n``; count the session's updates until the answer: (count, seconds)."""
        start = time.perf_counter()
        req_id = self.request("session/prompt", prompt_params(session_id, n), deadline)
        count = 0
        inbox = self.inbox
        while True:
            try:
                while not inbox:
                    inbox.extend(self.framing.receive(deadline))
            except (ConnectionEnded, Timeout) as exc:
                raise type(exc)(f"{exc} (after {count:,} of {n:,} updates)") from None
            batch = list(inbox)
            inbox.clear()
            for i, text in enumerate(batch):  # the hot loop: one decode per message
                msg = decode(text)
                if msg.get("method") == "session/update":
                    if msg["params"]["sessionId"] == session_id:
                        count += 1
                elif msg.get("id") == req_id:
                    elapsed = time.perf_counter() - start
                    inbox.extend(batch[i + 1 :])
                    if "error" in msg:
                        raise RuntimeError(f"prompt failed: {msg['error']}")
                    return count, elapsed

    def set_mode_latencies(self, session_id: str, n: int, deadline: float) -> list[float]:
        """``n`` sequential ``session/set_mode`` round trips, in seconds each."""
        params = {"sessionId": session_id, "modeId": "b"}
        out = []
        for _ in range(n):
            start = time.perf_counter()
            self.call("session/set_mode", params, deadline)
            out.append(time.perf_counter() - start)
        return out


def prompt_params(session_id: str, n: int) -> dict[str, Any]:
    return {"sessionId": session_id, "prompt": [{"type": "text", "text": f"flood {n}"}]}


def pipe_client(proc: subprocess.Popen[bytes]) -> Client:
    assert proc.stdin is not None
    assert proc.stdout is not None
    return Client(LineFraming(Transport(proc.stdout.fileno(), proc.stdin.fileno())))


def websocket_client(url: str, token: str, deadline: float) -> tuple[Client, socket.socket]:
    sock, rest = websocket_connect(url, token, deadline)
    fd = sock.fileno()
    return Client(WebSocketFraming(Transport(fd, fd), rest)), sock
