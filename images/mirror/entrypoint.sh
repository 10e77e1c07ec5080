#!/usr/bin/env bash
# Spark on Kubernetes starts the image with `driver ...` or `executor ...`: those go to Spark's own entrypoint.
# Anything else is a mirror command: run, validate, describe (see `mirrorkit --help`; this runs the same CLI as
# `python -m spark_app`).
# No signal is trapped here: Spark's entrypoint runs spark-submit under tini, which hands the pod's SIGTERM to
# spark-submit's JVM, and the mirror takes that signal over to stop between batches and exit 0 (spark_app/mirror.py,
# Mirror.stop_on_sigterm; tests/test_mirror_sigterm.py runs it this way).
set -euo pipefail
case "${1:-}" in
  driver | executor | driver-py)
    exec "${SPARK_ENTRYPOINT:-/opt/entrypoint.sh}" "$@"
    ;;
esac
exec "${MIRRORKIT_PYTHON:-python3}" -m spark_app "$@"
