"""`python -m spark_app run|validate|describe --config FILE`: the entry point of the mirror image."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys

from .config import ConfigError, MirrorConfig, load_config
from .policy import target_topic
from .profiles import SecretError, java_settings, redacted

log = logging.getLogger("spark_app")
PREFLIGHT_TIMEOUT_S = 20.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_app", description="The mirrorkit Kafka mirror.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("run", "run the mirror"),
        ("validate", "check a config and exit"),
        ("describe", "show the resolved flows and the topics they match now, without secrets"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--config", required=True, help="the mirror config (YAML or JSON)")
    run = sub.choices["run"]
    run.add_argument("--available-now", action="store_true", help="mirror everything present, then exit 0")
    run.add_argument("--master", default=None, help="Spark master, e.g. local[2] (spark-submit sets it in the image)")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
        if args.command == "validate":
            print(f"{args.config}: valid ({len(config.clusters)} clusters, {len(config.flows)} flows)")
            return 0
        if args.command == "describe":
            print(json.dumps(describe(config), indent=2))
            return 0
        return run_mirror(config, args.available_now, args.master)
    except (ConfigError, SecretError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - the last line of defence prints one clear line, not a JVM stack
        from .stream import MirrorFailed
        from .topics import ClusterUnreachable, StateError

        if isinstance(err, MirrorFailed | ClusterUnreachable | StateError):
            print(f"error: {err}", file=sys.stderr)
            return 1
        raise


def describe(config: MirrorConfig) -> dict:
    """Flows, clusters (redacted) and the topics each flow matches on its source right now."""
    from .topics import TopicSync

    out: dict = {"clusters": {}, "flows": []}
    for c in config.clusters:
        out["clusters"][c.alias] = {"profile": c.profile.value, "settings": redacted(java_settings(c, "consumer"))}
    for flow in config.flows:
        sync = TopicSync(flow, config.cluster(flow.source), config.cluster(flow.target))
        out["flows"].append(
            {
                "flow": flow.name,
                "replication_policy": flow.replication_policy,
                "topics": {t: target_topic(flow, t) for t in sorted(sync.source_topics())},
            }
        )
    return out


def run_mirror(config: MirrorConfig, available_now: bool, master: str | None) -> int:
    from .stream import Mirror, build_session
    from .topics import check_reachable

    for flow in config.flows:
        src, dst = config.cluster(flow.source), config.cluster(flow.target)
        log.info(
            "flow %s: %s (%s) -> %s (%s), policy %s, topics include %s exclude %s",
            flow.name, src.alias, src.profile.value, dst.alias, dst.profile.value,
            flow.replication_policy, flow.topics.include, flow.topics.exclude,
        )  # fmt: skip
    check_reachable(config.clusters, PREFLIGHT_TIMEOUT_S)  # before Spark: a wrong address or password fails fast
    spark = build_session(master)
    mirror = Mirror(spark, config)
    if available_now:
        mirror.run_available_now()
    else:
        signal.signal(signal.SIGTERM, lambda *_: mirror.stopping.set())
        mirror.run_forever()
    for flow in mirror.flows:
        t = flow.totals
        log.info(
            "flow %s: %d records, %d bytes in %d batches; dropped %d, dead-lettered %d, lost at source %d,"
            " quarantined %s", flow.flow.name, sum(t.records.values()), sum(t.bytes.values()), t.batches, t.dropped,
            t.dead_lettered, sum(loss.count for loss in t.data_loss), t.quarantined or "none",
        )  # fmt: skip
    spark.stop()
    return 0
