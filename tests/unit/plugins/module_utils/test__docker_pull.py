"""_docker_pull.progress: layers pulled, from what `docker pull` prints without a terminal."""

from __future__ import annotations

from ansible_collections.gpubox.inference.plugins.module_utils._docker_pull import progress

# `docker pull` (client 28, engine 20.10.24) from a Debian docker-registry 2.8.2 on this machine, 2026-12-01,
# an image of four layers whose base was already here; stdout redirected to a file.
PULL = """1: Pulling from gpubox/pull-test
4198f9555b56: Already exists
2bd62cc70873: Pulling fs layer
eafb7d1a169c: Pulling fs layer
4e3ec51a7da3: Pulling fs layer
4e3ec51a7da3: Verifying Checksum
4e3ec51a7da3: Download complete
eafb7d1a169c: Verifying Checksum
eafb7d1a169c: Download complete
2bd62cc70873: Verifying Checksum
2bd62cc70873: Download complete
2bd62cc70873: Pull complete
eafb7d1a169c: Pull complete
4e3ec51a7da3: Pull complete
Digest: sha256:ed6b79c22a776bb8f3647f07f3afdc8267e39d3b29ec2b0c60ba9ef5931551fb
Status: Downloaded newer image for 127.0.0.1:5055/gpubox/pull-test:1
127.0.0.1:5055/gpubox/pull-test:1
"""


def test_a_finished_pull_counts_every_layer():
    assert progress(PULL) == {
        "layers": 4,
        "pulled": 4,
        "downloaded": 4,
        "status": "Downloaded newer image for 127.0.0.1:5055/gpubox/pull-test:1",
    }


def test_a_pull_half_way_counts_what_is_done():
    lines = PULL.splitlines()
    assert progress("\n".join(lines[:8])) == {"layers": 4, "pulled": 1, "downloaded": 2, "status": None}
    assert progress("\n".join(lines[:1])) == {"layers": 0, "pulled": 0, "downloaded": 0, "status": None}


def test_an_image_already_here_has_nothing_to_count():
    up_to_date = "1: Pulling from gpubox/pull-test\nDigest: sha256:ed6b\nStatus: Image is up to date for x:1\n"
    assert progress(up_to_date) == {"layers": 0, "pulled": 0, "downloaded": 0, "status": "Image is up to date for x:1"}
