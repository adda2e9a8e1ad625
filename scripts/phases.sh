#!/usr/bin/env bash
# The phases of `make test`, timed: each one's wall time and status, and a table of them at the end (or where one
# fails), so that whoever adds a test sees what it costs. The times go to .make-test-phases in the checkout.
# Usage: phases.sh reset              forget the last run's phases; the run's wall clock starts
#        phases.sh run NAME CMD...    run CMD as phase NAME; on failure print the table and exit with CMD's status
#        phases.sh start NAME CMD...  run CMD as phase NAME in the background, beside the next phases (its output
#                                     goes to .make-test-phases.NAME.log, shown when it is awaited)
#        phases.sh wait NAME          wait for a phase started in the background; show its output; fail as run does
#        phases.sh table              print the table
set -uo pipefail

file="$(cd "$(dirname "$0")/.." && pwd)/.make-test-phases"

table() {
  local name seconds status
  printf '\nmake test, phase by phase:\n%-15s %9s  %s\n' phase time status
  while read -r name seconds status; do
    printf '%-15s %6d:%02d  %s\n' "$name" $((seconds / 60)) $((seconds % 60)) "$status"
  done <"$file"
  # The run's own wall time: phases started in the background overlap the ones after them.
  if [ -f "$file.start" ]; then
    seconds=$(($(date +%s) - $(cat "$file.start")))
    printf '%-15s %6d:%02d  (wall clock; a phase marked "beside" ran alongside the ones after it)\n' total \
      $((seconds / 60)) $((seconds % 60))
  fi
}

# A failed phase ends the run: phases still running in the background are stopped with it.
stop_background() {
  local pidfile
  for pidfile in "$file".*.pid; do
    [ -f "$pidfile" ] || continue
    kill -- -"$(cat "$pidfile")" 2>/dev/null
    rm -f "$pidfile"
  done
}

# One phase's line in the table (NAME SECONDS RC [beside]); a failed phase ends the run with its status.
record() {
  local status="passed${4:+ ($4)}"
  [ "$3" -eq 0 ] || status="FAILED (rc $3${4:+, $4})"
  echo "$1 $2 $status" >>"$file"
  if [ "$3" -ne 0 ]; then
    stop_background
    table
    exit "$3"
  fi
}

case "${1:-}" in
  reset)
    stop_background
    : >"$file"
    rm -f "$file".*.log "$file".*.done
    date +%s >"$file.start"
    ;;
  table) table ;;
  run)
    name=${2:?usage: phases.sh run NAME CMD...}
    shift 2
    start=$(date +%s)
    "$@"
    rc=$?
    record "$name" $(($(date +%s) - start)) "$rc"
    ;;
  start)
    name=${2:?usage: phases.sh start NAME CMD...}
    shift 2
    echo "[phases] $name runs beside the next phases; its output: $file.$name.log"
    # A session of its own, so that a failed phase can stop it with everything it started. The script in single
    # quotes is expanded by the inner bash, from its own arguments.
    # shellcheck disable=SC2016
    setsid bash -c 'start=$(date +%s); "${@:3}" >"$1.$2.log" 2>&1; rc=$?
      echo "$2 $(($(date +%s) - start)) $rc" >"$1.$2.done"' phases "$file" "$name" "$@" </dev/null &
    echo $! >"$file.$name.pid"
    ;;
  wait)
    name=${2:?usage: phases.sh wait NAME}
    pid=$(cat "$file.$name.pid" 2>/dev/null || true)
    echo "[phases] waiting for $name"
    # Until it says it is done, or is gone (reaped, or a zombie nobody reaps: not this shell's child).
    while [ ! -f "$file.$name.done" ]; do
      case "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || echo gone)" in gone | Z) break ;; esac
      sleep 2
    done
    rm -f "$file.$name.pid"
    cat "$file.$name.log" 2>/dev/null
    read -r _name seconds rc <"$file.$name.done" 2>/dev/null || { seconds=0 rc=1; }
    record "$name" "$seconds" "$rc" beside
    ;;
  *) echo "usage: phases.sh reset | run NAME CMD... | start NAME CMD... | wait NAME | table" >&2; exit 2 ;;
esac
