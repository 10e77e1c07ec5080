"""Mirror configs that point at test-bed clusters, with secrets in files as a Kubernetes Secret mount would give."""

from __future__ import annotations

import socket
from pathlib import Path

from .kafka_cluster import KafkaCluster, ListenerKind


def cluster_entry(cluster: KafkaCluster, alias: str) -> dict:
    """The `clusters[]` entry for a test-bed cluster; the secret goes to a 0600 file next to the broker's."""
    entry: dict = {"alias": alias, "bootstrap_servers": cluster.client.bootstrap}
    if cluster.kind is ListenerKind.PLAINTEXT:
        return entry | {"profile": "kafka"}
    secret = Path(cluster.folder) / f"secret-{alias}"
    secret.write_text(cluster.client.password)
    secret.chmod(0o600)
    entry |= {"password": {"file": str(secret)}, "ca_file": str(cluster.tls.ca_pem)}
    if cluster.kind is ListenerKind.EVENTHUBS:
        return entry | {"profile": "eventhubs"}
    return entry | {"profile": "msk-scram", "username": cluster.client.username}


def free_port() -> int:
    """A loopback port free right now, for a mirror's `metrics_port` (the config asks for a real port number)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
