# Sourced by the scripts: make sure .venv exists and holds the project with its test extras.
# Re-installs only when pyproject.toml, setup.py or the C source changed since the last install.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
py="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    echo "bootstrap: creating $venv" >&2
    "$py" -m venv "$venv"
fi
stamp="$venv/.acp-bridge-installed"
# The stamp hashes the build's files and this script: a change to the C extension's source
# rebuilds it. The editable install is setuptools' "compat" mode: the checkout's root on
# sys.path, as hatchling's editable install had it, so that `python -m bench.x` runs from any
# directory; the C extension is built in place in either mode.
want="$(cat "$root/pyproject.toml" "$root/setup.py" "$root/acp_bridge/protocol/scanc.c" "${BASH_SOURCE[0]}" |
    sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "bootstrap: installing acp-bridge and its test dependencies into .venv" >&2
    log="$venv/bootstrap.log"
    if ! { "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip &&
           "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
               --config-settings editable_mode=compat -e "$root[test]"
         } >"$log" 2>&1; then
        cat "$log" >&2
        echo "bootstrap: pip failed (log above, also in $log)" >&2
        exit 1
    fi
    echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
