"""Taking a flow over from MirrorMaker 2 and handing it back, on the real node, with the site's toolbox alone
(docs/operations/adopt.md, "From the site's toolbox"): the stack's `adopt` and `handback` commands, which run the
toolbox in a Job that mounts the mirror's checkpoint PVC.

A shipped site stack's objects are applied but for its SparkApplication, over clusters of this module's own where a
stopped MirrorMaker 2 left its state: the first MM2_COPIED records of each partition copied to the target, and its
positions in Connect's offsets topic. `adopt` from a plain toolbox run is refused (it does not mount the checkpoint);
from the stack's command it takes the flow over. The SparkApplication then starts on the node and copies only what MM2
had not: each target partition holds the source's records once each, in order. With the application deleted (the
mirror stopped), the stack's `handback` command writes MM2's positions at the mirror's end.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from bench.testbed.clients import Record, by_partition, create_topics, end_offsets, produce, read_all
from bench.testbed.testbed import TestBed
from infra.k8s.toolbox import TOOLBOX, create_command, verb_args
from spark_app.clients import producer, read_topic
from spark_app.config import MirrorConfig
from spark_app.dr.handback import connect_key
from spark_app.policy import HEARTBEATS_TOPIC, connect_offsets_topic, target_topic
from tests.infra.harness import Run
from tests.support.kube_api import KubeApiError, KubeApiServer
from tests.support.kube_node import KubeNode
from tests.support.mirror_config import create_event_hubs
from tests.support.mirror_image import MirrorImage
from tests.support.node_toolbox import run_toolbox, toolbox_site
from tests.support.polling import wait_until
from tests.support.stack_objects import apply_all

PARTITIONS = 3
RECORDS = 600  # per topic
MM2_COPIED = 120  # per partition: what MirrorMaker 2 copied before it was stopped
SUFFIX = "adp"  # the namespaces of this module, apart from the other node tests'
START_TIMEOUT_S = 600.0
CONNECTOR = "MirrorSourceConnector"


def mm2_positions(config: MirrorConfig, target: str, offsets_topic: str) -> dict[tuple[str, int], int]:
    """MM2's positions as the test reads them itself: per partition the newest last-copied offset (None: deleted)."""
    out: dict[tuple[str, int], int] = {}
    for msg in read_topic(config.cluster(target), offsets_topic):
        name, part = json.loads(msg.key() or b'["", {}]')
        if name == CONNECTOR:
            key = (part["topic"], part["partition"])
            if msg.value() is None:
                out.pop(key, None)
            else:
                out[key] = json.loads(msg.value())["offset"]
    return out


def test_the_stacks_adopt_and_handback_commands_take_the_flow_from_mm2_and_give_it_back_on_the_node(
    kube_api: KubeApiServer,
    kube_node: KubeNode,
    mirror_image: MirrorImage,
    stack_runs: dict[str, Run],
    platform_runs: dict[str, Run],
    testbed: TestBed,
    tmp_path_factory: Any,
) -> None:
    volumes = Path(tmp_path_factory.mktemp("volumes"))
    made = toolbox_site(kube_api, kube_node, mirror_image, stack_runs, platform_runs, testbed, volumes, SUFFIX)
    deployment, config, source_cluster, target_cluster = made.deployment, made.local, made.source, made.target
    namespace = deployment.namespace
    (flow,) = config.flows
    (claim,) = [o["metadata"]["name"] for o in deployment.objects if o["kind"] == "PersistentVolumeClaim"]
    topics = list(flow.topics.include)
    offsets_topic = connect_offsets_topic(flow)

    # What a stopped MM2 left: its copies of the first MM2_COPIED records per partition, and its positions.
    create_topics(source_cluster.admin, dict.fromkeys(topics, PARTITIONS))
    create_event_hubs(target_cluster.admin, config, flow.target, {target_topic(flow, t): PARTITIONS for t in topics})
    create_topics(target_cluster.admin, {offsets_topic: 1})
    sent: dict[str, list[Record]] = {}
    now = int(time.time() * 1000)  # not older: retention would delete the records
    for topic in topics:
        sent[topic] = [
            Record(i % PARTITIONS, f"k{i}".encode(), f"{topic}-v{i}".encode(), (), now + i) for i in range(RECORDS)
        ]
        produce(source_cluster.client, topic, sent[topic])
        copied = [r for part in by_partition(sent[topic]).values() for r in part[:MM2_COPIED]]
        produce(target_cluster.client, target_topic(flow, topic), copied)
    writer = producer(target_cluster.client, {"acks": "all"})
    for topic in topics:
        for p in range(PARTITIONS):
            writer.produce(offsets_topic, json.dumps({"offset": MM2_COPIED - 1}).encode(),
                           connect_key(CONNECTOR, flow.source, topic, p), partition=0)  # fmt: skip
    assert writer.flush(30) == 0

    app = deployment.app
    app_path = kube_api.object_path(app["apiVersion"], app["kind"], app["metadata"]["name"], namespace)
    # Everything of the site but its application, so the mirror has not run when adopt does.
    assert apply_all(kube_api, [o for o in deployment.objects if o["kind"] != "SparkApplication"], "pulumi-node") == {}
    try:
        # A plain toolbox run does not mount the checkpoint, and refuses, naming where the state lives.
        adopt_args = verb_args("adopt", "--flow", flow.name)
        ok, log = run_toolbox(kube_api, kube_node, namespace, f"{TOOLBOX}-adopt-plain",
                              create_command(namespace, adopt_args))  # fmt: skip
        assert not ok and "which this toolbox pod does not mount" in log, log
        # The stack's command mounts the mirror's checkpoint claim: adopt takes the flow over at MM2's positions.
        ok, log = run_toolbox(kube_api, kube_node, namespace, f"{TOOLBOX}-adopt-1",
                              create_command(namespace, adopt_args, checkpoint_claim=claim))  # fmt: skip
        assert ok and f"flow {flow.name} adopted {len(topics) * PARTITIONS} partition(s)" in log, log

        # The mirror starts on the adopted state and copies only what MM2 had not.
        assert apply_all(kube_api, [app], "pulumi-node") == {}

        def running() -> bool:
            try:
                return (kube_api.read(app).get("status") or {}).get("applicationState", {}).get("state") == "RUNNING"
            except KubeApiError as err:
                if err.status == 404:
                    return False
                raise

        wait_until(running, "the mirror RUNNING", timeout_s=START_TIMEOUT_S, every_s=2)
        ends = {(target_topic(flow, t), p): RECORDS // PARTITIONS for t in topics for p in range(PARTITIONS)}
        target = config.cluster(flow.target)
        wait_until(lambda: end_offsets(target, ends) == ends, "every record on the target once",
                   timeout_s=START_TIMEOUT_S, every_s=2)  # fmt: skip
        for topic in topics:
            landed = by_partition(read_all(target, target_topic(flow, topic), RECORDS))
            for p, records in by_partition(sent[topic]).items():
                assert [r.value for r in landed[p]] == [r.value for r in records], (topic, p)

        # The mirror stops (its application deleted: the driver gives up the flow's lease on SIGTERM); then the
        # stack's handback command writes MM2's positions where the mirror ended.
        kube_api.request("DELETE", app_path)

        def driver_gone() -> bool:
            selector = f"spark-role=driver,sparkoperator.k8s.io/app-name={app['metadata']['name']}"
            pods = kube_api.request("GET", f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": selector})
            return not running() and not pods["items"]

        wait_until(driver_gone, "the mirror gone", timeout_s=START_TIMEOUT_S, every_s=2)
        handback_args = verb_args("handback", "--flow", flow.name)
        ok, log = run_toolbox(kube_api, kube_node, namespace, f"{TOOLBOX}-handback-1",
                              create_command(namespace, handback_args, checkpoint_claim=claim))  # fmt: skip
        assert ok and f"flow {flow.name} handed back to MirrorMaker 2" in log, log
        last = RECORDS // PARTITIONS - 1
        handed = mm2_positions(config, flow.target, offsets_topic)
        assert {k: v for k, v in handed.items() if k[0] in topics} == {
            (t, p): last for t in topics for p in range(PARTITIONS)
        }
        # Besides, the source's heartbeats topic, which the mirror copies as MM2's source connector does.
        assert {t for t, _ in handed} - set(topics) <= {HEARTBEATS_TOPIC}, handed
    finally:
        with contextlib.suppress(KubeApiError):
            kube_api.request("DELETE", app_path)
        testbed.retire("adp-primary")
        testbed.retire("adp-dr")
