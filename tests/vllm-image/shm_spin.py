"""Shorten how long the test image's vLLM spins after each read of its shared-memory queue.

vLLM 0.32's `SpinCondition` (vllm/distributed/device_communicators/shm_broadcast.py) has each reader of the queue
between the engine core and its workers call sched_yield() in a loop for `busy_loop_s=1` second after every read,
for latency under load; the value is not configurable. On this 2-CPU test machine that second is most of what a
worker costs: measured with the tiny model and 10 streamed 64-token completions 3 s apart (docs/test-time.md),
one worker 12.7 CPU-s, 3.3 with 0.05 s; tensor parallel 2, 23.4 CPU-s, 4.4; the requests took as long or less.

The image sets GPUBOX_TEST_SHM_BUSY_LOOP_S=0.05: long enough that a reader never leaves the loop between the steps
of a stream (at 0 each step waited for the queue's 5 s recheck: 0.2 tokens/s). `-e GPUBOX_TEST_SHM_BUSY_LOOP_S=1`
gives upstream's value back. Only the test image is changed; the role deploys the user's image as it is.

Usage: shm_spin.py SITE_PACKAGES   (fails unless upstream's default is found exactly once)
"""

import pathlib
import sys

UPSTREAM = "        busy_loop_s: float = 1,\n"
PATCHED = '        busy_loop_s: float = float(os.environ.get("GPUBOX_TEST_SHM_BUSY_LOOP_S", "1")),\n'


def main(site_packages: str) -> None:
    path = pathlib.Path(site_packages) / "vllm/distributed/device_communicators/shm_broadcast.py"
    text = path.read_text()
    if text.count(UPSTREAM) != 1 or "\nimport os\n" not in text:
        sys.exit(
            f"{path}: upstream's `busy_loop_s: float = 1,` default (and `import os`) not found exactly once; "
            "this vLLM release changed the queue: measure its spin again before patching it"
        )
    path.write_text(text.replace(UPSTREAM, PATCHED))
    print(f"{path}: busy_loop_s from GPUBOX_TEST_SHM_BUSY_LOOP_S")


if __name__ == "__main__":
    main(*sys.argv[1:])
