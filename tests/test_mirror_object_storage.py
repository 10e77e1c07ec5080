"""A flow whose Spark checkpoint is in object storage (s3a:// on a real S3 API) keeps its state there: a hold made
before the mirror is SIGKILLed is still there when it restarts, and the held topic catches up with none lost; and
`adopt` sees a used checkpoint there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from bench.testbed.clients import Record, create_topics, produce, read_all
from bench.testbed.ports import free_port
from spark_app.ledger import STATE_FILE
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.mirror_config import one_flow_config

PER_WAVE = 50  # records per topic and partition in each wave
# What `adopt` does with a checkpoint location, run where Spark has the s3a connector: no session is passed, so
# spark_app.storage starts one, as it does for `mirrorkit adopt`.
ADOPT_STEPS = """
import json, sys
from spark_app.dr.adopt import checkpoint_refusals
from spark_app.ledger import LedgerState
from spark_app.quarantine import Hold, Quarantine
from spark_app.storage import checkpoint_files

used, empty = (checkpoint_files(location) for location in sys.argv[1:3])
state = LedgerState.load(empty)
found = repr((state.quarantined, state.positions))
state.adopted[("orders", 0)] = state.positions[("orders", 0)] = 42
state.quarantined["orders"] = Quarantine("why", {1: Hold(3, 4)})
state.save()
again = LedgerState.load(empty)
print(json.dumps({"used": checkpoint_refusals(used), "empty": checkpoint_refusals(empty), "found": found,
                  "again": repr((again.quarantined, again.adopted)), "class": type(empty).__name__}))
"""


def wave(tag: str) -> list[Record]:
    now = int(time.time() * 1000)
    return [Record(p, f"{tag}{p}-{i}".encode(), f"{tag}-value-{i}".encode(), (), now + i) for p in (0, 1)
            for i in range(PER_WAVE)]  # fmt: skip


def test_a_hold_in_an_s3a_checkpoint_survives_a_sigkill_and_the_held_topic_catches_up_none_lost(
    plaintext_cluster, target_cluster, s3, mirror_cli, tmp_path, unique
):
    good, held = f"good-{unique}", f"held-{unique}"
    create_topics(plaintext_cluster.admin, {good: 2, held: 2})
    create_topics(target_cluster.admin, {f"onprem.{good}": 2})  # the hub for `held` is missing: it is quarantined
    bucket = s3.bucket(unique.lower().replace("_", "-")[-40:].strip("-"))
    state_key = f"flows/onprem-dr/{STATE_FILE}"
    config = one_flow_config(
        plaintext_cluster, target_cluster, [good, held], f"s3a://{bucket}/flows/onprem-dr",
        emit_heartbeats=False, metrics_port=free_port(), topic_sync_interval_s=1.0,
    )  # fmt: skip
    command = mirror_cli.command(mirror_cli.config_file(config), "--master", "local[2]")
    env = mirror_cli.env | s3.spark_env()

    def hold() -> dict:
        """The hold of `held` in the state in the bucket, as {partition: {"first", "next"}} (its life aside)."""
        raw = s3.read(bucket, state_key)
        holds = json.loads(raw)["quarantined"].get(held, {}).get("partitions", {}) if raw else {}
        return {p: {"first": h["first"], "next": h["next"]} for p, h in holds.items()}

    def wait_for_hold(next_offset: int, timeout_s: float = 180.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while {p: h["next"] for p, h in hold().items()} != {"0": next_offset, "1": next_offset}:
            assert mirror.poll() is None, output()
            assert time.monotonic() < deadline, f"no hold up to {next_offset} in the bucket: {hold()}\n{output()}"
            time.sleep(0.5)
        return hold()

    sent = {good: wave("a"), held: wave("a")}
    for topic, records in sent.items():
        produce(plaintext_cluster.client, topic, records)
    with open(tmp_path / "out.log", "w+") as out:

        def output() -> str:
            out.flush()
            return (tmp_path / "out.log").read_text()[-4000:]

        def start() -> subprocess.Popen:
            return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

        mirror = start()
        try:
            read_all(target_cluster.client, f"onprem.{good}", expected=len(sent[good]), timeout_s=180, exact=False)
            assert wait_for_hold(PER_WAVE) == {"0": {"first": 0, "next": PER_WAVE}, "1": {"first": 0, "next": PER_WAVE}}
            os.killpg(mirror.pid, signal.SIGKILL)  # mid-quarantine
            mirror.wait(30)

            more = {good: wave("b"), held: wave("b")}  # produced while the mirror is down
            for topic, records in more.items():
                produce(plaintext_cluster.client, topic, records)
                sent[topic] += records
            mirror = start()
            # The restarted mirror goes on from the hold it finds in the bucket: its first offsets are still 0. Had
            # the hold been lost, the checkpoint (past offset PER_WAVE) would make a new one from PER_WAVE.
            assert wait_for_hold(2 * PER_WAVE) == {"0": {"first": 0, "next": 2 * PER_WAVE},
                                                   "1": {"first": 0, "next": 2 * PER_WAVE}}  # fmt: skip

            create_topics(target_cluster.admin, {f"onprem.{held}": 2})  # the cause is fixed
            got = {
                topic: read_all(target_cluster.client, f"onprem.{topic}", len(sent[topic]), 180, exact=False)
                for topic in (good, held)
            }
            mirror.send_signal(signal.SIGTERM)
            code = mirror.wait(120)
        finally:
            if mirror.poll() is None:
                os.killpg(mirror.pid, signal.SIGKILL)
    assert code == 0, output()
    for topic in (good, held):  # the SIGKILL may repeat a batch; nothing is lost or reordered
        assert_each_record_once_in_order(f"onprem.{topic}", got[topic], sent[topic], at_least_once=True)
    assert hold() == {}, "the caught-up topic left the state in the bucket"
    assert not (tmp_path / "s3a:").exists() and not os.path.exists("s3a:"), "state written to a local path"


def test_adopt_refuses_a_used_s3a_checkpoint_and_seeds_the_state_of_an_empty_one(s3, tmp_path, unique):
    bucket = s3.bucket(f"adopt-{unique.lower().replace('_', '-')[-30:].strip('-')}")
    s3.client().put_object(Bucket=bucket, Key="used/offsets/0", Body=b"v1\n{}")
    used, empty = f"s3a://{bucket}/used", f"s3a://{bucket}/empty"
    env = os.environ | {"PYSPARK_PYTHON": sys.executable} | s3.spark_env()
    done = subprocess.run([sys.executable, "-c", ADOPT_STEPS, used, empty], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["class"] == "HadoopFiles" and seen["found"] == "({}, {})"
    assert seen["used"] == [
        f"the flow's checkpoint {used}/offsets already holds positions (the mirror has run on it); point"
        " checkpoint_location at an empty path to adopt MM2's"
    ]
    assert seen["empty"] == []
    held = "{'orders': Quarantine(reason='why', partitions={1: Hold(first=3, next=4, life='')}, retry_at=0.0)}"
    assert seen["again"] == f"({held}, {{('orders', 0): 42}})"
    listed = s3.client().list_objects_v2(Bucket=bucket, Prefix="empty/")["Contents"]
    assert [o["Key"] for o in listed] == [f"empty/{STATE_FILE}"], "written in place: no temporary object"
    assert json.loads(s3.read(bucket, f"empty/{STATE_FILE}"))["adopted"] == {"orders": {"0": 42}}
