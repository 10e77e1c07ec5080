"""Checkpoints in S3: the bucket (made private, encrypted and protected, or taken as it is), the mirror role's
access to its own prefixes, and Spark's s3a settings that sign in with the pod's identity."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.schema import AwsSite

# AWS SDK v2 providers, which hadoop-aws 3.5 takes as they are: EKS Pod Identity serves credentials from the
# node's agent (the container credentials endpoint), IRSA from the projected web identity token.
POD_IDENTITY_PROVIDER = "software.amazon.awssdk.auth.credentials.ContainerCredentialsProvider"
IRSA_PROVIDER = "software.amazon.awssdk.auth.credentials.WebIdentityTokenFileCredentialsProvider"


@dataclass(frozen=True)
class CheckpointBucketArgs:
    bucket: str
    existing: bool  # take it as it is: no resource, so Pulumi never changes or deletes it
    protect: bool


class CheckpointBucket(pulumi.ComponentResource):
    """The bucket the mirrors' checkpoints live in: no public access, encrypted at rest, protected from deletion."""

    def __init__(self, name: str, args: CheckpointBucketArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("mirrorkit:aws:CheckpointBucket", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.bucket: pulumi.Output[str] = pulumi.Output.from_input(args.bucket)
        if not args.existing:
            bucket = aws.s3.Bucket(
                f"{name}-bucket",
                bucket=args.bucket,
                opts=pulumi.ResourceOptions(parent=self, protect=args.protect, retain_on_delete=args.protect),
            )
            aws.s3.BucketPublicAccessBlock(
                f"{name}-private",
                bucket=bucket.id,
                block_public_acls=True,
                block_public_policy=True,
                ignore_public_acls=True,
                restrict_public_buckets=True,
                opts=child,
            )
            aws.s3.BucketServerSideEncryptionConfiguration(
                f"{name}-encryption",
                bucket=bucket.id,
                rules=[
                    aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                        apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                            sse_algorithm="AES256"
                        )
                    )
                ],
                opts=child,
            )
            self.bucket = bucket.bucket
        self.register_outputs({"bucket": self.bucket})


def checkpoint_policy(bucket: str, prefixes: Sequence[str]) -> dict[str, Any]:
    """Read, write and delete under the mirror's own checkpoint prefixes, and list only there."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:DeleteObject", "s3:GetObject", "s3:PutObject"],
                "Resource": [f"arn:aws:s3:::{bucket}/{p}/*" for p in sorted(prefixes)],
            },
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{bucket}"],
                "Condition": {"StringLike": {"s3:prefix": [k for p in sorted(prefixes) for k in (p, f"{p}/*")]}},
            },
        ],
    }


def s3a_conf(site: AwsSite, region: str) -> dict[str, str]:
    """Spark's s3a settings for a site's pods: the pod's identity, never a key."""
    provider = IRSA_PROVIDER if site.oidc_provider_arn is not None else POD_IDENTITY_PROVIDER
    return {
        "spark.hadoop.fs.s3a.aws.credentials.provider": provider,
        "spark.hadoop.fs.s3a.endpoint.region": region,
    }
