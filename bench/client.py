"""
A minimal ACP v1 client for the benchmark: NDJSON over pipes, JSON text frames over a
WebSocket it speaks itself (RFC 6455 over a plain socket: handshake, masked sends, unmasked
receives, ping → pong), or ACP over HTTP (POSTs on a kept connection, server-sent events on
GET streams), with blocking I/O and no event loop.

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

    def __init__(self, framing: LineFraming | WebSocketFraming | HttpFraming) -> None:
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


# --- ACP over HTTP (POST, and server-sent events on GET) ------------------------------------


class _ChunkedBody:
    """A chunked HTTP body decoded as it arrives (Node's servers send their streams so)."""

    def __init__(self) -> None:
        self._raw = b""
        self._left = 0  # payload bytes of the current chunk still to come
        self._crlf = False  # the CRLF after a chunk's payload is next
        self.done = False

    def feed(self, data: bytes) -> bytes:
        raw = self._raw + data
        out = []
        pos = 0
        while pos < len(raw) and not self.done:
            if self._left:
                take = min(self._left, len(raw) - pos)
                out.append(raw[pos : pos + take])
                pos += take
                self._left -= take
                self._crlf = not self._left
                continue
            end = raw.find(b"\r\n", pos)
            if end < 0:
                break
            line = raw[pos:end]
            pos = end + 2
            if self._crlf:
                self._crlf = False
                continue
            size = int(line.split(b";", 1)[0], 16)
            if size == 0:
                self.done = True
            self._left = size
        self._raw = raw[pos:]
        return b"".join(out)


def _read_head(sock: socket.socket, deadline: float) -> tuple[int, dict[str, str], bytes]:
    """A response's status and headers (lower-case names), and the bytes read past them."""
    data = b""
    while b"\r\n\r\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            raise Timeout("no response head in time")
        chunk = sock.recv(READ_SIZE)
        if not chunk:
            raise ConnectionEnded("closed before a response head")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split(" ", 2)[1]), headers, rest


class HttpFraming:
    """
    ACP over HTTP as the SDKs' clients speak it: ``initialize`` POSTed (its answer in the
    body), every other message POSTed with ``Acp-Connection-Id`` (and ``Acp-Session-Id`` when
    it names a session, whose stream is opened first, as the TypeScript SDK does), messages
    received from server-sent-event streams (the connection's and each session's).
    """

    def __init__(self, url: str, token: str) -> None:
        assert url.startswith("http://"), url
        hostport, _, path = url[len("http://") :].partition("/")
        host, _, port = hostport.rpartition(":")
        self._address = (host, int(port))
        self._hostport = hostport
        self._path = "/" + path
        self._token = token
        self._post: socket.socket | None = None
        self._connection_id: str | None = None
        #: open streams: socket → (its body decoder or None for a raw one, its event buffer)
        self._streams: dict[socket.socket, tuple[_ChunkedBody | None, bytearray]] = {}
        self._sessions: set[str] = set()
        self._early: list[str] = []

    def _connect(self, deadline: float) -> socket.socket:
        sock = socket.create_connection(
            self._address, timeout=max(0.1, deadline - time.monotonic())
        )
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _request(self, method: str, headers: dict[str, str], body: bytes = b"") -> bytes:
        lines = [f"{method} {self._path} HTTP/1.1", f"Host: {self._hostport}"]
        lines.append(f"Authorization: Bearer {self._token}")
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if method != "GET":
            lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body

    def _post_message(self, text: str, headers: dict[str, str], deadline: float) -> bytes:
        """POST one message on the kept connection; the answer's body."""
        for attempt in (1, 2):
            if self._post is None:
                self._post = self._connect(deadline)
            sock = self._post
            try:
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                request_headers = {"Content-Type": "application/json", **headers}
                sock.sendall(self._request("POST", request_headers, text.encode()))
                status, head, rest = _read_head(sock, deadline)
            except (ConnectionEnded, OSError):
                sock.close()
                self._post = None
                if attempt == 2:
                    raise
                continue  # (a kept connection the server had closed: once more on a new one)
            body = self._read_body(sock, head, rest, deadline)
            if head.get("connection", "").lower() == "close":
                sock.close()
                self._post = None
            if status not in (200, 202):
                raise ConnectionError(f"POST answered {status}: {body[:200]!r}")
            if self._connection_id is None:
                self._connection_id = head.get("acp-connection-id")
            return body
        raise AssertionError("unreachable")

    def _read_body(
        self, sock: socket.socket, head: dict[str, str], rest: bytes, deadline: float
    ) -> bytes:
        if "chunked" in head.get("transfer-encoding", "").lower():
            decoder = _ChunkedBody()
            out = decoder.feed(rest)
            while not decoder.done:
                out += decoder.feed(self._recv(sock, deadline))
            return out
        length = int(head.get("content-length", "0"))
        while len(rest) < length:
            rest += self._recv(sock, deadline)
        return rest[:length]

    @staticmethod
    def _recv(sock: socket.socket, deadline: float) -> bytes:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            raise Timeout("read timed out")
        data = sock.recv(READ_SIZE)
        if not data:
            raise ConnectionEnded("end of stream")
        return data

    def _open_stream(self, session: str | None, deadline: float) -> None:
        assert self._connection_id is not None
        headers = {"Accept": "text/event-stream", "Acp-Connection-Id": self._connection_id}
        if session is not None:
            headers["Acp-Session-Id"] = session
        sock = self._connect(deadline)
        sock.sendall(self._request("GET", headers))
        status, head, rest = _read_head(sock, deadline)
        if status != 200:
            raise ConnectionError(f"GET of a stream answered {status}")
        chunked = "chunked" in head.get("transfer-encoding", "").lower()
        decoder = _ChunkedBody() if chunked else None
        self._streams[sock] = (decoder, bytearray())
        sock.setblocking(False)
        if rest:
            self._take(sock, rest)

    def send(self, text: str, deadline: float) -> None:
        msg = json.loads(text)
        if msg.get("method") == "initialize":
            self._early.append(self._post_message(text, {}, deadline).decode())
            self._open_stream(None, deadline)
            return
        assert self._connection_id is not None
        headers = {"Acp-Connection-Id": self._connection_id}
        params = msg.get("params")
        session = params.get("sessionId") if isinstance(params, dict) else None
        if isinstance(session, str):
            if session not in self._sessions:
                self._sessions.add(session)
                self._open_stream(session, deadline)
            headers["Acp-Session-Id"] = session
        self._post_message(text, headers, deadline)

    def _take(self, sock: socket.socket, data: bytes) -> None:
        decoder, buffer = self._streams[sock]
        buffer += decoder.feed(data) if decoder is not None else data

    def receive(self, deadline: float) -> list[str]:
        out, self._early = self._early, []
        while not out:
            left = deadline - time.monotonic()
            readable = select.select(list(self._streams), [], [], max(left, 0))[0]
            if not readable:
                raise Timeout("read timed out")
            for sock in readable:
                try:
                    data = sock.recv(READ_SIZE)
                except BlockingIOError:
                    continue
                if not data:
                    raise ConnectionEnded("a stream ended")
                self._take(sock, data)
                out += _events(self._streams[sock][1])
        return out

    def close(self) -> None:
        for sock in [*self._streams, *([self._post] if self._post else [])]:
            sock.close()
        self._streams.clear()
        self._post = None


def _events(buffer: bytearray) -> list[str]:
    """The data of each whole event in ``buffer`` (taken out of it); comments dropped."""
    end = buffer.rfind(b"\n\n")
    if end < 0:
        return []
    blocks = bytes(buffer[:end]).split(b"\n\n")
    del buffer[: end + 2]
    out = []
    for block in blocks:
        start = 0 if block.startswith(b"data: ") else block.find(b"\ndata: ") + 1
        if start or block.startswith(b"data: "):
            out.append(block[start + 6 :].decode())
    return out


def http_client(url: str, token: str) -> tuple[Client, HttpFraming]:
    framing = HttpFraming(url, token)
    return Client(framing), framing
