"""The errors that stop the mirror; the CLI prints each as one line naming what to fix."""

from __future__ import annotations

from .config import ClusterConfig, Profile


class MirrorFailed(RuntimeError):
    """The mirror cannot go on; the message says why and names the flow, cluster or topic."""


class ClusterUnreachable(MirrorFailed):
    """A cause that affects every topic: the mirror stops, naming the cluster."""

    def __init__(self, cluster: ClusterConfig, waited_s: float, detail: str) -> None:
        super().__init__(
            f"cluster '{cluster.alias}' ({cluster.bootstrap_servers}) is unreachable after {waited_s:.0f}s: {detail}"
        )


# What to check when a cluster refuses the mirror's login, by how it logs in.
_LOGIN_HINTS = {
    Profile.EVENTHUBS: "check the connection string its secret names",
    Profile.EVENTHUBS_ENTRA: "the broker refused the Entra ID token: check the workload identity's namespace role",
    Profile.MSK_SCRAM: "check its username and the password its secret names",
    Profile.MSK_IAM: "the broker refused the IAM token: check the role's kafka-cluster permissions and region",
    Profile.MTLS: "check its client certificate and key, and that the broker trusts their CA",
}


class AuthenticationFailed(ClusterUnreachable):
    def __init__(self, cluster: ClusterConfig) -> None:
        hint = _LOGIN_HINTS.get(cluster.profile, "check its credentials")
        MirrorFailed.__init__(
            self, f"authentication failed for cluster '{cluster.alias}' ({cluster.bootstrap_servers}): {hint}"
        )


class StateError(MirrorFailed):
    """The flow's state file is from another mirror version, or unreadable."""


class DeliveryFailed(MirrorFailed):
    """A batch could not be copied: the target refused records, or the source stopped answering."""


def first_cause(message: str) -> str:
    """The mirror's own error line out of a Py4J/Spark stack, when there is one."""
    for marker in (
        "MirrorFailed: ",
        "DeliveryFailed: ",
        "AuthenticationFailed: ",
        "SecretError: ",
        "OffsetOutOfRangeException: ",
    ):
        if marker in message:
            return marker + message.split(marker, 1)[1].splitlines()[0]
    return message.splitlines()[0] if message else "unknown error"
