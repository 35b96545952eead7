# Sourced by the bench scripts that run one server at a time on 127.0.0.1:$PORT with its data under $DIR
# (both set by the caller): `stop` ends the server started as $PID and removes $DIR (also on exit),
# `wait_port` waits until something listens on $PORT; `require_free_port` (before starting) refuses a port
# that another process already serves, which would otherwise be measured in the server's place.
PID=
stop() {
  if [[ -n "$PID" ]]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; PID=; fi
  rm -rf "$DIR"
}
trap stop EXIT
# A server that exited (its port taken by another process, say) is an error, never measured in its place.
wait_port() {
  for _ in $(seq 1 300); do
    kill -0 "$PID" 2>/dev/null || { echo "the server exited (is port $PORT taken?)" >&2; exit 1; }
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && return 0
    sleep 0.2
  done
  echo "nothing listens on $PORT" >&2; exit 1
}
require_free_port() {
  if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
    echo "port $PORT is already served by another process; stop it first" >&2; exit 1
  fi
}
