# Copyright (c) gpubox.inference contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Download a model into the Hub cache in a container of vLLM's image, with a progress line every ``interval`` s.

The download runs in a detached container (huggingface_hub ships in vLLM's image, so
the host needs nothing new); this plugin starts it with community.docker's modules,
measures the cache on the box with ansible.builtin.find every ``interval`` seconds,
and shows the bytes done of total, the rate and the time left, so that a long download
never looks like a hang. The options are documented in the hf_model_fetch module.
"""

from __future__ import annotations

import json
import os
import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.gpubox.inference.plugins.module_utils import _hub
from ansible_collections.gpubox.inference.plugins.module_utils._words import say

display = Display()

# Runs in the container with the image's own Python and huggingface_hub. A download
# killed earlier leaves BLOB.UUID.incomplete files that nothing will reuse (the client
# names them per process): they go first, so they do not count against the disk.
FETCH = """
import glob, json, os, sys
from huggingface_hub import snapshot_download
repo, commit, files = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
home = os.environ.get("HF_HOME", "/root/.cache/huggingface")
for stale in glob.glob(os.path.join(home, "hub", "models--" + repo.replace("/", "--"), "blobs", "*.incomplete")):
    os.remove(stale)
print("snapshot:", snapshot_download(repo, revision=commit, allow_patterns=files), flush=True)
"""


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("model", "commit", "files", "endpoint", "cache_dir", "image", "env_file", "name", "interval"))
    _requires_connection = True

    def _module(self, name: str, args: dict, task_vars: dict) -> dict:
        result = self._execute_module(module_name=name, module_args=args, task_vars=task_vars)
        if result.get("failed"):
            raise AnsibleActionFail(f"{name}: {result.get('msg', result)}")
        return result

    def _blobs(self, storage: str, task_vars: dict) -> dict:
        found = self._execute_module(
            module_name="ansible.builtin.find",
            module_args={"paths": [os.path.join(storage, "blobs")], "hidden": True, "file_type": "file"},
            task_vars=task_vars,
        )
        return {os.path.basename(item["path"]): item["size"] for item in found.get("files", [])}

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        for required in ("model", "commit", "files", "cache_dir", "image"):
            if not args.get(required):
                raise AnsibleActionFail(f"hf_model_fetch needs {required}")
        model, commit, files = args["model"], args["commit"], list(args["files"])
        endpoint = str(args.get("endpoint") or _hub.DEFAULT_ENDPOINT).rstrip("/")
        name = args.get("name") or "gpubox-model-fetch"
        interval = float(args.get("interval", 30))
        storage = os.path.join(args["cache_dir"], "hub", _hub.repo_folder(model))
        total = sum(int(item["size"]) for item in files)
        before = _hub.cache_state(files, self._blobs(storage, task_vars), set())
        result.update(changed=True, model=model, commit=commit, snapshot=os.path.join(storage, "snapshots", commit))
        if self._task.check_mode:
            result["msg"] = f"would download {_hub.human_bytes(before['missing_bytes'])} of {model}"
            return result
        container = {
            "name": name,
            "image": args["image"],
            "entrypoint": ["python3", "-c", FETCH],
            "command": [model, commit, json.dumps([item["path"] for item in files])],
            "env": {
                "HF_ENDPOINT": endpoint,
                "HF_HUB_OFFLINE": "0",
                "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                "HF_HUB_DISABLE_TELEMETRY": "1",
            },
            "volumes": [f"{args['cache_dir']}:/root/.cache/huggingface"],
            "network_mode": "host",
            "detach": True,
            "state": "started",
            "restart_policy": "no",
        }
        if args.get("env_file"):
            container["env_file"] = args["env_file"]
        display.display(
            f"{model}: downloading {len(files)} files, {_hub.human_bytes(before['missing_bytes'])} to go, from {endpoint}",
            stderr=True,
        )
        started = time.monotonic()
        # A container of that name left by an interrupted run is removed, never restarted with its old exit code.
        self._module("community.docker.docker_container", {"name": name, "state": "absent"}, task_vars)
        self._module("community.docker.docker_container", container, task_vars)
        next_line = started + interval
        try:
            while True:
                info = self._module("community.docker.docker_container_info", {"name": name}, task_vars)["container"]
                missing = None if info else _hub.cache_state(files, self._blobs(storage, task_vars), set())["missing_bytes"]
                outcome = _hub.fetch_outcome(info, missing)
                if not outcome["running"]:
                    break
                # The container is asked every 2 s at most; a line is due every interval, whatever the calls cost.
                time.sleep(max(0.0, min(next_line - time.monotonic(), 2.0)))
                if time.monotonic() < next_line:
                    continue
                next_line += interval
                done = _hub.cache_state(files, self._blobs(storage, task_vars), set())["done_bytes"]
                line = _hub.progress(total, done, before["done_bytes"], time.monotonic() - started)
                display.display(say("hub.progress", model=model, **line), stderr=True)
            if outcome.get("finding") == "hub.fetch_vanished":
                raise AnsibleActionFail(
                    say(
                        "hub.fetch_vanished",
                        model=model,
                        commit=commit,
                        endpoint=endpoint,
                        name=name,
                        missing=_hub.human_bytes(missing),
                    )
                )
            if not outcome["ok"]:
                rc = outcome["rc"]
                logs = self._execute_module(
                    module_name="ansible.builtin.command",
                    module_args={"argv": ["docker", "logs", "--tail", "20", name]},
                    task_vars=task_vars,
                )
                tail = (logs.get("stdout", "") + "\n" + logs.get("stderr", "")).strip().splitlines()[-20:]
                raise AnsibleActionFail(say("hub.fetch_failed", model=model, commit=commit, endpoint=endpoint, rc=rc, log=tail))
        finally:
            self._execute_module(
                module_name="community.docker.docker_container",
                module_args={"name": name, "state": "absent"},
                task_vars=task_vars,
            )
        after = _hub.cache_state(files, self._blobs(storage, task_vars), set())
        elapsed = time.monotonic() - started
        result.update(
            downloaded_bytes=max(after["done_bytes"] - before["done_bytes"], 0),
            total_bytes=total,
            elapsed_s=round(elapsed, 1),
            **_hub.progress(total, after["done_bytes"], before["done_bytes"], elapsed),
        )
        display.display(
            say("hub.progress", model=model, **_hub.progress(total, after["done_bytes"], before["done_bytes"], elapsed)),
            stderr=True,
        )
        return result
