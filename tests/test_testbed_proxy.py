"""The test bed's proxied clusters: clients reach every kind of cluster through Toxiproxy alone, and its faults break
that path and nothing else."""

from __future__ import annotations

import json
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


class StandIn:
    """The API calls of a Toxiproxy server, answered by a fake on `port` in place of the real server."""

    def __init__(self, port: int) -> None:
        self.port = port

    def request(self, method: str, path: str, body: dict[str, object] | None = None) -> object:
        return toxiproxy.call(self.port, method, path, body)


def test_a_heal_that_cannot_remove_a_toxic_in_time_closes_the_proxys_connections_and_then_removes_it(monkeypatch):
    """A stalled peer holds a toxic's stream, and the server answers each removal with 503 until the stream lets go: a
    long run died healing one. Past HEAL_WAIT_S the heal closes the proxy's connections, then the removal goes on."""
    calls: list[str] = []
    state = {"toxics": ["latency_downstream"], "enabled": True}

    class Stalled(BaseHTTPRequestHandler):
        def _reply(self, status: int, body: object = None) -> None:
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's names)
            toxic = {"type": "latency", "stream": "downstream", "toxicity": 1.0, "attributes": {"latency": 400}}
            self._reply(200, [toxic | {"name": name} for name in state["toxics"]])

        def do_DELETE(self) -> None:  # noqa: N802
            calls.append("DELETE")
            if state["enabled"]:
                self._reply(503, "timeout")
            else:
                state["toxics"].clear()
                self._reply(204)

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state["enabled"] = body["enabled"]
            calls.append(f"enabled={body['enabled']}")
            self._reply(200, {"name": "p", "enabled": body["enabled"]})

        def log_message(self, *args) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Stalled)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(toxiproxy, "HEAL_WAIT_S", 0.0)
    monkeypatch.setattr(toxiproxy, "BUSY_RETRIES", 0)
    try:
        toxiproxy.Proxy(StandIn(server.server_port), "p", "127.0.0.1:1").heal()
    finally:
        server.shutdown()
    assert calls == ["DELETE", "enabled=False", "DELETE", "enabled=True"], calls
    assert state == {"toxics": [], "enabled": True}
