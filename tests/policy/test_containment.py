"""File containment: a corpus of hostile paths over a real tree, and zero accesses outside."""

from __future__ import annotations

import builtins
import io
import os

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_bridge.policy.containment import PathRefused, contain, denied, resolve_roots
from acp_bridge.policy.rules import DEFAULT_DENY_PATHS

# ----------------------------------------------------------------------------- the tree
#
# {tmp}/ws and {tmp}/extra are the session roots. {tmp}/ws2, {tmp}/ws-evil and
# {tmp}/outside hold the canaries, which no allowed path may ever lead to.

FILES = [
    "ws/file.txt",
    "ws/a/file.txt",
    "ws/a/b/c.txt",
    "ws/a/.env.local",
    "ws/sub/.git/config",
    "ws/.git/config",
    "ws/.git/HEAD",
    "ws/.env",
    "ws/.env.prod",
    "ws/.environment",
    "ws/env",
    "ws/key.pem",
    "ws/id.key",
    "ws/KEY.PEM",
    "ws/notes.pem.txt",
    "ws/keypem",
    "ws/config",
    "ws/.gitignore",
    "ws/ünïcode/ñ.txt",
    "ws/日本語.txt",
    "ws/sp ace.txt",
    "extra/e.txt",
    "extra/.env",
    "ws2/canary.txt",
    "ws-evil/canary.txt",
    "outside/canary.txt",
    "outside/sub/x.txt",
]

CANARIES = ["ws2/canary.txt", "ws-evil/canary.txt", "outside/canary.txt", "outside/sub/x.txt"]

# (link, target): relative targets are relative to the link's directory; "{tmp}" is absolute.
LINKS = [
    ("ws/out_file", "../outside/canary.txt"),
    ("ws/out_file_abs", "{tmp}/outside/canary.txt"),
    ("ws/out_dir", "../outside"),
    ("ws/ws2_dir", "../ws2"),
    ("ws/chain1", "chain2"),
    ("ws/chain2", "chain3"),
    ("ws/chain3", "../outside/canary.txt"),
    ("ws/in_chain1", "in_chain2"),
    ("ws/in_chain2", "a/b/c.txt"),
    ("ws/loop_a", "loop_b"),
    ("ws/loop_b", "loop_a"),
    ("ws/self", "self"),
    ("ws/into_loop", "loop_a"),
    ("ws/dangling_out", "../outside/nope.txt"),
    ("ws/dangling_out_abs", "{tmp}/outside/newdir/new.txt"),
    ("ws/dangling_in", "new-target.txt"),
    ("ws/dangling_in_dir", "a/newfile.txt"),
    ("ws/to_extra", "../extra/e.txt"),
    ("ws/link_to_env", ".env"),
    ("ws/link_to_gitconfig", ".git/config"),
    ("ws/.env.alias", "file.txt"),
    ("ws/dir_in", "a"),
    ("ws/dir_up", ".."),
    ("ws/wsself", "."),
    ("ws/root_link", "/"),
    ("ws/a/up2", "../../outside"),
    ("ws/a/parentlink", ".."),
    ("extra/back", "../ws/file.txt"),
    ("ws_link", "ws"),
]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """The real tree, built once; its paths are fully resolved (tmp may sit under a link)."""
    tmp = os.path.realpath(tmp_path_factory.mktemp("containment"))
    for name in FILES:
        path = os.path.join(tmp, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(name)
    for link, target in LINKS:
        os.symlink(target.replace("{tmp}", tmp), os.path.join(tmp, link))
    return tmp


def roots_of(tmp: str) -> list[str]:
    return [f"{tmp}/ws", f"{tmp}/extra"]


# ----------------------------------------------------------------------------- the corpus


@attrs.frozen
class Allowed:
    """The path is allowed and resolves to ``resolved`` (a template)."""

    resolved: str


@attrs.frozen
class Case:
    id: str
    path: object  # a template when it is a string: {tmp}, {ws}, {extra}
    expect: Allowed | str  # or the refusal reason


def fill(template: str, tmp: str) -> str:
    return (
        template.replace("{ws}", f"{tmp}/ws")
        .replace("{extra}", f"{tmp}/extra")
        .replace("{tmp}", tmp)
    )


def ok(resolved: str) -> Allowed:
    return Allowed(resolved)


OUT = "outside_roots"
LOOP = "unresolvable"
REL = "not_absolute"
NUL = "nul_byte"
DENY = "denied"

CASES = [
    # --- plain paths inside, and lexical noise that stays inside
    Case("plain", "{ws}/file.txt", ok("{ws}/file.txt")),
    Case("nested", "{ws}/a/b/c.txt", ok("{ws}/a/b/c.txt")),
    Case("dotdot-back-in", "{ws}/a/../file.txt", ok("{ws}/file.txt")),
    Case("dots-and-dotdots", "{ws}/./a/./b/../b/c.txt", ok("{ws}/a/b/c.txt")),
    Case("double-slashes", "{ws}//a//b//c.txt", ok("{ws}/a/b/c.txt")),
    Case("leading-double-slash", "/{ws}/file.txt", ok("{ws}/file.txt")),
    Case("triple-slash", "//{ws}///file.txt", ok("{ws}/file.txt")),
    Case("trailing-slash-dir", "{ws}/a/", ok("{ws}/a")),
    Case("root-itself", "{ws}", ok("{ws}")),
    Case("root-trailing-slash", "{ws}/", ok("{ws}")),
    Case("root-dot", "{ws}/.", ok("{ws}")),
    Case("new-file", "{ws}/new.txt", ok("{ws}/new.txt")),
    Case("new-file-new-dir", "{ws}/newdir/new.txt", ok("{ws}/newdir/new.txt")),
    Case("missing-dir-dotdot", "{ws}/a/newdir/../file.txt", ok("{ws}/a/file.txt")),
    Case("up-and-down", "{ws}/a/b/../../a/b/c.txt", ok("{ws}/a/b/c.txt")),
    Case("out-and-back", "{ws}/../ws/file.txt", ok("{ws}/file.txt")),
    Case("extra-to-ws", "{extra}/../ws/a/b/c.txt", ok("{ws}/a/b/c.txt")),
    Case("dotdot-after-file", "{ws}/file.txt/..", ok("{ws}")),
    Case("under-a-file", "{ws}/file.txt/x", ok("{ws}/file.txt/x")),
    Case("dir", "{ws}/a/b", ok("{ws}/a/b")),
    Case("named-ws2-inside", "{ws}/ws2", ok("{ws}/ws2")),
    Case("tilde-name-inside", "{ws}/~", ok("{ws}/~")),
    Case("tilde-dir-inside", "{ws}/~/x", ok("{ws}/~/x")),
    Case("unicode", "{ws}/ünïcode/ñ.txt", ok("{ws}/ünïcode/ñ.txt")),
    Case("cjk", "{ws}/日本語.txt", ok("{ws}/日本語.txt")),
    Case("space", "{ws}/sp ace.txt", ok("{ws}/sp ace.txt")),
    Case("newline-name", "{ws}/new\nline.txt", ok("{ws}/new\nline.txt")),
    Case("second-root", "{extra}/e.txt", ok("{extra}/e.txt")),
    # --- symlinks that stay inside
    Case("chain-inside", "{ws}/in_chain1", ok("{ws}/a/b/c.txt")),
    Case("dir-link-inside", "{ws}/dir_in/b/c.txt", ok("{ws}/a/b/c.txt")),
    Case("dangling-inside", "{ws}/dangling_in", ok("{ws}/new-target.txt")),
    Case("dangling-inside-dir", "{ws}/dangling_in_dir", ok("{ws}/a/newfile.txt")),
    Case("link-to-other-root", "{ws}/to_extra", ok("{extra}/e.txt")),
    Case("other-root-link-back", "{extra}/back", ok("{ws}/file.txt")),
    Case("self-dir-link", "{ws}/wsself/file.txt", ok("{ws}/file.txt")),
    Case("up-link-back-in", "{ws}/dir_up/ws/file.txt", ok("{ws}/file.txt")),
    Case("up-link-to-other-root", "{ws}/dir_up/extra/e.txt", ok("{extra}/e.txt")),
    Case("parent-link-back-in", "{ws}/a/parentlink/file.txt", ok("{ws}/file.txt")),
    Case("root-link-back-in", "{ws}/root_link{ws}/file.txt", ok("{ws}/file.txt")),
    # --- near misses of the deny-list, which must pass
    Case("env-no-dot", "{ws}/env", ok("{ws}/env")),
    Case("environment-no-dot", "{ws}/environment", ok("{ws}/environment")),
    Case("dot-env-suffix-only", "{ws}/a.env", ok("{ws}/a.env")),
    Case("pem-infix", "{ws}/notes.pem.txt", ok("{ws}/notes.pem.txt")),
    Case("pem-no-dot", "{ws}/keypem", ok("{ws}/keypem")),
    Case("key-backup", "{ws}/x.key.bak", ok("{ws}/x.key.bak")),
    Case("config-not-in-git", "{ws}/config", ok("{ws}/config")),
    Case("config-in-a", "{ws}/a/config", ok("{ws}/a/config")),
    Case("git-without-dot", "{ws}/git/config", ok("{ws}/git/config")),
    Case("gitx-config", "{ws}/.gitx/config", ok("{ws}/.gitx/config")),
    Case("git-head", "{ws}/.git/HEAD", ok("{ws}/.git/HEAD")),
    Case("git-dir", "{ws}/.git", ok("{ws}/.git")),
    Case("gitignore", "{ws}/.gitignore", ok("{ws}/.gitignore")),
    Case("git-config-dir-child", "{ws}/.git/config.d", ok("{ws}/.git/config.d")),
    # --- the deny-list
    Case("env", "{ws}/.env", DENY),
    Case("env-prod", "{ws}/.env.prod", DENY),
    Case("env-nested", "{ws}/a/.env.local", DENY),
    Case("environment-matches-glob", "{ws}/.environment", DENY),  # `.env*` says so
    Case("pem", "{ws}/key.pem", DENY),
    Case("key", "{ws}/id.key", DENY),
    Case("pem-upper-case", "{ws}/KEY.PEM", DENY),
    Case("env-upper-case-new", "{ws}/.ENV", DENY),
    Case("bare-pem", "{ws}/.pem", DENY),
    Case("new-pem", "{ws}/new.pem", DENY),
    Case("git-config", "{ws}/.git/config", DENY),
    Case("git-config-nested", "{ws}/sub/.git/config", DENY),
    Case("git-config-upper", "{ws}/.GIT/CONFIG", DENY),
    Case("link-to-env", "{ws}/link_to_env", DENY),
    Case("link-to-git-config", "{ws}/link_to_gitconfig", DENY),
    Case("env-named-link", "{ws}/.env.alias", DENY),
    Case("env-named-link-double-slash", "/{ws}/.env.alias", DENY),
    Case("env-named-link-dotdot", "{ws}/a/../.env.alias", DENY),
    Case("env-via-dotdot", "{ws}/a/../.env", DENY),
    Case("env-double-slash", "{ws}//.env", DENY),
    Case("env-dot", "{ws}/./.env", DENY),
    Case("env-dir-child", "{ws}/.env/x", DENY),
    Case("env-d-dir", "{ws}/.env.d/conf", DENY),
    Case("env-in-other-root", "{extra}/.env", DENY),
    Case("env-via-dir-link", "{ws}/dir_in/.env.local", DENY),
    Case("git-config-via-self-link", "{ws}/wsself/.git/config", DENY),
    # --- `..` and sibling prefixes that leave the roots
    Case("sibling-ws2", "{tmp}/ws2/canary.txt", OUT),
    Case("sibling-ws-evil", "{tmp}/ws-evil/canary.txt", OUT),
    Case("outside", "{tmp}/outside/canary.txt", OUT),
    Case("prefix-ws2", "{ws}2/canary.txt", OUT),
    Case("prefix-ws2-dir", "{ws}2", OUT),
    Case("prefix-ws-evil", "{ws}-evil/canary.txt", OUT),
    Case("prefix-extra2", "{extra}2/x", OUT),
    Case("dotdot-sibling", "{ws}/../ws2/canary.txt", OUT),
    Case("dotdot-sibling-dir", "{ws}/../ws2", OUT),
    Case("dotdot-evil", "{ws}/../ws-evil/canary.txt", OUT),
    Case("dotdot-two", "{ws}/a/../../outside/canary.txt", OUT),
    Case("dotdot-three", "{ws}/a/b/../../../outside/canary.txt", OUT),
    Case("dots-to-parent", "{ws}/./a/./../..", OUT),
    Case("dots-to-outside", "{ws}/./a/./../../outside/canary.txt", OUT),
    Case("dotdot-root", "{ws}/..", OUT),
    Case("dotdot-many", "{ws}" + "/.." * 40 + "/etc/passwd", OUT),
    Case("dotdot-after-file-out", "{ws}/a/b/c.txt/../../../../ws2/canary.txt", OUT),
    Case("dotdot-missing-out", "{ws}/missing/../../outside/canary.txt", OUT),
    Case("dotdot-from-extra", "{extra}/../outside/canary.txt", OUT),
    Case("tmp", "{tmp}", OUT),
    Case("slash", "/", OUT),
    Case("etc-passwd", "/etc/passwd", OUT),
    Case("new-file-outside", "{tmp}/outside/new.txt", OUT),
    # --- symlinks that leave the roots
    Case("link-file-relative", "{ws}/out_file", OUT),
    Case("link-file-absolute", "{ws}/out_file_abs", OUT),
    Case("link-dir", "{ws}/out_dir", OUT),
    Case("link-dir-file", "{ws}/out_dir/canary.txt", OUT),
    Case("link-dir-dotdot", "{ws}/out_dir/sub/../canary.txt", OUT),
    Case("link-dir-new-file", "{ws}/out_dir/newfile.txt", OUT),
    Case("link-dir-new-dir", "{ws}/out_dir/newdir/newfile.txt", OUT),
    Case("link-sibling-dir", "{ws}/ws2_dir", OUT),
    Case("link-sibling-file", "{ws}/ws2_dir/canary.txt", OUT),
    Case("link-sibling-dotdot", "{ws}/ws2_dir/../file.txt", OUT),
    Case("chain-out", "{ws}/chain1", OUT),
    Case("chain-middle-out", "{ws}/chain2", OUT),
    Case("chain-out-dotdot", "{ws}/chain2/..", OUT),
    Case("dangling-out", "{ws}/dangling_out", OUT),
    Case("dangling-out-abs", "{ws}/dangling_out_abs", OUT),
    Case("dangling-out-child", "{ws}/dangling_out/x", OUT),
    Case("nested-link-up", "{ws}/a/up2/canary.txt", OUT),
    Case("parent-link-dotdot", "{ws}/a/parentlink/../outside/canary.txt", OUT),
    Case("self-link-dotdot", "{ws}/wsself/../outside/canary.txt", OUT),
    Case("up-link-outside", "{ws}/dir_up/outside/canary.txt", OUT),
    Case("up-link-sibling", "{ws}/dir_up/ws2/canary.txt", OUT),
    Case("root-link", "{ws}/root_link/etc/passwd", OUT),
    Case("root-link-sibling", "{ws}/root_link{tmp}/ws2/canary.txt", OUT),
    Case("dir-link-dotdot-out", "{ws}/dir_in/../../outside/canary.txt", OUT),
    # --- loops
    Case("loop-a", "{ws}/loop_a", LOOP),
    Case("loop-b", "{ws}/loop_b", LOOP),
    Case("self-loop", "{ws}/self", LOOP),
    Case("into-loop", "{ws}/into_loop", LOOP),
    Case("loop-child", "{ws}/loop_a/x", LOOP),
    Case("self-loop-children", "{ws}/self/x/y", LOOP),
    Case("loop-via-dir-link", "{ws}/dir_in/../loop_a", LOOP),
    Case("missing-then-loop", "{ws}/missing/../loop_a/x", LOOP),
    # --- not absolute: relative, empty, `~`, and not strings at all
    Case("empty", "", REL),
    Case("relative", "file.txt", REL),
    Case("relative-dir", "ws/file.txt", REL),
    Case("dot-relative", "./file.txt", REL),
    Case("dotdot-relative", "../outside/canary.txt", REL),
    Case("tilde", "~", REL),
    Case("tilde-path", "~/file.txt", REL),
    Case("tilde-user", "~root/x", REL),
    Case("leading-space", " {ws}/file.txt", REL),
    Case("backslashes", "\\tmp\\ws\\file.txt", REL),
    Case("drive-letter", "C:/ws/file.txt", REL),
    Case("file-url", "file://{ws}/file.txt", REL),
    Case("none", None, REL),
    Case("int", 5, REL),
    Case("zero", 0, REL),
    Case("float", 1.5, REL),
    Case("bool", True, REL),
    Case("list", ["/etc/passwd"], REL),
    Case("empty-list", [], REL),
    Case("dict", {"path": "/etc/passwd"}, REL),
    Case("bytes", b"/etc/passwd", REL),
    # --- NUL bytes
    Case("nul-end", "{ws}/file.txt\0", NUL),
    Case("nul-middle", "{ws}/\0/../../outside/canary.txt", NUL),
    Case("nul-only", "\0", NUL),
    Case("nul-extension", "{ws}/file.txt\0.pem", NUL),
    Case("nul-relative", "relative\0", NUL),
]


def run(case: Case, tmp: str) -> tuple[str | None, PathRefused | None, object]:
    path = fill(case.path, tmp) if isinstance(case.path, str) else case.path
    try:
        return contain(path, roots_of(tmp), DEFAULT_DENY_PATHS), None, path
    except PathRefused as exc:
        return None, exc, path


def test_corpus_has_at_least_100_cases():
    assert len(CASES) >= 100
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_corpus(tree, case):
    """Each path is allowed as exactly the file declared, or refused for the declared reason."""
    resolved, refused, path = run(case, tree)
    if isinstance(case.expect, Allowed):
        assert refused is None, f"refused: {refused}"
        assert resolved == fill(case.expect.resolved, tree)
    else:
        assert resolved is None, f"allowed as {resolved!r}"
        assert refused is not None
        assert refused.reason == case.expect
        assert refused.path is path
        assert str(refused).startswith(repr(path))


def identity(path: str) -> tuple[int, int]:
    st_ = os.stat(path)
    return st_.st_dev, st_.st_ino


def test_zero_accesses_outside_the_roots(tree, monkeypatch):
    """
    No allowed path leads outside: a client opening what contain() returns never meets a canary.

    contain() itself opens nothing (open is booby-trapped while it runs); then every allowed
    result is a real path (no symlink left), lies inside a root, and, opened the way a
    client would, is never one of the canaries.
    """
    canaries = {identity(f"{tree}/{name}") for name in CANARIES}
    before = {name: os.stat(f"{tree}/{name}").st_atime_ns for name in CANARIES}

    def no_open(*args, **kwargs):
        raise AssertionError(f"contain() opened a file: {args!r}")

    with monkeypatch.context() as m:
        m.setattr(builtins, "open", no_open)
        m.setattr(io, "open", no_open)
        m.setattr(os, "open", no_open)
        results = [run(case, tree) for case in CASES]

    roots = resolve_roots(roots_of(tree))
    opened: set[tuple[int, int]] = set()
    for resolved, _, _ in results:
        if resolved is None:
            continue
        assert os.path.realpath(resolved) == resolved
        assert any(os.path.commonpath([resolved, root]) == root for root in roots)
        if os.path.isfile(resolved):
            with open(resolved, "rb") as f:
                st_ = os.fstat(f.fileno())
                opened.add((st_.st_dev, st_.st_ino))
                f.read()
    assert opened, "the corpus opens some files"
    assert not opened & canaries
    after = {name: os.stat(f"{tree}/{name}").st_atime_ns for name in CANARIES}
    assert after == before


# ----------------------------------------------------------------------------- roots


def test_a_root_that_is_a_symlink_is_resolved(tree):
    """A root reached through a symlink contains what its target contains."""
    roots = [f"{tree}/ws_link"]
    assert contain(f"{tree}/ws_link/a/file.txt", roots, ()) == f"{tree}/ws/a/file.txt"
    assert contain(f"{tree}/ws/a/file.txt", roots, ()) == f"{tree}/ws/a/file.txt"
    with pytest.raises(PathRefused) as info:
        contain(f"{tree}/ws_link/../outside/canary.txt", roots, ())
    assert info.value.reason == "outside_roots"
    with pytest.raises(PathRefused) as info:
        contain(f"{tree}/ws_link/.env", roots, DEFAULT_DENY_PATHS)
    assert info.value.reason == "denied"


@pytest.mark.parametrize(
    "roots",
    [
        pytest.param([], id="none"),
        pytest.param(["ws"], id="relative"),
        pytest.param([""], id="empty"),
        pytest.param([None, 5], id="not-strings"),
        pytest.param(["{tmp}/ws\0"], id="nul"),
        pytest.param(["{tmp}/ws/loop_a"], id="loop"),
        pytest.param(["{tmp}/ws2"], id="sibling"),
    ],
)
def test_unusable_roots_contain_nothing(tree, roots):
    """Roots that are not absolute, resolvable strings are ignored: nothing is inside them."""
    roots = [fill(root, tree) if isinstance(root, str) else root for root in roots]
    with pytest.raises(PathRefused) as info:
        contain(f"{tree}/ws/file.txt", roots, ())
    assert info.value.reason == "outside_roots"


def test_resolve_roots_keeps_only_usable_roots(tree):
    assert resolve_roots([f"{tree}/ws_link", "rel", f"{tree}/ws/self", f"{tree}/extra/"]) == [
        f"{tree}/ws",
        f"{tree}/extra",
    ]


def test_nested_roots_deny_by_the_outermost_relative_path(tree):
    """With /ws and /ws/sub both roots, sub/.git/config is still denied from either."""
    roots = [f"{tree}/ws/sub", f"{tree}/ws"]
    with pytest.raises(PathRefused) as info:
        contain(f"{tree}/ws/sub/.git/config", roots, DEFAULT_DENY_PATHS)
    assert info.value.reason == "denied"


def test_filesystem_root_as_root_still_applies_the_deny_list(tree):
    assert contain(f"{tree}/outside/canary.txt", ["/"], ()) == f"{tree}/outside/canary.txt"
    with pytest.raises(PathRefused) as info:
        contain(f"{tree}/ws/.env", ["/"], DEFAULT_DENY_PATHS)
    assert info.value.reason == "denied"


# ----------------------------------------------------------------------------- the deny-list


@pytest.mark.parametrize("deny", [DEFAULT_DENY_PATHS, (".git/**",), (".git",)])
def test_a_root_inside_a_denied_directory_still_denies_its_files(tree, deny):
    """Regression: with cwd = ROOT/.git, ".git/config" relative to the root is "config", and
    the read was allowed. The deny-list matches the absolute path's components anywhere."""
    with pytest.raises(PathRefused) as info:
        contain(f"{tree}/ws/.git/config", [f"{tree}/ws/.git"], deny)
    assert info.value.reason == "denied"
    with pytest.raises(PathRefused) as info:
        contain(f"{tree}/ws/link_to_gitconfig", [f"{tree}/ws/.git", f"{tree}/ws"], deny)
    assert info.value.reason == "denied"


@pytest.mark.parametrize(
    ("path", "cwd", "hit"),
    [
        ("{ws}/.env", None, ".env*"),
        ("{ws}/.git/config", None, ".git/config"),
        ("{ws}/sub/.git/config", None, ".git/config"),
        ("{tmp}/outside/.ENV.prod", None, ".env*"),  # anywhere, not only in the roots
        ("{ws}/link_to_env", None, ".env*"),  # resolved: a symlink to a denied file
        ("{ws}/link_to_gitconfig", None, ".git/config"),
        ("{ws}/.env.alias", None, ".env*"),  # as written: a denied name that is a symlink
        ("{ws}/a/../.env", None, ".env*"),
        ("{ws}/dir_up/ws/key.pem", None, "*.pem"),
        (".git/config", None, ".git/config"),  # relative, no cwd: as written
        ("link_to_env", "{ws}", ".env*"),  # relative: resolved against the cwd
        ("{ws}/file.txt", None, None),
        ("{ws}/config", None, None),
        ("{ws}/.gitignore", None, None),
        ("{ws}/nope/new.txt", None, None),  # need not exist
        ("{ws}/loop_a", None, None),  # a loop is no hit (and no crash)
        ("{ws}/.env\0", None, ".env*"),  # NUL: not resolvable, checked as written
    ],
)
def test_denied_judges_paths_the_bridge_does_not_open(tree, path, cwd, hit):
    """denied(): a permission request's locations against the deny-list, anywhere."""
    filled = fill(path, tree)
    assert denied(filled, DEFAULT_DENY_PATHS, fill(cwd, tree) if cwd else None) == hit


@pytest.mark.parametrize(
    ("deny", "relative", "denied"),
    [
        (["secrets"], "secrets", True),
        (["secrets"], "secrets/a.txt", True),  # a component pattern covers the subtree
        (["secrets"], "a/secrets/b.txt", True),
        (["secrets"], "secretsx/a.txt", False),
        (["secrets/"], "a/secrets/b.txt", True),  # a trailing slash changes nothing
        (["config/*.json"], "config/a.json", True),
        (["config/*.json"], "x/config/a.json", True),
        (["config/*.json"], "config/sub/a.json", False),
        (["config/**.json"], "config/sub/a.json", True),
        (["/a/b.txt"], "a/b.txt", True),  # a leading slash is tolerated
        (["a/b.txt"], "x/a/b.txt", True),
        (["a/b.txt"], "a/b.txt/c", False),
        (["*.[pP][eE][mM]"], "k.Pem", True),
        (["id_?sa"], "id_rsa", True),
        (["id_?sa"], "id_rrsa", False),
        ([], ".env", False),
        ([""], ".env", False),
    ],
)
def test_deny_list_patterns(tmp_path, deny, relative, denied):
    root = os.path.realpath(tmp_path)
    path = f"{root}/{relative}"
    if denied:
        with pytest.raises(PathRefused) as info:
            contain(path, [root], deny)
        assert info.value.reason == "denied"
        assert repr(deny[0]) in str(info.value)
    else:
        assert contain(path, [root], deny) == path


@pytest.mark.skipif(os.geteuid() == 0, reason="root can examine any directory")
def test_a_directory_that_cannot_be_examined_is_unresolvable(tmp_path):
    root = os.path.realpath(tmp_path)
    os.mkdir(f"{root}/locked")
    os.chmod(f"{root}/locked", 0)
    try:
        with pytest.raises(PathRefused) as info:
            contain(f"{root}/locked/x/y", [root], ())
        assert info.value.reason == "unresolvable"
    finally:
        os.chmod(f"{root}/locked", 0o700)


def test_a_component_that_cannot_be_examined_is_unresolvable(tmp_path, monkeypatch):
    """Where lstat fails for any reason but absence, where the path leads is unknown: refuse."""
    root = os.path.realpath(tmp_path)
    os.mkdir(f"{root}/locked")
    real_lstat = os.lstat

    def lstat(path, *args, **kwargs):
        if os.fspath(path) == f"{root}/locked/x":
            raise PermissionError(13, "Permission denied", path)
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", lstat)
    with pytest.raises(PathRefused) as info:
        contain(f"{root}/locked/x/y", [root], ())
    assert info.value.reason == "unresolvable"


def test_a_very_long_symlink_chain_is_refused_not_crashed(tmp_path):
    """Python 3.11's realpath recurses once per link; a long chain must not escape as a crash."""
    root = os.path.realpath(tmp_path)
    for i in range(60):
        os.symlink(f"l{i + 1}", f"{root}/l{i}")
    os.symlink("/etc/passwd", f"{root}/l60")
    with pytest.raises(PathRefused) as info:
        contain(f"{root}/l0", [root], ())
    assert info.value.reason in ("outside_roots", "unresolvable")


# ----------------------------------------------------------------------------- fuzz

COMPONENTS = [
    "..",
    ".",
    "",
    "a",
    "b",
    "file.txt",
    "out_dir",
    "out_file",
    "ws2_dir",
    "chain1",
    "in_chain1",
    "loop_a",
    "self",
    "dangling_out",
    "dangling_in",
    "dir_in",
    "dir_up",
    "wsself",
    "parentlink",
    "up2",
    "root_link",
    "to_extra",
    "ws",
    "ws2",
    "outside",
    "extra",
    "canary.txt",
    ".env",
    "tmp",
]


@settings(max_examples=400, deadline=None)
@given(
    start=st.sampled_from(["{ws}", "{extra}", "{tmp}", ""]),
    parts=st.lists(st.sampled_from(COMPONENTS), max_size=8),
)
def test_random_walks_never_reach_a_canary(tree, start, parts):
    """Any walk of links and `..` from anywhere is refused or lands inside a root."""
    path = fill(start, tree) + "/" + "/".join(parts)
    try:
        resolved = contain(path, roots_of(tree), DEFAULT_DENY_PATHS)
    except PathRefused as exc:
        reason = exc.reason
    else:
        reason = None
    if reason is not None:
        assert reason in ("outside_roots", "unresolvable", "denied")
        return
    roots = resolve_roots(roots_of(tree))
    assert any(os.path.commonpath([resolved, root]) == root for root in roots)
    assert os.path.realpath(resolved) == resolved
    if os.path.exists(resolved):
        assert all(not os.path.samefile(resolved, f"{tree}/{c}") for c in CANARIES)
