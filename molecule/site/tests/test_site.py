"""What site.yml must leave on a Debian 12 box (stand-in GPUs, the real vLLM CPU build), checked with testinfra.

After converge and idempotence, side_effect.yml swaps a GPU and re-provisions with
JSON output; the tests at the end read that run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

PROJECT = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
# The first box; the second box and the gateway are checked by tests/test_gateway.py.
testinfra_hosts = ["gpubox-debian12"]


# ------------------------------------------------------------ the whole play


def site(*flags: str) -> subprocess.CompletedProcess:
    """site.yml on the converged box, as the user runs it, with extra flags."""
    return subprocess.run(
        ["ansible-playbook", "--inventory", os.environ["MOLECULE_INVENTORY_FILE"], *flags, str(PROJECT / "site.yml")],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1"},
    )


# The check-mode and tags runs go to the first box and the gateway: the second box runs the same roles (the
# idempotence stage ran them all on it), and each run over three hosts took half a minute more.
LIMIT = ("--limit", "gpubox-debian12,gpubox-gateway")


def assert_no_change(run: subprocess.CompletedProcess) -> None:
    """Nothing changed on the first box or on the gateway."""
    pattern = r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)"
    recaps = {name: counts for name, *counts in re.findall(pattern, run.stdout, re.M)}
    assert set(recaps) == {"gpubox-debian12", "gpubox-gateway"}, run.stdout[-3000:] + run.stderr[-2000:]
    for counts in recaps.values():
        assert int(counts[0]) > 0
        assert counts[1:] == ["0", "0", "0"], run.stdout[-3000:]


def test_check_mode_on_the_converged_host_reports_no_change():
    """`--check --diff` must predict no change on a converged host; a role whose check mode lies fails this."""
    assert_no_change(site("--check", "--diff", *LIMIT))


def test_a_run_limited_by_tags_changes_nothing(host):
    """--tags vllm, proxy or smoke on a converged box: changed=0, and the Compose file stays byte for byte."""
    compose = "/opt/gpubox/vllm/compose.yaml"
    before = host.check_output(f"sha256sum {compose}")
    container = host.check_output("docker compose --project-name gpubox-vllm ps --quiet vllm")
    for tag in ("vllm", "proxy", "smoke"):
        run = site("--tags", tag, *LIMIT)
        assert_no_change(run)
        assert host.check_output(f"sha256sum {compose}") == before, f"--tags {tag} rewrote {compose}"
        if tag == "smoke":
            assert "Smoke test: 4/4 streams OK" in run.stdout, run.stdout[-3000:]
    assert host.check_output("docker compose --project-name gpubox-vllm ps --quiet vllm") == container


# ------------------------------------------------------------ base


def test_base_packages(host):
    for name in ("pciutils", "ca-certificates", "python3-apt"):
        assert host.package(name).is_installed, name
    assert host.run("lspci -n").rc == 0


def test_the_state_folder_holds_all_the_state(host):
    """One folder (README, "State on the box"), and nothing left in the old local-facts places."""
    state = host.file("/var/lib/gpubox")
    assert state.is_directory
    assert (state.user, state.mode) == ("root", 0o755)
    assert {"gpu.json", "p2p.json", "vllm.json", "proxy.json", "huggingface", "vllm-cache"} <= set(state.listdir())
    assert not host.file("/etc/ansible/facts.d").exists


# ------------------------------------------------------------ preflight


def test_preflight_report_on_the_controller_says_there_is_no_gpu(host):
    name = host.backend.get_hostname()
    folder = PROJECT / "playbooks" / "preflight-reports" / name
    assert "No NVIDIA GPU found on this host" in (folder / "preflight.md").read_text()
    assert not (folder / "preflight.svg").exists()


# ------------------------------------------------------------ docker_engine


def deb822(host, path: str) -> dict[str, str]:
    """The fields of a one-stanza deb822 source file."""
    fields = {}
    for line in host.file(path).content_string.splitlines():
        key, sep, value = line.partition(":")
        if sep and not line.startswith((" ", "#")):
            fields[key] = value.strip()
    return fields


def test_docker_comes_from_the_signed_repository(host):
    for name in ("docker-ce", "docker-ce-cli", "containerd.io", "docker-buildx-plugin", "docker-compose-plugin"):
        assert host.package(name).is_installed, name
    source = deb822(host, "/etc/apt/sources.list.d/docker.sources")
    assert {k: source[k] for k in ("Types", "URIs", "Suites", "Components", "Architectures")} == {
        "Types": "deb",
        "URIs": "http://gpubox-debian12:8080/docker/debian",
        "Suites": "bookworm",
        "Components": "stable",
        "Architectures": "amd64",
    }
    key = host.file(source["Signed-By"])
    assert key.content_string.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
    assert (key.user, key.mode) == ("root", 0o644)
    assert not host.file("/etc/apt/sources.list.d/docker.list").exists


def test_docker_runs_with_compose_v2(host):
    docker = host.service("docker")
    assert docker.is_running
    assert docker.is_enabled
    assert host.check_output("docker compose version --short").startswith("2.")
    assert host.run("docker info").rc == 0


def test_daemon_json_was_merged_not_overwritten(host):
    daemon = json.loads(host.file("/etc/docker/daemon.json").content_string)
    assert daemon["log-level"] == "warn", "the setting put there before the roles ran is gone"
    assert daemon["log-driver"] == "local"
    assert daemon["log-opts"] == {"max-size": "20m"}
    assert daemon["runtimes"]["nvidia"] == {"path": "nvidia-container-runtime", "args": []}
    assert "default-runtime" not in daemon


def test_docker_applied_daemon_json_and_restarted_only_for_what_a_reload_cannot_apply(host):
    """The logging driver is read at start: the docker role restarted Docker for it. The nvidia runtime and
    live-restore are read again on a reload: the toolkit's change, made after Docker's last start, was applied
    by one, and the running daemon has it."""
    assert host.check_output("docker info --format '{{ .LoggingDriver }}'") == "local"
    assert host.check_output("docker info --format '{{ .LiveRestoreEnabled }}'") == "true"
    assert "nvidia" in json.loads(host.check_output("docker info --format '{{ json .Runtimes }}'"))
    changed = int(host.check_output("stat -c %Y /etc/docker/daemon.json"))
    started_us = int(host.check_output("systemctl show docker -p ActiveEnterTimestamp --value --timestamp=unix").lstrip("@"))
    assert started_us < changed, "Docker was restarted after the runtime was added, where a reload applies it"


# ------------------------------------------------------------ nvidia_container_toolkit


def test_toolkit_is_pinned_below_the_newest_version(host):
    for name in (
        "nvidia-container-toolkit",
        "nvidia-container-toolkit-base",
        "libnvidia-container-tools",
        "libnvidia-container1",
    ):
        package = host.package(name)
        assert package.is_installed, name
        assert package.version == "1.17.8-1", name
    assert "1.18.0-1" in host.check_output("apt-cache policy nvidia-container-toolkit")


def test_nvidia_source_is_a_signed_flat_repository(host):
    source = deb822(host, "/etc/apt/sources.list.d/nvidia-container-toolkit.sources")
    assert source["URIs"] == "http://gpubox-debian12:8080/nvidia/stable/deb/$(ARCH)"
    assert source["Suites"] == "/"
    assert "Components" not in source
    assert host.file(source["Signed-By"]).content_string.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
    assert not host.file("/etc/apt/sources.list.d/nvidia-container-toolkit.list").exists
    # apt read the source and trusts its key: the pinned package comes from it.
    assert "gpubox-debian12:8080/nvidia/stable/deb/amd64" in host.check_output("apt-cache policy nvidia-container-toolkit")


def test_without_a_gpu_no_cdi_spec_is_generated(host):
    assert host.file("/usr/bin/nvidia-ctk").exists
    assert not host.file("/etc/cdi/nvidia.yaml").exists


# ------------------------------------------------------------ nginx_proxy


def test_nginx_config_checks_and_listens(host):
    assert host.run("nginx -t").rc == 0
    assert host.service("nginx").is_running
    assert host.service("nginx").is_enabled
    assert host.socket("tcp://0.0.0.0:80").is_listening
    assert host.socket("tcp://0.0.0.0:443").is_listening
    assert not host.file("/etc/nginx/sites-enabled/default").exists
    site = host.file("/etc/nginx/conf.d/gpubox-openai.conf")
    assert (site.user, site.mode) == ("root", 0o640)
    # No copy of an old site (with old keys) anywhere: the role keeps none and removed the one prepare left.
    assert host.check_output("ls -A /etc/nginx/conf.d") == "gpubox-openai.conf"
    assert host.run("grep -rl revoked-key- /etc/nginx").stdout == ""


PROCESSES = """
import glob, os, sys
titles = []
for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        titles.append(open(path, "rb").read().split(b"\\0")[0])
    except OSError:  # the process ended meanwhile
        pass
name = sys.argv[1].encode()
print(sum(1 for title in titles if title == name or os.path.basename(title) == name))
"""


def count_processes(host, name: str) -> int:
    """Processes on the box whose title or program name is ``name`` (the box has no ps)."""
    return int(host.check_output(f"python3 -c {shlex.quote(PROCESSES)} {shlex.quote(name)}"))


def test_nginx_runs_the_roles_number_of_workers(host):
    # nginx_proxy_worker_processes: 1 by default, in the main configuration; the reload applied it.
    main = host.file("/etc/nginx/nginx.conf").content_string
    assert [line for line in main.splitlines() if line.startswith("worker_processes")] == ["worker_processes 1;"]
    # Sized for nginx_proxy_max_streams (1024): 2 connections per stream plus 256, and files for them.
    assert [line.strip() for line in main.splitlines() if "worker_connections" in line] == ["worker_connections 2304;"]
    assert "worker_rlimit_nofile 4608;" in main.splitlines()
    assert count_processes(host, "nginx: worker process") == 1


# The box's front door is TLS (the fleet's gateway reaches it so); its self-signed pair names 127.0.0.1.
TLS = 'ssl.create_default_context(cafile="/etc/nginx/gpubox-tls/selfsigned.crt")'

FETCH = f"""
import json, ssl, sys, urllib.error, urllib.request
request = urllib.request.Request("https://127.0.0.1/v1/models", headers=json.loads(sys.argv[1]))
try:
    response = urllib.request.urlopen(request, timeout=10, context={TLS})
except urllib.error.HTTPError as error:
    response = error
print(json.dumps({{"status": response.status, "headers": dict(response.headers), "body": response.read().decode()}}))
"""


def fetch(host, headers: dict) -> dict:
    """GET /v1/models through the proxy, from the test host itself (it has Python, not curl)."""
    return json.loads(host.check_output(f"python3 -c {shlex.quote(FETCH)} {shlex.quote(json.dumps(headers))}"))


def test_nginx_answers_json_and_hides_its_version(host):
    no_key = fetch(host, {})
    assert no_key["status"] == 401
    assert no_key["headers"]["Server"] == "nginx"
    assert json.loads(no_key["body"])["error"]["code"] == "invalid_api_key"
    models = fetch(host, {"Authorization": "Bearer molecule-key-0123456789abcdef"})
    assert models["status"] == 200, models
    assert [m["id"] for m in json.loads(models["body"])["data"]] == ["tiny"]


# ------------------------------------------------------------ vllm


def test_vllm_is_loopback_only_and_runs_the_loaded_image(host):
    assert host.socket("tcp://127.0.0.1:8000").is_listening
    assert not host.socket("tcp://0.0.0.0:8000").is_listening
    image = host.check_output("docker compose --project-name gpubox-vllm images --format json")
    assert "gpubox-vllm-cpu" in image
    compose = host.file("/opt/gpubox/vllm/compose.yaml").content_string
    assert "--tensor-parallel-size: 1: the CPU backend" in compose
    assert host.file("/opt/gpubox/vllm/vllm.env").mode == 0o600
    # The host's network: the server binds loopback itself, with no docker-proxy relaying each token.
    assert "network_mode: host" in compose
    assert host.check_output("docker inspect -f '{{.HostConfig.NetworkMode}}' gpubox-vllm-vllm-1") == "host"
    assert count_processes(host, "docker-proxy") == 0


def test_local_facts_record_the_deployment_and_the_endpoint(host):
    deployed = json.loads(host.file("/var/lib/gpubox/vllm.json").content_string)
    assert deployed["served_model_name"] == "tiny"
    assert deployed["url"] == "http://127.0.0.1:8000/v1"
    assert deployed["tensor_parallel_size"] == 1
    proxy = json.loads(host.file("/var/lib/gpubox/proxy.json").content_string)
    assert proxy["local_url"] == "https://127.0.0.1:443/v1"
    assert proxy["certificate"] == "/etc/nginx/gpubox-tls/selfsigned.crt"
    # A box of a fleet: where a rolling re-provision drains it (the file is there only while it is drained).
    assert proxy["drain_flag"] == "/run/gpubox-drained"
    assert not host.file("/run/gpubox-drained").exists


# ------------------------------------------------------------ the GPU swap (side_effect.yml)

SWAPPED_UUID = "GPU-3090cccc-0000-0000-0000-000000000000"


def swap_run() -> dict:
    return json.loads((Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "swap-run.json").read_text())


def changed_tasks(run: dict) -> set[str]:
    """The tasks that changed something on the box, by name without the role prefix."""
    names = set()
    for play in run["plays"]:
        for task in play["tasks"]:
            for result in task["hosts"].values():
                if result.get("changed"):
                    names.add(task["task"]["name"].split(" : ")[-1])
    return names


def debug_lines(run: dict, task_name: str) -> list[str]:
    for play in run["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"].split(" : ")[-1] == task_name:
                return [line for result in task["hosts"].values() for line in result.get("msg") or []]
    raise AssertionError(f"no task named {task_name!r} ran")


def test_exactly_the_swap_path_ran():
    run = swap_run()
    assert run["stats"]["gpubox-debian12"]["failures"] == 0
    assert run["stats"]["gpubox-debian12-b"]["failures"] == 0
    assert changed_tasks(run) == {
        "Remove vLLM's P2P access cache for the old GPUs",
        # The box is behind the fleet's gateway: drained before its server was recreated, and back in rotation
        # after its smoke test through its own front door.
        "Take the box out of the fleet's rotation (its front door refuses the gateway's new requests)",
        "Put the box back in the fleet's rotation",
        "Start the Compose project",
        "Remember the GPU set this deployment is for",
        "Remember what was deployed, for the next run's comparison",
        # A new GPU fingerprint is a new key: the correctness gate judged again and stored it.
        "Store the reference and the verdicts",
        # The new card (and, after the swap's reboot, the old one) back at their default limits: set again.
        "Set GPU persistence mode and the power limits",
        # The new GPUs recorded for the drift watch.
        "Record the box as deployed",
    }


def test_the_swap_recreated_vllm_and_left_the_rest_running(host):
    before = json.loads(host.file("/var/tmp/gpubox-before-swap.json").content_string)
    assert before["vllm"]
    assert host.check_output("docker compose --project-name gpubox-vllm ps --quiet vllm") != before["vllm"]
    assert host.check_output("systemctl show nginx --property MainPID --value") == before["nginx"]
    assert host.check_output("systemctl show docker --property MainPID --value") == before["docker"]


def test_the_swap_cleared_vllms_p2p_cache_and_kept_the_model_cache(host):
    assert not host.file("/var/lib/gpubox/vllm-cache/gpu_p2p_access_cache_for_0,1.json").exists
    assert host.file("/var/lib/gpubox/huggingface/keep-me").content_string == "model cache\n"


def test_the_new_gpu_set_is_stored(host):
    record = json.loads(host.file("/var/lib/gpubox/gpu.json").content_string)
    assert SWAPPED_UUID in json.dumps(record)
    deployed = json.loads(host.file("/var/lib/gpubox/vllm.json").content_string)
    assert deployed["fingerprint"] == record["fingerprint"]


def test_the_gate_judged_each_gpu_set_against_its_own_reference(host):
    """The swap is a new GPU fingerprint, so a new key: the reference was recorded again, not reused."""
    record = json.loads(host.file("/var/lib/gpubox/gpu.json").content_string)
    stored = json.loads(host.file("/var/lib/gpubox/gate.json").content_string)
    assert len(stored) == 2
    current = next(entry for key, entry in stored.items() if key.startswith(record["fingerprint"] + "|"))
    assert current["chosen"] == "as_planned"
    assert current["results"]["as_planned"]["agreement"]["agreeing"] == 8
    assert current["reference"]["answers"][0]["text"].startswith(" tensors over links and nginx streams tokens")


def test_the_summary_says_what_changed_and_what_was_measured():
    lines = debug_lines(swap_run(), "Say what was found, what was decided and why, and what was measured")
    text = "\n".join(lines)
    assert lines[0] == "gpubox-debian12:"
    assert "GPUs: 2 x NVIDIA GeForce RTX 3090 (driver 595.71.05)" in text
    assert "CHANGED since the last deploy" in text
    assert "replaced" in text
    assert "P2P, measured: GPU0->GPU1 ok" in text  # measured again, not from the cache
    assert "GPU swap handled: vLLM's P2P cache cleared, the vLLM container recreated" in text
    assert "Model: tiny (/srv/models/tiny-chat), tensor parallel 1" in text
    assert "Correctness gate: the correctness gate passed with the configuration as planned" in text
    assert "Endpoint: https://" in text
    assert "Smoke test: 4/4 streams OK" in text
    assert "GPU power: GPU0 298 W, GPU1 298 W, persistence mode on; set again at every boot" in text
    first, _sep, second = text.partition("\ngpubox-debian12-b:")
    assert second, text
    assert "Watched: the engine watchdog probes vLLM every 5 s" in first
    assert "engine watchdog" not in second  # the second box runs without it (molecule.yml)
    assert "the drift watch compares the box with this deployment every 600 s (journalctl -u gpubox-drift)" in text
    assert (
        "Monitoring: Prometheus at http://127.0.0.1:9090 reads the box, vLLM, Nginx, the GPUs (gpubox-gpu-metrics) every 5 s; "
        "alerts at http://127.0.0.1:9090/alerts; Grafana dashboard /usr/local/share/gpubox/grafana/gpubox-inference.json"
    ) in text


# ------------------------------------------------------------ gpubox: GPU power

RESET_POWER = """
import json
path = "/etc/gpubox-test/nvml.json"
machine = json.load(open(path))
for gpu in machine["gpus"]:
    gpu["persistence"] = 0
    gpu["power"].pop("limit_mw", None)
machine["set"] = []
json.dump(machine, open(path, "w"))
"""


def stand_in_gpus(host) -> dict:
    return json.loads(host.file("/etc/gpubox-test/nvml.json").content_string)


def test_gpu_power_was_set_and_is_set_again_at_boot(host):
    """85% of the cards' 350 W default; a boot puts the cards back at their defaults and the unit sets them again."""
    machine = stand_in_gpus(host)
    assert [(gpu["power"]["limit_mw"], gpu["persistence"]) for gpu in machine["gpus"]] == [(298000, 1), (298000, 1)]
    assert json.loads(host.file("/etc/gpubox/gpu-power.json").content_string) == {"limit": "85%", "persistence": True}
    assert host.file("/etc/gpubox/environment").mode == 0o600
    assert host.service("gpubox-gpu-power").is_enabled
    unit = host.file("/etc/systemd/system/gpubox-gpu-power.service").content_string
    assert "Before=docker.service" in unit
    assert "After=systemd-modules-load.service nvidia-persistenced.service" in unit
    host.check_output(f"python3 -c {shlex.quote(RESET_POWER)}")
    host.check_output("systemctl restart gpubox-gpu-power")
    machine = stand_in_gpus(host)
    assert machine["set"] == [
        {"gpu": 0, "persistence": 1},
        {"gpu": 0, "power_limit_mw": 298000},
        {"gpu": 1, "persistence": 1},
        {"gpu": 1, "power_limit_mw": 298000},
    ]
    journal = host.check_output("journalctl --unit gpubox-gpu-power --output cat --no-pager")
    assert "GPU1 NVIDIA GeForce RTX 3090: power limit 298.0 W, persistence mode on (set: power_limit, persistence)" in journal


# ------------------------------------------------------------ gpubox: the drift watch


def drift_said(host, lines: int, starts: str) -> list[str]:
    """The drift program's last lines in the journal (its own identifier: not systemd's "Finished ..."), once they show."""
    said: list[str] = []
    for _attempt in range(20):
        said = host.check_output(f"journalctl --identifier gpubox-drift --output cat --no-pager --lines {lines}").splitlines()
        if said and said[0].startswith(starts):
            break
        time.sleep(0.5)
    return said


# GPU0's link trains down to x4; a BIOS update turns ACS redirection back on at the root port above GPU1.
DRIFT = """
import json, pathlib, sys
sys.path.insert(0, "/opt/gpubox-test/python")
import hardware
path = "/etc/gpubox-test/nvml.json"
machine = json.load(open(path))
machine["gpus"][0]["width"] = [4, 16] if sys.argv[1] == "drift" else [16, 16]
json.dump(machine, open(path, "w"))
control = hardware.ACS_SRC_VALID | (hardware.ACS_REQ_REDIR | hardware.ACS_CMPLT_REDIR if sys.argv[1] == "drift" else 0)
hardware.set_acs(pathlib.Path("/opt/gpubox-test/box"), "0000:40:01.1", control)
"""


def test_the_drift_watch_says_what_drifted_since_the_deployment(host):
    """The box as the swap's run recorded it; then a link at x4 and ACS redirecting: a warning and a metric each."""
    timer = host.service("gpubox-drift.timer")
    assert timer.is_running
    assert timer.is_enabled
    recorded = json.loads(host.file("/var/lib/gpubox/drift.json").content_string)
    assert recorded["fingerprint"] == json.loads(host.file("/var/lib/gpubox/gpu.json").content_string)["fingerprint"]
    assert recorded["acs"] == {"verdict": "clear", "redirecting": []}
    assert recorded["images"] == [host.check_output("docker inspect -f '{{.Image}}' gpubox-vllm-vllm-1")]
    host.check_output("systemctl start gpubox-drift.service")
    assert drift_said(host, 1, "no drift")[0].startswith("no drift: the GPUs, their links, ACS")
    try:
        host.check_output(f"python3 -c {shlex.quote(DRIFT)} drift")
        host.check_output("systemctl start gpubox-drift.service")
        said = drift_said(host, 2, "GPU0")
        metrics = host.file("/var/lib/gpubox/metrics/drift.prom").content_string
    finally:
        host.check_output(f"python3 -c {shlex.quote(DRIFT)} restore")
    assert said == [
        "GPU0 (0000:09:00.0) runs its link at x4, x16 when deployed (it supports x16): reseat the card or check the slot "
        "and riser",
        "ACS now redirects peer-to-peer traffic on 0000:40:01.1 (a BIOS update turns it back on): NCCL over P2P may hang; "
        "run site.yml, whose preflight turns P2P off or remediates",
    ]
    assert 'gpubox_drift{check="link_width",gpu="0"} 1\n' in metrics
    assert 'gpubox_drift{check="acs_redirect"} 1\n' in metrics
    assert "gpubox_drift_findings 2\n" in metrics
    # It only said so: nothing it read was changed back, and the recorded box is the same.
    assert json.loads(host.file("/var/lib/gpubox/drift.json").content_string) == recorded


# ------------------------------------------------------------ the engine watchdog (last: it kills the engine)

WATCHDOG_JOURNAL = "journalctl --unit gpubox-vllm-watchdog --output cat --no-pager"


def test_the_watchdog_timer_runs_and_never_restarted_the_healthy_server(host):
    """Through converge, idempotence, the swap and the tests above, the timer probed every 5 s and restarted nothing."""
    timer = host.service("gpubox-vllm-watchdog.timer")
    assert timer.is_running
    assert timer.is_enabled
    state = json.loads(host.file("/var/lib/gpubox/watchdog.json").content_string)
    assert state["ticks"] >= 20, state
    assert state["restarts_total"] == 0, host.check_output(WATCHDOG_JOURNAL)
    config = json.loads(host.file("/etc/gpubox/vllm-watchdog.json").content_string)
    assert config["policy"] == {"failures": 3, "max_restarts": 3, "window_s": 3600, "start_grace_s": 600}
    assert "key" not in json.dumps(config).lower()
    metrics = host.file("/var/lib/gpubox/metrics/vllm_watchdog.prom").content_string
    assert "gpubox_vllm_watchdog_restarts_total 0\n" in metrics


ENGINE_KILL = """
import os, signal
for pid in os.listdir("/proc"):
    if pid.isdigit() and open(f"/proc/{pid}/cmdline", "rb").read().startswith(b"VLLM::EngineCore"):
        os.kill(int(pid), signal.SIGKILL)
        print(pid)
"""

COMPLETION = f"""
import json, ssl, sys, urllib.error, urllib.request
max_tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 1
body = {{"model": "tiny", "prompt": "the quick brown fox jumps over a lazy dog while gpus share", "max_tokens": max_tokens}}
request = urllib.request.Request("https://127.0.0.1/v1/completions", data=json.dumps(body).encode(),
    headers={{"Authorization": "Bearer molecule-key-0123456789abcdef", "Content-Type": "application/json"}})
try:
    print(urllib.request.urlopen(request, timeout=10, context={TLS}).status)
except (urllib.error.URLError, OSError) as error:
    print(getattr(error, "code", None) or error)
"""


def test_the_watchdog_restores_a_dead_engine_and_the_journal_says_why(host):
    """The engine process killed inside the container; its API server stays up and Docker sees nothing to restart."""
    container = host.check_output("docker compose --project-name gpubox-vllm ps --quiet vllm")
    assert host.check_output(f"python3 -c {shlex.quote(COMPLETION)}") == "200"
    assert host.check_output(f"docker exec gpubox-vllm-vllm-1 python3 -c {shlex.quote(ENGINE_KILL)}")
    killed = time.monotonic()
    answers, journal = [], ""
    # Stated: failures x (interval + timeout) + the server's start; 3 x 15 s + about 30 s here.
    while time.monotonic() - killed < 240:
        answers.append(host.check_output(f"python3 -c {shlex.quote(COMPLETION)}"))
        journal = host.check_output(WATCHDOG_JOURNAL)
        if answers[-1] == "200" and "vLLM serves again" in journal:
            break
        time.sleep(5)
    assert answers[-1] == "200", f"not serving {time.monotonic() - killed:.0f} s after the kill: {answers}\n{journal}"
    assert "vLLM serves again" in journal, journal
    assert answers[0] != "200", answers  # the engine was dead: Nginx answered an error until the restart
    assert "probe failed (1 of 3 in a row before a restart): vllm: /health answered HTTP 503" in journal
    assert "3 probes in a row failed (vllm: /health answered HTTP 503): recreating the Compose project" in journal
    assert "last 40 log lines of gpubox-vllm-vllm-1:" in journal
    assert "EngineDeadError" in journal or "EngineCore encountered an issue" in journal
    assert host.check_output("docker compose --project-name gpubox-vllm ps --quiet vllm") != container
    state = json.loads(host.file("/var/lib/gpubox/watchdog.json").content_string)
    assert state["restarts_total"] == 1


# ------------------------------------------------------------ monitoring (last: it stops vLLM, then removes itself)

PROMETHEUS = """
import json, sys, urllib.request
print(urllib.request.urlopen("http://127.0.0.1:9090" + sys.argv[1], timeout=10).read().decode())
"""


def prometheus(host, path: str) -> dict:
    return json.loads(host.check_output(f"python3 -c {shlex.quote(PROMETHEUS)} {shlex.quote(path)}"))["data"]


def query(host, expression: str) -> dict[str, float]:
    """An instant query's samples, by their gpu label (or '' without one)."""
    from urllib.parse import quote

    result = prometheus(host, f"/api/v1/query?query={quote(expression)}")["result"]
    return {sample["metric"].get("gpu", ""): float(sample["value"][1]) for sample in result}


def wait_for(what, seconds: float = 90, every: float = 3):
    """what() until it is truthy, for at most ``seconds``; its last value."""
    deadline = time.monotonic() + seconds
    while True:
        value = what()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


def test_prometheus_scrapes_vllm_nginx_and_the_box(host):
    def targets():
        active = prometheus(host, "/api/v1/targets")["activeTargets"]
        return {target["labels"]["job"]: target["health"] for target in active}

    assert wait_for(lambda: set(targets().values()) == {"up"}), targets()
    assert targets() == {"prometheus": "up", "node": "up", "vllm": "up", "nginx": "up"}
    for service in ("prometheus", "prometheus-node-exporter", "prometheus-nginx-exporter"):
        assert host.service(service).is_running, service
        assert host.service(service).is_enabled, service
    # Every exporter and Prometheus itself on loopback only.
    for port in (9090, 9100, 9113):
        assert host.socket(f"tcp://127.0.0.1:{port}").is_listening
        assert not host.socket(f"tcp://0.0.0.0:{port}").is_listening
    # The watchdog's test above recreated the server, whose counters start again at 0: tokens of its own to count.
    assert host.check_output(f"python3 -c {shlex.quote(COMPLETION)} 8") == "200"
    assert wait_for(lambda: query(host, "sum(vllm:generation_tokens_total)")[""] > 0), "vLLM's tokens never reached Prometheus"
    assert query(host, "nginx_connections_active")[""] >= 1


def test_the_stand_in_gpus_reach_prometheus_and_an_xid_in_the_kernel_log_raises_its_alert(host):
    """What the stand-in NVML reports (the power limit the gpubox role set: 85% of 350 W, in whole watts), read by
    gpubox-gpu-metrics."""
    assert host.service("gpubox-gpu-metrics.timer").is_running
    assert wait_for(lambda: len(query(host, "gpubox_gpu_power_limit_watts")) == 2)
    assert query(host, "gpubox_gpu_power_limit_watts") == {"0": 298, "1": 298}
    assert query(host, "gpubox_gpu_temperature_celsius") == {"0": 41, "1": 41}
    assert query(host, "gpubox_gpu_pcie_link_width") == {"0": 16, "1": 4}
    assert query(host, "gpubox_gpu_xid_errors") == {"0": 0, "1": 0}
    # The driver's line as the kernel logs it, under the journal's identifier for kernel lines.
    host.check_output("logger --tag kernel 'NVRM: Xid (PCI:0000:41:00): 79, pid=2213, name=python3, GPU has fallen off the bus.'")
    assert wait_for(lambda: query(host, "gpubox_gpu_xid_errors").get("1") == 1, 60), query(host, "gpubox_gpu_xid_errors")
    firing = wait_for(lambda: [a for a in prometheus(host, "/api/v1/alerts")["alerts"]
                               if a["labels"]["alertname"] == "GPUXidError" and a["state"] == "firing"], 60)  # fmt: skip
    assert [alert["labels"]["gpu"] for alert in firing] == ["1"]
    # GPU1 runs at x4 of its x16 (the stand-in box): the downtrained link is seen, and alerts after its 10 minutes.
    alerts = prometheus(host, "/api/v1/alerts")["alerts"]
    assert [alert["labels"].get("gpu") for alert in alerts if alert["labels"]["alertname"] == "GPULinkNarrow"] == ["1"]


def test_every_metric_the_alerts_and_the_dashboard_read_is_in_prometheus(host):
    import yaml

    sys.path.insert(0, str(PROJECT / "tests"))
    from promql import metric_names

    rules = yaml.safe_load(host.file("/etc/prometheus/gpubox-alerts.yml").content_string)
    dashboard = json.loads(host.file("/usr/local/share/gpubox/grafana/gpubox-inference.json").content_string)
    expressions = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    expressions += [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    read = set().union(*map(metric_names, expressions))
    names = set(prometheus(host, "/api/v1/label/__name__/values"))
    assert read - names == set(), sorted(read - names)
    assert {"nginx_up", "nginx_connections_active", "vllm:kv_cache_usage_perc", "gpubox_drift_findings"} <= read


def test_stopping_vllm_raises_the_engine_down_alert(host):
    """The real Prometheus sees vLLM down and raises VLLMDown with its labels and summary, pending until the rule's
    `for: 1m` has passed. That it then fires, and not before, is Prometheus's own rule evaluation, checked on the same
    rendered rules with promtool (tests/integration/roles/test_monitoring.py, an alert waits for its time): waiting
    the minute here again cost a minute of every run."""
    host.check_output("docker compose --project-name gpubox-vllm stop vllm")
    stopped = time.monotonic()

    def down():
        alerts = prometheus(host, "/api/v1/alerts")["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "VLLMDown" and a["state"] in ("pending", "firing")]

    raised = wait_for(down, 150, 5)
    assert raised, f"no VLLMDown {time.monotonic() - stopped:.0f} s after vLLM stopped: {prometheus(host, '/api/v1/alerts')}"
    assert raised[0]["labels"]["instance"] == "127.0.0.1:8000"
    assert raised[0]["annotations"]["summary"] == "vLLM at 127.0.0.1:8000 does not answer"
    rule = [r for g in prometheus(host, "/api/v1/rules")["groups"] for r in g["rules"] if r.get("name") == "VLLMDown"]
    assert [r["duration"] for r in rule] == [60], rule


def test_turned_off_the_monitoring_removes_what_it_installed(host):
    off = site("--tags", "monitoring", "--extra-vars", "monitoring_enabled=false")
    assert off.returncode == 0, off.stdout[-3000:]
    for package in ("prometheus", "prometheus-node-exporter", "prometheus-nginx-exporter"):
        assert not host.package(package).is_installed, package
    for path in ("/etc/systemd/system/gpubox-gpu-metrics.timer", "/usr/local/lib/gpubox/gpu-metrics",
                 "/var/lib/gpubox/metrics/gpu.prom", "/etc/prometheus/gpubox-alerts.yml", "/etc/gpubox/monitoring.json",
                 "/usr/local/share/gpubox/grafana"):  # fmt: skip
        assert not host.file(path).exists, path
    # The other programs' textfiles stay: they are the watchdog's and the drift watch's.
    assert host.file("/var/lib/gpubox/metrics/drift.prom").exists
    assert not host.socket("tcp://127.0.0.1:9090").is_listening


# ------------------------------------------------------------ last: Docker restarted under the server


def test_vllm_keeps_serving_while_docker_restarts(host):
    """live-restore: Docker restarting (an upgrade, a changed setting) leaves the server running; only the vllm
    role restarts it, and drains a box of a fleet first. (The monitoring tests stopped vLLM: started again first.)"""
    host.check_output("docker compose --project-name gpubox-vllm start vllm")
    assert wait_for(lambda: host.check_output(f"python3 -c {shlex.quote(COMPLETION)}") == "200", 240, 5)
    started = "docker inspect -f '{{.State.StartedAt}}' gpubox-vllm-vllm-1"
    before = host.check_output(started)
    host.run_expect([0], "systemctl restart docker")
    answer = host.check_output(f"python3 -c {shlex.quote(COMPLETION)}")
    assert answer == "200", (answer, host.run("docker ps -a; docker logs --tail 20 gpubox-vllm-vllm-1").stdout)
    assert host.check_output(started) == before, "the server was restarted with Docker"
