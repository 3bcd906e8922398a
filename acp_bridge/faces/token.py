"""
The access token of the WebSocket daemon: created, read and resolved here only. No trio.

Two kinds of file hold a token, read with different care:

- **The daemon's own file** (``websocket.token_file``, else ``token`` under
  :func:`~acp_bridge.config.model.default_state_dir`): generated when missing (256 random bits,
  URL-safe, mode 0600 in a 0700 directory, appearing complete or not at all). It is read only if
  it is a regular file, not a symbolic link, owned by us and unreadable by group and others:
  ``serve`` refuses to start otherwise, and ``status`` and ``attach`` read it with the same
  checks, so a client never sends a token the daemon would not accept.
- **A file the user names** (``--token-file``): read as given, wherever it lives.

Either way at most :data:`MAX_TOKEN_BYTES` are read and surrounding whitespace is stripped. A
token a client sends must be non-empty printable ASCII without spaces (it travels in an HTTP
header); :func:`check_token` says so before any connection.

Where a client's token comes from (:func:`resolve_token` for ``attach``, ``faces.status`` for
``status``): the named file, else (``attach``) ``--token-env`` or ``$ACP_BRIDGE_TOKEN``, else the
daemon's token; ``attach`` has no config, so that is the generated file, and only for a
loopback URL: never the local daemon's token for another machine.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import pathlib
import secrets
import stat
import urllib.parse
from typing import TYPE_CHECKING, Final

import structlog

from acp_bridge.config.model import Config, ConfigError, default_state_dir

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "MAX_TOKEN_BYTES",
    "TokenError",
    "check_token",
    "existing_token",
    "is_loopback",
    "load_or_create_token",
    "read_named_token_file",
    "resolve_token",
]

logger = structlog.get_logger("acp_bridge.ws")

#: Bytes read from a token file at most (a token is 43 characters; this is generous).
MAX_TOKEN_BYTES: Final = 4096
#: The variable ``attach`` reads when given neither --token-file nor --token-env.
TOKEN_ENV: Final = "ACP_BRIDGE_TOKEN"


class TokenError(Exception):
    """No usable token on the client side: a usage error, with what to do."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address literal, bracketed or not) is loopback only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# --------------------------------------------------------------------- the daemon's file


def load_or_create_token(config: Config) -> tuple[bytes, str | None]:
    """
    The bearer token and the file it lives in (None for an inline ``token``).

    With neither ``token`` nor ``token_file``, the file is ``token`` under
    :func:`default_state_dir`. A missing file is generated: 256 random bits, URL-safe, in a
    new file of mode 0600 (its directory created 0700) that appears complete or not at all,
    so two daemons starting at once agree on one token. An existing file is reused.

    Raises:
        ConfigError: the file is readable by group or others, not a regular file, not ours,
            empty, or cannot be read or written.
    """
    ws = config.websocket
    if ws.token is not None:
        return ws.token.encode(), None
    path, source = _token_path(config)
    try:
        token = _read_token(path)
        if token is None:
            _create_token(path)
            token = _read_token(path)
    except OSError as exc:
        raise ConfigError(source, [f"{path}: {exc.strerror or exc}"]) from None
    except _TokenFileError as exc:
        raise ConfigError(source, [str(exc)]) from None
    if token is None:  # removed again between creating and reading: not worth a retry loop
        raise ConfigError(source, [f"{path}: vanished while being created"])
    if len(token) < 16:
        logger.warning("ws_token_short", path=str(path), length=len(token))
    return token, str(path)


def existing_token(config: Config) -> tuple[bytes | None, str | None]:
    """
    The token a daemon of ``config`` uses, as :func:`load_or_create_token` finds it, and its
    file; without generating one (the token is None when the file does not exist).

    Raises:
        ConfigError: as :func:`load_or_create_token`.
    """
    ws = config.websocket
    if ws.token is not None:
        return ws.token.encode(), None
    path, source = _token_path(config)
    try:
        return _read_token(path), str(path)
    except OSError as exc:
        raise ConfigError(source, [f"{path}: {exc.strerror or exc}"]) from None
    except _TokenFileError as exc:
        raise ConfigError(source, [str(exc)]) from None


def _token_path(config: Config) -> tuple[pathlib.Path, str]:
    """The token file of ``config``, and how errors about it name it."""
    ws = config.websocket
    path = (
        pathlib.Path(ws.token_file) if ws.token_file is not None else default_state_dir() / "token"
    )
    return path, f"{config.source}: websocket.token_file" if ws.token_file else str(path)


class _TokenFileError(Exception):
    pass


def _read_token(path: pathlib.Path) -> bytes | None:
    """The token in ``path``; None if there is no such file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _TokenFileError(f"{path}: is a symbolic link; give the real file") from None
        raise
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise _TokenFileError(f"{path}: not a regular file")
        if info.st_mode & 0o077:
            raise _TokenFileError(
                f"{path}: readable by group or others (mode {stat.S_IMODE(info.st_mode):04o}); "
                f"run: chmod 600 {path}"
            )
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            raise _TokenFileError(f"{path}: owned by another user")
        token = bytes(f.read(MAX_TOKEN_BYTES)).strip()
    if not token:
        raise _TokenFileError(f"{path}: empty; delete it to have a token generated")
    return token


def _create_token(path: pathlib.Path) -> None:
    """Write a new token file atomically: a private temporary file, linked into place."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(token + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(temporary, path)  # fails if a token appeared meanwhile: that one wins
        except FileExistsError:
            return
        logger.info("ws_token_generated", path=str(path))
    finally:
        temporary.unlink(missing_ok=True)


# --------------------------------------------------------------------- the client side


def check_token(token: str, source: str) -> str:
    """
    ``token`` if a client can send it, else :class:`TokenError` naming ``source``.

    It travels as ``Authorization: Bearer TOKEN``: printable ASCII without spaces.
    """
    if not token:
        raise TokenError(f"{source}: empty")
    if not (token.isascii() and token.isprintable()) or " " in token:
        raise TokenError(f"{source}: not a token (spaces or control characters)")
    return token


def read_named_token_file(path: str) -> str:
    """
    The token in a file the user named (``--token-file``), stripped and checked.

    Raises:
        TokenError: the file cannot be read, or holds no usable token.
    """
    source = f"token file {path}"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TOKEN_BYTES)
    except OSError as exc:
        raise TokenError(f"{source}: {exc.strerror or exc}") from None
    return check_token(raw.decode("utf-8", "replace").strip(), source)


def resolve_token(
    token_file: str | None,
    token_env: str | None,
    url: str,
    *,
    environ: Mapping[str, str] | None = None,
) -> str:
    """
    ``attach``'s bearer token: from ``token_file``, else the variable ``token_env``; with
    neither, ``$ACP_BRIDGE_TOKEN``, else (for a loopback URL only) the token file a local
    ``acp-bridge serve`` generates under its state directory.

    Raises:
        TokenError: the file is missing or unreadable (or, for the generated one, not private),
            the variable unset, the token empty or not fit for an HTTP header.
    """
    env = os.environ if environ is None else environ
    if token_file is not None:
        return read_named_token_file(token_file)
    if token_env is not None:
        return check_token(env.get(token_env, "").strip(), f"environment variable {token_env}")
    if env.get(TOKEN_ENV, "").strip():
        return check_token(env[TOKEN_ENV].strip(), f"environment variable {TOKEN_ENV}")
    host = urllib.parse.urlsplit(url).hostname or ""
    found: bytes | None = None
    path: str | None = None
    if is_loopback(host):
        try:
            found, path = existing_token(Config(agents={}))
        except ConfigError as exc:
            raise TokenError(str(exc)) from None
    if found is None:
        raise TokenError(
            "no token: give --token-file FILE or --token-env VAR "
            "(`acp-bridge serve` prints where its token is)"
        )
    return check_token(found.decode("utf-8", "replace"), f"token file {path}")
