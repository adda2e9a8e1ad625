#!/usr/bin/env bash
# Run the collection's hardware modules on this host, as root, against its real GPUs, and keep
# what they read: the raw outputs (nvidia-smi, lspci, /proc and /sys) and each module's JSON.
# A check of the GPU code paths on real hardware, and a way to capture a box for a bug report.
#
#   scripts/gpu-host-check.sh OUTDIR
#
# Needs ansible-core importable by python3 (or ANSIBLE_BIN naming an `ansible` command).
# CHECK_PAIR_MIB: the copy sizes of the device-local pair run, in MiB (default "64 1024").
# Writes OUTDIR/check.log (what ran, module results in short) and OUTDIR/captures.tar.gz.
# Exit status 0 when every module ran without failing, else 1.
set -uo pipefail

out=${1:?usage: scripts/gpu-host-check.sh OUTDIR}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out/captures"
out=$(cd "$out" && pwd)
log=$out/check.log
: >"$log"
say() { echo "$*" | tee -a "$log"; }

# The collection under an ansible_collections tree of its own, so nothing in the checkout changes.
collections=$(mktemp -d)
mkdir -p "$collections/ansible_collections/gpubox"
ln -s "$root" "$collections/ansible_collections/gpubox/inference"
export ANSIBLE_COLLECTIONS_PATH=$collections ANSIBLE_ROLES_PATH=$root/roles ANSIBLE_NOCOLOR=1
export ANSIBLE_LOCALHOST_WARNING=0 ANSIBLE_INVENTORY_UNPARSED_WARNING=0 ANSIBLE_STDOUT_CALLBACK=default
export ANSIBLE_LOAD_CALLBACK_PLUGINS=1 ANSIBLE_CALLBACK_RESULT_FORMAT=json
unset ANSIBLE_CONFIG
cd "$collections" || exit 1 # no ansible.cfg here: the checkout's would name callbacks this host may not have
ansible=${ANSIBLE_BIN:-ansible}
python=$(command -v python3)

capture() { # name command...: the command's output and exit status, as a fixture would hold it
    local name=$1
    shift
    { "$@"; } >"$out/captures/$name.txt" 2>&1
    say "capture $name: rc=$? ($(wc -l <"$out/captures/$name.txt") lines) <- $*"
}

capture nvidia-smi nvidia-smi
capture nvidia-smi-q nvidia-smi -q
capture nvidia-smi-q-pcie nvidia-smi -q -d PCIE
capture topo-m nvidia-smi topo -m
for kind in r w n; do capture "topo-p2p-$kind" nvidia-smi topo -p2p "$kind"; done
capture lspci-vvv lspci -vvv
capture lspci-tv lspci -tv
capture cmdline cat /proc/cmdline
capture cpuinfo-head head -n 30 /proc/cpuinfo
pci_links() { # each PCI device: vendor, class, current and max link, and where it sits in the tree
    local d
    for d in /sys/bus/pci/devices/*; do
        echo "${d##*/} $(cat "$d/vendor" "$d/class" | tr '\n' ' ')$(cat "$d/current_link_speed" 2>/dev/null)" \
            "x$(cat "$d/current_link_width" 2>/dev/null) max $(cat "$d/max_link_speed" 2>/dev/null)" \
            "x$(cat "$d/max_link_width" 2>/dev/null) $(readlink -f "$d")"
    done
}
pci_links >"$out/captures/sys-pci-links.txt" 2>&1
say "capture sys-pci-links: $(wc -l <"$out/captures/sys-pci-links.txt") devices <- /sys/bus/pci/devices/*"
capture sys-pci-devices ls -l /sys/bus/pci/devices/
pci_config() { # each device's configuration space as lspci -xxxx prints it, so `lspci -F` reads it anywhere
    local d
    for d in /sys/bus/pci/devices/*; do
        echo "${d##*/} class $(cat "$d/class")"
        od -An -tx1 -v -w16 "$d/config" | awk '{ printf "%02x:%s\n", (NR - 1) * 16, $0 }'
        echo
    done
}
pci_config >"$out/captures/sys-pci-config.txt" 2>&1
say "capture sys-pci-config: $(grep -c ' class ' "$out/captures/sys-pci-config.txt") devices <- /sys/bus/pci/devices/*/config"
capture iommu-groups ls /sys/kernel/iommu_groups/

failed=0
module() { # name args: run one module through Ansible on this host, keep its JSON
    local name=$1 args=$2 started rc
    started=$(date +%s.%N)
    "$ansible" localhost -c local -i localhost, -e "ansible_python_interpreter=$python" \
        -m "gpubox.inference.$name" -a "$args" >"$out/captures/module-$name.json" 2>&1
    rc=$?
    say "module $name: rc=$rc in $(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $started }") s"
    [ $rc -eq 0 ] || failed=1
    "$python" - "$out/captures/module-$name.json" <<'EOF' | tee -a "$log"
import json, sys
text = open(sys.argv[1]).read()
try:
    result = json.loads(text[text.index("{"): text.rindex("}") + 1])
except ValueError:
    print("  (no JSON)\n" + text[-2000:])
    raise SystemExit
facts = result.get("ansible_facts") or result
print("  " + json.dumps(facts, sort_keys=True)[:6000])
EOF
}

module gpu_facts "fingerprint_path=$out/captures/no-record.fact"
module gpu_topology_info ""
module pcie_platform_info ""
module iommu_acs_info ""
module gpu_p2p_facts "cache_path=$out/captures/p2p.fact fingerprint=check force=true timeout=60"
module gpu_p2p_facts "cache_path=$out/captures/p2p.fact fingerprint=check timeout=60"

# The P2P measuring code on a device-local "pair" (GPU0 to itself): every driver call of a pair's
# measurement and check, against the real driver, on a machine with one GPU.
say "measure_pair GPU0 -> GPU0 (device-local copies through the pair code):"
PYTHONPATH=$collections "$python" - "${CHECK_PAIR_MIB:-64 1024}" <<'EOF' 2>&1 | tee -a "$log"
import json
import sys
from ansible_collections.gpubox.inference.plugins.module_utils._cuda_p2p import default_settings, library_path, measure
for mib in map(int, sys.argv[1].split()):
    settings = {**default_settings(), "bandwidth_bytes": mib * 1024 * 1024}
    result = measure(library_path(None), settings, 60, pairs=[(0, 0)])
    pair = result["pairs"].get((0, 0))
    print(f"  {mib} MiB: error={result['error']} host={json.dumps(result['host'].get(0))}")
    print(f"  {mib} MiB: pair={json.dumps(pair)}")
EOF

say "preflight role on this host:"
cat >"$out/captures/preflight.yml" <<EOF
- name: Preflight on this host
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    ansible_python_interpreter: $python
    preflight_report_dir: $out/captures/preflight-reports
  roles:
    - preflight
EOF
"$ansible-playbook" -i localhost, "$out/captures/preflight.yml" >"$out/captures/preflight.log" 2>&1
rc=$?
say "preflight: rc=$rc"
[ $rc -eq 0 ] || failed=1
grep -E "msg|report|verdict" "$out/captures/preflight.log" | head -n 40 | tee -a "$log"

tar -C "$out" -czf "$out/captures.tar.gz" captures && rm -rf "$out/captures"
rm -rf "$collections"
say "done: failed=$failed"
exit $failed
