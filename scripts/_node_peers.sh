# Sourced by scripts/test after _bootstrap.sh: install the npm test peers pinned in
# tests/support/peers/node (package.json and its package-lock.json) into .node-peers/ (gitignored).
# Re-installs only when either file changed since the last install (a stamp, like the venv's).
#
# Without node or npm: a one-line notice; the tests that need a peer then skip with a reason.
# With them, a failed install stops the run (exit 1): CI and developers with node must run the
# interop tests, and a skip there would turn a broken install into a green run.
peers_src="$root/tests/support/peers/node"
peers_dir="$root/.node-peers"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "bootstrap: node or npm is not on PATH; the npm interop tests (docs/interop.md) will be skipped" >&2
else
    peers_want="$(cat "$peers_src/package.json" "$peers_src/package-lock.json" | sha256sum | cut -d' ' -f1)"
    peers_stamp="$peers_dir/.acp-bridge-installed"
    if [ ! -f "$peers_stamp" ] || [ "$(cat "$peers_stamp")" != "$peers_want" ]; then
        echo "bootstrap: installing the npm test peers into $peers_dir" >&2
        mkdir -p "$peers_dir"
        rm -f "$peers_stamp"
        # npm install (not npm ci) on a copy: it follows the lock but may rewrite it (adding
        # the registry's addresses), which must not happen to the committed one. npm ci would
        # refuse this lock: a dependency names optional platform packages that were never
        # published, which the lock cannot list. Install scripts are not run: no peer needs
        # one, and the peers then behave the same under every npm version.
        cp "$peers_src/package.json" "$peers_src/package-lock.json" "$peers_dir/"
        peers_log="$peers_dir/install.log"
        if ! (cd "$peers_dir" && npm install --no-audit --no-fund --ignore-scripts) >"$peers_log" 2>&1; then
            cat "$peers_log" >&2
            echo "bootstrap: npm install of the test peers failed (log above, also in $peers_log)" >&2
            exit 1
        fi
        echo "$peers_want" > "$peers_stamp"
    fi
fi
