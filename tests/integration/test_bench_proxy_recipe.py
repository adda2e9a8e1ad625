"""scripts/bench_proxy.py's recipe configuration (the blog setup it measures against), checked by this machine's Nginx."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess

from conftest import ROOT

spec = importlib.util.spec_from_file_location("bench_proxy", ROOT / "scripts" / "bench_proxy.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_the_recipe_config_is_one_nginx_accepts(tmp_path):
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    conf = bench.recipe_conf(tmp_path, "127.0.0.1:9", 18399)
    text = conf.read_text()
    assert "@" not in text  # every placeholder filled in
    for setting in ("worker_processes auto;", "keepalive 32;", "proxy_buffering off;", 'proxy_set_header Connection "";'):
        assert setting in text
    checked = subprocess.run([nginx, "-t", "-c", str(conf)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr
