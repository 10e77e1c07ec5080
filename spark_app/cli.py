"""The command line, `mirrorkit <command> --config FILE` (or `python -m spark_app`).

Each command's logic lives in its module; this one parses arguments, prints, and maps errors to exit codes: 2 for a
config or argument the command refuses, 1 for a mirror, cluster or group state that stops it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import logging
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .config import ConfigError, FlowConfig, MirrorConfig, load_config
from .copy_wing.choice import CoreChoice, choices
from .errors import MirrorFailed
from .policy import target_topic
from .profiles import SecretError, Settings, librdkafka_settings, redacted

if TYPE_CHECKING:
    from .dr.connection import Publication
    from .dr.views import FailoverRow

log = logging.getLogger("spark_app")
PREFLIGHT_TIMEOUT_S = 20.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mirrorkit", description="The mirrorkit Kafka mirror.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("run", "run the mirror"),
        ("validate", "check a config and exit"),
        ("describe", "show the flows, the core that copies each and why, and the topics they match now; no secrets"),
        ("status", "per flow and topic-partition: lag, last checkpoint age, last heartbeat age"),
        ("failover", "commit translated offsets on a flow's target for its consumer groups"),
        ("drill", "measure a running flow's RPO, RTO and re-read with a probe topic and group of its own"),
        ("failback", "move the groups back to the primary once the reverse flow has caught up"),
        ("adopt", "take a flow over from a stopped MirrorMaker 2: its positions, offset syncs and checkpoints"),
        ("handback", "hand a stopped flow back to MirrorMaker 2: it resumes where the mirror stopped"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--config", required=True, help="the mirror config (YAML or JSON)")
    run = sub.choices["run"]
    run.add_argument("--available-now", action="store_true", help="mirror everything present, then exit 0")
    run.add_argument("--master", default=None, help="Spark master, e.g. local[2] (spark-submit sets it in the image)")
    sub.choices["describe"].add_argument(
        "--offline", action="store_true",
        help="reach no cluster and read no secret: no topics and no client settings (e.g. in a pipeline)",
    )  # fmt: skip
    sub.choices["status"].add_argument("--json", action="store_true", help="print JSON instead of a table")
    fail = sub.choices["failover"]
    fail.add_argument("--flow", required=True, help="the flow to fail over, as SRC->DST")
    fail.add_argument("--groups", default=None, help="only groups matching this regex (full match)")
    fail.add_argument("--dry-run", action="store_true", help="print the plan, commit nothing")
    fail.add_argument("--force", action="store_true",
                      help="fail over while the flow's mirror still runs: fence it first, saying so")  # fmt: skip
    publish_arguments(fail, "the flow's target")
    drill = sub.choices["drill"]
    drill.add_argument("--flow", required=True, help="the flow to drill, as SRC->DST; its mirror must be running")
    drill.add_argument("--probe-topic", default="mirrorkit_drill", help="a topic the flow mirrors, for the drill only")
    drill.add_argument("--records", type=int, default=1000, help="probe records to produce (default 1000)")
    drill.add_argument("--seconds", type=float, default=20.0, help="over this many seconds (default 20)")
    drill.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    back = sub.choices["failback"]
    back.add_argument("--flow", required=True, help="the reverse flow, as DR->PRIMARY")
    back.add_argument("--dry-run", action="store_true", help="print what it would commit, commit nothing")
    back.add_argument("--force", action="store_true",
                      help="go past failed checks (live consumers on DR, lag, checkpoints not yet current), saying"
                      " which")  # fmt: skip
    publish_arguments(back, "the primary")
    take = sub.choices["adopt"]
    take.add_argument("--flow", required=True, help="the flow MM2 ran, as SRC->DST (MM2's cluster aliases)")
    take.add_argument("--force", action="store_true",
                      help="adopt even while MM2's Connect group has members or its heartbeats are fresh")  # fmt: skip
    take.add_argument("--connect-group", default=None,
                      help="MM2's Connect group on the target (default: the flow's mirrormaker2.connect_group, else"
                      " <SRC>-mm2, dedicated mode's)")  # fmt: skip
    take.add_argument("--offsets-topic", default=None,
                      help="Connect's offsets topic on the target (default: the flow's mirrormaker2.offsets_topic,"
                      " else mm2-offsets.<SRC>.internal, dedicated mode's)")  # fmt: skip
    take.add_argument("--connector", default=None, help="the MirrorSourceConnector's name, if the topic holds several")
    take.add_argument("--mm2-policy", choices=("default", "identity"), default="default",
                      help="MM2's replication.policy.class: Default- or IdentityReplicationPolicy")  # fmt: skip
    take.add_argument("--mm2-separator", default=".", help="MM2's replication.policy.separator (default '.')")
    take.add_argument("--heartbeat-quiet-s", type=float, default=None,
                      help="MM2 counts as running while its newest heartbeat is younger (default 30)")  # fmt: skip
    give = sub.choices["handback"]
    give.add_argument("--flow", required=True, help="the flow to hand back, as SRC->DST (MM2's cluster aliases)")
    give.add_argument("--force", action="store_true",
                      help="hand back even while MM2's Connect group has members or either tool's heartbeats are"
                      " fresh")  # fmt: skip
    give.add_argument("--connect-group", default=None,
                      help="MM2's Connect group on the target (default: the flow's mirrormaker2.connect_group, else"
                      " <SRC>-mm2, dedicated mode's)")  # fmt: skip
    give.add_argument("--offsets-topic", default=None,
                      help="Connect's offsets topic on the target (default: the flow's mirrormaker2.offsets_topic,"
                      " else mm2-offsets.<SRC>.internal, dedicated mode's)")  # fmt: skip
    give.add_argument("--connector", default="MirrorSourceConnector",
                      help="MM2's source connector (Strimzi: <SRC>-><DST>.MirrorSourceConnector)")  # fmt: skip
    give.add_argument("--mm2-offset-syncs-location", choices=("source", "target"), default="source",
                      help="MM2's offset-syncs.topic.location (default source, MM2's)")  # fmt: skip
    give.add_argument(
        "--heartbeat-quiet-s",
        type=float,
        default=None,
        help="MM2 or the mirror counts as running while its newest heartbeat is younger (default 30)",
    )
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
        if args.command == "validate":
            print(f"{args.config}: valid ({len(config.clusters)} clusters, {len(config.flows)} flows)")
            return 0
        if args.command == "describe":
            print(json.dumps(dataclasses.asdict(describe(config, args.offline)), indent=2))
            return 0
        if args.command == "status":
            return print_status(config, args.json)
        if args.command == "failover":
            return run_failover(config, args.flow, args.groups, args.dry_run, args.force, publication(args))
        if args.command == "failback":
            return run_failback(config, args.flow, args.dry_run, args.force, publication(args))
        if args.command == "adopt":
            return run_adopt(config, args)
        if args.command == "handback":
            return run_handback(config, args)
        if args.command == "drill":
            return run_drill(config, args.flow, args.probe_topic, args.records, args.seconds, args.json)
        return run_mirror(config, args.available_now, args.master)
    except (ConfigError, SecretError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except MirrorFailed as err:  # one clear line, not a JVM stack
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        gc.collect()  # free Kafka clients held in cycles now, not while the interpreter exits (see clients.list_topics)


def publish_arguments(parser: argparse.ArgumentParser, where: str) -> None:
    parser.add_argument("--publish-configmap", default=None, metavar="NAMESPACE/NAME",
                        help=f"publish the applications' connection profile for {where} as this ConfigMap, through the"
                        " Kubernetes API with the pod's service-account token")  # fmt: skip
    parser.add_argument("--profile-out", default=None, metavar="PATH",
                        help=f"write the applications' connection profile for {where} to this file (JSON)")  # fmt: skip


def publication(args: argparse.Namespace) -> Publication:
    from .dr.connection import ConfigMapRef, Publication

    where = None if args.publish_configmap is None else ConfigMapRef.parse(args.publish_configmap)
    return Publication(where, args.profile_out)


@dataclass(frozen=True)
class ClusterView:
    profile: str
    settings: Settings | None  # redacted; None offline


@dataclass(frozen=True)
class CopyView:
    copies: str  # the flow's batches or slots, and how they commit
    core: str  # spark_app.copy_wing.choice.Core
    reason: str


@dataclass(frozen=True)
class FlowView:
    flow: str
    replication_policy: str
    copy: CopyView  # which core copies the flow's records, and why
    topics: dict[str, str] | None  # source topic -> target topic, for the topics the flow selects now; None offline


@dataclass(frozen=True)
class Description:
    clusters: dict[str, ClusterView]
    flows: list[FlowView]


def describe(config: MirrorConfig, offline: bool = False) -> Description:
    """Flows, clusters (redacted), the core that copies each flow and the topics it matches on its source now;
    `offline`, what the config alone says: neither a cluster nor a secret is read."""
    from .topics import TopicSync

    clusters = {
        c.alias: ClusterView(c.profile.value, None if offline else redacted(librdkafka_settings(c, "consumer")))
        for c in config.clusters
    }
    flows = []
    for flow, choice in zip(config.flows, choices(config), strict=True):
        names = None
        if not offline:
            sync = TopicSync(flow, config.cluster(flow.source), config.cluster(flow.target))
            names = {t: target_topic(flow, t) for t in sorted(sync.source_topics())}
        flows.append(FlowView(flow.name, flow.replication_policy, _copy_view(choice), names))
    return Description(clusters, flows)


def _copy_view(choice: CoreChoice) -> CopyView:
    return CopyView(choice.copies, choice.core.value, choice.reason)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"


def print_status(config: MirrorConfig, as_json: bool) -> int:
    """Read only what the mirror wrote on the clusters, so it works beside a running mirror or without one."""
    from .dr.views import status_of

    flows = [status_of(config, flow) for flow in config.flows]
    copies = choices(config)
    if as_json:
        rows = [
            dataclasses.asdict(f) | {"copy": dataclasses.asdict(_copy_view(c))}
            for f, c in zip(flows, copies, strict=True)
        ]
        print(json.dumps({"flows": rows}, indent=2))
        return 0
    for choice in copies:
        print(choice)
    print(
        f"{'flow':16} {'topic':24} {'part':>4} {'mirrored':>10} {'lag':>8} {'checkpoint age':>15} {'heartbeat age':>14}"
    )
    for f in flows:
        heartbeat = _age(f.heartbeat_age_s)
        if f.unreadable is not None:
            print(f"{f.flow:16} (its DR state cannot be read: {f.unreadable})")
            continue
        if not f.partitions:
            print(f"{f.flow:16} {'(nothing mirrored yet)':24} {'':>4} {'':>10} {'':>8} {'-':>15} {heartbeat:>14}")
        for p in f.partitions:
            lag = str(p.lag) if p.lag is not None else "unknown" if f.source_reachable else "source down"
            print(
                f"{f.flow:16} {p.topic:24} {p.partition:>4} {p.mirrored_offset:>10} {lag:>8}"
                f" {_age(p.checkpoint_age_s):>15} {heartbeat:>14}"
            )
    return 0


def run_failover(
    config: MirrorConfig,
    flow_name: str,
    groups: str | None,
    dry_run: bool,
    force: bool,
    publication: Publication | None = None,
) -> int:
    """Failover as one promotion of the flow's target, each step printed: fence the flow's mirror (its DR lease),
    translate the groups, lift the copies' write block, publish the applications' connection profile. A failed
    step stops the steps after it; the exit code is 1 when one failed or a group was refused. A dry run changes
    nothing: it prints the plan on stdout, and what each step would do on stderr."""
    from confluent_kafka import KafkaException

    from .dr.connection import GroupResume, Publication, PublishFailed, failover_profile
    from .dr.views import Checks, fence, lift, running_mirror, translate_groups, withheld_grants

    publication = publication or Publication()
    say = sys.stderr if dry_run else sys.stdout  # a dry run's stdout is the plan alone, for scripts that read it
    flow = config.flow(flow_name)
    if groups is not None:
        try:
            re.compile(groups)
        except re.error as err:
            raise ConfigError(f"--groups: '{groups}' is not a valid regex: {err}") from None
    plan = failover_plan_printed(config, flow, groups)
    if not plan:
        print(f"no checkpoint for flow {flow.name} on '{flow.target}' matches; no group to translate", file=say)
    if publication.asked:  # before anything changes: a grant missing there refuses the failover now
        for line in publication.check():
            print(f"checked: {line}", file=say)
    verb = "would " if dry_run else ""
    running = running_mirror(config, flow, wait_s=0.0) if dry_run or force else running_mirror(config, flow)
    checks = Checks("failover", force)
    if dry_run:
        fenced = f"would refuse: {running} (--force fences it)" if running else "no mirror of the flow runs"
    elif running:
        checks.fail(running)
        fence(config, flow)
        fenced = "fenced the running mirror (took the flow's DR lease)"
    else:
        fenced = "no mirror of the flow runs"
    print_forced(checks.forced)
    print(f"step 1/4 fence: {fenced}", file=say)

    resumes = [GroupResume(r.group, r.topic, r.partition, r.target_offset) for r in plan]
    refused = 0
    if dry_run:
        print(
            f"step 2/4 translate groups: would commit {len({r.group for r in plan})} group(s), as planned above",
            file=say,
        )
    else:
        resumes = []
        for result in translate_groups(config, flow, plan):
            if result.refused:
                refused += 1
                print(f"refused: {result.refused}", file=sys.stderr)
                continue
            for (topic, partition), offset in sorted(result.committed.items()):
                print(f"committed {result.group} {topic}[{partition}] = {offset} on '{flow.target}'", file=say)
                resumes.append(GroupResume(result.group, topic, partition, offset))
            for (topic, partition), offset in sorted(result.kept.items()):
                print(
                    f"kept {result.group} {topic}[{partition}] = {offset}: already at or past the translation", file=say
                )
                resumes.append(GroupResume(result.group, topic, partition, offset))
        moved = len({g.group for g in resumes})
        print(f"step 2/4 translate groups: {moved} group(s) translated, {refused} refused", file=say)

    if not flow.sync_topic_acls:
        print(f"step 3/4 lift write block: none (flow {flow.name} does not sync topic ACLs)", file=say)
    else:
        try:
            grants = withheld_grants(config, flow) if dry_run else lift(config, flow)
        except KafkaException as err:
            raise MirrorFailed(
                f"step 3/4 lift write block failed on '{flow.target}': {err.args[0].str()}; steps 1 and 2 are done"
                " (run failover again: it keeps what it committed, and lifts what is still withheld)"
            ) from None
        for rule in grants:
            print(f"{verb}grant {rule}", file=say)
        print(f"step 3/4 lift write block: {verb}set {len(grants)} write grant(s) on '{flow.target}'", file=say)

    profile = failover_profile(config.cluster(flow.target), flow, resumes)
    print(f"profile ({len(profile.topics)} topic(s), {len(resumes)} group partition(s)):", file=say)
    print(profile.to_json(), file=say)
    if not publication.asked:
        print("step 4/4 publish profile: not asked (--publish-configmap NAMESPACE/NAME, --profile-out PATH)", file=say)
    elif dry_run:
        print("step 4/4 publish profile: would write it where checked above", file=say)
    else:
        try:
            published = publication.publish(profile)
        except PublishFailed as err:
            raise PublishFailed(
                f"step 4/4 publish profile failed: {err}; steps 1 to 3 are done (run failover again to publish)"
            ) from None
        for line in published:
            print(f"step 4/4 publish profile: {line}", file=say)
    none_matched = not plan and groups is not None  # the operator named groups, and none has a checkpoint
    return 1 if refused or none_matched else 0


def failover_plan_printed(config: MirrorConfig, flow: FlowConfig, groups: str | None) -> list[FailoverRow]:
    """The failover plan, printed as a table: where each group resumes on the target."""
    from .dr.views import failover_plan

    plan = failover_plan(config, flow, groups)
    print(f"{'group':24} {'topic':24} {'part':>4} {'source offset':>13} {'target offset':>13} {'re-read':>8}  note")
    for r in plan:
        reread = "?" if r.reread is None else str(r.reread)
        notes = []
        if r.held_for_local:
            notes.append("held-for-local-records")
        if r.clamped_from is not None:
            notes.append(f"log-start(translated-{r.clamped_from})")
        note = ",".join(notes) or "-"
        where = f"{r.group:24} {r.topic:24} {r.partition:>4}"
        print(f"{where} {r.source_offset:>13} {r.target_offset:>13} {reread:>8}  {note}")
    clamped = sum(1 for r in plan if r.clamped_from is not None)
    if clamped:
        print(
            f"{clamped} row(s) resume at the target partition's log start: the records between their translated"
            f" offset and it were deleted on '{flow.target}' (retention), so the group cannot read them there"
        )
    return plan


def run_drill(
    config: MirrorConfig, flow_name: str, probe_topic: str, records: int, seconds: float, as_json: bool
) -> int:
    """Drill a running flow with its own probe topic and group; print the report (steps go to stderr)."""
    from .dr.drill import Drill, DrillOptions

    if records < 2 or seconds <= 0:
        raise ConfigError("--records must be at least 2 and --seconds above 0")
    flow = config.flow(flow_name)
    drill = Drill(config, flow, DrillOptions(probe_topic, records, seconds), log=lambda s: print(s, file=sys.stderr))
    report = drill.run()
    if as_json:
        print(json.dumps(dataclasses.asdict(report), indent=2))
        return 0
    rows = [
        ("flow", report.flow),
        ("probe topic", f"{report.probe_topic} -> {report.target_topic}"),
        ("probe group", report.probe_group),
        ("produced (acknowledged)", report.produced),
        ("on the target at the cut", report.on_target_at_cut),
        ("RPO records", report.rpo_records),
        ("RPO seconds", f"{report.rpo_seconds:.3f}"),
        ("consumed on the source", report.consumed_on_source),
        ("checkpoint after the cut s", f"{report.checkpoint_wait_s:.3f}"),
        ("RTO seconds", f"{report.rto_seconds:.3f}"),
        ("read on the target", report.read_on_target),
        ("re-read", report.reread),
        ("re-read the plan predicted", "?" if report.reread_bound is None else report.reread_bound),
        ("skipped", report.skipped),
    ]
    for name, value in rows:
        print(f"{name:28} {value}")
    for line in report.cleanup:
        print(f"cleanup: {line}")
    return 0 if report.skipped == 0 else 1


def run_failback(
    config: MirrorConfig, flow_name: str, dry_run: bool, force: bool, publication: Publication | None = None
) -> int:
    """Refuse while the operator must act (unless forced); else commit (or, on a dry run, print) where each group
    goes. Once every group moved back, the primary's connection profile is published where asked (checked before
    anything moves)."""
    from .dr.connection import GroupResume, Publication, primary_profile
    from .dr.failback import failback, original_flow

    publication = publication or Publication()
    reverse = config.flow(flow_name)
    original = original_flow(config, reverse)
    if publication.asked:
        for line in publication.check():
            print(f"checked: {line}")
    result = failback(config, reverse, dry_run, force)
    print_forced(result.forced)
    print(f"{'move':13} {'group':24} {'topic':24} {'part':>4} {'offset':>10}  on '{result.primary}'")
    for a in result.actions:
        print(f"{a.move:13} {a.group:24} {a.topic:24} {a.partition:>4} {a.offset:>10}  {a.done}")
    if not result.actions and not result.refused:
        print(f"no group of flow {flow_name} on '{result.dr}' has offsets to move")
    if refused(result.refused):
        if publication.asked:
            print("profile not published: a group was refused, so the applications stay on DR's profile")
        return 1
    if publication.asked:
        resumes = [GroupResume(a.group, a.topic, a.partition, a.offset) for a in result.actions]
        profile = primary_profile(config.cluster(original.source), original, resumes)
        print(profile.to_json())
        if dry_run:
            print("publish profile: would write it where checked above")
        for line in [] if dry_run else publication.publish(profile):
            print(f"publish profile: {line}")
    return 0


def refused(reasons: list[str]) -> bool:
    """Print each reason an operator verb refused, on stderr; whether there was any."""
    for reason in reasons:
        print(f"refused: {reason}", file=sys.stderr)
    return bool(reasons)


def print_forced(reasons: list[str]) -> None:
    """What `--force` went past, before what the command did (each was logged too)."""
    for reason in reasons:
        print(f"forced past: {reason}")


def run_adopt(config: MirrorConfig, args: argparse.Namespace) -> int:
    """Refuse while the operator must act; else seed the flow and print where each partition starts."""
    from .dr.adopt import HEARTBEAT_QUIET_S, AdoptOptions, Mm2Naming, adopt

    naming = Mm2Naming(args.mm2_policy, args.mm2_separator)
    quiet_s = HEARTBEAT_QUIET_S if args.heartbeat_quiet_s is None else args.heartbeat_quiet_s
    options = AdoptOptions(naming, args.offsets_topic, args.connector, quiet_s, args.force, args.connect_group)
    result = adopt(config, config.flow(args.flow), options)
    if refused(result.refused):
        return 1
    print(f"{'topic':24} {'part':>4} {'starts at':>10} {'from':10} {'history':>8}")
    for p in result.partitions:
        origin = "MM2" if p.committed else "log start"
        print(f"{p.topic:24} {p.partition:>4} {p.next_offset:>10} {origin:10} {len(p.runs):>8}")
    for topic in result.skipped:
        print(f"not adopted: '{topic}' (MM2 copied it; flow {result.flow} does not select it)")
    for group, count in sorted(result.checkpoints.items()):
        print(f"checkpoints carry on: {group} ({count} partition(s))")
    print(f"flow {result.flow} adopted {len(result.partitions)} partition(s); start the mirror on it now")
    return 0


def run_handback(config: MirrorConfig, args: argparse.Namespace) -> int:
    """Refuse while the operator must act; else write MM2's positions and syncs and print where MM2 starts."""
    from .dr.adopt import HEARTBEAT_QUIET_S
    from .dr.handback import HandbackOptions, handback

    quiet_s = HEARTBEAT_QUIET_S if args.heartbeat_quiet_s is None else args.heartbeat_quiet_s
    options = HandbackOptions(args.offsets_topic, args.connector, args.mm2_offset_syncs_location, quiet_s, args.force,
                              args.connect_group)  # fmt: skip
    result = handback(config, config.flow(args.flow), options)
    if refused(result.refused):
        return 1
    print(f"{'topic':24} {'part':>4} {'MM2 starts at':>13}")
    for (topic, partition), offset in sorted(result.positions.items()):
        print(f"{topic:24} {partition:>4} {offset:>13}")
    print(f"{result.syncs} offset sync(s) written to '{result.syncs_topic}'")
    print(f"flow {result.flow} handed back to MirrorMaker 2; start it with its config as it was")
    return 0


def run_mirror(config: MirrorConfig, available_now: bool, master: str | None) -> int:
    from .clients import check_reachable
    from .mirror import Mirror, start_spark
    from .progress import FlowProgress, ProgressReport
    from .transactions import check_transactions

    for flow in config.flows:
        src, dst = config.cluster(flow.source), config.cluster(flow.target)
        log.info(
            "flow %s: %s (%s) -> %s (%s), policy %s, topics include %s exclude %s",
            flow.name, src.alias, src.profile.value, dst.alias, dst.profile.value,
            flow.replication_policy, flow.topics.include, flow.topics.exclude,
        )  # fmt: skip
    # Spark's JVM starts (about 2 s) while the clusters are asked, so neither waits for the other. A wrong address or
    # password, or a target that cannot do the transactions a flow needs, still stops `run` before any flow starts.
    with ThreadPoolExecutor(1, thread_name_prefix="spark-start") as starting:
        session = starting.submit(start_spark, master)
        try:
            check_reachable(config.clusters, PREFLIGHT_TIMEOUT_S)
            check_transactions(config)
        except BaseException:
            with contextlib.suppress(Exception):
                session.result().stop()
            raise
        spark = session.result()
    mirror = Mirror(spark, config)
    mirror.stop_on_sigterm()
    if available_now:
        with ProgressReport([FlowProgress.of(flow) for flow in mirror.flows]):
            mirror.run_available_now()
    else:
        mirror.run_forever()
    for running in mirror.flows:
        t, ledger = running.totals, running.ledger
        log.info(
            "flow %s: %d records, %d bytes in %d batches; dropped %d, dead-lettered %d, lost at source %d,"
            " quarantined %s", running.flow.name, t.records_total, t.bytes_total, t.batches, t.dropped,
            t.dead_lettered, ledger.lost_records, ledger.quarantined or "none",
        )  # fmt: skip
    spark.stop()
    return 0
