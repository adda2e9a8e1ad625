#!/usr/bin/env bash
# Build the signed apt repositories the docker_engine and nvidia_container_toolkit
# roles install from in the tests, since Docker's and NVIDIA's cannot be reached here.
# Runs on the test host; serves nothing itself (gpubox-test-repo.service does).
#
#   /srv/repo/docker/debian      Docker's layout: dists/<codename>/stable/binary-<arch>, key at ./gpg
#   /srv/repo/nvidia             NVIDIA's flat layout: <channel>/deb/<arch>/, key at ./gpgkey
#
# docker-ce is Debian's docker.io repackaged under Docker's name (the engine, its
# CLI and its service, without docker.io's conflict with docker-ce); the other
# Docker packages are thin, except docker-compose-plugin, which carries the real
# Compose v2 binary given as $1.
# The NVIDIA packages carry stand-in nvidia-ctk and nvidia-container-runtime scripts,
# in two versions (1.17.8-1 and 1.18.0-1) so the tests can check pinning.
# The packages are gzip -1: dpkg-deb's default xz took a minute of the scenario's prepare for docker-ce and
# Compose alone, to save disk space nothing here needs.
set -euo pipefail

compose_binary=$1
codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
arch=$(dpkg --print-architecture)
root=/srv/repo
work=$(mktemp -d)
export GNUPGHOME=$work/gnupg
mkdir -m 700 "$GNUPGHOME"

gpg --batch --quiet --passphrase '' --quick-gen-key 'gpubox test repository <test@gpubox.invalid>' rsa2048 sign never
rm -rf "$root"
mkdir -p "$root/docker/debian/pool" "$root/docker/debian/dists/$codename/stable/binary-$arch"
gpg --batch --armor --export > "$root/docker/debian/gpg"

# package NAME VERSION DEPENDS [SRC:DEST ...]
package() {
  local name=$1 version=$2 depends=$3 out=$4
  shift 4
  local dir=$work/$name-$version
  mkdir -p "$dir/DEBIAN"
  {
    echo "Package: $name"
    echo "Version: $version"
    echo "Architecture: $arch"
    echo "Maintainer: gpubox tests <test@gpubox.invalid>"
    [ -n "$depends" ] && echo "Depends: $depends"
    echo "Description: gpubox test stand-in for $name"
  } > "$dir/DEBIAN/control"
  for pair in "$@"; do
    install -D -m 0755 "${pair%%:*}" "$dir/${pair#*:}"
  done
  dpkg-deb -Zgzip -z1 --build --root-owner-group "$dir" "$out/${name}_${version}_$arch.deb" >/dev/null
}

pool=$root/docker/debian/pool
(cd "$work" && apt-get download -q docker.io >/dev/null)
dpkg-deb -R "$work"/docker.io_*.deb "$work/docker-ce"
awk '/^(Conflicts|Replaces|Breaks|Provides):/ {skip=1; next} /^ / && skip {next} {skip=0}
     /^Package:/ {print "Package: docker-ce"; next} /^Version:/ {print "Version: 5:28.0.0-1"; next} {print}' \
  "$work/docker-ce/DEBIAN/control" > "$work/control" && mv "$work/control" "$work/docker-ce/DEBIAN/control"
dpkg-deb -Zgzip -z1 --build --root-owner-group "$work/docker-ce" "$pool/docker-ce_5:28.0.0-1_$arch.deb" >/dev/null
package docker-ce-cli 5:28.0.0-1 "docker-ce" "$pool"
package containerd.io 1.7.0-1 "containerd" "$pool"
package docker-buildx-plugin 0.20.0-1 "" "$pool"
package docker-compose-plugin 2.40.3-1 "" "$pool" "$compose_binary:usr/libexec/docker/cli-plugins/docker-compose"

sign() {  # sign the Release file in the current folder
  gpg --batch --yes --clearsign -o InRelease Release
  gpg --batch --yes --armor --detach-sign -o Release.gpg Release
}

(cd "$root/docker/debian" &&
  apt-ftparchive packages pool > "dists/$codename/stable/binary-$arch/Packages" &&
  gzip -kf "dists/$codename/stable/binary-$arch/Packages" &&
  cd "dists/$codename" &&
  apt-ftparchive -o "APT::FTPArchive::Release::Codename=$codename" -o "APT::FTPArchive::Release::Suite=$codename" \
    -o "APT::FTPArchive::Release::Components=stable" -o "APT::FTPArchive::Release::Architectures=$arch" \
    release . > Release && sign)

cat > "$work/nvidia-ctk" <<'CTK'
#!/bin/sh
# Stand-in nvidia-ctk: writes a CDI spec for `cdi generate --output=FILE`.
case "$*" in
  "--version") echo "NVIDIA Container Toolkit CLI version (gpubox test stand-in)" ;;
  "cdi generate --output="*) out=${3#--output=}; mkdir -p "$(dirname "$out")"; printf 'cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n' > "$out" ;;
  *) echo "nvidia-ctk stand-in: unsupported: $*" >&2; exit 2 ;;
esac
CTK
printf '#!/bin/sh\nexec runc "$@"\n' > "$work/nvidia-container-runtime"

for channel in stable experimental; do
  flat=$root/nvidia/$channel/deb/$arch
  mkdir -p "$flat"
  for version in 1.17.8-1 1.18.0-1; do
    package libnvidia-container1 "$version" "" "$flat"
    package libnvidia-container-tools "$version" "libnvidia-container1 (= $version)" "$flat"
    package nvidia-container-toolkit-base "$version" "" "$flat" \
      "$work/nvidia-ctk:usr/bin/nvidia-ctk" "$work/nvidia-container-runtime:usr/bin/nvidia-container-runtime"
    package nvidia-container-toolkit "$version" \
      "nvidia-container-toolkit-base (= $version), libnvidia-container-tools (= $version)" "$flat"
  done
  (cd "$flat" && apt-ftparchive packages . > Packages && gzip -kf Packages && apt-ftparchive release . > Release && sign)
done
gpg --batch --armor --export > "$root/nvidia/gpgkey"
rm -rf "$work"
echo "test repositories ready under $root"
