#!/usr/bin/env bash
# Debian packages that `make test` uses on the machine running the tests:
# ShellCheck for ansible-test sanity, debootstrap for the Molecule test image, git, and
# Nginx and OpenSSL for the proxy tests (a real Nginx runs the rendered site), pciutils
# (lspci, setpci) for the ACS tests that compare against the real lspci, and a C
# compiler for the stand-in libcuda (tests/fakes/libcuda.c), and Docker's registry
# (docker-registry, the CNCF distribution server) on loopback for the image pull tests, and
# Prometheus's promtool, which checks the monitoring role's rules and runs their tests.
# Installs only what is missing.
set -euo pipefail

missing=()
for pair in shellcheck:shellcheck debootstrap:debootstrap git:git nginx:nginx openssl:openssl gcc:gcc lspci:pciutils setpci:pciutils docker-registry:docker-registry promtool:prometheus; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
[ -f /usr/include/stdio.h ] || missing+=(libc6-dev)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "[host-tools] installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
