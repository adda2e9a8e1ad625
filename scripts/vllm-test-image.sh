#!/usr/bin/env bash
# Build the image that runs a real vLLM (CPU build) with a tiny local model, for the
# vLLM role's end-to-end test, unless an image with the same tag is there. The tag is
# a hash of tests/vllm-image/ and the base image, so a second run reuses it.
# Usage: vllm-test-image.sh            build if missing, print the image name
#        vllm-test-image.sh --name     print the image name only
#        vllm-test-image.sh --archive  build if missing, `docker save` it once into the
#                                      cache, print the archive's path (Molecule's box loads it)
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
context_src="$top/tests/vllm-image"
base=$("$top/scripts/test-image.sh" --name)
REPO=gpubox-vllm-cpu
TAG=$(cat "$context_src"/* "$0" <(echo "$base") | sha256sum | cut -c1-12)
IMAGE="$REPO:$TAG"

if [ "${1:-}" = --name ]; then
  echo "$IMAGE"
  exit 0
fi
log() { printf '[vllm-test-image] %s\n' "$*" >&2; }
cache=${GPUBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpubox-inference}
if [ "${1:-}" = --archive ]; then
  "$0" >/dev/null
  archive="$cache/$REPO-$TAG.tar"
  if [ ! -f "$archive" ]; then
    log "saving $IMAGE to $archive"
    rm -f "$cache/$REPO"-*.tar "$cache/$REPO"-*.tar.partial
    docker save --output "$archive.partial" "$IMAGE"
    mv "$archive.partial" "$archive"
  fi
  echo "$archive"
  exit 0
fi
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  log "reusing $IMAGE"
  echo "$IMAGE"
  exit 0
fi

"$top/scripts/test-image.sh" >/dev/null
wheelhouse="$cache/vllm-wheelhouse-$(grep -v "^#" "$context_src/requirements.txt" | sha256sum | cut -c1-12)"
if [ ! -f "$wheelhouse/.complete" ]; then
  log "downloading wheels into $wheelhouse"
  mkdir -p "$wheelhouse"
  # The host's Python is 3.11 on x86_64 like the image's, so its wheels fit; torch's CPU
  # build comes from this machine's local wheel folder (pip's find-links).
  if ! python3 -m pip download -q --no-deps --only-binary :all: -d "$wheelhouse" -r "$context_src/requirements.txt" \
       >"$wheelhouse.log" 2>&1; then
    grep -v "^WARNING: Location 'file:" "$wheelhouse.log" >&2
    exit 1
  fi
  touch "$wheelhouse/.complete"
fi

context=$(mktemp -d /var/tmp/gpubox-vllm-image.XXXXXX)
trap 'rm -rf "$context"' EXIT
cp "$context_src"/* "$context/"
cp -al "$wheelhouse" "$context/wheelhouse" 2>/dev/null || cp -a "$wheelhouse" "$context/wheelhouse"
rm -f "$context/wheelhouse/.complete"
log "building $IMAGE (a few minutes the first time)"
docker build -q --build-arg "BASE=$base" -t "$IMAGE" "$context" >/dev/null
docker image ls --format '{{.Repository}}:{{.Tag}}' "$REPO" | grep -vx "$IMAGE" | xargs -r docker image rm >/dev/null || true
echo "$IMAGE"
