#!/bin/bash
# PostgreSQL and Redis for the scaling runs on the device machine, which has neither (issue 19: the fan-out timed on
# the production stack, not only on the embedded SQLite one).
#
#   bash bench/stack_services.sh pack     # here: fills .stack/ (git-ignored) with PostgreSQL 16's relocatable build
#                                         # from the pgserver wheel and this machine's redis-server with its libraries
#   source bench/stack_services.sh start  # there (carry .stack): starts both and exports DATABASE_URL and REDIS_URL
#
# PostgreSQL refuses to run as root: the device's commands run as root, so the server runs as user nobody.
set -o pipefail
STACK_DIR=${STACK_DIR:-$PWD/.stack}
PG_PORT=${PG_PORT:-5432}
REDIS_PORT=${REDIS_PORT:-6379}

pack() {
  rm -rf "$STACK_DIR" && mkdir -p "$STACK_DIR/redis/lib" "$STACK_DIR/wheel"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 -d "$STACK_DIR/wheel" pgserver==0.1.4 || return 1
  # The wheel's layout is kept: its programs find libpq at $ORIGIN/../../../pgserver.libs.
  (cd "$STACK_DIR" && python3 -m zipfile -e wheel/pgserver-*.whl unpacked && mkdir -p pgserver/pginstall && \
    mv unpacked/pgserver/pginstall/{bin,lib,share} pgserver/pginstall/ && mv unpacked/pgserver.libs . && \
    rm -rf unpacked wheel) || return 1
  # Only what a server needs: the client tools and headers stay behind (the carry has a 64 MiB limit).
  (cd "$STACK_DIR/pgserver/pginstall/bin" && ls | grep -v -x -e postgres -e initdb -e pg_ctl -e pg_isready -e createdb -e psql | xargs rm -f)
  chmod -R a+rX "$STACK_DIR" && chmod a+x "$STACK_DIR"/pgserver/pginstall/bin/*  # zipfile keeps no modes
  local redis
  redis=$(readlink -f "$(command -v redis-server)") || return 1
  cp "$redis" "$STACK_DIR/redis/redis-server"
  ldd "$redis" | awk '/=>/ {print $3}' | grep -v -E '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
    xargs -I{} cp -L {} "$STACK_DIR/redis/lib/"
  du -sh "$STACK_DIR"
}

start() {
  local data=/tmp/stack-pgdata bin="$STACK_DIR/pgserver/pginstall/bin"
  export DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:$PG_PORT/gpuest REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0
  # A machine kept warm since an earlier call may run both already: they are emptied, not started again.
  if python3 -c "import redis, sys; redis.Redis(port=int(sys.argv[1])).flushall()" "$REDIS_PORT" 2>/dev/null; then
    echo "Redis on port $REDIS_PORT was running: emptied"
  else
    LD_LIBRARY_PATH="$STACK_DIR/redis/lib" "$STACK_DIR/redis/redis-server" --port "$REDIS_PORT" --bind 127.0.0.1 \
      --daemonize yes --save '' --appendonly no --logfile /tmp/stack-redis.log || return 1
  fi
  if "$bin/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT"; then
    echo "PostgreSQL on port $PG_PORT was running: database gpuest made anew"
    as_nobody "$bin/psql" -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "DROP DATABASE IF EXISTS gpuest" postgres ||
      return 1
  else
    rm -rf "$data" && mkdir -p "$data" && chown nobody "$data"
    as_nobody "$bin/initdb" -D "$data" -U postgres --auth=trust -E UTF8 >/tmp/stack-initdb.log 2>&1 ||
      { tail -5 /tmp/stack-initdb.log; return 1; }
    as_nobody "$bin/pg_ctl" -D "$data" -l /tmp/stack-postgres.log -w \
      -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k /tmp -c max_connections=200 -c fsync=off" start >/dev/null ||
      { tail -5 /tmp/stack-postgres.log; return 1; }
  fi
  as_nobody "$bin/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres gpuest || return 1
  echo "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') and Redis" \
    "$(LD_LIBRARY_PATH="$STACK_DIR/redis/lib" "$STACK_DIR/redis/redis-server" --version | awk '{print $3}') up:" \
    "DATABASE_URL=$DATABASE_URL REDIS_URL=$REDIS_URL"
}

as_nobody() {
  python3 -c 'import os, sys; os.setgid(65534); os.setgroups([]); os.setuid(65534); os.execv(sys.argv[1], sys.argv[1:])' "$@"
}

case ${1:-} in
  pack) pack ;;
  start) start ;;
  *) echo "usage: bash bench/stack_services.sh pack | source bench/stack_services.sh start" >&2 ;;
esac
