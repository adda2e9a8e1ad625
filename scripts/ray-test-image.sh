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
TAG=$(cat "$context_src"/* "$0" "$top/scripts/wheelhouse-image.sh" <(echo "$base") | sha256sum | cut -c1-12)
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
# Ray and what it needs that the vLLM image lacks (pip resolves against what is installed).
exec "$top/scripts/wheelhouse-image.sh" ray-test-image "$IMAGE" "$context_src" "$base" ray-wheelhouse
