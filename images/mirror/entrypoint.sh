#!/usr/bin/env bash
# Spark on Kubernetes starts the image with `driver ...` or `executor ...`: those go to Spark's own entrypoint.
# Anything else is a mirror command: run, validate, describe (see `mirrorkit --help`; this runs the same CLI as
# `python -m spark_app`).
set -euo pipefail
case "${1:-}" in
  driver | executor | driver-py)
    exec "${SPARK_ENTRYPOINT:-/opt/entrypoint.sh}" "$@"
    ;;
esac
exec "${MIRRORKIT_PYTHON:-python3}" -m spark_app "$@"
