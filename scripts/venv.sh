#!/usr/bin/env bash
# Create (once) and print the path of a virtualenv keyed by the hash of its lock files.
# Usage: venv.sh run    -> ansible only (requirements.txt), for `make provision`
#        venv.sh test   -> plus the test toolchain (requirements-test.txt), for `make test`
#        venv.sh wheels -> a folder with the wheels of requirements.txt, downloaded once: the pip index of the
#                          Molecule box that runs `make provision` itself (molecule/local), which reaches no registry
# The venvs live in ${GPUBOX_CACHE:-~/.cache/gpubox-inference}, outside the checkout,
# so a fresh clone with the same lock files reuses them.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
kind=${1:?usage: venv.sh run|test}
case "$kind" in
  run) locks=("$top/requirements.txt") ;;
  test) locks=("$top/requirements.txt" "$top/requirements-test.txt") ;;
  wheels) locks=("$top/requirements.txt") ;;
  *) echo "venv.sh: unknown venv '$kind' (expected run, test or wheels)" >&2; exit 2 ;;
esac

python=${PYTHON:-python3}
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
hash=$(cat "${locks[@]}" | sha256sum | cut -c1-12)
cache=${GPUBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpubox-inference}
venv="$cache/venv-$kind-py$pyver-$hash"
# This machine's pip config lists local indexes that may not exist; their warnings are noise.
quiet() { grep -v "^WARNING: Location 'file:" >&2 || true; }

if [ "$kind" = wheels ]; then
  if [ ! -f "$venv/.complete" ]; then
    echo "[venv] downloading the wheels of requirements.txt into $venv" >&2
    rm -rf "$venv"
    mkdir -p "$venv"
    # pip and setuptools too: the venv that `make provision` makes upgrades pip first.
    "$python" -m pip download -q --only-binary :all: -d "$venv" -r "${locks[-1]}" pip setuptools 2>&1 | quiet
    touch "$venv/.complete"
  fi
  echo "$venv"
  exit 0
fi

if [ ! -f "$venv/.complete" ]; then
  echo "[venv] creating $venv" >&2
  rm -rf "$venv"
  mkdir -p "$cache"
  if ! "$python" -m venv "$venv" >/dev/null 2>&1; then
    echo "[venv] $python has no venv module; installing python3-venv" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    "$python" -m venv "$venv"
  fi
  "$venv/bin/python" -m pip install -q --upgrade pip 2>&1 | quiet
  "$venv/bin/python" -m pip install -q -r "${locks[-1]}" 2>&1 | quiet
  "$venv/bin/python" -c 'import ansible, pynvml' 2>/dev/null || { echo "[venv] install failed" >&2; exit 1; }
  touch "$venv/.complete"
fi
echo "$venv"
