#!/usr/bin/env bash
# The phases of `make test`, timed: each one's wall time and status, and a table of them at the end (or where one
# fails), so that whoever adds a test sees what it costs. The times go to .make-test-phases in the checkout.
# Usage: phases.sh reset              forget the last run's phases
#        phases.sh run NAME CMD...    run CMD as phase NAME; on failure print the table and exit with CMD's status
#        phases.sh table              print the table
set -uo pipefail

file="$(cd "$(dirname "$0")/.." && pwd)/.make-test-phases"

table() {
  local total=0 name seconds status
  printf '\nmake test, phase by phase:\n%-12s %9s  %s\n' phase time status
  while read -r name seconds status; do
    printf '%-12s %6d:%02d  %s\n' "$name" $((seconds / 60)) $((seconds % 60)) "$status"
    total=$((total + seconds))
  done <"$file"
  printf '%-12s %6d:%02d\n' total $((total / 60)) $((total % 60))
}

case "${1:-}" in
  reset) : >"$file" ;;
  table) table ;;
  run)
    name=${2:?usage: phases.sh run NAME CMD...}
    shift 2
    start=$(date +%s)
    "$@"
    rc=$?
    echo "$name $(($(date +%s) - start)) $([ "$rc" -eq 0 ] && echo passed || echo "FAILED (rc $rc)")" >>"$file"
    if [ "$rc" -ne 0 ]; then
      table
      exit "$rc"
    fi
    ;;
  *) echo "usage: phases.sh reset | run NAME CMD... | table" >&2; exit 2 ;;
esac
