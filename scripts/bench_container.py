"""What the vLLM benchmarks share: wait for a server started with `docker run -d` to answer."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def first_answer(name: str, probe: Callable[[], T | None], interval: float) -> T:
    """probe() every ``interval`` seconds until it answers (not None); exit with the container's last log lines if it
    stops running first."""
    while (answer := probe()) is None:
        running = subprocess.run(
            ["docker", "inspect", "-f", "{{.State.Running}}", name], capture_output=True, text=True, check=False
        )
        if running.stdout.strip() != "true":
            logs = subprocess.run(["docker", "logs", "--tail", "20", name], capture_output=True, text=True, check=False)
            sys.exit(f"{name} exited before answering:\n{logs.stdout}{logs.stderr}")
        time.sleep(interval)
    return answer
