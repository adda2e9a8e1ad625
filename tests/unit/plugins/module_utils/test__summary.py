"""_summary.summary: site.yml's closing lines from what the run found, decided and measured."""

from __future__ import annotations

from ansible_collections.gpubox.inference.plugins.module_utils._summary import summary

GPU = {
    "present": True,
    "count": 2,
    "driver_version": "595.71.05",
    "devices": [{"name": "NVIDIA GeForce RTX 3090"}, {"name": "NVIDIA GeForce RTX 3090"}],
    "fingerprint": "3f0c1a2b3c4d5e6f",
    "fingerprint_stored": "3f0c1a2b3c4d5e6f",
    "changed_since_stored": False,
}
P2P = {
    "source": "measured",
    "cached": False,
    "matrices": {"unidirectional_p2p_enabled": [[None, 25.13], [1.02, None]]},
    "pairs": {
        "0-1": {"status": "ok", "ratio_to_limit": 0.79},
        "1-0": {"status": "broken", "ratio_to_limit": None},
    },
}
VLLM = {
    "model": "Qwen/Qwen2.5-7B-Instruct",
    "served_model_name": "qwen",
    "tensor_parallel_size": 2,
    "env": {"NCCL_P2P_DISABLE": "1"},
    "reasons": {
        "--tensor-parallel-size": "2: the GPUs the preflight allows",
        "NCCL_P2P_DISABLE": "GPU1-GPU0 P2P copies lose or corrupt data",
        "VLLM_WORKER_MULTIPROC_METHOD": "not shown",
    },
    "warnings": ["something to know"],
    "swapped": False,
}
SMOKE = {
    "requests": 4,
    "succeeded": 4,
    "ttft_ms": {"p50": 23.14},
    "output_tokens_per_s": 511.6,
    "buffering": {"verdict": "streaming"},
}


def test_everything_found_decided_and_measured():
    parts = {"gpu": GPU, "gpu_p2p": P2P, "preflight": {"verdict": "fit", "group": ["GPU0", "GPU1"]}, "vllm": VLLM}
    parts |= {"endpoint": {"url": "https://gpu-box:443/v1"}, "smoke": SMOKE}
    assert summary("gpu-box", parts) == [
        "gpu-box:",
        "GPUs: 2 x NVIDIA GeForce RTX 3090 (driver 595.71.05), fingerprint 3f0c1a2b3c4d; unchanged since the last deploy",
        "Preflight: fit for tensor parallelism, tensor-parallel group GPU0, GPU1",
        "P2P, measured: GPU0->GPU1 ok 25.1 GB/s (0.79 of the link); GPU1->GPU0 broken",
        "Model: qwen (Qwen/Qwen2.5-7B-Instruct), tensor parallel 2",
        "Decided: --tensor-parallel-size (2: the GPUs the preflight allows); "
        "NCCL_P2P_DISABLE=1 (GPU1-GPU0 P2P copies lose or corrupt data)",
        "Warning: something to know",
        "Endpoint: https://gpu-box:443/v1 (OpenAI-compatible; API key required)",
        "Smoke test: 4/4 streams OK, TTFT p50 23.1 ms, 512 tok/s, streaming",
    ]


def test_a_swap_is_said_in_words():
    gpu = {**GPU, "changed_since_stored": True, "change_summary": "GPU at 0000:41:00.0 replaced"}
    lines = summary("box", {"gpu": gpu, "gpu_p2p": {**P2P, "cached": True}, "vllm": {**VLLM, "swapped": True}})
    assert "CHANGED since the last deploy: GPU at 0000:41:00.0 replaced" in lines[1]
    # A rerun after a failed swap deploy: P2P for the new GPUs was measured by that run and is cached now.
    assert lines[2].startswith("P2P, from the cache (measured earlier for these GPUs): ")
    assert "GPU swap handled: vLLM's P2P cache cleared, the vLLM container recreated" in lines
    assert not [line for line in lines if "re-measured" in line], "one fact, one line: the P2P line says how"


def test_first_deploy_and_no_gpu():
    assert summary("a", {"gpu": {**GPU, "fingerprint_stored": None}})[1].endswith("first deploy on this GPU set")
    assert summary("b", {"gpu": {"present": False, "reason": "no NVIDIA driver"}})[1] == "GPUs: none (no NVIDIA driver)"


def test_preflight_failures_and_warnings_lead_with_the_first():
    preflight = {"verdict": "hang", "failures": ["GPU1 sits behind the chipset", "x"], "warnings": ["x4 link"]}
    assert summary("h", {"preflight": preflight})[1] == (
        "Preflight: will hang or corrupt; 2 failure(s): GPU1 sits behind the chipset; 1 warning(s): x4 link"
    )


def test_a_single_gpu_verdict_in_words():
    assert summary("h", {"preflight": {"verdict": "single_gpu"}})[1] == "Preflight: single gpu"


def test_a_run_that_deployed_nothing_says_so():
    assert summary("h", {}) == ["h:", "nothing deployed in this run (check the tags and vllm_model / nginx_proxy_api_keys)"]


def test_smoke_without_numbers():
    smoke = {"requests": 4, "succeeded": 0, "ttft_ms": {"p50": None}, "output_tokens_per_s": None, "buffering": {}}
    assert summary("h", {"smoke": smoke})[1] == "Smoke test: 0/4 streams OK"


def test_host_links_follow_the_pairs_in_gpu_order():
    links = {
        "10": {"status": "hang"},
        "2": {"status": "broken"},
        "0": {"status": "ok", "host_to_device_gbps": 24.81, "device_to_host_gbps": 26.33, "ratio_to_limit": 0.84},
        "1": {"status": "ok", "host_to_device_gbps": 3.1, "device_to_host_gbps": 2.9, "ratio_to_limit": None},
    }
    lines = summary("box", {"gpu_p2p": {**P2P, "host_links": links}})
    assert lines[2] == (
        "Host links, measured: GPU0 ok to GPU 24.8 GB/s, from GPU 26.3 GB/s (0.84 of the link); "
        "GPU1 ok to GPU 3.1 GB/s, from GPU 2.9 GB/s; GPU2 broken; GPU10 hang"
    )
    one = summary("box", {"gpu_p2p": {"source": "measured", "cached": True, "pairs": {}, "host_links": {"0": links["0"]}}})
    assert one[1].startswith("Host links, from the cache (measured earlier for these GPUs): GPU0 ok to GPU 24.8 GB/s")


def test_the_gate_says_what_it_kept_and_what_failed_before():
    bang = "prompt 1: the answer is a run of '!' (what a broken all-reduce produces)"
    gate = {
        "words": "the correctness gate failed with as planned and passed with custom all-reduce off",
        "results": {
            "as_planned": {"passed": False, "findings": [bang]},
            "no_custom_all_reduce": {"passed": True, "findings": []},
        },
    }
    lines = summary("box", {"vllm": {**VLLM, "gate": gate}})
    assert f"Correctness gate: {gate['words']}" in lines
    assert f"Correctness gate, as planned: failed ({bang})" in lines
    assert not any(line.startswith("Correctness gate, custom all-reduce off") for line in lines)


def test_replicas_and_the_layout_choice_are_said():
    vllm = {
        **VLLM,
        "tensor_parallel_size": 1,
        "replicas": 2,
        "upstreams": ["127.0.0.1:8000", "127.0.0.1:8001"],
        "reasons": {**VLLM["reasons"], "layout": "2xtp1 measured 45.0 tokens/s ..."},
    }
    lines = summary("box", {"vllm": vllm})
    assert "Model: qwen (Qwen/Qwen2.5-7B-Instruct), tensor parallel 1, 2 replicas on 127.0.0.1:8000, 127.0.0.1:8001" in lines
    assert "Layout: 2xtp1 measured 45.0 tokens/s ..." in lines
    assert not any(line.startswith("Layout") for line in summary("box", {"vllm": VLLM}))


def test_a_model_over_a_ray_cluster_says_its_head_workers_and_split():
    cluster = {"head": "box-1", "workers": ["box-2", "box-3"], "tensor_parallel_size": 2, "pipeline_parallel_size": 3}
    lines = summary("box-1", {"vllm": {**VLLM, "cluster": cluster}})
    assert (
        "Ray cluster: head box-1, workers box-2, box-3; tensor parallel 2 within each box, pipeline parallel 3 across the boxes"
    ) in lines
    assert not any(line.startswith("Ray cluster") for line in summary("box-1", {"vllm": VLLM}))


def test_gpu_power_and_what_is_watched_are_said():
    power = {"gpus": [{"index": 0, "target_w": 298.0, "limit_w": 350.0, "persistence_target": True},
                      {"index": 1, "target_w": None, "limit_w": 350.0, "persistence_target": True}]}  # fmt: skip
    lines = summary("box", {"power": power, "vllm": {**VLLM, "watchdog": {"interval": 30}}, "drift": {"interval": 600}})
    assert "GPU power: GPU0 298 W, GPU1 350 W, persistence mode on; set again at every boot (gpubox-gpu-power.service)" in lines
    assert lines[-1] == (
        "Watched: the engine watchdog probes vLLM every 30 s and recreates it when its engine dies or hangs "
        "(journalctl -u gpubox-vllm-watchdog); the drift watch compares the box with this deployment every 600 s "
        "(journalctl -u gpubox-drift); metrics in /var/lib/gpubox/metrics"
    )
    drift_only = summary("box", {"drift": {"interval": 60}})
    assert drift_only[-1].startswith("Watched: the drift watch compares the box with this deployment every 60 s")
    assert not any(line.startswith(("Watched", "GPU power")) for line in summary("box", {"vllm": VLLM, "power": {"gpus": []}}))


def test_the_monitoring_says_what_prometheus_reads_and_where_the_alerts_are():
    monitoring = {"prometheus": "http://127.0.0.1:9090", "interval": 15, "jobs": ["node", "vllm", "nginx"], "gpus": True,
                  "alertmanagers": [], "dashboard": "/usr/local/share/gpubox/grafana/gpubox-inference.json"}  # fmt: skip
    assert summary("box", {"monitoring": monitoring})[-1] == (
        "Monitoring: Prometheus at http://127.0.0.1:9090 reads the box, vLLM, Nginx, the GPUs (gpubox-gpu-metrics) every "
        "15 s; alerts at http://127.0.0.1:9090/alerts; Grafana dashboard /usr/local/share/gpubox/grafana/gpubox-inference.json"
    )
    sent = summary("box", {"monitoring": {**monitoring, "jobs": ["node"], "gpus": False, "alertmanagers": ["am:9093"]}})
    assert sent[-1].startswith("Monitoring: Prometheus at http://127.0.0.1:9090 reads the box every 15 s; alerts at am:9093;")
    assert not any(line.startswith("Monitoring") for line in summary("box", {"monitoring": None}))


def test_the_gateway_says_its_endpoint_and_each_box_with_its_state():
    gateway = {"url": "https://gw.lan:443/v1", "model": "llama", "answers": {"box-1": 200, "box-2": 0},
               "members": [{"name": "box-1", "upstream": "10.0.0.1:443", "drained": False},
                           {"name": "box-2", "upstream": "10.0.0.2:443", "drained": False}],
               "left_out": [{"name": "box-3", "reason": "no_tls"}]}  # fmt: skip
    lines = summary("gw", {"gateway": gateway})
    assert lines[1] == "Gateway: https://gw.lan:443/v1 (OpenAI-compatible; API key required), in front of the fleet"
    assert lines[2].startswith("Fleet: 'llama' balanced over 2 box(es): box-1 (10.0.0.1:443) in rotation, answering; ")
    assert "box-2 (10.0.0.2:443) in rotation, NOT answering (no connection)" in lines[2]
    assert "box-3 left out: its front door is plain HTTP" in lines[2]
    assert not any(line.startswith(("Gateway", "Fleet")) for line in summary("box", {"gateway": None}))
