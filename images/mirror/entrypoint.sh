#!/usr/bin/env bash
# The mirror image's entrypoint, under tini (PID 1: it hands the pod's signals to the process this script becomes, and
# reaps orphaned processes).
#
# Spark on Kubernetes starts its pods on this image with arguments of its own, and says the rest in the environment
# (its Kubernetes backend: BasicDriverFeatureStep, BasicExecutorFeatureStep):
# - the driver pod: `driver <spark-submit's arguments>` (--properties-file under SPARK_CONF_DIR, --class, the main
#   file, the mirror's arguments), with SPARK_DRIVER_BIND_ADDRESS set to the pod's IP. It becomes spark-submit in
#   client mode; exec'd, so the pod's SIGTERM reaches spark-submit's JVM, and the mirror takes that signal over to stop
#   between batches and exit 0 (spark_app/mirror.py, Mirror.stop_on_sigterm).
# - each executor pod: `executor`, with SPARK_DRIVER_URL, SPARK_EXECUTOR_ID, SPARK_EXECUTOR_CORES,
#   SPARK_EXECUTOR_MEMORY, SPARK_APPLICATION_ID, SPARK_RESOURCE_PROFILE_ID, SPARK_EXECUTOR_POD_IP,
#   SPARK_EXECUTOR_POD_NAME, the JVM's options one per SPARK_JAVA_OPT_<n> (in order of n), SPARK_CLASSPATH
#   (spark.executor.extraClassPath) and SPARK_CONF_DIR. It becomes the executor's JVM, running Spark's Kubernetes
#   executor backend.
# Anything else is a mirror command: run, validate, describe... (see `mirrorkit --help`; the same CLI as
# `python -m spark_app`).
#
# Nothing here writes a file: the image runs with a read-only root file system.
set -euo pipefail

spark_home=${SPARK_HOME:-/opt/spark}

# Fails, naming what is missing, unless every variable named after the role is set and not empty.
require() {
  local role=$1 name
  shift
  for name in "$@"; do
    if [ -z "${!name:-}" ]; then
      echo "entrypoint.sh: '$role' needs $name, which Spark's Kubernetes backend sets on the $role pod" >&2
      exit 64
    fi
  done
}

# The executor JVM's class path, in the order Spark's launcher builds the driver's: extra class path, conf dir, Spark's
# jars, Hadoop's conf dir, then what is added after them.
executor_class_path() {
  local parts=() part joined=""
  parts+=("${SPARK_CLASSPATH:-}" "${SPARK_CONF_DIR:-$spark_home/conf}" "$spark_home/jars/*")
  parts+=("${HADOOP_CONF_DIR:-}" "${SPARK_EXTRA_CLASSPATH:-}" "${SPARK_DIST_CLASSPATH:-}")
  for part in "${parts[@]}"; do
    [ -n "$part" ] && joined=${joined:+$joined:}$part
  done
  printf '%s' "$joined"
}

case "${1:-}" in
  driver)
    shift
    require driver SPARK_DRIVER_BIND_ADDRESS
    export SPARK_HOME=$spark_home
    exec "$spark_home/bin/spark-submit" --conf "spark.driver.bindAddress=$SPARK_DRIVER_BIND_ADDRESS" \
      --deploy-mode client "$@"
    ;;
  executor)
    shift
    require executor SPARK_DRIVER_URL SPARK_EXECUTOR_ID SPARK_EXECUTOR_CORES SPARK_EXECUTOR_MEMORY \
      SPARK_APPLICATION_ID SPARK_EXECUTOR_POD_IP SPARK_RESOURCE_PROFILE_ID SPARK_EXECUTOR_POD_NAME
    export SPARK_HOME=$spark_home
    # SPARK_JAVA_OPT_0, _1, ... _10 in numeric order, each one argument whatever it holds.
    options=()
    while read -r index; do
      name=SPARK_JAVA_OPT_$index
      options+=("${!name}")
    done < <(compgen -e | sed -n 's/^SPARK_JAVA_OPT_\([0-9][0-9]*\)$/\1/p' | sort -n)
    # The heap's bounds come before the options, so that the mirror's own -Xms (spark_app.config.SPARK_JVM_OPTIONS,
    # in spark.executor.extraJavaOptions) decides where the heap starts; -Xmx is Spark's alone (it refuses one in
    # the options).
    exec "${JAVA_HOME:+$JAVA_HOME/bin/}java" "-Xms$SPARK_EXECUTOR_MEMORY" "-Xmx$SPARK_EXECUTOR_MEMORY" \
      "${options[@]}" -cp "$(executor_class_path)" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID" --cores "$SPARK_EXECUTOR_CORES" \
      --app-id "$SPARK_APPLICATION_ID" --hostname "$SPARK_EXECUTOR_POD_IP" \
      --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" --podName "$SPARK_EXECUTOR_POD_NAME" "$@"
    ;;
esac
exec "${MIRRORKIT_PYTHON:-python3}" -m spark_app "$@"
