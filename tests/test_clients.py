"""The Kafka client module's rules that need no broker: which errors mean the credentials were refused."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from spark_app.clients import auth_error_callback
from spark_app.config import ClusterConfig
from spark_app.errors import AuthenticationFailed

CLUSTER = ClusterConfig(alias="dr", bootstrap_servers="127.0.0.1:9093", profile="kafka")


def test_a_refused_password_raises_naming_the_cluster_but_never_the_secret():
    on_error = auth_error_callback(CLUSTER)
    for code, reason in (
        (KafkaError._AUTHENTICATION, "SASL authentication error: Authentication failed: Invalid username or password"),
        (KafkaError.SASL_AUTHENTICATION_FAILED, "Authentication failed during authentication due to invalid creds"),
    ):
        with pytest.raises(AuthenticationFailed, match=r"authentication failed for cluster 'dr' \(127.0.0.1:9093\)"):
            on_error(KafkaError(code, reason))


def test_a_connection_lost_during_the_sasl_handshake_is_not_a_refusal():
    """Seen while a consumer closed during a reconnect: librdkafka reports it as _AUTHENTICATION."""
    on_error = auth_error_callback(CLUSTER)
    on_error(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: SaslAuthenticateRequest failed: Local:"
                        " Broker transport failure (after 0ms in state DOWN)"))  # fmt: skip
    on_error(KafkaError(KafkaError._TRANSPORT, "Connection refused"))
    on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "2/2 brokers are down"))
