"""Let vLLM's CPU platform fork the engine core where no worker process binds OpenMP threads (the test image's).

vLLM's CPU platform forces the ``spawn`` start method, so that each worker process starts OpenMP afresh and binds its
threads to the CPUs of VLLM_CPU_OMP_THREADS_BIND. A server whose engine core runs the model itself (the ``uni``
executor: VLLM_ENABLE_V1_MULTIPROCESSING=0 and one worker) has no worker to bind, yet its engine core spawned imports
torch and vLLM all over again. Here that server forks its engine core when VLLM_WORKER_MULTIPROC_METHOD=fork asks for
it (the image's default); every other server spawns, as upstream. The build fails if the line is not there.
"""

import py_compile
import sys

FORCED = '        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"\n'
WHERE_WORKERS = (
    '        if (parallel_config.distributed_executor_backend != "uni"\n'
    '                or os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") != "fork"):\n'
    '            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"\n'
)

path = sys.argv[1]
with open(path) as source:
    text = source.read()
if text.count(FORCED) != 1:
    sys.exit(f"{path}: expected exactly one {FORCED.strip()!r}, found {text.count(FORCED)}")
with open(path, "w") as source:
    source.write(text.replace(FORCED, WHERE_WORKERS))
py_compile.compile(path, doraise=True)
