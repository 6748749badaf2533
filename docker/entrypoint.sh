#!/bin/sh
# docker/entrypoint.sh: the container's entry point. With no arguments or with flags it execs
# attnd, so that the daemon is PID 1 and receives the SIGTERM of `docker stop` itself (it drains
# in-flight work and exits 0); any other command (e.g. `sh`) is run instead, for debugging.
# Configuration normally comes from ATTND_* environment variables, read by attnd itself.
set -eu
if [ "$#" -eq 0 ] || [ "${1#-}" != "$1" ]; then
    exec /usr/local/bin/attnd "$@"
fi
exec "$@"
