#!/usr/bin/env bash
# Run `ansible-test sanity --venv` on this checkout. ansible-test must run from
# a real .../ansible_collections/gpubox/inference folder (it resolves the
# physical path, so the symlink in .collections does not do), so the files git
# knows about (tracked, or new and not ignored) are copied to a folder outside
# this repository first (inside it, ansible-test would ask git and see nothing).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
work=${GPUBOX_SANITY_DIR:-${TMPDIR:-/tmp}/gpubox-sanity}
dest="$work/ansible_collections/gpubox/inference"
python=$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')

rm -rf "$dest"
mkdir -p "$dest"
git -C "$top" ls-files -z --cached --others --exclude-standard \
  | tar -C "$top" --null --files-from=- --ignore-failed-read -c 2>/dev/null \
  | tar -C "$dest" -x

# ansible-test bootstraps pip in its venvs with a get-pip.py it downloads from a
# host not reachable here; give it an offline stand-in at its cache path.
pip_version=$(python - <<'PY'
import re, ansible_test._internal.python_requirements as m, inspect
print(re.search(r"pip='([0-9.]+)'", inspect.getsource(m)).group(1))
PY
)
install -D -m 0644 "$top/scripts/get_pip_offline.py" "$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py"

cd "$dest"
exec ansible-test sanity --venv --python "$python" --color no "$@"
