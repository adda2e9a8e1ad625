"""Shared test setup for tests/unit (pure: no Docker, Nginx, vLLM, Ray, systemd or network) and tests/integration
(the tests that start real parts): the collection on sys.path, and the captured command outputs. The helpers beside
this file (hardware.py, the stand-ins in fakes/, and the real servers of vllm_server.py, nginx_server.py and
hub_server.py) serve both.

Captured outputs live in tests/fixtures/<folder>/<name>.txt, copied unchanged
from the project's shared fixtures. Each starts with a header (``# source:``,
``# machine:``, ``# expected:``), then a ``# ---`` line, then the output exactly
as it was posted. ``Capture.text`` is that output; ``Capture.expected`` is the
careful human reading that the parsers are tested against.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
UNIT = ROOT / "tests" / "unit"
COLLECTIONS = ROOT / ".collections"

if not (COLLECTIONS / "ansible_collections" / "gpubox" / "inference").exists():
    raise pytest.UsageError(f"{COLLECTIONS}/ansible_collections/gpubox/inference is missing: run `make setup` first")
sys.path.insert(0, str(COLLECTIONS))

# Every command a test runs, and the project script that installs it (`make deps` runs them all).
INSTALLED_BY = {
    "lspci": "scripts/host-tools.sh (pciutils)",
    "setpci": "scripts/host-tools.sh (pciutils)",
    "nginx": "scripts/host-tools.sh (nginx)",
    "openssl": "scripts/host-tools.sh (openssl)",
    "gcc": "scripts/host-tools.sh (gcc, libc6-dev)",
    "docker": "scripts/docker-engine.sh (docker.io and Compose v2)",
    "docker-registry": "scripts/host-tools.sh (docker-registry)",
    "promtool": "scripts/host-tools.sh (prometheus)",
}


def require(tool: str) -> str:
    """The path of ``tool``, or the test fails saying which install step provides it (never a traceback)."""
    path = shutil.which(tool)
    if not path:
        pytest.fail(f"'{tool}' is not on PATH: run `make deps`, whose {INSTALLED_BY[tool]} installs it", pytrace=False)
    return path


# Llama 3.1 8B's config.json, the fields the vLLM plan reads (32 heads, 8 KV heads).
LLAMA_8B = {
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}


def plan_settings(**overrides) -> dict:
    """The vllm role's settings for _vllm.plan, as vars/main.yml assembles them, for Llama 3.1 8B on CUDA."""
    base = {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "model_exists": False,
        "container_model": "meta-llama/Llama-3.1-8B-Instruct",
        "served_model_name": "llama",
        "device": "cuda",
        "tensor_parallel_size": 0,
        "pipeline_parallel_size": 1,
        "gpu_memory_utilization": 0.9,
        "max_model_len": 8192,
        "max_num_batched_tokens": 0,
        "dtype": "auto",
        "env": {},
        "extra_args": [],
        "disable_custom_all_reduce": "auto",
        "min_concurrent_sequences": 4,
    }
    return {**base, **overrides}


def plan_gpus(count: int, mib: int = 24576) -> dict:
    """gpu_facts for ``count`` GPUs of ``mib`` MiB each."""
    return {"present": True, "count": count, "devices": [{"memory_total_mib": mib} for _gpu in range(count)]}


HEADER_KEYS = ("source", "machine", "expected")
SEPARATOR = "# ---"


@dataclass(frozen=True)
class Capture:
    """One captured command output and what a person read in it."""

    path: Path
    source: str
    machine: str
    expected: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.path.parent.name}/{self.path.stem}"


def parse_capture(path: Path) -> Capture:
    """Split a fixture file into its header fields and the output as posted."""
    raw = path.read_text(encoding="utf-8")
    head, sep, body = raw.partition(f"\n{SEPARATOR}\n")
    if not sep:
        raise ValueError(f"{path}: no '{SEPARATOR}' line between header and output")
    fields: dict[str, str] = {}
    for line in head.splitlines():
        key, colon, value = line.removeprefix("# ").partition(":")
        if not line.startswith("# ") or not colon or key not in HEADER_KEYS:
            raise ValueError(f"{path}: unexpected header line {line!r}")
        fields[key] = value.strip()
    missing = [k for k in HEADER_KEYS if k not in fields]
    if missing:
        raise ValueError(f"{path}: header lacks {', '.join(missing)}")
    return Capture(path=path, text=body, **fields)


def captures(folder: str) -> list[Capture]:
    """All captures in one fixtures folder (e.g. ``A_topo_m``), sorted by name."""
    return [parse_capture(p) for p in sorted((FIXTURES / folder).glob("*.txt"))]


def capture_params(folder: str) -> list:
    """``pytest.param`` per capture in a folder, with readable ids, for parametrize."""
    return [pytest.param(c, id=c.path.stem) for c in captures(folder)]


# vLLM's own cache folder (vllm_cache_dir), shared by every server a run starts, as a box's servers share theirs: vLLM
# finds a model's architecture once, in a subprocess that imports it all again, and keeps the answer there (keyed by the
# hash of its model code, written atomically). Made by the run's controller; pytest-xdist's workers inherit its name.
VLLM_CACHE_ENV = "GPUBOX_TEST_VLLM_CACHE"


def pytest_configure(config) -> None:
    if not hasattr(config, "workerinput") and VLLM_CACHE_ENV not in os.environ:
        os.environ[VLLM_CACHE_ENV] = tempfile.mkdtemp(prefix="gpubox-test-vllm-cache-")
        config.add_cleanup(lambda: shutil.rmtree(os.environ.pop(VLLM_CACHE_ENV), ignore_errors=True))


def pytest_sessionstart(session) -> None:
    """Compose projects the tests name gpubox-test-*, left running by a run that was killed (their restart policy
    brings them back with the Docker engine), are taken down first: one would answer on a port a test expects free.
    Once, by the pytest-xdist controller before its workers start (a worker would take down the other's servers), and
    never by a run that only lists the tests (``--collect-only`` beside a running test session took down its servers)
    or runs only tests/unit (`make unit` beside `make integration` took down the integration run's servers)."""
    docker = shutil.which("docker")
    if not docker or hasattr(session.config, "workerinput") or session.config.option.collectonly:
        return
    paths = [(session.config.invocation_params.dir / arg.split("::")[0]).resolve() for arg in session.config.args]
    if all(path == UNIT or UNIT in path.parents for path in paths):
        return
    listed = subprocess.run(
        [docker, "ps", "-a", "--format", '{{.Label "com.docker.compose.project"}}'],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    for project in sorted({name for name in listed.stdout.split() if name.startswith("gpubox-test-")}):
        down = [docker, "compose", "--project-name", project, "down", "--timeout", "1"]
        subprocess.run(down, capture_output=True, check=False, timeout=120)


def pytest_collection_modifyitems(config, items) -> None:
    """Every test of a file that deploys the real vLLM server is marked ``vllm`` (``-m "not vllm"`` leaves them out). A
    test under tests/unit that asks for a real server is refused: tests/unit is what runs without Docker, Nginx or vLLM.

    `make integration` runs a file per worker on two workers, in the order collected here: the files that deploy vLLM
    servers of their own (``vllm_image``; minutes each) first, so that the two workers end close together; each worker
    shares its own ``vllm_server`` between its other files."""
    servers = {"vllm_server", "vllm_image"}
    files = {item.path for item in items if servers & set(item.fixturenames)}
    misplaced = sorted({str(path.relative_to(ROOT)) for path in files if UNIT in path.parents})
    if misplaced:
        raise pytest.UsageError(f"{', '.join(misplaced)}: a test that deploys the real vLLM server belongs in tests/integration")
    own = files - {item.path for item in items if "vllm_server" in item.fixturenames}
    for item in items:
        if item.path in files:
            item.add_marker(pytest.mark.vllm)
    items.sort(key=lambda item: item.path not in own)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


ANSIBLE_ENV = {
    **os.environ,
    "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
    "ANSIBLE_NOCOLOR": "1",
    # The venv running pytest holds ansible; its bin/ comes first.
    "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
    # The modules' code compiled once, not at every task (tests/pycode/sitecustomize.py says why and how).
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests" / "pycode"), os.environ.get("PYTHONPATH")])),
    "GPUBOX_PYCODE_CACHE": str(Path.home() / ".cache" / "gpubox-inference" / "pycode"),
}


def run_ansible(*argv: str) -> subprocess.CompletedProcess:
    """Run an Ansible CLI from the checkout with the project's ansible.cfg; never raises on failure."""
    return subprocess.run(list(argv), cwd=ROOT, env=ANSIBLE_ENV, capture_output=True, text=True, check=False)


def run_playbook_json(*argv: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """``ansible-playbook`` with the json callback: the run, and its JSON document (None when standard output is not
    one, which a task that prints there causes)."""
    import json

    env = {**ANSIBLE_ENV, "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.json"}
    result = subprocess.run(["ansible-playbook", *argv], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    try:
        return result, json.loads(result.stdout)
    except ValueError:
        return result, None


def run_module(module: str, args: dict, path_prefix: Path | None = None, check: bool = False) -> dict:
    """Run ``gpubox.inference.<module>`` on localhost through the ``ansible`` CLI and return its result.

    ``path_prefix`` goes first on PATH, for stand-in commands such as a fake nvidia-smi.
    """
    import json

    env = {**ANSIBLE_ENV, "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "json"}
    if path_prefix:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env['PATH']}"
    argv = ["ansible", "localhost", "-c", "local", "-i", "localhost,"]
    argv += ["-e", f"ansible_python_interpreter={sys.executable}", "-m", f"gpubox.inference.{module}"]
    if args:
        argv += ["-a", json.dumps(args)]
    if check:
        argv.append("--check")
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    try:
        # The json callback's document comes first; timing callbacks may print after it.
        document, _end = json.JSONDecoder().raw_decode(proc.stdout[proc.stdout.index("{") :])
        return document["plays"][0]["tasks"][0]["hosts"]["localhost"]
    except (ValueError, KeyError, IndexError):
        pytest.fail(f"no JSON result (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


@pytest.fixture(scope="session")
def fake_libcuda(tmp_path_factory) -> Path:
    """The stand-in CUDA driver, compiled once per test run."""
    from hardware import build_fake_libcuda

    return build_fake_libcuda(tmp_path_factory.mktemp("libcuda"))


@pytest.fixture(scope="session")
def vllm_image() -> str:
    """The vLLM CPU test image (scripts/vllm-test-image.sh), for the tests that deploy servers of their own."""
    from vllm_server import image_name

    image = image_name()
    if subprocess.run([require("docker"), "image", "inspect", image], capture_output=True, check=False).returncode:
        pytest.fail(f"image {image} is missing: run `make deps` (scripts/vllm-test-image.sh) first")
    return image


@pytest.fixture(scope="session")
def vllm_server(vllm_image, tmp_path_factory):
    """The real vLLM deployed once per test worker with the vllm role, on that worker's port; torn down at the end."""
    from vllm_server import PROJECT, copy_model_out, role_vars, run_role

    work = tmp_path_factory.mktemp("vllm")
    copy_model_out(vllm_image, work)
    result = run_role(work, role_vars(work, vllm_image))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    yield {"image": vllm_image, "workdir": work, "result": result}
    subprocess.run(["docker", "compose", "--project-name", PROJECT, "down", "--timeout", "5"], capture_output=True, check=False)
