"""A stack cluster becomes spark_app's ClusterConfig: the profile its platform and auth mean, its secrets as files
mounted from its Kubernetes Secret, and the credentials the stack must set for it."""

from __future__ import annotations

from typing import Any

import pytest

from infra.clusters import PENDING_BOOTSTRAP, cluster_config
from infra.schema import ClusterSpec
from spark_app.config import ClusterConfig, Profile, SecretRef

ARN = "arn:aws:kafka:eu-west-1:111111111111:cluster/dr/abc-1"
MSK = {
    "cluster_arn": ARN,
    "vpc_id": "vpc-0a",
    "cidr": "10.0.0.0/16",
    "route_table_ids": ["rtb-0a"],
    "security_group_id": "sg-0a",
}
EVENTHUBS = {"namespace": "mirrorkit-dr", "resource_group": "rg", "tier": "Premium"}
SELF_MANAGED = {"bootstrap_servers": "k0.dc1:9093,k1.dc1:9093", "ca_file": "/etc/ssl/ca.pem"}
SECRETS = "/etc/mirrorkit/secrets/c"


def spec(platform: str, **fields: Any) -> ClusterSpec:
    base = {"eventhubs": EVENTHUBS, "msk": MSK, "kafka": SELF_MANAGED}[platform]
    return ClusterSpec.model_validate(
        {"alias": "c", "region": "eu-west-1", platform: base | fields, "client_overrides": {"linger.ms": "20"}}
    )


def expected(**fields: Any) -> ClusterConfig:
    return ClusterConfig(alias="c", client_overrides={"linger.ms": "20"}, **fields)


def test_event_hubs_with_sas_signs_in_with_the_connection_string_file():
    assert cluster_config(spec("eventhubs")) == expected(
        bootstrap_servers="mirrorkit-dr.servicebus.windows.net:9093",
        profile=Profile.EVENTHUBS,
        password=SecretRef(file=f"{SECRETS}/password"),
    )
    assert spec("eventhubs").credential_keys() == ()  # the program makes the connection string itself


def test_event_hubs_with_local_auth_off_signs_in_with_entra_and_no_secret():
    assert cluster_config(spec("eventhubs", disable_local_auth=True)) == expected(
        bootstrap_servers="mirrorkit-dr.servicebus.windows.net:9093", profile=Profile.EVENTHUBS_ENTRA
    )
    assert spec("eventhubs", disable_local_auth=True).credential_keys() == ()


def test_event_hubs_through_geo_dr_reaches_the_alias():
    geo = spec("eventhubs", geo_dr={"alias": "mirrorkit-dr-alias", "partner_namespace_id": "/ns/p"})
    assert cluster_config(geo).bootstrap_servers == "mirrorkit-dr-alias.servicebus.windows.net:9093"


def test_msk_scram_signs_in_as_its_user_with_the_password_file_on_9096():
    assert cluster_config(spec("msk", auth="scram", username="dr-mirror")) == expected(
        bootstrap_servers=f"{PENDING_BOOTSTRAP}:9096",
        profile=Profile.MSK_SCRAM,
        username="dr-mirror",
        password=SecretRef(file=f"{SECRETS}/password"),
    )
    assert spec("msk", auth="scram").credential_keys() == ("password",)


def test_msk_iam_signs_in_with_the_pods_role_in_the_clusters_region_on_9098():
    assert cluster_config(spec("msk", auth="iam")) == expected(
        bootstrap_servers=f"{PENDING_BOOTSTRAP}:9098", profile=Profile.MSK_IAM, region="eu-west-1"
    )
    assert spec("msk", auth="iam").credential_keys() == ()


def test_msk_tls_is_mutual_tls_with_the_certificate_files_on_9094():
    assert cluster_config(spec("msk", auth="tls")) == expected(
        bootstrap_servers=f"{PENDING_BOOTSTRAP}:9094",
        profile=Profile.MTLS,
        client_cert_file=f"{SECRETS}/client_cert",
        client_key=SecretRef(file=f"{SECRETS}/client_key"),
    )
    assert spec("msk", auth="tls").credential_keys() == ("client_cert", "client_key")


def test_self_managed_without_auth_is_plain_kafka():
    assert cluster_config(spec("kafka")) == expected(
        bootstrap_servers="k0.dc1:9093,k1.dc1:9093", profile=Profile.KAFKA, ca_file="/etc/ssl/ca.pem"
    )
    assert spec("kafka").credential_keys() == ()


def test_self_managed_tls_is_server_tls_alone_and_takes_no_client_certificate():
    assert cluster_config(spec("kafka", auth="tls")) == expected(
        bootstrap_servers="k0.dc1:9093,k1.dc1:9093", profile=Profile.KAFKA, tls=True, ca_file="/etc/ssl/ca.pem"
    )
    assert spec("kafka", auth="tls").credential_keys() == ()


def test_self_managed_scram_is_sasl_ssl_scram_as_its_user():
    assert cluster_config(spec("kafka", auth="scram", username="mirror")) == expected(
        bootstrap_servers="k0.dc1:9093,k1.dc1:9093",
        profile=Profile.MSK_SCRAM,
        ca_file="/etc/ssl/ca.pem",
        username="mirror",
        password=SecretRef(file=f"{SECRETS}/password"),
    )
    assert spec("kafka", auth="scram", username="mirror").credential_keys() == ("password",)


def test_self_managed_scram_without_a_user_is_refused_at_its_key():
    with pytest.raises(ValueError, match="username: give the mirror's SCRAM user"):
        spec("kafka", auth="scram")


def test_self_managed_mtls_presents_the_certificate_files():
    assert cluster_config(spec("kafka", auth="mtls")) == expected(
        bootstrap_servers="k0.dc1:9093,k1.dc1:9093",
        profile=Profile.MTLS,
        ca_file="/etc/ssl/ca.pem",
        client_cert_file=f"{SECRETS}/client_cert",
        client_key=SecretRef(file=f"{SECRETS}/client_key"),
    )
    with_acls = spec("kafka", auth="mtls", acls={"principal": "User:CN=mirror"})
    assert with_acls.credential_keys() == ("client_cert", "client_key", "admin_client_cert", "admin_client_key")
