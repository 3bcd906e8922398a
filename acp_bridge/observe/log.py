"""
structlog setup: one call from the command line, never at import time.

Diagnostics never go to stdout: in ``stdio`` mode stdout *is* the protocol, and one stray
line there corrupts the client's stream. They go to stderr (or a file), as JSON lines when
a program reads them and as readable console lines when a human does.

Note that structlog's own default, before :func:`configure_logging` runs, prints to stdout;
the CLI configures logging before it starts anything that logs.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Final, TextIO

import structlog

if TYPE_CHECKING:
    from structlog.typing import EventDict, FilteringBoundLogger, Processor

    from acp_bridge.observe.redact import Redactor

__all__ = ["LEVELS", "configure_logging", "get_logger", "reset_logging"]

#: The accepted ``level`` names, mapped to the numbers structlog filters on.
LEVELS: Final = {"debug": 10, "info": 20, "warning": 30, "error": 40}

_FORMATS: Final = ("auto", "json", "console")

# A file configure_logging opened itself, to close when it is reconfigured or reset.
_owned_file: TextIO | None = None


def _is_stdout(stream: TextIO) -> bool:
    if stream is sys.stdout or stream is sys.__stdout__:
        return True
    try:
        return stream.fileno() == 1
    except (OSError, ValueError, AttributeError):  # StringIO, a closed or wrapped stream
        return False


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError, AttributeError):
        return False


class _NamedWriteLogger(structlog.WriteLogger):
    """A WriteLogger that remembers the name it was asked for, like a stdlib logger."""

    def __init__(self, file: TextIO, name: str | None) -> None:
        super().__init__(file)
        self.name = name


class _NamedWriteLoggerFactory:
    """
    Like :class:`structlog.WriteLoggerFactory`, but keeps ``get_logger(name)``'s name.

    So the usual ``logger = structlog.get_logger(__name__)`` at module level names its events,
    and the name is looked up when an event is written, after configuration.
    """

    def __init__(self, file: TextIO) -> None:
        self._file = file

    def __call__(self, *args: Any) -> _NamedWriteLogger:
        name = args[0] if args and isinstance(args[0], str) else None
        return _NamedWriteLogger(self._file, name)


def _add_logger_name(logger: Any, method_name: str, event_dict: EventDict) -> EventDict:
    """Add ``logger``: the name given to ``get_logger``, unless one is bound already."""
    name = getattr(logger, "name", None)
    if name is not None:
        event_dict.setdefault("logger", name)
    return event_dict


class _RedactSecrets:
    """No registered secret (agent env, MCP headers, the daemon's token) reaches a log line."""

    __slots__ = ("_redactor",)

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor

    def __call__(self, _logger: object, _name: str, event: EventDict) -> EventDict:
        redactor = self._redactor
        if len(redactor):
            for key, value in event.items():
                if isinstance(value, str):
                    event[key] = redactor.redact(value)
                elif isinstance(value, (list, dict)):
                    event[key] = redactor.redact_json(value)
        return event


def configure_logging(
    *,
    level: str = "info",
    fmt: str = "auto",
    file: str | None = None,
    stream: TextIO | None = None,
    redactor: Redactor | None = None,
) -> None:
    """
    Configure structlog for the whole process (again, if called again).

    Every event carries ``timestamp`` (ISO 8601, UTC), ``level`` and ``event``, plus whatever
    the logger has bound, such as ``logger`` (see :func:`get_logger`).

    Args:
        level: the least severe level written: ``debug``, ``info``, ``warning`` or ``error``.
        fmt: ``json`` (one JSON object per line), ``console`` (aligned, for humans), or
            ``auto``: ``console`` when the output is a terminal, else ``json``.
        file: append to this file (opened line-buffered, UTF-8) instead of ``stream``.
        stream: where to write when ``file`` is not given; default :data:`sys.stderr`.
        redactor: the secrets to mask in every event (the bridge's, see ``observe.redact``); None
            masks nothing.

    Raises:
        ValueError: an unknown level or format, or an output that is stdout.
        OSError: ``file`` cannot be opened.
    """
    global _owned_file  # structlog's configuration is process-wide anyway

    threshold = LEVELS.get(level.lower())
    if threshold is None:
        raise ValueError(f"unknown log level {level!r}: expected one of {', '.join(LEVELS)}")
    if fmt not in _FORMATS:
        raise ValueError(f"unknown log format {fmt!r}: expected one of {', '.join(_FORMATS)}")
    out = stream if stream is not None else sys.stderr
    if file is None and _is_stdout(out):
        raise ValueError("refusing to log to stdout: it carries the protocol")

    opened = None
    if file is not None:
        # Stays open while configured; closed on reconfiguration or by reset_logging().
        opened = open(file, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
    _close_owned_file()
    if opened is not None:
        _owned_file = out = opened

    console = fmt == "console" or (fmt == "auto" and _is_tty(out))
    processors: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        _add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    if redactor is not None:
        processors.append(_RedactSecrets(redactor))
    if console:
        processors.append(structlog.dev.ConsoleRenderer(colors=_is_tty(out)))
    else:
        processors += [structlog.processors.dict_tracebacks, structlog.processors.JSONRenderer()]

    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=_NamedWriteLoggerFactory(out),
        # Not cached: a logger bound before a reconfiguration (or inside capture_logs() in
        # tests) must follow it. Per-peer loggers are concrete after bind() anyway.
        cache_logger_on_first_use=False,
    )


def _close_owned_file() -> None:
    global _owned_file
    if _owned_file is not None:
        _owned_file.close()
        _owned_file = None


def reset_logging() -> None:
    """Undo :func:`configure_logging`: structlog's defaults again, and any log file closed."""
    structlog.reset_defaults()
    _close_owned_file()


def get_logger(name: str) -> FilteringBoundLogger:
    """
    A logger whose events carry ``logger=name``; the same as ``structlog.get_logger(name)``.

    Cheap and lazy: it may be created at import time, before :func:`configure_logging`.
    """
    logger: FilteringBoundLogger = structlog.get_logger(name)
    return logger
