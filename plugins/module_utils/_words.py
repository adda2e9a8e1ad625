# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: every sentence the collection says about a finding or a decision, rendered from its fields here only.

Pure functions, no Ansible imports. Producers (``_p2p``, ``_preflight``, ``_vllm``)
return codes with fields, for example ``{"code": "nccl_p2p_disable.acs_redirect",
"pairs": [["GPU0", "GPU1"]], "bridge": "40:01.1"}``; consumers branch on the fields;
``say`` turns a code and its fields into words for the reasons, reports and the summary.
Rewording a template here changes what is shown, never what is deployed.
"""

from __future__ import annotations

import time

TEMPLATES = {
    # A measured GPU pair's P2P status (_p2p.pair_status).
    "p2p.ok": "P2P copies arrive intact and beat the host-staged copy",
    "p2p.no_peer_access": "the driver reports no peer access between them",
    "p2p.slower_than_staged": "P2P is slower than copying through host memory",
    "p2p.broken": "P2P copies lose or corrupt data",
    "p2p.hang": "a P2P copy never returned",
    # Why the preflight finds a GPU pair slow or hanging (_preflight.combine).
    "cause.link": "{link} link",
    "cause.p2p_status": "P2P {status}",
    "cause.chipset": "{gpu} behind the chipset",
    "cause.downtrained": "{gpu} downtrained ({note})",
    "cause.acs_redirect": "ACS redirects P2P on {bridge}",
    # The preflight's policy findings (failures or warnings, as the policy says).
    "problem.chipset_gpu": "{gpu} ({bus_id}) hangs off the chipset, not a CPU root port, in a tensor-parallel group",
    "problem.downtrained": "{gpu} ({bus_id}): {note}",
    "problem.link_load_unknown": "{gpu} ({bus_id}): {note}",
    "problem.hang_pair": "{pair}: will hang or corrupt ({causes})",
    # The preflight's decision for the group.
    "decision.acs_redirect": "NCCL_P2P_DISABLE=1 because ACS redirects P2P on {bridge}",
    "decision.iommu_translated": "the IOMMU translates DMA, so redirected P2P also goes through it",
    "decision.p2p_on": "NCCL keeps P2P on (nothing redirects it)",
    # The vLLM plan's reasons, one per derived setting (_vllm.plan).
    "tp.cpu": "{size}: the CPU backend",
    "tp.user": "your choice",
    "tp.derived": (
        "{size}: the largest group of the {allowed} GPU(s) the preflight allows whose size divides the model's "
        "{heads} attention heads and {kv_heads} KV heads"
    ),
    "tp.derived_no_config": "{size}: the {allowed} GPU(s) the preflight allows (the model's head counts are unknown)",
    "tp.lowered": "{size}: lowered from vllm_tensor_parallel_size={pinned}, this host has {gpus} GPUs (vllm_allow_downgrade)",
    # A cluster across boxes on Ray (_cluster.plan): its decisions and refusals.
    "cluster.tp": (
        "{size}: tensor parallelism stays within a box: the largest size at most each box's {gpus} GPU(s) that divides "
        "the model's {heads} attention heads and {kv_heads} KV heads"
    ),
    "pp.user": "your choice",
    "cluster.pp": (
        "{size}: one pipeline stage per box, the model's {layers} layers split across them (only activations cross the network)"
    ),
    "cluster.serve": "{head} serves the model over the cluster (the server's Ray driver beside its head node)",
    "cluster.serve.cpu": (
        "none: vLLM's CPU platform does not run on Ray (0.32.0: 'current platform cpu does not support ray'), "
        "so the cluster forms and nothing serves on it"
    ),
    "cluster.interface.user": "your choice",
    "cluster.interface.route": "each box's interface of its default route, which carries the boxes' own addresses",
    "cluster.ib_disable": "no RDMA NIC on {boxes}: NCCL uses sockets on every box (both ends of a connection need one transport)",
    "cluster.one_box": "a cluster needs two boxes or more ({boxes} given)",
    "cluster.disagree": "the boxes differ in {field}: {values}",
    "cluster.no_gpu": "no GPU on {boxes}",
    "cluster.network_mode": (
        "vllm_network_mode={mode}: a cluster's nodes and server use the host's network (Ray and NCCL open ports of "
        "their own choosing between the boxes); set it to host"
    ),
    "cluster.no_address": "no address known for {box} (set vllm_cluster_address, or give it a default route)",
    "cluster.tp_exceeds_box": "a tensor-parallel size of {size} needs more GPUs than a box has ({gpus})",
    "cluster.tp_heads": (
        "a tensor-parallel size of {size} does not divide the model's {heads} attention heads and {kv_heads} KV heads"
    ),
    "cluster.pp_boxes": "a pipeline-parallel size of {size} is not one stage per box ({boxes} boxes)",
    "cluster.pp_layers": "{size} pipeline stages for {layers} layers",
    "cluster.no_interface": "no network interface known for {box} (set vllm_cluster_interface, or give it a default route)",
    "cuda_device_order": "GPU numbers follow the PCI bus, as nvidia-smi and the preflight count them",
    "multiproc_spawn": "tensor-parallel workers must not fork a process that holds CUDA",
    "nccl_p2p_disable.acs_redirect": "ACS redirects P2P on {bridge} (GPU pair {pair})",
    "nccl_p2p_disable.measured": "{pair} {status_words}",
    "nccl_p2p_disable.tool_hang": "the P2P measurement did not finish within {seconds:.0f} s",
    "nccl_p2p_level.sys": "every GPU pair's P2P was measured, verified and faster than staging",
    "nccl_ib_disable": "no InfiniBand or RoCE NIC in the topology; NCCL stops probing for one",
    "cpu_kvcache": "GiB of KV cache for the CPU backend",
    "user_env": "your choice (vllm_env)",
    "user_choice": "your choice",
    "vllm_default": "unset: vLLM's own default (on in current releases); set it true or false to decide",
    "hub_offline": "the role fetched {model} at {commit} before the server started: restarts and reboots never need the network",
    "host_network": (
        "127.0.0.1:{port} on the host's own network, loopback only: no docker-proxy relays every streamed token "
        "(a published port measured 0.78x the throughput at 50 streams on the 2-core bench machine)"
    ),
    "bridge_network": "the container's bridge network, published on 127.0.0.1:{port} only (your choice)",
    # The model on a Hub or a mirror (_hub, hf_model_info, hf_model_fetch).
    "hub.gated_no_token": (
        "{model} at {endpoint} answered HTTP {status}: the model is gated. Accept its terms on its page with your account, "
        "then set vllm_hf_token (in a vault) to a token of that account"
    ),
    "hub.gated_no_access": (
        "{model} at {endpoint} answered HTTP {status}: the token in vllm_hf_token has no access to this gated model. "
        "Accept its terms with the token's account, or use a token that has access"
    ),
    "hub.not_found": (
        "{model} at {endpoint} answered HTTP {status}: no such model. Check vllm_model for a typo; "
        "a private model also needs vllm_hf_token"
    ),
    "hub.revision_not_found": (
        "{model} at {endpoint} answered HTTP {status}: it has no revision {revision!r}. Check vllm_model_revision"
    ),
    "hub.token_refused": (
        "{model} at {endpoint} answered HTTP {status}: the token in vllm_hf_token was refused. "
        "Check that it is valid and not expired"
    ),
    "hub.forbidden": (
        "{model} at {endpoint} answered HTTP {status}: access is forbidden. Check vllm_hf_token and the model's access"
    ),
    "hub.http_error": (
        "{model} at {endpoint} answered HTTP {status} ({detail}). The Hub may be busy or down: run again later, "
        "or set vllm_hf_endpoint to a mirror"
    ),
    "hub.unreachable": (
        "{endpoint} cannot be reached from the box for {model} ({reason}). Check the box's network, DNS and proxy, "
        "or set vllm_hf_endpoint to a mirror it can reach"
    ),
    "hub.bad_answer": (
        "{endpoint} answered {url} with something that is not the Hub's JSON ({reason}): is vllm_hf_endpoint a Hub or a mirror?"
    ),
    "hub.no_weights": (
        "{model} at {commit} has no safetensors or .bin weights at its top level: vLLM cannot load this revision "
        "(a GGUF or other format needs a local path in vllm_model)"
    ),
    "hub.disk": (
        "{model} does not fit in vllm_hf_cache_dir={path}: {missing} still to download plus the margin needs {needed}, "
        "and {free} is free there. Free some space, or set vllm_hf_cache_dir to a larger disk"
    ),
    "hub.progress": "{model}: {done} of {total} ({percent:.0f}%) at {rate}, {left} left, {elapsed} so far",
    # An image pull (_docker_pull.progress, image_pull).
    "pull.progress": "{image}: {pulled} of {layers} layers pulled ({downloaded} downloaded), {elapsed} so far",
    "pull.failed": "docker pull {image} failed (exit code {rc}): {log}",
    # The image against the driver (_vllm.cuda_finding).
    "cuda.too_old": (
        "{image} needs CUDA {required} (its NVIDIA_REQUIRE_CUDA), and the NVIDIA driver on this box supports CUDA {driver} "
        "(NVML): update the driver, or set vllm_image_tag to a vLLM image built for CUDA {driver} or older"
    ),
    # What a starting vLLM says it is doing (_vllm_log.phase), with the time since the deploy.
    "start.container": "{project}: the container is starting, {elapsed} so far",
    "start.engine": "{project}: initializing the engine, {elapsed} so far",
    "start.loading_weights": "{project}: loading the weights, {elapsed} so far",
    "start.loading_shards": "{project}: loading the weights (shard {done} of {total}), {elapsed} so far",
    "start.weights_loaded": "{project}: weights loaded, preparing the engine, {elapsed} so far",
    "start.compiling": "{project}: compiling the model (torch.compile), {elapsed} so far",
    "start.profiling": "{project}: profiling memory and sizing the KV cache, {elapsed} so far",
    "start.cuda_graphs": "{project}: capturing CUDA graphs, {elapsed} so far",
    "start.cuda_graphs_percent": "{project}: capturing CUDA graphs ({percent}%), {elapsed} so far",
    "start.ready": "{project}: the server is up, waiting for /v1/models, {elapsed} so far",
    "start.answered": "{project}: /v1/models answered after {elapsed}",
    "start.timeout": "vLLM did not answer on {url} within vllm_wait_timeout={timeout} s; its last log lines: {log}",
    "start.exited": "vLLM's container {status} (exit code {rc}) before it answered on {url}; its last log lines: {log}",
    # The correctness gate (_gate, _vllm.gate_plan, vllm_answer_check).
    "cpu_threads_bind": "{workers} CPU workers share the {cpus} CPUs evenly (vLLM binds one worker per NUMA node otherwise)",
    "cpu_threads_bind.replicas": "each of the {replicas} replicas binds its workers to its own share of the {cpus} CPUs",
    # The serving layout (_layout, _vllm.layout_plan).
    "tp.replica": "{replicas} replicas of {size} each (vllm_layout), behind Nginx",
    "layout.replicas": "{replicas} replicas of {size} {unit}(s) each behind Nginx (vllm_layout=replicas)",
    "layout.single": "only one layout fits the {units} {unit}(s): {layout} (vllm_layout=auto)",
    "layout.unmeasured": "{layout} until the layouts {candidates} are measured (vllm_layout=auto)",
    "layout.measured": (
        "{layout} measured {tokens_per_s:.1f} tokens/s at TTFT p99 {ttft_p99_ms:.0f} ms against {other_tokens_per_s:.1f} "
        "at {other_ttft_p99_ms:.0f} ms with {other}: the fastest within the TTFT bound of {bound_ms:.0f} ms ({bound_words})"
    ),
    "layout.only": "{layout} is the only layout that served every request of the measurement ({tokens_per_s:.1f} tokens/s)",
    "layout.none_in_bound": (
        "no layout met the TTFT bound of {bound_ms:.0f} ms (vllm_tune_max_ttft_ms); {layout} had the lowest TTFT p99, "
        "{ttft_p99_ms:.0f} ms"
    ),
    "layout.none": "no layout served every request of the measurement; keeping {layout}",
    "gate.passed": "the correctness gate passed with the configuration {step}",
    "gate.fallback": "the correctness gate failed with {failed} and passed with {step}",
    "gate.faster": (
        "the correctness gate passed with both; {kept} measured {kept_tokens_per_s:.0f} tokens/s against "
        "{other_tokens_per_s:.0f} with {other}, so it is kept"
    ),
    "gate.reference_one": "the reference answers come from one {unit} (the model fits it), custom all-reduce off",
    "gate.reference_no_p2p": (
        "the reference answers come from {gpus} GPUs with custom all-reduce and P2P off (NCCL_P2P_DISABLE=1)"
    ),
    "gate.empty": "the answer is empty",
    "gate.repeated": "one token ({token!r}) is {count} of its {tokens} tokens",
    "gate.bang_run": "the answer is a run of '!' (what a broken all-reduce produces)",
    "gate.replacement": "the answer is a run of replacement characters (broken output)",
    "gate.bad_logprob": "a logprob is {value} (NaN or infinite)",
    "gate.disagrees": (
        "{agreeing} of {prompts} prompts agree with the reference on their first {tokens} tokens (at least {needed} must)"
    ),
    "gate.not_started": "the server did not start: {reason}",
    "gate.failed": (
        "no configuration passed the correctness gate ({results}); the server answers wrong text on this box. "
        "Evidence: {evidence}"
    ),
    "hub.fetch_failed": "downloading {model} at {commit} from {endpoint} failed (exit code {rc}); its last lines: {log}",
    "hub.fetch_vanished": (
        "downloading {model} at {commit} from {endpoint} stopped: its container {name} is gone "
        "(removed while it ran) with {missing} still missing; run again to resume"
    ),
    # The engine watchdog on the box (_watchdog.tick, gpubox-vllm-watchdog), into the journal.
    "watchdog.no_deployment": "no vLLM deployment is recorded on this box; nothing to watch",
    "watchdog.stopped": "vLLM's containers are stopped (by hand, or by the correctness gate); the watchdog leaves them so",
    "watchdog.docker_restarting": "Docker is restarting {containers} (it exited); its restart policy brings it back",
    "watchdog.starting": "{service} is starting: {seconds:.0f} s of its {grace_s:.0f} s to start (vllm_wait_timeout)",
    "watchdog.healthy": "{servers} vLLM server(s) answer /health and a one-token completion",
    "watchdog.busy": "{busy}: the probe's completion timed out while tokens kept flowing, so the engine is busy, not hung",
    "watchdog.recovered": "vLLM serves again, {seconds:.0f} s after the watchdog recreated it",
    "watchdog.failing": "probe failed ({count} of {failures} in a row before a restart): {problems}",
    "watchdog.restart": (
        "{failures} probes in a row failed ({problems}): recreating the Compose project "
        "(restart {restarts} of at most {max_restarts} in {window})"
    ),
    "watchdog.gave_up": (
        "{failures} probes in a row failed ({problems}) and {restarts} restarts in the last {window} did not keep vLLM "
        "serving: the watchdog leaves it as it is until {next_at}. Read this journal and the project's "
        "`docker compose logs`, fix the cause, then run site.yml"
    ),
    "watchdog.restart_failed": "recreating the Compose project failed (exit code {rc}): {output}",
    "watchdog.health_unreachable": "{service}: /health did not answer ({error})",
    "watchdog.health_status": "{service}: /health answered HTTP {status}",
    "watchdog.completion_timeout": "{service}: a one-token completion did not answer within {seconds:.0f} s and no token moved",
    "watchdog.completion_status": "{service}: a one-token completion answered HTTP {status} ({error})",
    "watchdog.completion_unreachable": "{service}: a one-token completion did not answer ({error})",
    # The power sweep (_power.sweep, playbooks/power.yml).
    "power.knee": (
        "{limit_w:.0f} W keeps {speed_share:.0%} of the fastest speed (at {fastest_w:.0f} W) with {tokens_per_joule:.3f} "
        "tokens per joule against {fastest_tokens_per_joule:.3f}, drawing {watts:.0f} W against {fastest_watts:.0f} W: "
        "set gpubox_gpu_power_limit_w: {limit_w:.0f}"
    ),
    "power.none": "no step of the sweep served every request with an energy reading; nothing to recommend",
    # The drift watch (_drift.compare, gpubox-drift), into the journal: what changed since the last deployment.
    "drift.gpus": "the GPUs are not the ones deployed on (fingerprint {recorded:.12} then, {now:.12} now): run site.yml",
    "drift.driver": "the NVIDIA driver changed from {recorded} to {now} since the deployment: run site.yml",
    "drift.link_width": (
        "GPU{gpu} ({bus_id}) runs its link at x{now}, x{recorded} when deployed (it supports x{max}): reseat the card "
        "or check the slot and riser"
    ),
    "drift.link_gen_max": (
        "GPU{gpu} ({bus_id}) can reach only Gen{now} now, Gen{recorded} when deployed: a BIOS setting or the slot changed"
    ),
    "drift.link_width_max": "GPU{gpu} ({bus_id}) can reach only x{now} now, x{recorded} when deployed",
    "drift.link_gen_under_load": (
        "GPU{gpu} ({bus_id}) runs its link at Gen{now} under load ({state}) where it reaches Gen{max}: downtrained"
    ),
    "drift.acs_redirect": (
        "ACS now redirects peer-to-peer traffic on {bridges} (a BIOS update turns it back on): NCCL over P2P may hang; "
        "run site.yml, whose preflight turns P2P off or remediates"
    ),
    "drift.iommu": "the IOMMU mode changed from {recorded} to {now} since the deployment: run site.yml",
    "drift.image": "vLLM's containers run {now}, not the image deployed ({recorded}): run site.yml",
    "drift.none": "no drift: the GPUs, their links, ACS, the IOMMU, the driver and vLLM's image are as deployed",
    # The GPU metrics program (monitoring role, gpubox-gpu-metrics), into the journal.
    "gpu_metrics.nvml": "NVML could not read the GPUs ({error}): {path} holds no GPU series until it can",
    "gpu_metrics.no_kernel_log": "the kernel log could not be read (journalctl: {error}): no Xid series this time",
}


# The correctness gate's configurations (_vllm.gate_plan's steps), in words.
STEPS = {
    "as_planned": "as planned",
    "no_custom_all_reduce": "custom all-reduce off (--disable-custom-all-reduce)",
    "no_p2p": "P2P off (NCCL_P2P_DISABLE=1, custom all-reduce off)",
}


# Where a layout choice's TTFT bound came from (_layout.choose's bound_from).
BOUNDS = {"setting": "vllm_tune_max_ttft_ms", "best": "twice the lowest TTFT p99 measured"}


def say(code: str, **fields) -> str:
    """The words for ``code`` with its fields; a status inside ``fields`` is rendered through its own template.

    Gate step names (``step``, ``kept``, ``other``, ``failed``) are rendered as ``STEPS`` says; lists are joined.
    """
    for name in ("step", "kept", "other", "failed"):
        if name in fields:
            value = fields[name]
            fields[name] = ", then ".join(STEPS.get(v, v) for v in value) if isinstance(value, list) else STEPS.get(value, value)
    if "candidates" in fields and isinstance(fields["candidates"], list):
        fields["candidates"] = ", ".join(fields["candidates"])
    if "bound_from" in fields:
        fields["bound_words"] = BOUNDS.get(fields["bound_from"], fields["bound_from"])
    if isinstance(fields.get("problems"), list):
        fields["problems"] = "; ".join(explain(problem) for problem in fields["problems"])
    if code.startswith("cluster."):
        fields = {
            key: ", ".join(value) if isinstance(value, list)
            else "; ".join(f"{name} {item}" for name, item in value.items()) if isinstance(value, dict)
            else value
            for key, value in fields.items()
        }  # fmt: skip
    if code.startswith("drift."):
        fields = {key: ", ".join(value) if isinstance(value, list) else value for key, value in fields.items()}
    for name in ("containers", "busy"):
        if isinstance(fields.get(name), list):
            fields[name] = ", ".join(fields[name])
    if "window_s" in fields:
        fields["window"] = f"{fields['window_s'] / 60:.0f} min"
    if isinstance(fields.get("next_at"), (int, float)):
        fields["next_at"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(fields["next_at"]))
    if "status" in fields and f"p2p.{fields['status']}" in TEMPLATES:
        fields.setdefault("status_words", TEMPLATES[f"p2p.{fields['status']}"])
    return TEMPLATES[code].format(**fields)


def explain(decision: dict) -> str:
    """``say`` for a decision dict: its ``code`` and its other keys as fields."""
    return say(decision["code"], **{k: v for k, v in decision.items() if k != "code"})
