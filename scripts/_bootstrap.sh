# Sourced by the scripts: make sure .venv exists and holds the project with its test extras.
# Re-installs only when pyproject.toml changed since the last install.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
py="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    echo "bootstrap: creating $venv" >&2
    "$py" -m venv "$venv"
fi
stamp="$venv/.acp-bridge-installed"
want="$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "bootstrap: installing acp-bridge and its test dependencies into .venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root[test]" >&2
    echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
