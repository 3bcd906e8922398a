# Sourced by scripts/test: Debian packages some tests run against (OpenSSH's server and client
# for the remote-agent tests, tests/interop/test_remote.py; Chromium for the approval console's browser
# tests, tests/interop/test_console_browser.py, driven by Playwright). Installed only when missing, and only when
# running as root with apt-get (CI: root on a fresh machine); otherwise a notice, and those
# tests are skipped with the reason.
debian_peers_missing=()
if ! command -v sshd >/dev/null 2>&1 && [ ! -x /usr/sbin/sshd ]; then
    debian_peers_missing+=(openssh-server)
fi
if ! command -v ssh >/dev/null 2>&1 || ! command -v ssh-keygen >/dev/null 2>&1; then
    debian_peers_missing+=(openssh-client)
fi
if ! command -v chromium >/dev/null 2>&1; then
    debian_peers_missing+=(chromium)
fi
if [ "${#debian_peers_missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "peers: installing ${debian_peers_missing[*]} with apt-get" >&2
        debian_peers_log="${venv:-.}/debian-peers.log"
        # (Only the programs are needed: the tests start their own sshd on a loopback port.)
        if ! { apt-get update -qq &&
               DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                   "${debian_peers_missing[@]}"; } >"$debian_peers_log" 2>&1; then
            tail -n 20 "$debian_peers_log" >&2
            echo "peers: apt-get failed (log above); the ssh or browser tests will be skipped" >&2
        fi
    else
        echo "peers: ${debian_peers_missing[*]} missing (as root: apt-get install" \
             "${debian_peers_missing[*]}); the ssh or browser tests will be skipped" >&2
    fi
fi
# sshd will not start without its privilege separation directory (the package's service
# creates it, and none ran here).
if [ "$(id -u)" = 0 ] && [ ! -d /run/sshd ] && { command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ]; }; then
    mkdir -p /run/sshd && chmod 0755 /run/sshd
fi
unset debian_peers_missing debian_peers_log
