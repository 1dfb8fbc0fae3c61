#!/usr/bin/env bash
# The stack of deploy/compose.yaml without containers: the demo forum, memcached as L1 and
# `crawlergate serve` in front, all on loopback. Ctrl-C stops them all.
#
#   deploy/run-local.sh            run until Ctrl-C (the gate on http://127.0.0.1:8080)
#   deploy/run-local.sh --check    start, check crawler hits, a person's pass-through and the figures, stop
#                                  (what CI runs: tests/test_deploy_local.py)
#
# Ports and folders: FORUM_PORT (8000), MEMCACHED_PORT (11211), GATE_PORT (8080), STATE_DIR (a new
# temporary folder). CRAWLERGATE (the command, default: crawlergate on PATH, else .venv/bin/crawlergate).
set -euo pipefail
cd "$(dirname "$0")/.."

FORUM_PORT=${FORUM_PORT:-8000}
MEMCACHED_PORT=${MEMCACHED_PORT:-11211}
GATE_PORT=${GATE_PORT:-8080}
made_state_dir=false
if [ -z "${STATE_DIR:-}" ]; then
  STATE_DIR=$(mktemp -d -t crawlergate-local-XXXXXX)
  made_state_dir=true
fi
CRAWLERGATE=${CRAWLERGATE:-$(command -v crawlergate || echo .venv/bin/crawlergate)}
PYTHON=${PYTHON:-$(dirname "$CRAWLERGATE")/python}
[ -x "$PYTHON" ] || PYTHON=python3
check=false
[ "${1:-}" = "--check" ] && check=true

command -v memcached >/dev/null || { echo "run-local: memcached is needed (apt-get install memcached)" >&2; exit 2; }
[ -x "$CRAWLERGATE" ] || { echo "run-local: $CRAWLERGATE not found: install crawlergate first (see README)" >&2; exit 2; }

pids=()
stop() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if $check && $made_state_dir; then rm -rf "$STATE_DIR"; fi
}
trap stop EXIT

wait_for() {  # URL or host:port, seconds
  local target=$1 deadline=$((SECONDS + $2))
  until "$PYTHON" - "$target" <<'PY' 2>/dev/null
import socket, sys, urllib.request
target = sys.argv[1]
if target.startswith("http"):
    urllib.request.urlopen(target, timeout=1).read()
else:
    host, port = target.rsplit(":", 1)
    socket.create_connection((host, int(port)), timeout=1).close()
PY
  do
    [ "$SECONDS" -lt "$deadline" ] || { echo "run-local: $target did not come up" >&2; exit 1; }
    sleep 0.2
  done
}

memcached -l 127.0.0.1 -p "$MEMCACHED_PORT" -m 64 -U 0 -u "$(id -un)" &
pids+=($!)
"$CRAWLERGATE" demo forum --host 127.0.0.1 --port "$FORUM_PORT" --threads 300 --work-ms 5 --db "$STATE_DIR/forum.sqlite3" &
pids+=($!)
wait_for "127.0.0.1:$MEMCACHED_PORT" 10
wait_for "http://127.0.0.1:$FORUM_PORT/" 120
"$CRAWLERGATE" serve --origin "http://127.0.0.1:$FORUM_PORT" --port "$GATE_PORT" --workers 2 \
  --memcached "127.0.0.1:$MEMCACHED_PORT" --cache-dir "$STATE_DIR/l2" &
pids+=($!)
wait_for "http://127.0.0.1:$GATE_PORT/_crawlergate/healthz" 60
echo "run-local: the gate is on http://127.0.0.1:$GATE_PORT (dashboard: /_crawlergate/), state in $STATE_DIR"

if ! $check; then
  wait
  exit 0
fi

"$PYTHON" - "http://127.0.0.1:$GATE_PORT" <<'PY'
import json, sys, time, urllib.request
gate = sys.argv[1]
googlebot = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
firefox = "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0"

# What a browser sends on a page load: without it a person's user agent alone makes a suspect (rules/evidence.toml).
navigation = {"Accept": "text/html,*/*;q=0.8", "Accept-Language": "en", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}

def get(path, agent):
    headers = {"User-Agent": agent, "Accept-Encoding": "gzip", **(navigation if agent == firefox else {})}
    request = urllib.request.Request(gate + path, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.status, answer.headers["X-Crawlergate"]

outcomes = [get("/showthread.php?t=7", googlebot)[1] for _ in range(3)]
assert outcomes[0] == "miss" and set(outcomes[1:]) <= {"l1-hit", "l2-hit"}, outcomes
assert get("/showthread.php?t=7", firefox) == (200, "pass")
# The second worker may still be starting (healthz answered from the first): its count is waited for.
for _ in range(150):
    stats = json.load(urllib.request.urlopen(gate + "/_crawlergate/stats", timeout=10))
    if stats["processes"] == 2:
        break
    time.sleep(0.2)
assert stats["crawler"]["requests"] == 3 and stats["human"]["requests"] == 1, stats
assert stats["l1"]["backend"] == "MemcachedStore" and stats["processes"] == 2, stats
print("run-local: check passed:", outcomes, "and a person's pass")
PY
