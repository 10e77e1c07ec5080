"""Checkpoints in object storage: infra makes (or takes) the bucket or container, lets each mirror's identity reach
its own prefixes only, and renders Spark's s3a and abfss settings with the pod's identity and no key."""

from __future__ import annotations

import copy
import json
import re

import pytest

from infra.azure.checkpoints import prefix_condition
from infra.settings import load_settings
from spark_app.config import ConfigError
from tests.infra.harness import ROOT, Run, run_values, set_config, stack_values, with_secrets

ACTIVE_ACTIVE = ROOT / "stacks" / "topologies" / "active-active.yaml"
DR = ROOT / "stacks" / "topologies" / "dr-msk-to-eventhubs.yaml"
BUCKET = "mirrorkit-checkpoints-example"
BUCKETS = {BUCKET: "us-east-1", f"{BUCKET}-eu-west-1": "eu-west-1"}  # active-active's, each in its site's region
SPARK_APP = "kubernetes:sparkoperator.k8s.io/v1beta2:SparkApplication"
ABFSS = "abfss://checkpoints@mirrorkitdr.dfs.core.windows.net/dr"
ACCOUNT = "mirrorkitdr.dfs.core.windows.net"
KEYS = ("access.key", "secret.key", "session.token", "account.key", "client.secret", "sas")


def spark_confs(run: Run) -> dict[str, dict[str, str]]:
    return {app.plain["metadata"]["name"]: app.plain["spec"]["sparkConf"] for app in run.of_type(SPARK_APP)}


def no_key_in(conf: dict[str, str]) -> None:
    assert not [k for k in conf if any(word in k.lower() for word in KEYS)]


def test_each_region_s_bucket_is_made_there_private_encrypted_and_protected(stack_runs):
    run = stack_runs["active-active"]
    providers = {f"{p.urn}::{p.name}-id": p.plain["region"] for p in run.of_type("pulumi:providers:aws")}
    buckets = {b.plain["bucket"]: b for b in run.of_type("aws:s3/bucket:Bucket")}
    assert {name: providers[b.provider or ""] for name, b in buckets.items()} == BUCKETS
    assert all(b.protect for b in buckets.values())
    blocks = run.of_type("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
    assert len(blocks) == len(BUCKETS)
    for block in blocks:
        assert all(
            block.plain[k]
            for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
        )
    encryption = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
    assert len(run.of_type(encryption)) == len(BUCKETS)


def test_each_mirror_role_reaches_only_its_own_checkpoint_prefixes(stack_runs):
    run = stack_runs["active-active"]
    policies = {
        p.name: json.loads(p.plain["policy"])
        for p in run.of_type("aws:iam/rolePolicy:RolePolicy")
        if p.name.endswith("-checkpoints")
    }
    expected = {
        "use1-mirror-checkpoints": (BUCKET, "eu-us"),
        "euw1-mirror-checkpoints": (f"{BUCKET}-eu-west-1", "us-eu"),
    }
    assert set(policies) == set(expected)
    for name, policy in policies.items():
        bucket, flow = expected[name]
        prefix = f"active-active/active-active/{flow}"
        objects, listing = policy["Statement"]
        assert objects["Resource"] == [f"arn:aws:s3:::{bucket}/{prefix}/*"]
        assert set(objects["Action"]) == {"s3:GetObject", "s3:PutObject", "s3:DeleteObject"}
        assert listing["Action"] == ["s3:ListBucket"] and listing["Resource"] == [f"arn:aws:s3:::{bucket}"]
        assert listing["Condition"] == {"StringLike": {"s3:prefix": [prefix, f"{prefix}/*"]}}


def test_s3a_signs_in_with_the_pods_identity_and_no_key(stack_runs):
    confs = spark_confs(stack_runs["active-active"])
    provider = "spark.hadoop.fs.s3a.aws.credentials.provider"
    assert confs["mirrorkit-active-active-use1"][provider].endswith(".ContainerCredentialsProvider")  # Pod Identity
    assert confs["mirrorkit-active-active-euw1"][provider].endswith(".WebIdentityTokenFileCredentialsProvider")  # IRSA
    assert {app: conf["spark.hadoop.fs.s3a.endpoint.region"] for app, conf in confs.items()} == {
        "mirrorkit-active-active-use1": "us-east-1",
        "mirrorkit-active-active-euw1": "eu-west-1",
    }
    for conf in confs.values():
        no_key_in(conf)


def test_an_existing_bucket_is_taken_not_made():
    values = copy.deepcopy(with_secrets(stack_values(ACTIVE_ACTIVE)))
    values["mirrorkit:mirror"]["checkpoint"]["existing"] = True
    run = run_values(values, stack="active-active")
    assert not run.of_type("aws:s3/bucket:Bucket")
    assert [p for p in run.of_type("aws:iam/rolePolicy:RolePolicy") if p.name.endswith("-checkpoints")]


def abfss_values() -> dict:
    values = copy.deepcopy(with_secrets(stack_values(DR)))
    values["mirrorkit:mirror"]["checkpoint"] = {"url": ABFSS, "resource_group": "rg-storage", "region": "westeurope"}
    values["mirrorkit:sites"][0]["azure"] = {"oidc_issuer_url": "https://oidc.eks.eu-west-1.amazonaws.com/id/X"}
    return values


def test_the_container_is_made_and_only_the_mirrors_prefix_is_granted():
    run = run_values(abfss_values(), stack="dr")
    (container,) = run.of_type("azure-native:storage:BlobContainer")
    assert container.protect and container.plain["containerName"] == "checkpoints"
    assert container.plain["accountName"] == "mirrorkitdr" and container.plain["publicAccess"] == "None"
    (grant,) = [r for r in run.of_type("azure-native:authorization:RoleAssignment") if "checkpoints" in r.name]
    scope = grant.plain["scope"]
    assert scope.endswith("/storageAccounts/mirrorkitdr/blobServices/default/containers/checkpoints")
    assert grant.plain["roleDefinitionId"].endswith("/ba92f5b4-2d11-453d-a403-e96b0029c9fe")  # Blob Data Contributor
    assert (
        grant.plain["conditionVersion"] == "2.0" and "StringStartsWith 'dr/dr/primary-dr/'" in grant.plain["condition"]
    )
    (app,) = run.of_type(SPARK_APP)
    assert grant.urn in app.dependencies
    conf = app.plain["spec"]["sparkConf"]
    assert conf[f"spark.hadoop.fs.azure.account.auth.type.{ACCOUNT}"] == "OAuth"
    assert conf[f"spark.hadoop.fs.azure.account.oauth.provider.type.{ACCOUNT}"] == (
        "org.apache.hadoop.fs.azurebfs.oauth2.WorkloadIdentityTokenProvider"
    )
    assert conf[f"spark.hadoop.fs.azure.account.oauth2.client.id.{ACCOUNT}"] == "client-euw1-entra-identity"
    assert conf[f"spark.hadoop.fs.azure.account.oauth2.token.file.{ACCOUNT}"].startswith("/var/run/secrets/")
    no_key_in(conf)


@pytest.mark.parametrize("scheme", ["s3a", "abfss"])
def test_object_storage_without_the_sites_cloud_identity_is_refused(scheme):
    values = abfss_values() if scheme == "abfss" else copy.deepcopy(with_secrets(stack_values(ACTIVE_ACTIVE)))
    if scheme == "abfss":
        del values["mirrorkit:sites"][0]["azure"]
        expected = r"sites\[0\]\.azure: missing; .*abfss"
    else:
        values = copy.deepcopy(with_secrets(stack_values(DR)))
        values["mirrorkit:mirror"]["checkpoint"] = {"url": "s3a://bucket-x/x"}
        values["mirrorkit:sites"][0].pop("aws")
        values["mirrorkit:placement"] = {"primary->dr": "euw1"}
        expected = r"sites\[0\]\.aws: missing; .*s3a"
    set_config(values)
    with pytest.raises(ConfigError, match=expected):
        load_settings()


BLOBS = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs"


def allows(condition: str, action: str, path: str | None = None, prefix: str | None = None) -> bool:
    """Evaluates the subset of Azure's ABAC condition language prefix_condition writes, for one request: an action
    (`read`, `list`, `write`, ...), the blob's path, or the listing's prefix. An attribute the request lacks compares
    false, as Azure's does."""
    sub = "Blob.List" if action == "list" else None
    action = "read" if action == "list" else action
    python = condition
    for old, new in (
        (rf"ActionMatches\{{'{BLOBS}/([a-z/]+)'\}}", r"(action == '\1')"),
        (r"SubOperationMatches\{'([A-Za-z.]+)'\}", r"(sub == '\1')"),
        (rf"@Resource\[{BLOBS}:path\] StringEquals ('[^']*')", r"eq(path, \1)"),
        (rf"@Resource\[{BLOBS}:path\] StringStartsWith ('[^']*')", r"starts(path, \1)"),
        (rf"@Request\[{BLOBS}:prefix\] StringEquals ('[^']*')", r"eq(prefix, \1)"),
        (rf"@Request\[{BLOBS}:prefix\] StringStartsWith ('[^']*')", r"starts(prefix, \1)"),
        (r"!\(", "not ("),
        (r"\bAND NOT\b", "and not"),
        (r"\bAND\b", "and"),
        (r"\bOR\b", "or"),
    ):
        python = re.sub(old, new, python)
    assert "@" not in python and "{" not in python, f"an unknown term is left: {python}"
    names = {
        "action": action,
        "sub": sub,
        "path": path,
        "prefix": prefix,
        "eq": lambda a, b: a is not None and a == b,
        "starts": lambda a, b: a is not None and a.startswith(b),
    }
    return bool(eval(python, {"__builtins__": {}}, names))  # noqa: S307  # the program's own condition text


def test_the_abfss_grant_reaches_the_checkpoint_root_and_its_listing_and_nothing_beside_it():
    condition = prefix_condition(["dr/dr/primary-dr", "dr/dr/other-dr"])
    root = "dr/dr/primary-dr"
    for action in ("read", "write", "delete", "add/action", "move/action"):
        assert allows(condition, action, path=root), f"{action} of the checkpoint root itself"
        assert allows(condition, action, path=f"{root}/offsets/0")
        assert not allows(condition, action, path="dr/dr/primary-dr2/offsets/0"), f"{action} beside the root"
        assert not allows(condition, action, path="dr/dr"), f"{action} above the root"
    assert allows(condition, "list", prefix=root) and allows(condition, "list", prefix=f"{root}/")
    assert allows(condition, "list", prefix=f"{root}/offsets/")
    assert not allows(condition, "list", prefix="dr/dr/primary-dr2")
    assert not allows(condition, "list", prefix="dr/")
    assert not allows(condition, "list")  # the whole container
    assert allows(condition, "write", path="dr/dr/other-dr/commits/1")


def test_a_deployment_in_one_region_keeps_its_one_bucket_as_the_url_names_it():
    values = copy.deepcopy(with_secrets(stack_values(DR)))
    values["mirrorkit:mirror"]["checkpoint"] = {"url": "s3a://bucket-x/x"}
    run = run_values(values, stack="dr")
    ((bucket, checkpoints),) = [
        (b.plain["bucket"], b.urn.rsplit("::", 1)[1]) for b in run.of_type("aws:s3/bucket:Bucket")
    ]
    assert (bucket, checkpoints) == ("bucket-x", "checkpoints-bucket")  # its name and URN of the first releases
    (config,) = run.result["configs"].values()
    assert "checkpoint_location: s3a://bucket-x/x/dr/primary-dr" in config
    assert spark_confs(run)["mirrorkit-dr-euw1"]["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"  # the site's


def test_without_per_region_every_regions_checkpoints_stay_in_the_urls_one_bucket_so_an_upgrade_moves_none():
    values = copy.deepcopy(with_secrets(stack_values(ACTIVE_ACTIVE)))
    del values["mirrorkit:mirror"]["checkpoint"]["per_region"]
    run = run_values(values, stack="active-active")
    assert [b.plain["bucket"] for b in run.of_type("aws:s3/bucket:Bucket")] == [BUCKET]
    for config in run.result["configs"].values():
        assert f"checkpoint_location: s3a://{BUCKET}/active-active/active-active/" in config, config
    confs = spark_confs(run)
    assert {conf["spark.hadoop.fs.s3a.endpoint.region"] for conf in confs.values()} == {"us-east-1"}, confs


def test_a_bucket_name_a_region_would_take_past_s3s_limit_is_refused_naming_the_key():
    values = copy.deepcopy(with_secrets(stack_values(ACTIVE_ACTIVE)))
    values["mirrorkit:mirror"]["checkpoint"]["url"] = f"s3a://{'b' * 54}/x"
    set_config(values)
    with pytest.raises(ConfigError, match=r"mirrorkit:mirror\.checkpoint\.url: site 'euw1' .* eu-west-1"):
        load_settings()
