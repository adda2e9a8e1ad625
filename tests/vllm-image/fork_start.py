"""Make the start method that vLLM's CPU platform forces a default, for the test image (see the Dockerfile)."""

import py_compile
import sys

FORCED = 'os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"'
DEFAULT = 'os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")'

path = sys.argv[1]
with open(path) as source:
    text = source.read()
if text.count(FORCED) != 1:
    sys.exit(f"{path}: expected exactly one {FORCED!r}, found {text.count(FORCED)}")
with open(path, "w") as source:
    source.write(text.replace(FORCED, DEFAULT))
py_compile.compile(path, doraise=True)
