# Sourced by the set-up scripts: runs one long step with its output in a log file and a
# line on stderr when it starts, every 20 s while it runs (with the newest progress marker
# the log shows, such as ninja's [n/N]), and when it ends, with its time. On failure the
# log's last lines and its path are printed and the step's exit code is returned.
#
#   kwk_step "building llama.cpp tools" "$LOG" cmake --build ...

kwk_step() {
  local label="$1" log="$2"
  shift 2
  local start now marker rc pid
  start=$(date +%s)
  mkdir -p "$(dirname "$log")"
  echo "[kwk set-up] $label (log: $log)" >&2
  "$@" >"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    # Sleep in short slices so a quick step ends quickly.
    for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
      kill -0 "$pid" 2>/dev/null || break
      sleep 1
    done
    kill -0 "$pid" 2>/dev/null || break
    now=$(date +%s)
    marker="$(grep -o '^\[[0-9]*/[0-9]*\]' "$log" 2>/dev/null | tail -n 1 || true)"
    echo "[kwk set-up]   ... $label: $((now - start)) s${marker:+, $marker}" >&2
  done
  rc=0
  wait "$pid" || rc=$?
  now=$(date +%s)
  if [ "$rc" -ne 0 ]; then
    tail -n 20 "$log" >&2
    echo "[kwk set-up] FAILED: $label after $((now - start)) s (exit $rc; full log: $log)" >&2
    return "$rc"
  fi
  echo "[kwk set-up] done: $label in $((now - start)) s" >&2
}
