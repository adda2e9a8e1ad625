#!/usr/bin/env bash
# Build the Debian 12 systemd image that Molecule boots as its test host, unless
# an image with the same tag is already there. No container registry is
# reachable, so the root filesystem comes from debootstrap and `docker import`.
# The tag is a hash of this script, so changing the recipe builds a new image
# and a second `make test` reuses the first one's.
# Usage: test-image.sh            build if missing, print the image name
#        test-image.sh --name     print the image name only
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
REPO=gpubox-test-debian12
TAG=$(sha256sum "$here/test-image.sh" | cut -c1-12)
IMAGE="$REPO:$TAG"
SUITE=bookworm
PACKAGES=python3,python3-apt,systemd,systemd-sysv,dbus,sudo,ca-certificates

if [ "${1:-}" = --name ]; then
  echo "$IMAGE"
  exit 0
fi

log() { printf '[test-image] %s\n' "$*" >&2; }

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  log "reusing $IMAGE"
  echo "$IMAGE"
  exit 0
fi

if ! command -v debootstrap >/dev/null 2>&1; then
  log "installing debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

# The host's own Debian mirror (the only archive reachable here).
mirror=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
[ -n "$mirror" ] || mirror=$(awk '$1=="deb" && $3=="'"$SUITE"'" {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
[ -n "$mirror" ] || mirror=http://deb.debian.org/debian

root=$(mktemp -d /var/tmp/gpubox-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
log "debootstrap $SUITE from $mirror"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$mirror" >/var/tmp/gpubox-debootstrap.log 2>&1 \
  || { tail -20 /var/tmp/gpubox-debootstrap.log >&2; exit 1; }
# The guest reaches the Debian archive through the same mirror. The package lists
# debootstrap fetched stay, so apt in the guest works before its first update.
echo "deb $mirror $SUITE main" >"$root/etc/apt/sources.list"
rm -rf "$root"/var/cache/apt/archives/*.deb
log "docker import $IMAGE"
tar -C "$root" -c . | docker import -c 'CMD ["/sbin/init"]' -c 'ENV container=docker' - "$IMAGE" >/dev/null
# Images from earlier recipes are of no further use.
docker image ls --format '{{.Repository}}:{{.Tag}}' "$REPO" | grep -vx "$IMAGE" | xargs -r docker image rm >/dev/null || true
echo "$IMAGE"
