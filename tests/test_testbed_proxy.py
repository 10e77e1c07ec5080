"""The test bed's proxied clusters: clients reach every kind of cluster through Toxiproxy alone, and its faults break
that path and nothing else."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from confluent_kafka import KafkaException

from bench.testbed import clients, toxiproxy
from bench.testbed.clients import Record, create_placed_topics, create_topics, produce, read_all
from bench.testbed.toxiproxy import Stream, Toxic, ToxiproxyServer
from tests.support.assertions import assert_each_record_once_in_order

CLUSTERS = ["plaintext_cluster", "source_cluster", "target_cluster", "multi_broker_cluster"]


def records(count: int, partitions: int, tag: str) -> list[Record]:
    now = int(time.time() * 1000)
    return [Record(i % partitions, f"k{i}".encode(), f"{tag}-{i}".encode(), (("n", str(i).encode()),), now + i)
            for i in range(count)]  # fmt: skip


@pytest.mark.parametrize("cluster_name", CLUSTERS)
def test_each_cluster_kind_advertises_only_its_proxies_and_round_trips_records_exactly_through_them(
    cluster_name, request, unique
):
    cluster = request.getfixturevalue(cluster_name)
    topic = f"proxied-{unique}"
    if cluster_name == "multi_broker_cluster":
        create_placed_topics(cluster.admin, {topic: [1, 2]})  # one partition behind each broker's proxy
    else:
        create_topics(cluster.admin, {topic: 2})
    brokers = clients.admin(cluster.proxied).list_topics(timeout=15).brokers.values()
    assert {(b.host, b.port) for b in brokers} == {("127.0.0.1", p.port) for p in cluster.faults.proxies}

    sent = records(500, 2, "proxied")
    produce(cluster.proxied, topic, sent)
    assert_each_record_once_in_order(topic, read_all(cluster.proxied, topic, expected=len(sent)), sent)


@pytest.mark.parametrize("cluster_name", ["plaintext_cluster", "target_cluster"])
def test_a_cut_fails_the_proxied_clients_metadata_while_the_direct_client_works_and_heal_restores_it(
    cluster_name, request, unique
):
    cluster = request.getfixturevalue(cluster_name)
    topic = f"cut-{unique}"
    create_topics(cluster.admin, {topic: 1})
    proxied, direct = clients.admin(cluster.proxied), clients.admin(cluster.client)
    assert proxied.list_topics(timeout=15).brokers
    cluster.faults.cut()
    try:
        assert [p.enabled for p in cluster.faults.proxies] == [False]
        with pytest.raises(KafkaException):
            proxied.list_topics(timeout=5)
        assert direct.list_topics(timeout=15).brokers
    finally:
        cluster.faults.heal()
    deadline = time.monotonic() + 60
    while True:  # the same client, once its reconnect backoff lets it try again
        try:
            assert proxied.list_topics(timeout=5).brokers
            break
        except KafkaException:
            assert time.monotonic() < deadline, "the proxied client did not get metadata again after the heal"
            time.sleep(0.2)
    sent = records(10, 1, "healed")
    produce(cluster.proxied, topic, sent)
    assert_each_record_once_in_order(topic, read_all(cluster.proxied, topic, expected=len(sent)), sent)


def test_a_latency_toxic_is_in_place_on_every_brokers_proxy_and_records_still_flow_through_it(
    multi_broker_cluster, unique
):
    cluster, topic = multi_broker_cluster, f"slow-{unique}"
    create_placed_topics(cluster.admin, {topic: [1, 2]})
    cluster.faults.latency(200, jitter_ms=50)
    try:
        toxic = Toxic("latency_downstream", "latency", Stream.DOWNSTREAM, 1.0, {"latency": 200, "jitter": 50})
        assert cluster.faults.toxics() == {"multi-1": [toxic], "multi-2": [toxic]}
        sent = records(200, 2, "slow")
        produce(cluster.proxied, topic, sent)
        assert_each_record_once_in_order(topic, read_all(cluster.proxied, topic, expected=len(sent)), sent)
    finally:
        cluster.faults.heal()
    assert cluster.faults.toxics() == {"multi-1": [], "multi-2": []}


def test_a_missing_toxiproxy_server_fails_naming_the_setup_command(tmp_path, monkeypatch):
    monkeypatch.setattr(toxiproxy, "SERVER", tmp_path / "toxiproxy-server")
    with pytest.raises(RuntimeError, match=r"toxiproxy-server is missing: run `bash \.ci/setup`"):
        ToxiproxyServer(tmp_path).start()


def test_a_busy_servers_503_is_asked_again_for_a_read_or_a_delete_and_a_delete_done_the_first_time_is_done():
    """Toxiproxy ends a call it cannot serve in time with 503 (Go's timeout handler), as on a machine loaded by the
    nemesis: a long run died on one while healing. A GET or DELETE is asked again; a POST is not (it may have been
    done); a DELETE that finds its object gone on the retry had done its work."""
    answers: list[int] = []

    class Busy(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            status = answers.pop(0)
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"[]" if status == 200 else b"no")

        do_GET = do_DELETE = do_POST = _answer  # noqa: N815 (http.server's names)

        def log_message(self, *args) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_port
    try:
        answers[:] = [503, 503, 200]
        assert toxiproxy.call(port, "GET", "/proxies/p/toxics") == [] and answers == []
        answers[:] = [503, 404]
        assert toxiproxy.call(port, "DELETE", "/proxies/p/toxics/t") is None and answers == []
        answers[:] = [503]
        with pytest.raises(toxiproxy.ToxiproxyError, match="HTTP 503"):
            toxiproxy.call(port, "POST", "/proxies", {"name": "p"})
        answers[:] = [404]
        with pytest.raises(toxiproxy.ToxiproxyError, match="HTTP 404"):
            toxiproxy.call(port, "DELETE", "/proxies/p/toxics/t")  # gone before any retry: the caller's mistake
    finally:
        server.shutdown()
