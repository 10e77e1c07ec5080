"""The mirror's SCRAM user on an MSK cluster: a Secrets Manager secret MSK can read, and its association."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.naming import msk_scram_secret_name
from infra.schema import MskSpec


@dataclass(frozen=True)
class MskScramUserArgs:
    cluster: MskSpec
    alias: str
    password: pulumi.Output[str]  # secret
    stack: str  # the secret's name carries it, so stacks in one account do not collide


class MskScramUser(pulumi.ComponentResource):
    """MSK reads SCRAM users only from secrets named `AmazonMSK_...` and encrypted with a customer KMS key.

    SingleScramSecretAssociation adds this one secret; ScramSecretAssociation would replace every other user's.

    The secret is deleted at once, without a recovery window: a name in its window is still taken, so a destroy
    then up of the stack would fail to make it again, and nothing is lost (the password is in stack config).
    """

    def __init__(self, name: str, args: MskScramUserArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("mirrorkit:aws:MskScramUser", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        key = aws.kms.Key(
            f"{name}-key",
            description=f"mirrorkit SCRAM secret for MSK cluster {args.alias}",
            enable_key_rotation=True,
            opts=child,
        )
        secret = aws.secretsmanager.Secret(
            f"{name}-secret",
            name=msk_scram_secret_name(args.stack, args.alias),
            kms_key_id=key.arn,
            recovery_window_in_days=0,
            opts=child,
        )
        # Typed here: mypy cannot pick Output.secret's type parameter out of an Output argument on its own.
        value: pulumi.Output[str] = pulumi.Output.secret(
            args.password.apply(lambda p: json.dumps({"username": args.cluster.username, "password": p}))
        )
        aws.secretsmanager.SecretVersion(f"{name}-value", secret_id=secret.id, secret_string=value, opts=child)
        aws.msk.SingleScramSecretAssociation(
            f"{name}-association", cluster_arn=args.cluster.cluster_arn, secret_arn=secret.arn, opts=child
        )
        self.secret_arn = secret.arn
        self.register_outputs({"secret_arn": self.secret_arn})
