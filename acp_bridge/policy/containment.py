"""
File containment: the paths an agent's ``fs/*`` calls may touch.

No trio, and no file is ever opened here: paths are resolved with :func:`os.path.realpath`
and checked with :func:`os.lstat`. :func:`contain` returns the fully resolved path, and the
caller forwards *that* to the client instead of the agent's path, so the client touches
exactly the file that was checked (short of a symlink swapped in between, which only
something already able to write inside the roots can do).

The deny-list is made of globs (:func:`acp_bridge.policy.rules.compile_glob`) matched against the
components of the absolute path, anywhere (not only below a root: a session whose cwd is
``ROOT/.git`` must not read ``ROOT/.git/config``), ignoring case (a case-insensitive file
system opens ``.ENV`` for ``.env``). A pattern without ``/`` matches any one component, so
``.env*`` denies ``a/.env.local`` and a directory pattern such as ``secrets`` denies
everything below it; a pattern with ``/`` matches any run of the path's trailing components,
so ``.git/config`` denies ``sub/.git/config`` too. Both the path as the agent wrote it (with
``..`` folded away) and the resolved one are checked, so neither a symlink to a denied file
nor a denied name that is a symlink gets through. :func:`denied` applies the same list to
paths the bridge does not open itself (a permission request's locations).
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
from typing import TYPE_CHECKING

from acp_bridge.policy.rules import compile_glob

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

__all__ = ["PathRefused", "contain", "denied", "resolve_roots"]


class PathRefused(Exception):
    """
    A path an agent may not use; the message names the path and why.

    Attributes:
        path: the path as given (any type: it came from the agent).
        reason: ``not_absolute``, ``nul_byte``, ``outside_roots``, ``denied`` or
            ``unresolvable``.
    """

    def __init__(self, path: object, reason: str, detail: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path!r}: {detail}")


def contain(path: object, roots: Sequence[str], deny: Sequence[str]) -> str:
    """
    Check that ``path`` is a file the agent may touch, and return it fully resolved.

    Args:
        path: from the agent's request; anything but an absolute string is refused.
        roots: the session's ``[cwd, *additionalDirectories]``; they are resolved too, and
            ones that are not absolute strings are ignored (so they contain nothing).
        deny: deny-list globs (see the module docs); they come from the configuration.

    Returns:
        The path with every symlink, ``.``, ``..`` and repeated ``/`` resolved. Its last
        components may not exist yet (a file about to be written), but no part of it that
        exists is a symlink.

    Raises:
        PathRefused: with ``reason`` ``not_absolute`` (not a string, empty, relative, ``~``),
            ``nul_byte``, ``outside_roots`` (also a dangling symlink pointing out),
            ``unresolvable`` (a symlink loop, a component that cannot be examined) or
            ``denied`` (a deny-list hit).
    """
    if not isinstance(path, str):
        raise PathRefused(path, "not_absolute", f"expected an absolute path, not {_a(path)}")
    if "\0" in path:
        raise PathRefused(path, "nul_byte", "contains a NUL byte")
    if not path.startswith("/"):
        raise PathRefused(path, "not_absolute", "expected an absolute path")
    resolved = _resolve(path)
    if resolved is None:
        raise PathRefused(path, "unresolvable", "cannot be resolved (a symlink loop?)")
    if not any(_within(resolved, root) for root in resolve_roots(roots)):
        raise PathRefused(path, "outside_roots", "outside the session roots")
    # What the agent wrote counts as much as where it leads: check both names.
    for candidate in (resolved, posixpath.normpath(path)):
        pattern = _denied(candidate, deny)
        if pattern is not None:
            raise PathRefused(path, "denied", f"matches the deny-list pattern {pattern!r}")
    return resolved


def denied(path: str, deny: Sequence[str], cwd: str | None = None) -> str | None:
    """
    The deny-list pattern ``path`` hits as written, with ``..`` folded away, or resolved
    (symlinks followed); ``None`` when it hits none.

    For paths the bridge only passes judgement on (a permission request's locations, which
    the agent may go on to open itself): nothing is refused here for lying outside the roots
    or for not resolving, and a match on any of the three forms counts. A relative path is
    resolved against ``cwd`` (when given).
    """
    candidates = [path, posixpath.normpath(path)]
    absolute = path if path.startswith("/") or cwd is None else posixpath.join(cwd, path)
    if absolute.startswith("/") and "\0" not in absolute:
        # (3.11's realpath recurses per symlink; what was written is checked all the same)
        with contextlib.suppress(OSError, ValueError, RecursionError):
            candidates.append(os.path.realpath(absolute))
    for candidate in candidates:
        pattern = _denied(candidate, deny)
        if pattern is not None:
            return pattern
    return None


def resolve_roots(roots: Sequence[str]) -> list[str]:
    """
    The roots, resolved, that can contain anything.

    A root that is not an absolute string, or that cannot be resolved, is left out.
    """
    out: list[str] = []
    for root in _absolute(roots):
        real = _resolve(root)
        if real is not None:
            out.append(real)
    return out


def _absolute(roots: Sequence[str]) -> Iterator[str]:
    for root in roots:
        if isinstance(root, str) and root.startswith("/") and "\0" not in root:
            yield root


def _a(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _resolve(path: str) -> str | None:
    """
    ``realpath``, checked: ``None`` unless every existing part of the result is no symlink.

    Non-strict ``realpath`` leaves a symlink loop in place instead of raising, and a path
    under a component that cannot be examined is not known to stay where it seems to.
    """
    try:
        resolved = os.path.realpath(path)
    except (OSError, ValueError, RecursionError):  # 3.11's realpath recurses per symlink
        return None
    prefix = ""
    for part in resolved.split("/")[1:]:
        prefix = f"{prefix}/{part}"
        try:
            mode = os.lstat(prefix).st_mode
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                break  # nothing there yet (a file to be written), or under a plain file
            return None
        if stat.S_ISLNK(mode):
            return None
    return resolved


def _within(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or below it, by components (``/ws2`` is not in ``/ws``)."""
    try:
        return posixpath.commonpath([path, root]) == root
    except ValueError:
        return False


def _denied(path: str, deny: Sequence[str]) -> str | None:
    """The first deny-list pattern that ``path``'s components match (see the module docs)."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    for raw in deny:
        pattern = raw.strip("/")
        if not pattern:
            continue
        regex = compile_glob(pattern, ignore_case=True)
        candidates: Iterator[str]
        if "/" in pattern:
            candidates = ("/".join(parts[i:]) for i in range(len(parts)))
        else:
            candidates = iter(parts)
        if any(regex.match(candidate) for candidate in candidates):
            return raw
    return None
