"""`mirrorkit failover` as one promotion of the flow's target, and its refusals: the flow fenced, the groups
translated, the copies' write block lifted and the applications' connection profile published (a file, and a
ConfigMap through a real Kubernetes API server with a toolbox's service-account token and Role), each step printed
and its outcome in the exit code; a dry run says what each step would do and changes nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AclOperation

from bench.testbed.clients import Record, create_topics, produce
from bench.testbed.kafka_cluster import KafkaCluster, cluster_entry
from spark_app.cli import main as cli_main
from spark_app.config import MirrorConfig, parse_config
from spark_app.dr import connection
from spark_app.dr.formats import Checkpoint
from spark_app.dr.groups import ClusterGroups
from spark_app.dr.lease import holder
from spark_app.policy import checkpoints_topic
from spark_app.profiles import librdkafka_settings
from spark_app.topics import TopicSync
from tests.support.kube_api import KubeApiError, KubeApiServer
from tests.test_topic_acls import (
    grant_the_mirror,
    mirror_config,
    produce_one,
    set_acls,
    source_topic,
    topic_acl,
    topic_rules,
)


def config_file(config: MirrorConfig, folder: Path) -> Path:
    path = folder / "mirror.json"
    path.write_text(json.dumps(config.model_dump(mode="json")))
    return path


def test_failover_with_no_checkpoint_lifts_the_write_block_prints_each_grant_and_writes_the_profile(
    acl_source_cluster: KafkaCluster, acl_target_cluster: KafkaCluster, unique: str, tmp_path: Path, capsys
):
    """No group has a checkpoint yet: the failover still lifts the copies' write block (it used to stop before),
    naming each grant it sets; the dry run names them and sets none; the profile names the copy and the target's
    SCRAM sign-in by where its password lives, never the password."""
    topic = f"payments-{unique}"
    name = f"app-{unique}"
    application = acl_target_cluster.add_user(name)
    config = mirror_config(acl_source_cluster, acl_target_cluster, topic, tmp_path)
    flow = config.flows[0]
    grant_the_mirror(config, acl_source_cluster, acl_target_cluster)
    source_topic(acl_source_cluster, topic)
    principal, copy = f"User:{name}", f"src.{topic}"
    set_acls(acl_source_cluster, [topic_acl(topic, principal, op) for op in (AclOperation.WRITE, AclOperation.READ)])
    assert TopicSync(flow, config.cluster("src"), config.cluster("dst")).sync().mirrored == {topic: 2}
    failover = ["failover", "--config", str(config_file(config, tmp_path)), "--flow", "src->dst"]
    grant = f"ALLOW WRITE for {principal} from * on topic '{copy}'"
    capsys.readouterr()

    assert cli_main([*failover, "--dry-run", "--profile-out", str(tmp_path / "dry.json")]) == 0
    dry = capsys.readouterr()
    assert dry.out.splitlines()[1:] == [], dry.out  # the plan alone (no group has a checkpoint): scripts read it
    assert f"would grant {grant}" in dry.err, dry.err
    assert "step 3/4 lift write block: would set" in dry.err, dry.err
    assert "step 4/4 publish profile: would write" in dry.err, dry.err
    assert not (tmp_path / "dry.json").exists()
    assert (principal, "WRITE", "ALLOW") not in topic_rules(acl_target_cluster, copy)
    refused = produce_one(application, copy)
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, refused

    profile_path = tmp_path / "profile.json"
    assert cli_main([*failover, "--profile-out", str(profile_path)]) == 0
    out = capsys.readouterr().out
    assert "no checkpoint for flow src->dst on 'dst' matches; no group to translate" in out, out
    assert f"grant {grant}" in out and "step 3/4 lift write block: set" in out, out
    assert f"step 4/4 publish profile: wrote {profile_path}" in out, out
    assert (principal, "WRITE", "ALLOW") in topic_rules(acl_target_cluster, copy)
    assert produce_one(application, copy) is None

    written = profile_path.read_text()
    profile = json.loads(written)
    target = config.cluster("dst")
    assert profile["cluster"] == "dst" and profile["bootstrap_servers"] == target.bootstrap_servers
    assert profile["topics"] == [{"source_topic": topic, "topic": copy}]
    assert profile["groups"] == [] and profile["replication_policy"] == "default"
    assert target.password is not None
    assert profile["auth"]["sasl_mechanism"] == "SCRAM-SHA-512"
    assert profile["auth"]["secret"] == target.password.describe()
    secret = Path(target.password.file).read_text().strip() if target.password.file else os.environ[target.password.env]
    assert secret and secret not in written and secret not in out


def resumable_group(
    source: KafkaCluster, target: KafkaCluster, unique: str, tmp_path: Path
) -> tuple[MirrorConfig, str, str]:
    """A flow p->d of one topic (aliases of its own), and on d its copy and the checkpoints of one group as the
    mirror writes them (no Spark): the group resumes at 5 and 6 there."""
    topic, group = f"orders-{unique}", f"app-{unique}"
    p, d = f"p{unique[-6:]}", f"d{unique[-6:]}"  # the flow's internal topics are named after them
    config = parse_config(
        {
            "clusters": [cluster_entry(source, p), cluster_entry(target, d)],
            "flows": [{"source": p, "target": d, "topics": {"include": [topic]}, "sync_topic_acls": False,
                       "groups": {"include": [group]}, "checkpoint_location": str(tmp_path / "ckpt")}],
        }
    )  # fmt: skip
    flow = config.flows[0]
    remote = f"{p}.{topic}"
    create_topics(target.admin, {remote: 2, checkpoints_topic(flow): 1})
    produce(target.client, remote, [Record(i % 2, None, str(i).encode()) for i in range(20)])
    checkpoints = [Checkpoint(group, remote, 0, 40, 5), Checkpoint(group, remote, 1, 40, 6)]
    produce(target.client, checkpoints_topic(flow), [Record(0, cp.key(), cp.value()) for cp in checkpoints])
    return config, topic, group


def toolbox_token(kube_api: KubeApiServer, namespace: str, account: str, folder: Path) -> Path:
    """A service-account token and the API server's CA, where a pod of `account` finds them."""
    kube_api.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": account}})
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    issued = kube_api.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", request)
    folder.mkdir()
    (folder / "token").write_text(issued["status"]["token"])
    (folder / "ca.crt").write_bytes(kube_api.ca.read_bytes())
    return folder


def test_failover_publishes_the_profile_as_a_configmap_with_the_toolbox_role_and_without_it_changes_nothing(
    kube_api: KubeApiServer, plaintext_cluster, target_cluster, unique: str, tmp_path: Path, capsys, monkeypatch
):
    config, topic, group = resumable_group(plaintext_cluster, target_cluster, unique, tmp_path)
    p, d = config.flows[0].source, config.flows[0].target
    namespace, name = f"apps-{uuid.uuid4().hex[:8]}", "kafka-connection"
    kube_api.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    kube_api.request("POST", f"{rbac}/roles", {
        "metadata": {"name": "profile-writer"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [name],
                   "verbs": ["get", "create", "patch", "update"]}],
    })  # fmt: skip
    kube_api.request("POST", f"{rbac}/rolebindings", {
        "metadata": {"name": "profile-writer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "profile-writer"},
        "subjects": [{"kind": "ServiceAccount", "name": "toolbox", "namespace": namespace}],
    })  # fmt: skip
    host, port = kube_api.url.removeprefix("https://").rsplit(":", 1)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    failover = ["failover", "--config", str(config_file(config, tmp_path)), "--flow", f"{p}->{d}"]
    failover += ["--publish-configmap", f"{namespace}/{name}"]
    on_target = ClusterGroups(config.cluster(d))
    configmap = f"/api/v1/namespaces/{namespace}/configmaps/{name}"

    # A token without the Role: refused before any step, naming the namespace and the ConfigMap; nothing moved.
    monkeypatch.setattr(connection, "SERVICEACCOUNT", toolbox_token(kube_api, namespace, "other", tmp_path / "o"))
    capsys.readouterr()
    assert cli_main(failover) == 1
    captured = capsys.readouterr()
    assert f"ConfigMap {name} in namespace {namespace}" in captured.err and "HTTP 403" in captured.err, captured.err
    assert "step 1/4" not in captured.out, captured.out
    assert on_target.committed(group) == {}
    with pytest.raises(KubeApiError) as absent:
        kube_api.request("GET", configmap)
    assert absent.value.status == 404

    # The toolbox's token: every step runs, and the ConfigMap holds the profile.
    monkeypatch.setattr(connection, "SERVICEACCOUNT", toolbox_token(kube_api, namespace, "toolbox", tmp_path / "t"))
    assert cli_main(failover) == 0
    out = capsys.readouterr().out
    assert f"step 4/4 publish profile: wrote ConfigMap {name} in namespace {namespace}" in out, out
    remote = f"{p}.{topic}"
    assert {tp: c.offset for tp, c in on_target.committed(group).items()} == {(remote, 0): 5, (remote, 1): 6}
    stored = kube_api.request("GET", configmap)["data"]
    profile = json.loads(stored["profile.json"])
    assert stored["bootstrap.servers"] == config.cluster(d).bootstrap_servers == profile["bootstrap_servers"]
    client = librdkafka_settings(config.cluster(d), "consumer")  # what the kit's own clients sign in with
    assert stored["security.protocol"] == client["security.protocol"] == profile["auth"]["security_protocol"]
    assert stored.get("sasl.mechanism") == client.get("sasl.mechanism") == profile["auth"]["sasl_mechanism"]
    assert not {v for k, v in client.items() if k in ("sasl.password", "ssl.key.pem")} & set(stored.values())
    assert profile["verb"] == "failover" and profile["topics"] == [{"source_topic": topic, "topic": remote}]
    assert profile["groups"] == [
        {"group": group, "topic": remote, "partition": 0, "offset": 5},
        {"group": group, "topic": remote, "partition": 1, "offset": 6},
    ]


LEASE_HOLDER = """
import sys, time
from spark_app.config import load_config
from spark_app.dr.lease import DrLease
config = load_config(sys.argv[1])
lease = DrLease(config.cluster(config.flows[0].target), config.flows[0])
lease.acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_a_crashed_mirrors_lease_refuses_a_dry_run_is_fenced_forced_and_lapses_before_an_unforced_failover(
    plaintext_cluster, target_cluster, unique: str, tmp_path: Path, capsys
):
    """A mirror killed outright leaves its lease held until its session lapses: the dry run says the failover would
    refuse; forced, the failover fences it at once; unforced, it waits for the lapse, then goes ahead."""
    config, topic, group = resumable_group(plaintext_cluster, target_cluster, unique, tmp_path)
    p, d = config.flows[0].source, config.flows[0].target
    path = config_file(config, tmp_path)
    failover = ["failover", "--config", str(path), "--flow", f"{p}->{d}"]
    flow = config.flows[0]

    def crashed_mirror() -> None:
        mirror = subprocess.Popen(
            [sys.executable, "-c", LEASE_HOLDER, str(path)], stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            assert mirror.stdout is not None and mirror.stdout.readline().strip() == "held"
        finally:
            os.killpg(mirror.pid, signal.SIGKILL)
            mirror.wait()
        assert holder(config, flow) is not None  # killed, its lease not yet lapsed

    crashed_mirror()
    capsys.readouterr()
    assert cli_main([*failover, "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert f"step 1/4 fence: would refuse: the mirror of flow {flow.name} still runs" in err, err
    assert ClusterGroups(config.cluster(d)).committed(group) == {}

    assert cli_main([*failover, "--force"]) == 0
    out = capsys.readouterr().out
    assert f"forced past: the mirror of flow {flow.name} still runs" in out, out
    assert "step 1/4 fence: fenced the running mirror" in out, out
    assert ClusterGroups(config.cluster(d)).committed(group) != {}

    crashed_mirror()
    assert cli_main(failover) == 0  # waits out the session (lease.SESSION_S), as the mirror is gone
    out = capsys.readouterr().out
    assert "step 1/4 fence: no mirror of the flow runs" in out, out


def test_members_still_on_the_target_refuse_their_group_even_forced_and_the_other_steps_run(
    plaintext_cluster, target_cluster, unique: str, tmp_path: Path, capsys
):
    """A group whose consumers still run on the target cannot be moved under them: refused by name, with and without
    --force (Kafka itself refuses a commit for a group with members); the exit code says so."""
    from bench.testbed import clients as bed

    config, topic, group = resumable_group(plaintext_cluster, target_cluster, unique, tmp_path)

    p, d = config.flows[0].source, config.flows[0].target
    failover = ["failover", "--config", str(config_file(config, tmp_path)), "--flow", f"{p}->{d}"]
    live = bed.consumer(target_cluster.client, group, {"enable.auto.commit": False})
    live.subscribe([f"{p}.{topic}"])
    try:
        for _ in range(120):
            if live.assignment():
                break
            live.poll(0.5)
        assert live.assignment(), "the live consumer never joined its group"
        capsys.readouterr()
        for forced in ([], ["--force"]):
            assert cli_main([*failover, *forced, "--profile-out", str(tmp_path / "p.json")]) == 1
            captured = capsys.readouterr()
            assert f"group '{group}' has 1 active member(s) on '{d}'" in captured.err, captured.err
            assert "step 2/4 translate groups: 0 group(s) translated, 1 refused" in captured.out, captured.out
            assert "step 4/4 publish profile: wrote" in captured.out, captured.out
            assert ClusterGroups(config.cluster(d)).committed(group) == {}
    finally:
        live.close()
