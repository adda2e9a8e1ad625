#!/usr/bin/env bash
# Build a test image whose Python packages come from a wheelhouse downloaded on the host: pip inside a build cannot
# reach PyPI here, and the host's Python (3.11, x86_64) is the images'. The wheelhouse is kept in the cache, keyed by
# the requirements; the repository's other tags are removed once the image is built.
# Used by ray-test-image.sh, which names the image (a hash of its recipe) and checks first whether it is there.
# Usage: wheelhouse-image.sh LOG_NAME IMAGE CONTEXT_DIR BASE_IMAGE WHEELHOUSE_PREFIX [pip download options...]
set -euo pipefail

name=$1 image=$2 context_src=$3 base=$4 prefix=$5
shift 5
log() { printf '[%s] %s\n' "$name" "$*" >&2; }
cache=${GPUBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpubox-inference}
wheelhouse="$cache/$prefix-$(grep -v "^#" "$context_src/requirements.txt" | sha256sum | cut -c1-12)"
if [ ! -f "$wheelhouse/.complete" ]; then
  log "downloading wheels into $wheelhouse"
  mkdir -p "$wheelhouse"
  if ! python3 -m pip download -q "$@" --only-binary :all: -d "$wheelhouse" -r "$context_src/requirements.txt" \
       >"$wheelhouse.log" 2>&1; then
    grep -v "^WARNING: Location 'file:" "$wheelhouse.log" >&2
    exit 1
  fi
  touch "$wheelhouse/.complete"
fi

context=$(mktemp -d "/var/tmp/$name.XXXXXX")
trap 'rm -rf "$context"' EXIT
cp "$context_src"/* "$context/"
cp -al "$wheelhouse" "$context/wheelhouse" 2>/dev/null || cp -a "$wheelhouse" "$context/wheelhouse"
rm -f "$context/wheelhouse/.complete"
log "building $image (a few minutes the first time)"
docker build -q --build-arg "BASE=$base" -t "$image" "$context" >/dev/null
repo=${image%%:*}
docker image ls --format '{{.Repository}}:{{.Tag}}' "$repo" | grep -vx "$image" | xargs -r docker image rm >/dev/null || true
echo "$image"
