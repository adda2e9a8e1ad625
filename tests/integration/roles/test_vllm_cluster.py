"""The vllm role's Ray cluster (tasks_from: cluster) with the real ray package: two hosts, each a Compose project of
the vLLM test image with Ray (scripts/ray-test-image.sh), on a Docker network this test creates (their addresses
are on it and nowhere else). The role plans the cluster from what it reads on each host, starts a head and a
worker, and waits until both are in; a Ray task then runs on each node.

vLLM 0.32.0's CPU platform refuses Ray ("current platform cpu does not support ray"), so no vLLM serves across
these nodes here (the plan says so, and renders no server): a Ray driver in a container of its own beside the head
node, as the head's vLLM server is, runs a task on each node; and the server the role renders for CUDA boxes (run in
check mode with the stand-in NVML) has its command checked against vLLM's own parser.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, require, run_ansible, run_playbook_json
from hardware import one_stand_in_gpu
from vllm_server import copy_model_out, vllm_cache

HOSTS = ("box-a", "box-b")


def docker(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *argv], capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def image() -> str:
    require("docker")
    built = subprocess.run([str(ROOT / "scripts" / "ray-test-image.sh")], capture_output=True, text=True, check=False)
    if built.returncode:
        pytest.fail(f"scripts/ray-test-image.sh failed:\n{built.stderr}")
    return built.stdout.strip()


@pytest.fixture(scope="module")
def network(image):
    """A Docker network of this test's own, and an address on it for each host."""
    name = f"gpubox-ray-test-{time.time_ns() % 10**8}"
    # A subnet Docker picks as free, given back as the network's own (fixed addresses need one the user set).
    docker("network", "create", name)
    subnet = json.loads(docker("network", "inspect", name).stdout)[0]["IPAM"]["Config"][0]["Subnet"]
    docker("network", "rm", name)
    docker("network", "create", "--subnet", subnet, name)
    try:
        prefix = subnet.split("/")[0].rsplit(".", 1)[0]
        yield name, {host: f"{prefix}.{10 + i}" for i, host in enumerate(HOSTS)}
    finally:
        docker("network", "rm", name, check=False)


def project(host: str) -> str:
    return f"gpubox-ray-test-{host}"


def write_play(work: Path, image: str, network: str, addresses: dict, play_vars: dict | None = None, **host_overrides) -> None:
    repo, tag = image.split(":")
    hosts = {
        host: {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "vllm_cluster_address": addresses[host],
            "vllm_cluster_project_name": project(host),
            "vllm_cluster_project_dir": str(work / host),
            **host_overrides.get(host, {}),
        }
        for host in HOSTS
    }
    (work / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    play = {
        "hosts": "all",
        "gather_facts": False,
        "vars": {
            "vllm_device": "cpu",
            "vllm_image": repo,
            "vllm_image_tag": tag,
            "vllm_cluster_hosts": list(HOSTS),
            "vllm_cluster_network": network,
            "vllm_hf_cache_dir": str(work / "hf"),
            "vllm_cache_dir": vllm_cache(),
            "vllm_wait_timeout": 180,
            **(play_vars or {}),
        },
        "tasks": [{"ansible.builtin.include_role": {"name": "gpubox.inference.vllm", "tasks_from": "cluster.yml"}}],
    }
    (work / "play.yml").write_text(yaml.safe_dump([play]))


def run_play(work: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_ansible("ansible-playbook", "-i", str(work / "inventory.yml"), str(work / "play.yml"), *extra)


def remove(host: str) -> None:
    ids = docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={project(host)}").stdout.split()
    if ids:
        docker("rm", "-f", *ids, check=False)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, image, network):
    work = tmp_path_factory.mktemp("cluster")
    name, addresses = network
    write_play(work, image, name, addresses)
    try:
        result = run_play(work)
        yield {"work": work, "result": result, "addresses": addresses}
    finally:
        for host in HOSTS:
            remove(host)


def container(host: str) -> str:
    return f"{project(host)}-ray-1"


# Each Ray node runs a task pinned to it, which answers with the address of the node it ran on.
TASK_ON_EACH_NODE = """
import json, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address="auto", logging_level="ERROR")
@ray.remote(num_cpus=0)
def where():
    return ray.util.get_node_ip_address()
nodes = [node for node in ray.nodes() if node["Alive"]]
pinned = [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote()
          for node in nodes]
print(json.dumps(sorted(ray.get(pinned, timeout=120))))
"""


def ray_task_addresses() -> list[str]:
    """The task run from a Ray driver in a container of its own, as the head's vLLM server runs: in the head
    container's network and processes (Ray finds its node's raylet among them), with its Ray session folder (the
    volume the Compose project shares)."""
    head = container("box-a")
    session = next(m["Name"] for m in json.loads(docker("inspect", head).stdout)[0]["Mounts"] if m["Destination"] == "/tmp/ray")
    image = json.loads(docker("inspect", head).stdout)[0]["Config"]["Image"]
    driver = ["run", "--rm", "--network", f"container:{head}", "--pid", f"container:{head}", "--ipc", "host"]
    driver += ["-v", f"{session}:/tmp/ray"]
    ran = docker(*driver, "--entrypoint", "python3", image, "-c", TASK_ON_EACH_NODE, check=False)
    assert ran.returncode == 0, ran.stderr[-3000:]
    return json.loads(ran.stdout.strip().splitlines()[-1])


def test_two_hosts_form_one_cluster_and_a_ray_task_runs_on_each(cluster):
    result = cluster["result"]
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    assert "Wait until every box has joined the head" in result.stdout
    assert ray_task_addresses() == sorted(cluster["addresses"].values())


def test_the_head_and_the_worker_run_what_the_plan_says(cluster):
    work, addresses = cluster["work"], cluster["addresses"]
    head = yaml.safe_load((work / "box-a" / "compose.yaml").read_text())["services"]["ray"]
    worker = yaml.safe_load((work / "box-b" / "compose.yaml").read_text())["services"]["ray"]
    assert head["command"][:4] == ["start", "--head", "--port", "6379"]
    assert worker["command"][:3] == ["start", "--address", f"{addresses['box-a']}:6379"]
    assert head["networks"]["cluster"]["ipv4_address"] == addresses["box-a"]
    assert worker["networks"]["cluster"]["ipv4_address"] == addresses["box-b"]
    # The same image on both, restarted by Docker, NCCL and Gloo told one interface.
    assert head["image"] == worker["image"]
    assert worker["restart"] == "unless-stopped"
    assert set(worker["environment"]) == {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_DISABLE"}
    recorded = json.loads((work / "box-b" / "cluster.json").read_text())
    assert (recorded["head"], recorded["workers"], recorded["node"]) == ("box-a", ["box-b"], "box-b")
    assert recorded["args"] == [
        "--tensor-parallel-size", "1", "--pipeline-parallel-size", "2", "--distributed-executor-backend", "ray",
    ]  # fmt: skip
    assert recorded["reason_words"]["--pipeline-parallel-size"].startswith("2: one pipeline stage per box")
    # vLLM's CPU platform does not run on Ray: no server beside the head, and the plan says why.
    assert recorded["serve"] is False
    assert "vLLM's CPU platform does not run on Ray" in recorded["reason_words"]["server"]
    assert "vllm" not in yaml.safe_load((work / "box-a" / "compose.yaml").read_text())["services"]


def test_the_recorded_arguments_are_ones_vllm_takes(cluster, image):
    """The head's vLLM arguments from cluster.json, parsed by vLLM's own parser in the image."""
    args = json.loads((cluster["work"] / "box-a" / "cluster.json").read_text())["args"]
    parse = (
        "import json, sys\n"
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "ns = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])\n"
        "print(json.dumps([ns.tensor_parallel_size, ns.pipeline_parallel_size, ns.distributed_executor_backend]))\n"
    )
    ran = docker("run", "--rm", "--entrypoint", "python3", image, "-c", parse, "--model", "/models/tiny-chat", *args, check=False)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert json.loads(ran.stdout.strip().splitlines()[-1]) == [1, 2, "ray"]


def test_a_second_run_changes_nothing(cluster):
    again = run_play(cluster["work"])
    assert again.returncode == 0, again.stdout[-5000:]
    recap = [line for line in again.stdout.splitlines() if line.startswith(HOSTS)]
    assert len(recap) == 2
    assert all("changed=0" in line for line in recap), recap


def test_a_worker_that_stops_is_started_again_and_rejoins(cluster):
    """Docker restarts the node (restart: unless-stopped), and `ray start` joins the head again."""
    restarts = int(docker("inspect", "--format", "{{.RestartCount}}", container("box-b")).stdout)
    docker("exec", container("box-b"), "sh", "-c", "kill -TERM 1")
    deadline = time.monotonic() + 120
    addresses = []
    while time.monotonic() < deadline:
        now = int(docker("inspect", "--format", "{{.RestartCount}}", container("box-b")).stdout)
        if now > restarts:
            addresses = ray_task_addresses()
            if len(addresses) == 2:
                break
        time.sleep(3)
    assert int(docker("inspect", "--format", "{{.RestartCount}}", container("box-b")).stdout) > restarts
    assert addresses == sorted(cluster["addresses"].values())


def test_boxes_that_disagree_are_refused_before_anything_changes(tmp_path, image):
    addresses = {"box-a": "127.0.0.10", "box-b": "127.0.0.11"}
    write_play(tmp_path, image, "", addresses, **{"box-b": {"vllm_image_tag": "v0.31.0"}})
    result = run_play(tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 2
    repo, tag = image.split(":")
    assert f"vllm_cluster_hosts: the boxes differ in image: box-a {repo}:{tag}; box-b {repo}:v0.31.0" in out
    assert not (tmp_path / "box-a").exists()
    assert not (tmp_path / "box-b").exists()


def test_one_host_is_not_a_cluster(tmp_path, image):
    write_play(tmp_path, image, "", {"box-a": "127.0.0.10", "box-b": "127.0.0.11"})
    result = run_play(tmp_path, "-e", '{"vllm_cluster_hosts": ["box-a"]}')
    assert result.returncode == 2
    assert "vllm_cluster_hosts: a cluster needs two boxes or more (box-a given)" in result.stdout


def test_on_cuda_boxes_the_head_serves_the_model_with_a_command_vllms_parser_takes(tmp_path, image, monkeypatch):
    """Two boxes of one RTX 3090 each (the stand-in NVML), in check mode: each box plans its own part, the head's
    Compose project gets the server (a Ray driver beside the head node), the worker's does not; the server's command,
    as rendered, is parsed by vLLM's own parser in the image."""
    one_stand_in_gpu(tmp_path, monkeypatch)
    copy_model_out(image, tmp_path)
    addresses = {"box-a": "127.0.0.10", "box-b": "127.0.0.11"}
    cuda = {
        "vllm_device": "cuda",
        "vllm_model": str(tmp_path / "tiny-chat"),
        "vllm_served_model_name": "tiny",
        "vllm_port": 18170,
        "vllm_api_key": "not-in-the-compose-file",
        "vllm_max_model_len": 512,
        "vllm_project_dir": str(tmp_path / "project"),
        "_vllm_state_dir": str(tmp_path / "state"),
    }
    write_play(tmp_path, image, "", addresses, cuda)
    for host in HOSTS:
        (tmp_path / host).mkdir()  # boxes with the cluster's folder (check mode renders nothing into a missing one)
    result, doc = run_playbook_json("-i", str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml"), "--check", "--diff")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    rendered = {}
    for play in doc["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"].endswith("Render the node's Compose project"):
                rendered = {host: yaml.safe_load(r["diff"][0]["after"]) for host, r in task["hosts"].items()}
    assert set(rendered) == set(HOSTS)
    assert "vllm" not in rendered["box-b"]["services"]
    # The vLLM workers Ray starts in each node have the box's own plan's environment, and the cluster's.
    assert rendered["box-b"]["services"]["ray"]["environment"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert rendered["box-b"]["services"]["ray"]["environment"]["NCCL_SOCKET_IFNAME"]
    server = rendered["box-a"]["services"]["vllm"]
    assert server["entrypoint"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert (server["network_mode"], server["pid"]) == ("host", "service:ray")
    assert server["depends_on"] == {"ray": {"condition": "service_healthy"}}
    assert server["environment"]["RAY_ADDRESS"] == "127.0.0.10:6379"
    assert server["environment"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert server["env_file"] == ["vllm.env"]
    assert "not-in-the-compose-file" not in json.dumps(rendered)
    # The server's Ray driver joins the head node through the session folder the node shares.
    ray_session = [v for v in rendered["box-a"]["services"]["ray"]["volumes"] if v.endswith(":/tmp/ray")]
    assert ray_session == [v for v in server["volumes"] if v.endswith(":/tmp/ray")] == ["ray-session:/tmp/ray"]
    parse = (
        "import json, sys\n"
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "ns = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])\n"
        "print(json.dumps([ns.model, ns.served_model_name, ns.host, ns.port, ns.tensor_parallel_size,\n"
        "                  ns.pipeline_parallel_size, ns.distributed_executor_backend, ns.max_model_len]))\n"
    )
    # Docker Compose takes the head's project as rendered (a server sharing the node's network and processes).
    (tmp_path / "check").mkdir()
    (tmp_path / "check" / "compose.yaml").write_text(yaml.safe_dump(rendered["box-a"]))
    (tmp_path / "check" / "vllm.env").write_text("")
    checked = docker("compose", "--project-directory", str(tmp_path / "check"), "config", "--quiet", check=False)
    assert checked.returncode == 0, checked.stderr
    ran = docker("run", "--rm", "--entrypoint", "python3", image, "-c", parse, *server["command"], check=False)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert json.loads(ran.stdout.strip().splitlines()[-1]) == [
        "/models/tiny-chat", ["tiny"], "127.0.0.1", 18170, 1, 2, "ray", 512,
    ]  # fmt: skip
