#!/usr/bin/env bash
# Build the vLLM test image with Ray (tests/ray-image/) for the cluster test, unless an image with the same tag is
# there. The tag is a hash of tests/ray-image/, this script and the vLLM test image's name, so a second run reuses it.
# Usage: ray-test-image.sh           build if missing, print the image name
#        ray-test-image.sh --name    print the image name only
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
context_src="$top/tests/ray-image"
base=$("$top/scripts/vllm-test-image.sh" --name)
REPO=gpubox-vllm-ray
TAG=$(cat "$context_src"/* "$0" <(echo "$base") | sha256sum | cut -c1-12)
IMAGE="$REPO:$TAG"

if [ "${1:-}" = --name ]; then
  echo "$IMAGE"
  exit 0
fi
log() { printf '[ray-test-image] %s\n' "$*" >&2; }
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  log "reusing $IMAGE"
  echo "$IMAGE"
  exit 0
fi

"$top/scripts/vllm-test-image.sh" >/dev/null
cache=${GPUBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpubox-inference}
wheelhouse="$cache/ray-wheelhouse-$(grep -v "^#" "$context_src/requirements.txt" | sha256sum | cut -c1-12)"
if [ ! -f "$wheelhouse/.complete" ]; then
  log "downloading wheels into $wheelhouse"
  mkdir -p "$wheelhouse"
  # The host's Python is 3.11 on x86_64 like the image's, so its wheels fit.
  if ! python3 -m pip download -q --only-binary :all: -d "$wheelhouse" -r "$context_src/requirements.txt" \
       >"$wheelhouse.log" 2>&1; then
    grep -v "^WARNING: Location 'file:" "$wheelhouse.log" >&2
    exit 1
  fi
  touch "$wheelhouse/.complete"
fi

context=$(mktemp -d /var/tmp/gpubox-ray-image.XXXXXX)
trap 'rm -rf "$context"' EXIT
cp "$context_src"/* "$context/"
cp -al "$wheelhouse" "$context/wheelhouse" 2>/dev/null || cp -a "$wheelhouse" "$context/wheelhouse"
rm -f "$context/wheelhouse/.complete"
log "building $IMAGE"
docker build -q --build-arg "BASE=$base" -t "$IMAGE" "$context" >/dev/null
docker image ls --format '{{.Repository}}:{{.Tag}}' "$REPO" | grep -vx "$IMAGE" | xargs -r docker image rm >/dev/null || true
echo "$IMAGE"
