"""The monitoring role's Prometheus configuration and alert rules, rendered by the role and checked by the real promtool;
each alert fires on the series that mean trouble and stays quiet on a healthy box (promtool test rules, Prometheus's own
rule engine); every metric the rules and the dashboard read is one that vLLM or the box's programs really write."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import urllib.request

import pytest
import yaml
from conftest import COLLECTIONS, ROOT, require, run_ansible
from hardware import RTX3090_PAIR, nvml_machine, stand_in_pynvml
from promql import metric_names
from vllm_server import PORT as VLLM_PORT

from ansible_collections.gpubox.inference.plugins.module_utils import _drift, _gpu_metrics, _watchdog

ROLE = ROOT / "roles" / "monitoring"
DASHBOARD = ROLE / "files" / "gpubox-inference.json"
DEPLOYMENT = {"upstreams": ["127.0.0.1:8000", "127.0.0.1:8001"], "url": "http://127.0.0.1:8000"}


def render(work, **variables) -> tuple[str, str, subprocess.CompletedProcess]:
    """The role's render.yml (each file validated by promtool as it is written); the rules, the config, the run."""
    rules, config = work / "gpubox-alerts.yml", work / "prometheus.yml"
    task = {"ansible.builtin.include_role": {"name": "gpubox.inference.monitoring", "tasks_from": "render.yml"}}
    playbook = work / "render.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [task]}]))
    extra = {"ansible_python_interpreter": sys.executable, "_monitoring_rules": str(rules),
             "_monitoring_prometheus_config": str(config), **variables}  # fmt: skip
    (work / "vars.json").write_text(json.dumps(extra))
    require("promtool")
    result = run_ansible("ansible-playbook", "-i", "localhost,", "-c", "local", "-e", f"@{work / 'vars.json'}", str(playbook))
    return (rules.read_text() if rules.exists() else ""), (config.read_text() if config.exists() else ""), result


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    work = tmp_path_factory.mktemp("monitoring")
    rules, config, result = render(work, vllm_deployment=DEPLOYMENT, nginx_proxy_endpoint={"url": "https://box"})
    assert result.returncode == 0, result.stdout[-3000:]
    return {"work": work, "rules": rules, "config": config}


def test_prometheus_scrapes_each_vllm_server_nginx_and_the_box(rendered):
    config = yaml.safe_load(rendered["config"])
    assert config["global"] == {"scrape_interval": "15s", "evaluation_interval": "15s"}
    assert config["rule_files"] == [str(rendered["work"] / "gpubox-alerts.yml")]
    assert "alerting" not in config
    jobs = {job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]}
    assert jobs == {"prometheus": ["127.0.0.1:9090"], "node": ["127.0.0.1:9100"], "vllm": DEPLOYMENT["upstreams"],
                    "nginx": ["127.0.0.1:9113"]}  # fmt: skip


def test_without_vllm_or_the_front_door_there_is_nothing_of_theirs_to_scrape(tmp_path):
    _rules, config, result = render(tmp_path, monitoring_prometheus_listen="0.0.0.0:9091", monitoring_alertmanagers=["am:9093"])
    assert result.returncode == 0, result.stdout[-3000:]
    config = yaml.safe_load(config)
    assert [job["job_name"] for job in config["scrape_configs"]] == ["prometheus", "node"]
    assert config["scrape_configs"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9091"]
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["am:9093"]


def test_promtool_refuses_a_broken_rule_and_nothing_is_written(tmp_path):
    """The validation is real: a threshold that breaks the expression is rejected by promtool, and the file is not written
    (the role's own check refuses such a value before, naming it: test_monitoring_role_settings)."""
    rules, _config, result = render(tmp_path, monitoring_alert_kv_cache_usage="0.9)")
    assert result.returncode != 0
    assert "failed to validate" in result.stdout, result.stdout[-2000:]
    assert rules == ""


def test_the_thresholds_are_the_settings(tmp_path):
    rules, _config, result = render(tmp_path, monitoring_alert_gpu_temperature_c=80, monitoring_alert_kv_cache_usage=0.95,
                                    monitoring_alert_5xx_ratio=0.01)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    expressions = {rule["alert"]: rule["expr"] for group in yaml.safe_load(rules)["groups"] for rule in group["rules"]}
    assert expressions["GPUHot"] == "gpubox_gpu_temperature_celsius > 80"
    assert expressions["VLLMKVCacheFull"] == "vllm:kv_cache_usage_perc > 0.95"
    assert expressions["VLLMServerErrors"].endswith("> 0.01")


# promtool test rules: the input series (one sample a minute) and, for each alert, when it is checked and the alerts
# expected then. A healthy box's series run alongside, and no alert may fire from them.
VLLM, NODE = 'job="vllm",instance="127.0.0.1:8000"', 'job="node",instance="127.0.0.1:9100"'
GPU1 = f'{NODE},gpu="1",uuid="GPU-b"'
HEALTHY_GPU0 = f'{NODE},gpu="0",uuid="GPU-a"'
SERIES = {
    f"up{{{VLLM}}}": "1 1 0x30",
    f"up{{{NODE}}}": "1 1 0x30",
    'up{job="nginx",instance="127.0.0.1:9113"}': "1 1 0x30",
    'up{job="vllm",instance="127.0.0.1:8001"}': "1x32",
    f"gpubox_vllm_watchdog_sound{{{NODE}}}": "1 1 0x30",
    f"gpubox_vllm_watchdog_gave_up{{{NODE}}}": "0 0 1x30",
    f"vllm:kv_cache_usage_perc{{{VLLM}}}": "0.5 0.5 0.95x30",
    'vllm:kv_cache_usage_perc{job="vllm",instance="127.0.0.1:8001"}': "0.85x32",
    f'http_requests_total{{{VLLM},status="2xx"}}': "0+60x32",
    f'http_requests_total{{{VLLM},status="5xx"}}': "0+6x32",
    'http_requests_total{job="vllm",instance="127.0.0.1:8001",status="2xx"}': "0+60x32",
    'http_requests_total{job="vllm",instance="127.0.0.1:8001",status="5xx"}': "0+1x32",
    f"gpubox_gpu_temperature_celsius{{{GPU1}}}": "70 70 90x30",
    f"gpubox_gpu_temperature_celsius{{{HEALTHY_GPU0}}}": "84x32",
    f'gpubox_gpu_clocks_event_reason{{{GPU1},reason="hw_slowdown"}}': "0 0 1x30",
    f'gpubox_gpu_clocks_event_reason{{{HEALTHY_GPU0},reason="sw_power_cap"}}': "1x32",
    f"gpubox_gpu_xid_errors{{{GPU1}}}": "0 0 0 1x29",
    f"gpubox_gpu_xid_errors{{{HEALTHY_GPU0}}}": "0x32",
    f"gpubox_gpu_pcie_link_width{{{GPU1}}}": "4x32",
    f"gpubox_gpu_pcie_link_max_width{{{GPU1}}}": "16x32",
    f"gpubox_gpu_pcie_link_width{{{HEALTHY_GPU0}}}": "8x32",
    f"gpubox_gpu_pcie_link_max_width{{{HEALTHY_GPU0}}}": "8x32",
    f"gpubox_gpu_pcie_link_generation{{{GPU1}}}": "2x32",
    f"gpubox_gpu_pcie_link_max_generation{{{GPU1}}}": "4x32",
    f"gpubox_gpu_utilization_ratio{{{GPU1}}}": "0.9x32",
    # Idle at Gen1: power saving, not a fault.
    f"gpubox_gpu_pcie_link_generation{{{HEALTHY_GPU0}}}": "1x32",
    f"gpubox_gpu_pcie_link_max_generation{{{HEALTHY_GPU0}}}": "4x32",
    f"gpubox_gpu_utilization_ratio{{{HEALTHY_GPU0}}}": "0x32",
    f"gpubox_drift_findings{{{NODE}}}": "0 0 2x30",
}
# The alerts at 30 minutes, each with its labels (the series' and the rule's severity); all but these are quiet.
FIRING = {
    "VLLMDown": [{"severity": "critical", "job": "vllm", "instance": "127.0.0.1:8000"}],
    "VLLMEngineUnsound": [{"severity": "critical", "job": "node", "instance": "127.0.0.1:9100"}],
    "VLLMWatchdogGaveUp": [{"severity": "critical", "job": "node", "instance": "127.0.0.1:9100"}],
    "VLLMKVCacheFull": [{"severity": "warning", "job": "vllm", "instance": "127.0.0.1:8000"}],
    "VLLMServerErrors": [{"severity": "warning", "instance": "127.0.0.1:8000"}],
    "FrontDoorDown": [{"severity": "critical", "job": "nginx", "instance": "127.0.0.1:9113"}],
    "GPUHot": [{"severity": "warning", "job": "node", "instance": "127.0.0.1:9100", "gpu": "1", "uuid": "GPU-b"}],
    "GPUSlowedByHardware": [{"severity": "warning", "job": "node", "instance": "127.0.0.1:9100", "gpu": "1", "uuid": "GPU-b",
                             "reason": "hw_slowdown"}],
    "GPUXidError": [{"severity": "critical", "job": "node", "instance": "127.0.0.1:9100", "gpu": "1", "uuid": "GPU-b"}],
    "GPULinkNarrow": [{"severity": "warning", "job": "node", "instance": "127.0.0.1:9100", "gpu": "1", "uuid": "GPU-b"}],
    "GPULinkSlowUnderLoad": [{"severity": "warning", "job": "node", "instance": "127.0.0.1:9100", "gpu": "1",
                              "uuid": "GPU-b"}],
    "BoxDrift": [{"severity": "warning", "job": "node", "instance": "127.0.0.1:9100"}],
    "ExporterDown": [{"severity": "warning", "job": "node", "instance": "127.0.0.1:9100"}],
}  # fmt: skip


def rule_test(work, rules: str, series: dict, at: str, firing: dict) -> subprocess.CompletedProcess:
    """promtool test rules over the rendered rules (annotations left out: promtool would compare their text too)."""
    groups = yaml.safe_load(rules)
    names = [rule["alert"] for group in groups["groups"] for rule in group["rules"]]
    for group in groups["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (work / "rules.yml").write_text(yaml.safe_dump(groups))
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": name, "values": values} for name, values in series.items()],
                "alert_rule_test": [
                    {"eval_time": at, "alertname": name, "exp_alerts": [{"exp_labels": one} for one in firing.get(name, [])]}
                    for name in names
                ],
            }
        ],
    }
    (work / "rules.test.yml").write_text(yaml.safe_dump(test))
    return subprocess.run([require("promtool"), "test", "rules", "rules.test.yml"], cwd=work, capture_output=True, text=True,
                          check=False)  # fmt: skip


def test_each_alert_fires_on_trouble_and_the_healthy_series_raise_none(rendered, tmp_path):
    result = rule_test(tmp_path, rendered["rules"], SERIES, "30m", FIRING)
    assert result.returncode == 0, result.stdout + result.stderr
    alerts = {rule["alert"] for group in yaml.safe_load(rendered["rules"])["groups"] for rule in group["rules"]}
    # Every alert but the stale-metrics one is proven here; that one has its own test below.
    assert alerts - set(FIRING) == {"GPUMetricsStale"}


def test_the_test_can_fail_an_alert_that_does_not_fire_is_caught(rendered, tmp_path):
    quiet = {**SERIES, f"gpubox_gpu_temperature_celsius{{{GPU1}}}": "70x32"}
    result = rule_test(tmp_path, rendered["rules"], quiet, "30m", FIRING)
    assert result.returncode != 0
    assert "GPUHot" in result.stdout + result.stderr


def test_an_alert_waits_for_its_time_before_it_fires(rendered, tmp_path):
    # vLLM stopped answering at 2m; one minute later VLLMDown is only pending.
    result = rule_test(tmp_path, rendered["rules"], {f"up{{{VLLM}}}": "1 1 0x30"}, "2m30s", {})
    assert result.returncode == 0, result.stdout + result.stderr


def test_gpu_metrics_that_stop_coming_raise_an_alert(rendered, tmp_path):
    # Read at 0 s and at 60 s, then never again: stale past 120 s.
    series = {f"gpubox_gpu_metrics_last_read_timestamp_seconds{{{NODE}}}": "0 60 _x3"}
    firing = {"GPUMetricsStale": [{"severity": "warning", "job": "node", "instance": "127.0.0.1:9100"}]}
    assert rule_test(tmp_path, rendered["rules"], series, "4m", firing).returncode == 0
    fresh = {f"gpubox_gpu_metrics_last_read_timestamp_seconds{{{NODE}}}": "0+60x10"}
    result = rule_test(tmp_path, rendered["rules"], fresh, "8m", {})
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------------------ metric names


def sample_names(text: str) -> set[str]:
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    return {re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0) for line in samples}


def test_the_name_reader_reads_names_only():
    assert metric_names('sum by (instance) (rate(http_requests_total{job="vllm", status="5xx"}[5m]))') == {"http_requests_total"}
    assert metric_names("(a_b < c:d) and on (instance, gpu) (e > 0.5)") == {"a_b", "c:d", "e"}


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def rule_expressions(rules: str) -> list[str]:
    return [rule["expr"] for group in yaml.safe_load(rules)["groups"] for rule in group["rules"]]


@pytest.fixture
def written_names(vllm_server, tmp_path, monkeypatch) -> set[str]:
    """Every metric name the real vLLM serves (after a request) and the box's programs write (the GPUs on the stand-in)."""
    request = urllib.request.Request(f"http://127.0.0.1:{VLLM_PORT}/v1/models", headers={"Authorization": "Bearer x"})
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(request, timeout=30)
    with urllib.request.urlopen(f"http://127.0.0.1:{VLLM_PORT}/metrics", timeout=30) as response:
        names = sample_names(response.read().decode())
    monkeypatch.setenv("GPUBOX_FAKE_NVML", str(nvml_machine(tmp_path / "machine.json", copy.deepcopy(RTX3090_PAIR))))
    nvml = stand_in_pynvml()
    names |= sample_names(_gpu_metrics.metrics(_gpu_metrics.read(nvml), {}, 0))
    names |= sample_names(_gpu_metrics.metrics([{**_gpu_metrics.read(nvml)[0]}], {"0000:09:00": {"count": 1, "last": 79}}, 0))
    names |= sample_names(_drift.metrics([], {"at": 0}))
    names |= sample_names(_watchdog.metrics(_watchdog.new_state(), {"code": "watchdog.sound", "sound": True}))
    return names | {"up"}


def test_every_metric_the_rules_and_the_dashboard_read_is_written(rendered, written_names):
    """Nginx's exporter's names are checked in Molecule, against the real exporter (molecule/site/tests)."""
    read = set().union(*map(metric_names, dashboard_expressions() + rule_expressions(rendered["rules"])))
    missing = {name for name in read - written_names if not name.startswith("nginx_")}
    assert not missing, sorted(missing)
    assert {"vllm:kv_cache_usage_perc", "gpubox_gpu_xid_errors", "gpubox_drift_findings"} <= read


# ------------------------------------------------------------ the role's own check of its settings


def run_main(work, **variables) -> subprocess.CompletedProcess:
    playbook = work / "main.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False,
                                         "roles": [{"role": "gpubox.inference.monitoring"}]}]))  # fmt: skip
    extra = {"ansible_python_interpreter": sys.executable, "_monitoring_record": str(work / "monitoring.json"), **variables}
    (work / "vars.json").write_text(json.dumps(extra))
    return run_ansible("ansible-playbook", "-i", "localhost,", "-c", "local", "-e", f"@{work / 'vars.json'}", str(playbook))


RULES = {
    "duration": "must be a Prometheus duration (15d, 12w, 36h)",
    "listen": "must be host:port (127.0.0.1:9090, 0.0.0.0:9090)",
    "kv": "must be a share of the KV cache, above 0 and at most 1 (0.9)",
    "5xx": "must be a share of the responses, above 0 and at most 1 (0.05)",
    "celsius": "must be degrees Celsius above 0 (85)",
    "type": "is of type str and we were unable to convert",
}


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"monitoring_scrape_interval": 0}, "monitoring_scrape_interval=0: must be whole seconds, at least 1"),
        ({"monitoring_retention": "two weeks"}, f"monitoring_retention=two weeks: {RULES['duration']}"),
        ({"monitoring_prometheus_listen": "9090"}, f"monitoring_prometheus_listen=9090: {RULES['listen']}"),
        ({"monitoring_alert_kv_cache_usage": 90}, f"monitoring_alert_kv_cache_usage=90: {RULES['kv']}"),
        ({"monitoring_alert_5xx_ratio": 0}, f"monitoring_alert_5xx_ratio=0: {RULES['5xx']}"),
        ({"monitoring_alert_gpu_temperature_c": -5}, f"monitoring_alert_gpu_temperature_c=-5: {RULES['celsius']}"),
        # A value of the wrong type is refused by the role's argument spec, naming it too.
        ({"monitoring_gpu_interval": "fast"}, f"argument 'monitoring_gpu_interval' {RULES['type']} to int"),
        ({"monitoring_alert_kv_cache_usage": "0.9)"}, f"argument 'monitoring_alert_kv_cache_usage' {RULES['type']} to float"),
    ],
    ids=lambda value: next(iter(value)) if isinstance(value, dict) else "",
)
def test_monitoring_role_settings_are_refused_naming_the_variable_value_and_rule(tmp_path, variables, message):
    result = run_main(tmp_path, monitoring_enabled=True, **variables)
    assert result.returncode != 0
    assert message in result.stdout, result.stdout[-2000:]
    # Refused before anything: the record of what the role installs is not written.
    assert not (tmp_path / "monitoring.json").exists()


@pytest.mark.parametrize("enabled", [False, "false"], ids=["bool", "string-from-extra-vars"])
def test_off_on_a_box_it_never_installed_on_changes_nothing(tmp_path, enabled):
    result = run_main(tmp_path, monitoring_enabled=enabled)
    assert result.returncode == 0, result.stdout[-2000:]
    assert re.search(r"localhost\s+: ok=\d+\s+changed=0\s+unreachable=0\s+failed=0", result.stdout), result.stdout[-1500:]


# ------------------------------------------------------------ the GPU metrics program, run as its timer runs it


def run_gpu_metrics(tmp_path, machine: dict, journalctl: str) -> tuple[subprocess.CompletedProcess, str]:
    """gpubox-gpu-metrics on the stand-in NVML, with a stand-in journalctl first on PATH printing ``journalctl``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "journalctl").write_text(journalctl)
    (bin_dir / "journalctl").chmod(0o755)
    env = {**os.environ, "GPUBOX_LIB": str(COLLECTIONS), "PYTHONPATH": str(ROOT / "tests" / "fakes"),
           "GPUBOX_FAKE_NVML": str(nvml_machine(tmp_path / "machine.json", machine)),
           "PATH": os.pathsep.join([str(bin_dir), os.environ["PATH"]])}  # fmt: skip
    textfile = tmp_path / "metrics" / "gpu.prom"
    program = ROOT / "roles" / "monitoring" / "files" / "gpubox-gpu-metrics.py"
    result = subprocess.run([sys.executable, str(program), str(textfile)], capture_output=True, text=True, env=env, check=False)
    return result, textfile.read_text() if textfile.exists() else ""


def test_the_program_writes_the_gpus_and_this_boots_xid_errors(tmp_path):
    log = "#!/bin/sh\necho 'NVRM: Xid (PCI:0000:41:00): 79, pid=2213, name=python3, GPU has fallen off the bus.'\n"
    result, text = run_gpu_metrics(tmp_path, copy.deepcopy(RTX3090_PAIR), log)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""
    assert 'gpubox_gpu_xid_errors{gpu="1",uuid="GPU-3090bbbb-0000-0000-0000-000000000000"} 1\n' in text
    assert 'gpubox_gpu_temperature_celsius{gpu="0",uuid="GPU-3090aaaa-0000-0000-0000-000000000000"} 41\n' in text


def test_without_nvml_or_the_kernel_log_it_says_so_and_writes_what_it_has(tmp_path):
    result, text = run_gpu_metrics(tmp_path, {**RTX3090_PAIR, "init_error": "Driver Not Loaded"}, "#!/bin/sh\nexit 1\n")
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "<3>NVML could not read the GPUs (Driver Not Loaded): " + str(tmp_path / "metrics" / "gpu.prom")
        + " holds no GPU series until it can",
        "<4>the kernel log could not be read (journalctl: exit 1): no Xid series this time",
    ]  # fmt: skip
    assert "gpubox_gpu_temperature_celsius" not in text
    assert "gpubox_gpu_metrics_last_read_timestamp_seconds" in text
