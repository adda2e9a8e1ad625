# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private: the vLLM deployment plan, every setting the user's choice or derived from measured facts.

Pure functions, data in and data out, no Ansible imports. ``plan`` takes the
user's settings, the facts gathered on the host (the preflight result, the GPU
and P2P facts) and the model's ``config.json``, and returns the validation
errors, the server arguments, the environment, one reason per derived setting,
and a KV-cache estimate. The vllm role renders what it returns.

``facts["previous"]`` is what the last deployment stored (``record`` below). After a
GPU swap, a plan that can only run as a lesser configuration than that one (fewer
tensor-parallel GPUs, P2P now off) is an error unless ``settings["allow_downgrade"]``.
"""

from __future__ import annotations

import re

from ansible_collections.gpubox.inference.plugins.module_utils import _gate, _hub, _layout, _p2p, _preflight, _topology
from ansible_collections.gpubox.inference.plugins.module_utils._words import explain

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1, "auto": 2}


def _gpu_count(facts: dict) -> int:
    gpu = facts.get("gpu") or {}
    if gpu.get("present"):
        return int(gpu.get("count") or 0)
    return int((facts.get("preflight") or {}).get("gpu_count") or 0)


def _port(settings: dict) -> int:
    """The port vLLM answers on at 127.0.0.1 (``vllm_port``); a string from ``-e`` counts as its number."""
    return int(settings.get("port", 8000))


def validate(settings: dict, facts: dict, model_config: dict | None, tp: int) -> list[str]:
    """One message per broken rule, naming the variable, the value and the rule."""
    errors = []
    gpus = _gpu_count(facts)
    if settings["device"] == "cuda":
        if tp < 1:
            errors.append(f"vllm_tensor_parallel_size={tp} must be at least 1")
        elif gpus and tp * settings["pipeline_parallel_size"] > gpus:
            errors.append(
                f"vllm_tensor_parallel_size={tp} x vllm_pipeline_parallel_size={settings['pipeline_parallel_size']} "
                f"must be at most the {gpus} GPUs on this host"
            )
    heads = (model_config or {}).get("num_attention_heads")
    kv_heads = (model_config or {}).get("num_key_value_heads")
    if heads and tp >= 1 and heads % tp:
        errors.append(f"vllm_tensor_parallel_size={tp} must divide the model's {heads} attention heads")
    elif kv_heads and tp >= 1 and kv_heads % tp and tp % kv_heads:
        errors.append(f"vllm_tensor_parallel_size={tp} must divide the model's {kv_heads} KV heads, or be a multiple of them")
    errors += [
        f"the preflight refuses this box: {failure} (preflight_fail_on_* decides what it refuses)"
        for failure in (facts.get("preflight") or {}).get("failures") or []
    ]
    utilization = settings["gpu_memory_utilization"]
    if not 0 < utilization <= 1:
        errors.append(f"vllm_gpu_memory_utilization={utilization} must be in (0, 1]")
    max_len = settings["max_model_len"]
    context = (model_config or {}).get("max_position_embeddings")
    if max_len < 0:
        errors.append(f"vllm_max_model_len={max_len} must be positive (or 0 for the model's own)")
    elif context and max_len > context:
        errors.append(f"vllm_max_model_len={max_len} must fit the model's context of {context} tokens")
    if settings["model"].startswith("/") and not settings.get("model_exists"):
        errors.append(f"vllm_model={settings['model']!r} is a path that does not exist on the host")
    if not settings["model"]:
        errors.append("vllm_model must name a Hugging Face model id or an absolute path on the host")
    if settings.get("swap_space"):
        errors.append(
            f"vllm_swap_space={settings['swap_space']}: the vLLM this collection deploys has no --swap-space "
            "(vLLM removed it); remove the variable"
        )
    disk = (facts.get("hub") or {}).get("disk_problem")
    if disk:
        errors.append(explain(disk))
    port = _port(settings)
    if not 1 <= port <= 65535:
        errors.append(f"vllm_port={port} must be a TCP port, from 1 to 65535")
    return errors + _watchdog_errors(settings)


# The engine watchdog's settings and their least sound values (tasks/watchdog.yml).
WATCHDOG_MINIMUMS = {"watchdog_interval": 5, "watchdog_timeout": 1, "watchdog_failures": 1, "watchdog_max_restarts": 1}


def _watchdog_errors(settings: dict) -> list[str]:
    if not settings.get("watchdog"):
        return []
    return [
        f"vllm_{name}={settings[name]} must be at least {least}"
        for name, least in WATCHDOG_MINIMUMS.items()
        if settings.get(name) is not None and int(settings[name]) < least
    ]


def kv_cache_estimate(settings: dict, facts: dict, model_config: dict | None, tp: int, weights_bytes: int | None) -> dict | None:
    """Tokens of KV cache that fit per GPU after the weights, and concurrent sequences at max_model_len."""
    config = model_config or {}
    gpu = facts.get("gpu") or {}
    devices = gpu.get("devices") or []
    if not config or not devices or settings["device"] != "cuda":
        return None
    layers = config.get("num_hidden_layers")
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    hidden = config.get("hidden_size")
    if not (layers and heads and hidden):
        return None
    head_dim = config.get("head_dim") or hidden // heads
    dtype = (
        settings["dtype"] if settings["dtype"] != "auto" else str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")
    )
    width = DTYPE_BYTES.get(dtype, 2)
    if settings.get("kv_cache_dtype", "auto").startswith("fp8"):
        width = 1
    kv_heads_per_gpu = max(kv_heads // tp, 1)
    per_token = 2 * layers * kv_heads_per_gpu * head_dim * width
    if weights_bytes is None:
        vocab = config.get("vocab_size") or 32000
        intermediate = config.get("intermediate_size") or 4 * hidden
        params = layers * (4 * hidden * hidden + 3 * hidden * intermediate) + 2 * vocab * hidden
        weights_bytes = params * DTYPE_BYTES.get(dtype, 2)
    memory = min(d.get("memory_total_mib") or 0 for d in devices[: max(tp, 1)]) * 1024 * 1024
    free = memory * settings["gpu_memory_utilization"] - weights_bytes / tp - 1.5 * 1024**3  # activations, CUDA graphs
    tokens = max(int(free // per_token), 0)
    max_len = settings["max_model_len"] or config.get("max_position_embeddings") or 0
    sequences = tokens // max_len if max_len else None
    return {
        "bytes_per_token_per_gpu": per_token,
        "weights_gib_per_gpu": round(weights_bytes / tp / 1024**3, 2),
        "kv_cache_tokens": tokens,
        "max_model_len": max_len,
        "concurrent_sequences": sequences,
    }


def _tensor_parallel(settings: dict, facts: dict, model_config: dict | None) -> tuple[int, dict]:
    """The tensor-parallel size and why: the user's, the CPU backend's, or the largest group the heads allow."""
    pinned, pp = settings["tensor_parallel_size"], settings["pipeline_parallel_size"]
    gpus = _gpu_count(facts)
    config = model_config or {}
    heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads") or config.get("num_attention_heads")
    if settings["device"] == "cpu":
        return (pinned, {"code": "tp.user"}) if pinned else (1, {"code": "tp.cpu", "size": 1})
    if not pinned:
        allowed = len((facts.get("preflight") or {}).get("group") or []) or gpus or 1
        size = largest_fitting_tp(max(allowed // pp, 1), heads, kv_heads)
        if heads:
            return size, {"code": "tp.derived", "size": size, "allowed": allowed, "heads": heads, "kv_heads": kv_heads}
        return size, {"code": "tp.derived_no_config", "size": size, "allowed": allowed}
    if gpus and pinned * pp > gpus and settings.get("allow_downgrade"):
        size = largest_fitting_tp(gpus // pp, heads, kv_heads)
        return size, {"code": "tp.lowered", "size": size, "pinned": pinned, "gpus": gpus}
    return pinned, {"code": "tp.user"}


def _nccl(facts: dict, gpus: list[int]) -> tuple[dict, dict]:
    """NCCL's environment for one server on ``gpus``, from the measurement and the preflight, and why."""
    env: dict[str, str] = {}
    why: dict[str, dict] = {}
    if len(gpus) < 2:
        return env, why
    decisions = (facts.get("gpu_p2p") or {}).get("decisions") or {}
    measured = _p2p.for_group(decisions, gpus) if decisions else {}
    preflight = facts.get("preflight") or {}
    names = [f"GPU{index}" for index in gpus]
    judged = _preflight.for_group(preflight, names)["decisions"] if preflight.get("pairs") else {}
    disable = None
    if measured.get("cause") == "tool_hang":
        disable = {"code": "nccl_p2p_disable.tool_hang", "seconds": decisions["tool_hang_s"]}
    elif measured.get("nccl_p2p_disable"):
        disable = {"code": "nccl_p2p_disable.measured", **measured["unusable"][0]}
    elif judged.get("nccl_p2p_disable"):
        disable = {"code": "nccl_p2p_disable.acs_redirect", "bridge": judged["bridge"], "pair": "-".join(judged["pairs"][0])}
    if disable:
        env["NCCL_P2P_DISABLE"] = "1"
        why["NCCL_P2P_DISABLE"] = disable
    elif measured.get("nccl_p2p_level"):
        env["NCCL_P2P_LEVEL"] = measured["nccl_p2p_level"]
        why["NCCL_P2P_LEVEL"] = {"code": "nccl_p2p_level.sys"}
    return env, why


def _nccl_for(facts: dict, groups: list[list[int]]) -> tuple[dict, dict]:
    """One NCCL environment for every server of a layout: the strictest any of their GPU groups needs."""
    found = [_nccl(facts, group) for group in groups]
    for name in ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL"):
        for env, why in found:
            if name in env:
                return env, why
    return {}, {}


def plan(settings: dict, facts: dict, model_config: dict | None = None, weights_bytes: int | None = None) -> dict:
    """Everything the vllm role renders: arguments, environment, decisions and their reasons, errors, estimate.

    ``decisions`` holds one code with its fields per derived setting; ``reasons`` is the same in words
    (``_words``), for the Compose file's comments and the summary. Nothing here branches on words.
    """
    preflight = facts.get("preflight") or {}
    decisions: dict[str, dict] = {}
    env: dict[str, str] = {}

    tp, decisions["--tensor-parallel-size"] = _tensor_parallel(settings, facts, model_config)
    bound_replicas = False
    layout = layout_plan(settings, facts, model_config, weights_bytes, tp)
    replicas = layout["layout"]["replicas"]
    if layout["decision"]:
        decisions["layout"] = layout["decision"]
    if replicas > 1 or layout["layout"]["size"] != tp * settings["pipeline_parallel_size"]:
        tp = layout["layout"]["size"]
        decisions["--tensor-parallel-size"] = {"code": "tp.replica", "size": tp, "replicas": replicas}
    size = tp * settings["pipeline_parallel_size"]
    groups = [list(range(index * size, (index + 1) * size)) for index in range(replicas)]
    derived_nccl: dict[str, dict] = {}

    if settings["device"] == "cuda":
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        decisions["CUDA_DEVICE_ORDER"] = {"code": "cuda_device_order"}
        env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        decisions["VLLM_WORKER_MULTIPROC_METHOD"] = {"code": "multiproc_spawn"}
        nccl_env, derived_nccl = _nccl_for(facts, groups)
        env.update(nccl_env)
        decisions.update(derived_nccl)
        if not preflight.get("rdma_nics"):
            env["NCCL_IB_DISABLE"] = "1"
            decisions["NCCL_IB_DISABLE"] = {"code": "nccl_ib_disable"}
    else:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(settings.get("cpu_kvcache_gib") or 1)
        decisions["VLLM_CPU_KVCACHE_SPACE"] = {"code": "cpu_kvcache"}
        cpus = int(settings.get("cpu_count") or 0)
        if replicas > 1 and cpus >= tp * replicas:
            # Each replica's workers on their own share of the CPUs (services sets them per replica).
            decisions["VLLM_CPU_OMP_THREADS_BIND"] = {"code": "cpu_threads_bind.replicas", "cpus": cpus, "replicas": replicas}
            # vLLM binds CPU workers only in its multiprocess executor, even for one worker.
            bound_replicas = "VLLM_CPU_OMP_THREADS_BIND" not in (settings.get("env") or {})
        elif tp > 1 and cpus >= tp:
            # vLLM binds each CPU worker to one NUMA node unless told; split the CPUs evenly instead.
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binding(cpus, tp)
            decisions["VLLM_CPU_OMP_THREADS_BIND"] = {"code": "cpu_threads_bind", "cpus": cpus, "workers": tp}

    for key, value in (settings.get("env") or {}).items():
        env[key] = str(value)
        decisions[key] = {"code": "user_env"}

    custom_all_reduce = settings.get("disable_custom_all_reduce", "auto")
    if custom_all_reduce == "auto":
        # Custom all-reduce copies over P2P itself, whatever NCCL is told (vllm_env included).
        disable_car = "NCCL_P2P_DISABLE" in derived_nccl
        if disable_car:
            decisions["--disable-custom-all-reduce"] = derived_nccl["NCCL_P2P_DISABLE"]
    else:
        disable_car = bool(custom_all_reduce)
        if disable_car:
            decisions["--disable-custom-all-reduce"] = {"code": "user_choice"}

    args = ["--model", settings["container_model"], "--served-model-name", settings["served_model_name"]]
    hub = facts.get("hub") or {}
    if hub.get("commit"):
        # The role fetched this commit before the server starts (vllm_model_fetch=role).
        env["HF_HUB_OFFLINE"] = "1"
        decisions["HF_HUB_OFFLINE"] = {"code": "hub_offline", "model": settings["model"], "commit": hub["commit"][:12]}
    elif _hub_id(settings):
        endpoint = str(settings.get("hf_endpoint") or _hub.DEFAULT_ENDPOINT).rstrip("/")
        if endpoint != _hub.DEFAULT_ENDPOINT:
            env["HF_ENDPOINT"] = endpoint
            decisions["HF_ENDPOINT"] = {"code": "user_choice"}
        if settings.get("model_revision") and settings["model_revision"] != "main":
            args += ["--revision", settings["model_revision"]]
            decisions["--revision"] = {"code": "user_choice"}
    port = _port(settings)
    if settings.get("network_mode", "host") == "host":
        args += ["--host", "127.0.0.1", "--port", str(port)]
        decisions["--host"] = {"code": "host_network", "port": port}
    else:
        args += ["--host", "0.0.0.0", "--port", "8000"]
        decisions["--host"] = {"code": "bridge_network", "port": port}
    if settings["device"] == "cuda" or tp > 1:
        args += ["--tensor-parallel-size", str(tp)]
    if settings["pipeline_parallel_size"] > 1:
        args += ["--pipeline-parallel-size", str(settings["pipeline_parallel_size"])]
    if settings["device"] == "cuda":
        args += ["--gpu-memory-utilization", str(settings["gpu_memory_utilization"])]
    else:
        args += ["--distributed-executor-backend", "uni" if size == 1 and not bound_replicas else "mp"]
    for flag, key in (
        ("--max-model-len", "max_model_len"),
        ("--max-num-batched-tokens", "max_num_batched_tokens"),
    ):
        if settings.get(key):
            args += [flag, str(settings[key])]
    if settings.get("dtype") and settings["dtype"] != "auto":
        args += ["--dtype", settings["dtype"]]
    if settings.get("quantization"):
        args += ["--quantization", settings["quantization"]]
    for flag, key in TRI_STATE:
        choice = tri_state(settings.get(key))
        if choice is None:
            decisions[flag] = {"code": "vllm_default", "flag": flag}
        else:
            args.append(flag if choice else "--no-" + flag[2:])
            decisions[flag] = {"code": "user_choice"}
    if settings.get("enforce_eager"):
        args.append("--enforce-eager")
    if disable_car:
        args.append("--disable-custom-all-reduce")
    args += [str(a) for a in settings.get("extra_args") or []]

    errors = validate(settings, facts, model_config, tp) + layout["errors"]
    if _port(settings) + replicas - 1 > 65535:
        errors.append(f"vllm_port={_port(settings)} leaves no port for each of the {replicas} replicas (they take the next)")
    deployed = {
        "tensor_parallel_size": tp,
        "replicas": replicas,
        "layout": layout["layout"]["name"],
        "model_revision": settings.get("model_revision") or "main",
        "model_commit": hub.get("commit"),
        "nccl_p2p_disable": env.get("NCCL_P2P_DISABLE") == "1",
        "fingerprint": (facts.get("gpu") or {}).get("fingerprint"),
    }
    lost = downgrades(facts.get("previous"), deployed)
    if lost and not settings.get("allow_downgrade"):
        errors.append(
            "the GPUs changed and the running deployment cannot be kept as it is: "
            + "; ".join(lost)
            + ". Fix the hardware, or set vllm_allow_downgrade=true to redeploy with less"
        )
    estimate = None if errors else kv_cache_estimate(settings, facts, model_config, tp, weights_bytes)
    gate = gate_plan(settings, facts, args, env, tp, model_config, weights_bytes, layout["layout"])
    for step in gate["steps"]:
        step["services"] = services(settings, step["args"], step["env"], size, replicas)
    reference = gate["reference"]
    if reference:
        reference["services"] = services(settings, reference["args"], reference["env"], reference["gpus"], 1)
    chosen = gate["chosen"]
    if chosen:
        step = next(s for s in gate["steps"] if s["name"] == chosen["step"])
        args, env = step["args"], step["env"]
        for setting in step["changes"]:
            decisions[setting] = chosen
    deployed_services = services(settings, args, env, size, replicas)
    deployed["upstreams"] = [f"127.0.0.1:{service['port']}" for service in deployed_services]
    # The Compose service behind each upstream, in the same order (the engine watchdog probes them by name).
    deployed["services"] = [service["name"] for service in deployed_services]
    deployed["gate_step"] = chosen["step"] if chosen else "as_planned"
    deployed["nccl_p2p_disable"] = env.get("NCCL_P2P_DISABLE") == "1"
    warnings = [f"downgraded after the GPU change: {item}" for item in lost] if settings.get("allow_downgrade") else []
    sequences = (estimate or {}).get("concurrent_sequences")
    if sequences is not None and sequences < settings.get("min_concurrent_sequences", 1):
        warnings.append(
            f"vllm_max_model_len={estimate['max_model_len']} leaves KV cache for about {sequences} concurrent "
            f"sequences (fewer than vllm_min_concurrent_sequences={settings['min_concurrent_sequences']}); "
            "lower it or add GPUs"
        )
    return {
        "tensor_parallel_size": tp,
        "args": args,
        "env": env,
        "decisions": decisions,
        "reasons": {setting: explain(decision) for setting, decision in decisions.items()},
        "errors": errors,
        "warnings": warnings,
        "kv_cache": estimate,
        "gate": gate,
        "layout": layout,
        # One Compose service per server: the plan's, with its port, GPUs and CPU share.
        "services": deployed_services,
        # What the role stores once deployed; the next run's facts["previous"].
        "record": deployed,
    }


def cpu_binding(cpus: int, workers: int, first: int = 0) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for ``workers`` CPU workers over CPUs first..first+cpus-1, in even contiguous shares."""
    share = cpus // workers
    ranges = [(first + w * share, first + w * share + share - 1) for w in range(workers)]
    return "|".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def services(settings: dict, args: list[str], env: dict, size: int, replicas: int) -> list[dict]:
    """The Compose services of one configuration: ``replicas`` servers of ``size`` GPUs (or CPU workers) each.

    Server ``i`` answers on ``vllm_port + i`` and takes GPUs ``i*size`` on; on the CPU backend,
    replicas each bind their workers to their own share of the CPUs (unless vllm_env sets it).
    """
    base, host = _port(settings), settings.get("network_mode", "host") == "host"
    cpus = int(settings.get("cpu_count") or 0)
    bind = (
        settings["device"] == "cpu"
        and replicas > 1
        and cpus >= size * replicas
        and "VLLM_CPU_OMP_THREADS_BIND" not in (settings.get("env") or {})
    )
    out = []
    for index in range(replicas):
        own_args, own_env = list(args), dict(env)
        if index and host and "--port" in own_args:
            own_args[own_args.index("--port") + 1] = str(base + index)
        if bind:
            share = cpus // replicas
            own_env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binding(share, size, first=index * share)
        out.append(
            {"name": "vllm" if index == 0 else f"vllm-{index + 1}", "port": base + index,
             "url": f"http://127.0.0.1:{base + index}/v1",
             "gpus": [str(gpu) for gpu in range(index * size, (index + 1) * size)], "args": own_args, "env": own_env}
        )  # fmt: skip
    return out


def layout_plan(settings: dict, facts: dict, model_config: dict | None, weights_bytes: int | None, tp: int) -> dict:
    """How the servers are laid out over the ``tp x pp`` units the tensor-parallel plan uses (``_layout``).

    ``vllm_layout``: ``tp`` (one server, the default), ``replicas`` (``vllm_replica_size`` each, or the
    smallest size that fits), ``auto`` (the stored measurement's choice for this key; before there is
    one, ``tp`` is deployed and ``measure`` is set, with each candidate's services). ``layout_measure``
    measures again whatever is stored (playbooks/tune.yml).
    """
    setting = str(settings.get("layout") or "tp")
    pp = settings["pipeline_parallel_size"]
    units = tp * pp
    config = model_config or {}
    heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads") or config.get("num_attention_heads")
    wanted = settings.get("min_concurrent_sequences", 1)

    def fits(size: int) -> bool:
        if not fits_heads(size, heads, kv_heads):
            return False
        estimate = kv_cache_estimate(settings, facts, model_config, size, weights_bytes) if settings["device"] == "cuda" else None
        return estimate is None or (estimate["kv_cache_tokens"] > 0 and (estimate["concurrent_sequences"] or 0) >= wanted)

    candidates = _layout.candidates(units, fits) if pp == 1 else [_layout.layout(units, 1)]
    names = [c["name"] for c in candidates]
    load = {key: int(settings.get(f"tune_{key}") or default) for key, default in TUNE_DEFAULTS.items()}
    store_key = _layout.key(_gate_key(settings, facts), units, load)
    stored = ((facts.get("layout_store") or {}).get(store_key)) or {}
    unit = "GPU" if settings["device"] == "cuda" else "CPU worker"
    errors, decision, chosen = [], None, candidates[0]
    if setting not in _layout.LAYOUTS:
        errors.append(f"vllm_layout={setting!r} must be one of {', '.join(_layout.LAYOUTS)}")
    elif setting != "tp" and pp > 1:
        errors.append(f"vllm_layout={setting} needs vllm_pipeline_parallel_size=1 (it is {pp})")
    elif setting == "replicas":
        size = int(settings.get("replica_size") or 0) or candidates[-1]["size"]
        if units % size or not fits_heads(size, heads, kv_heads) or (size != units and not fits(size)):
            errors.append(
                f"vllm_replica_size={size} must divide the {units} {unit}s of the layout and fit the model "
                f"(heads, and the KV cache for vllm_min_concurrent_sequences={wanted}); these fit: "
                + ", ".join(str(c["size"]) for c in candidates)
            )
        else:
            chosen = _layout.layout(size, units // size)
            decision = {"code": "layout.replicas", "replicas": chosen["replicas"], "size": size, "unit": unit}
    elif setting == "auto" and len(candidates) == 1:
        decision = {"code": "layout.single", "layout": chosen["name"], "units": units, "unit": unit}
    elif setting == "auto" and stored.get("chosen") in names and stored.get("decision"):
        chosen = candidates[names.index(stored["chosen"])]
        decision = stored["decision"]
    elif setting == "auto":
        decision = {"code": "layout.unmeasured", "layout": chosen["name"], "candidates": names}
    measure = (
        not errors
        and len(candidates) > 1
        and (bool(settings.get("layout_measure")) or (setting == "auto" and decision.get("code") == "layout.unmeasured"))
    )
    if measure:
        for candidate in candidates:
            fixed = {"layout": "replicas" if candidate["replicas"] > 1 else "tp", "replica_size": candidate["size"]}
            candidate["services"] = plan({**settings, **fixed, "layout_measure": False}, facts, model_config, weights_bytes)[
                "services"
            ]
    return {
        "setting": setting,
        "units": units,
        "candidates": candidates,
        "layout": chosen,
        "decision": decision,
        "measure": measure,
        "key": store_key,
        "stored": stored,
        "load": load,
        "max_ttft_ms": float(settings.get("tune_max_ttft_ms") or 0),
        "errors": errors,
    }


# The target load a layout is measured at (vllm_tune_*), when the settings do not say.
TUNE_DEFAULTS = {"concurrency": 8, "prompt_tokens": 512, "max_tokens": 128}


def _gate_key(settings: dict, facts: dict) -> str:
    hub = facts.get("hub") or {}
    image = f"{settings.get('image', '')}:{settings.get('image_tag', '')}"
    revision = hub.get("commit") or (settings.get("model_revision") if _hub_id(settings) else None)
    return _gate.key((facts.get("gpu") or {}).get("fingerprint"), settings["model"], revision, image)


def _consumer_over_pcie(facts: dict, size: int) -> bool:
    """GeForce or TITAN cards, and some pair of the deployed GPUs not joined by NVLink."""
    devices = ((facts.get("gpu") or {}).get("devices") or [])[:size]
    consumer = any(("GeForce" in str(d.get("name"))) or ("TITAN" in str(d.get("name"))) for d in devices)
    names = {f"GPU{index}" for index in range(size)}
    pairs = [p for p in (facts.get("preflight") or {}).get("pairs") or [] if set(p["gpus"]) <= names]
    return consumer and any(_topology.link_class(p["link"]) != "NVLINK" for p in pairs)


def _with_arg(args: list[str], flag: str) -> list[str]:
    return args if flag in args else [*args, flag]


def _reference(settings: dict, facts: dict, args: list[str], env: dict, tp: int, model_config, weights_bytes) -> dict | None:
    """The known-safe configuration the gate's reference answers come from; None when the plan is that one.

    One GPU (or one CPU worker) when the model fits it, else the same size with custom all-reduce and P2P off.
    """
    size = tp * settings["pipeline_parallel_size"]
    if size == 1:
        return None
    fits_one = settings["device"] == "cpu"
    if not fits_one and settings["pipeline_parallel_size"] == 1:
        one = kv_cache_estimate(settings, facts, model_config, 1, weights_bytes)
        fits_one = bool(one and one["kv_cache_tokens"] > 0 and (one["concurrent_sequences"] or 0) >= 1)
    if fits_one:
        single = [*args]
        position = single.index("--tensor-parallel-size") if "--tensor-parallel-size" in single else -1
        if position >= 0:
            single[position + 1] = "1"
        if "--distributed-executor-backend" in single:
            single[single.index("--distributed-executor-backend") + 1] = "uni"
        single = [a for a in single if a != "--disable-custom-all-reduce"]
        quiet = {k: v for k, v in env.items() if not k.startswith("NCCL_P2P") and k != "VLLM_CPU_OMP_THREADS_BIND"}
        unit = "GPU" if settings["device"] == "cuda" else "CPU worker"
        return {"code": "gate.reference_one", "unit": unit, "tensor_parallel_size": 1, "gpus": 1, "args": single, "env": quiet}
    return {
        "code": "gate.reference_no_p2p",
        "tensor_parallel_size": tp,
        "gpus": size,
        "args": _with_arg(args, "--disable-custom-all-reduce"),
        "env": {**env, "NCCL_P2P_DISABLE": "1"},
    }


def gate_plan(
    settings: dict, facts: dict, args: list[str], env: dict, tp: int, model_config=None, weights_bytes=None, layout=None
) -> dict:
    """The correctness gate's part of the plan: the key, the reference configuration, the fallback steps.

    Steps, in order: as planned; without custom all-reduce (when the plan has it on and tp > 1);
    without P2P (NCCL_P2P_DISABLE=1, custom all-reduce off) when P2P is on. On consumer GPUs over
    PCIe the first two are both measured (``compare``) and custom all-reduce is kept only when it
    passed and was faster. ``chosen`` is what the stored verdicts for this key decided, if any.
    """
    size = tp * settings["pipeline_parallel_size"]
    steps = [{"name": "as_planned", "args": args, "env": env, "changes": []}]
    car_on = size > 1 and "--disable-custom-all-reduce" not in args
    if car_on:
        steps.append(
            {"name": "no_custom_all_reduce", "args": _with_arg(args, "--disable-custom-all-reduce"), "env": env,
             "changes": ["--disable-custom-all-reduce"]}
        )  # fmt: skip
    if size > 1 and env.get("NCCL_P2P_DISABLE") != "1":
        steps.append(
            {"name": "no_p2p", "args": _with_arg(args, "--disable-custom-all-reduce"), "env": {**env, "NCCL_P2P_DISABLE": "1"},
             "changes": ["--disable-custom-all-reduce", "NCCL_P2P_DISABLE"] if car_on else ["NCCL_P2P_DISABLE"]}
        )  # fmt: skip
    if car_on and settings["device"] == "cuda" and _consumer_over_pcie(facts, size):
        for step in steps[:2]:
            step["compare"] = True
    store_key = _gate_key(settings, facts)
    if layout and layout["replicas"] > 1:
        # Replicas are another configuration: their verdicts are their own.
        store_key += f"|{layout['name']}"
    stored = ((facts.get("gate_store") or {}).get(store_key)) or {}
    results = stored.get("results") or {}
    chosen = _gate.choose(steps, results) if results and stored.get("reference") else None
    reference = _reference(settings, facts, args, env, tp, model_config, weights_bytes)
    return {
        "key": store_key,
        "reference": reference,
        "reference_reason": explain({k: v for k, v in reference.items() if k not in ("args", "env")}) if reference else None,
        "steps": steps,
        "stored": stored,
        "chosen": chosen,
        # What the deployment record says of the gate when this run does not judge (check mode).
        "record": {"gate": {"words": explain(chosen), "results": results}} if chosen else {},
        "size": size,
    }


# Settings whose vLLM default is on in current releases: unset leaves vLLM's default, false passes --no-...
TRI_STATE = (
    ("--enable-chunked-prefill", "enable_chunked_prefill"),
    ("--enable-prefix-caching", "enable_prefix_caching"),
)


def tri_state(value) -> bool | None:
    """None for unset (None, '', 'default'), else the boolean; strings from ``-e`` count as their meaning."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null", "default")):
        return None
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "on", "1")
    return bool(value)


def _hub_id(settings: dict) -> bool:
    return bool(settings.get("model")) and not str(settings["model"]).startswith("/")


def fits_heads(size: int, heads: int | None, kv_heads: int | None = None) -> bool:
    """vLLM's rule: the size divides the attention heads, and divides the KV heads or is a multiple of them."""
    if heads and heads % size:
        return False
    return not kv_heads or kv_heads % size == 0 or size % kv_heads == 0


def largest_fitting_tp(gpus: int, heads: int | None, kv_heads: int | None = None) -> int:
    """The largest tensor-parallel size at most ``gpus`` that fits the heads (``fits_heads``; 1 at worst)."""
    return next((size for size in range(max(gpus, 1), 0, -1) if fits_heads(size, heads, kv_heads)), 1)


def downgrades(previous: dict | None, deployed: dict) -> list[str]:
    """What the new plan gives up against the last deployment, in words; empty when nothing."""
    if not previous:
        return []
    lost = []
    before, after = int(previous.get("tensor_parallel_size") or 1), deployed["tensor_parallel_size"]
    replicas_before, replicas = int(previous.get("replicas") or 1), int(deployed.get("replicas") or 1)
    if replicas_before != replicas:
        # Another layout (vllm_layout): what counts is how many GPUs serve.
        if after * replicas < before * replicas_before:
            lost.append(f"GPUs serving {before * replicas_before} -> {after * replicas}")
    elif after < before:
        lost.append(f"tensor parallel size {before} -> {after}")
    if after > 1 and deployed["nccl_p2p_disable"] and not previous.get("nccl_p2p_disable"):
        lost.append("GPU peer-to-peer was on and must now be off (NCCL_P2P_DISABLE=1)")
    return lost


def cuda_required(image_env: list[str] | None) -> str | None:
    """The CUDA version an image declares it needs, from its ``NVIDIA_REQUIRE_CUDA=cuda>=X.Y ...``; None if none."""
    for item in image_env or []:
        name, _sep, value = str(item).partition("=")
        if name == "NVIDIA_REQUIRE_CUDA":
            found = re.search(r"(?:^|\s)cuda>=(\d+)\.(\d+)", value)
            return f"{found.group(1)}.{found.group(2)}" if found else None
    return None


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:2])


def cuda_finding(image: str, image_env: list[str] | None, driver_cuda: str | None) -> dict | None:
    """A refusal when the image needs a newer CUDA than the driver supports (NVML's CUDA driver version), else None.

    An image that declares nothing, or a box whose driver version is unknown, is not judged.
    """
    required = cuda_required(image_env)
    if not required or not driver_cuda or _version(driver_cuda) >= _version(required):
        return None
    return {"code": "cuda.too_old", "image": image, "required": required, "driver": driver_cuda}
