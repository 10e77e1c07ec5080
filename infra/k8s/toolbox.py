"""The site's toolbox: the mirror's image, with the `mirrorkit` CLI as its entrypoint, ready in the site's own namespace
to run the operator verbs (`status`, `drill`, `failover`, `failback`) from the surviving region alone.

It is a suspended CronJob whose schedule never comes (February 31st), not a suspended Job: a Job runs once and its
pod template cannot change, so each verb would need a Job of its own made at deploy time, and a finished one cannot run
again. A CronJob is a template instead: each run is a Job made from it by hand (`kubectl create job --from=cronjob/...`,
docs/operations/failover.md), with the verb's arguments set in that Job, and its pod is the one rendered here (the
image by digest, restricted Pod Security, the toolbox's service account, its config and secrets). A run is never
retried by Kubernetes (`backoffLimit: 0`): a failover is run again by the operator, who reads what it printed.

Everything it mounts is made by the site's own stack in its own namespace: its config (the site's flows, the stopped
ones too, so stopping the flow of a lost region keeps what its failover needs), the Secrets the mirror signs in with,
and a scratch folder. It signs in to the clusters as the site's mirror does (the same Secrets, the same cloud identity
through its service account), so its grants are the site's identity's, which holds the verbs' own besides the mirror's
(`TOOLBOX_GRANTED`; spark_app.policy.operator_access). It mounts no flow's checkpoint location, so `adopt` and
`handback`, which read and write the flow's state there, refuse in it (`TOOLBOX_ENV`), unless a run mounts the
mirror's checkpoint PVC as the stack's `adopt` and `handback` commands do (`commands`). Its Role
lets it write one ConfigMap, the applications' connection profile, and nothing else. Its network policy lets it reach
DNS, the API server and the Kafka ports of the site's clusters, and the clouds' sign-in where the site's identity
needs it; nothing reaches it.

Objects are spelt in Kubernetes' own camelCase field names (infra.k8s.namespace's doc says why each call carries
`# type: ignore[call-overload]`).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from infra.azure.identity import TokenByHand
from infra.k8s.mirror_app import CONFIG_DIR, CONFIG_FILE, CONTAINER_SECURITY, POD_SECURITY, SCRATCH_DIR
from infra.k8s.namespace import site_egress
from infra.naming import CHECKPOINT_DIR, SECRETS_DIR
from spark_app.config import FlowConfig, parse_config
from spark_app.dr.adopt import TOOLBOX_MARK
from spark_app.dr.connection import TopicRoute, auth_profile
from spark_app.policy import replication_policy

# mypy 2.4 fails inside (INTERNAL ERROR, after taking over 20 GB of memory) checking a call of CronJob's overloads, so
# the class is called untyped; its fields are checked where every toolbox object is: tests/infra/test_toolbox*.py.
_cron_job: Any = k8s.batch.v1.CronJob

TOOLBOX = "mirrorkit-toolbox"  # the CronJob, its service account, Role, binding and network policy
TOOLBOX_CONFIG = f"{TOOLBOX}-config"
TOOLBOX_LABELS = {"app.kubernetes.io/name": TOOLBOX}  # not the mirror's: the mirror's network policy never selects it
CONTAINER = "toolbox"
ENTRYPOINT = "/opt/mirrorkit/venv/bin/mirrorkit"  # the CLI the image installs (pyproject's `mirrorkit` script)
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"
NEVER = "0 0 31 2 *"  # February 31st: with `suspend` besides, the CronJob never makes a Job of its own
CHECKPOINT_VOLUME = "checkpoints"  # the mirror's checkpoint claim, where a run of `adopt` or `handback` mounts it
PROFILE_CONFIGMAP = "kafka-connection"  # the applications' connection profile, unless the site names another
# What the toolbox may do to the profile's ConfigMap: server-side apply (and its dry run) of that one name.
PROFILE_VERBS = ["get", "create", "patch", "update"]


@dataclass(frozen=True)
class ProfileConfigMap:
    """Where `failover --publish-configmap` writes the applications' connection profile."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ToolboxArgs:
    namespace: pulumi.Input[str]  # the site's mirror namespace
    image: str  # the mirror's, by digest
    config_yaml: pulumi.Input[str]  # the site's flows (stopped ones too), secrets only referenced
    secret_names: Mapping[str, str]  # alias -> Kubernetes Secret in the namespace, mounted at SECRETS_DIR/<alias>
    kafka_ports: Sequence[int]  # of the clusters the site's flows name
    api_server_cidrs: Sequence[str]
    profile: ProfileConfigMap
    service_account_annotations: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)  # the site's identity
    pod_labels: Mapping[str, str] = field(default_factory=dict)  # e.g. Azure workload identity's opt-in label
    https_egress: bool = False  # Entra ID's token endpoint or STS: TCP 443 to anywhere
    pod_identity_agent: bool = False  # EKS Pod Identity's node-local agent
    token_by_hand: TokenByHand | None = None  # Entra ID sign-in where the workload identity webhook does not run
    image_pull_secrets: Sequence[str] = ()


# The site's identity (its Kafka ACLs, its IAM role) is granted what its mirror does and what the toolbox's verbs do
# besides (spark_app.policy.operator_access), as the toolbox signs in with it: `failover` commits the groups'
# translated offsets on the target; `drill` makes, writes and reads its probe topic and deletes its probe groups;
# `adopt` and `handback` read and write MirrorMaker 2's and Connect's topics. infra.topology passes this to every
# renderer of the identity's grants.
TOOLBOX_GRANTED = True
# Set in the toolbox's pod: `adopt` and `handback` refuse there, naming where to run them, since the pod mounts no
# flow's checkpoint location (the PVC is the mirror driver's; object storage is reached through Spark's settings).
TOOLBOX_ENV = {TOOLBOX_MARK: "1"}


def network_policy_spec(args: ToolboxArgs) -> dict[str, Any]:
    """Egress to DNS, the API server and the site's Kafka ports (as the mirror's is made: by port), and the clouds'
    sign-in where the site's identity needs it; no ingress at all."""
    egress = site_egress(args.api_server_cidrs, args.kafka_ports, args.https_egress, args.pod_identity_agent)
    return {"podSelector": {"matchLabels": TOOLBOX_LABELS}, "policyTypes": ["Ingress", "Egress"], "egress": egress}


def pod_spec(args: ToolboxArgs, account: pulumi.Input[str], config_map: pulumi.Input[str]) -> dict[str, Any]:
    """The toolbox's pod: `mirrorkit status` unless a run sets other arguments; restricted Pod Security."""
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": config_map}},
        {"name": "scratch", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "scratch", "mountPath": SCRATCH_DIR},
    ]
    for alias, secret in sorted(args.secret_names.items()):
        volumes.append({"name": f"secret-{alias}", "secret": {"secretName": secret}})
        mounts.append({"name": f"secret-{alias}", "mountPath": f"{SECRETS_DIR}/{alias}", "readOnly": True})
    env: list[dict[str, Any]] = [{"name": "HOME", "value": SCRATCH_DIR}]
    env += [{"name": k, "value": v} for k, v in TOOLBOX_ENV.items()]
    token = args.token_by_hand
    if token is not None:
        volumes.append(token.volume)
        mounts.append(token.mount)
        env += [{"name": k, "value": v} for k, v in token.env.items()]
    spec: dict[str, Any] = {
        "serviceAccountName": account,
        "restartPolicy": "Never",
        "securityContext": POD_SECURITY,
        "containers": [
            {
                "name": CONTAINER,
                "image": args.image,
                "imagePullPolicy": "IfNotPresent",
                "command": [ENTRYPOINT],
                "args": ["status", "--config", CONFIG_PATH],
                "env": env,
                "securityContext": CONTAINER_SECURITY,
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
                "volumeMounts": mounts,
            }
        ],
        "volumes": volumes,
    }
    if args.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in args.image_pull_secrets]
    return spec


def verb_args(verb: str, *extra: str) -> list[str]:
    """A verb's arguments as the toolbox's container takes them: the config it mounts, then the verb's own."""
    return [verb, "--config", CONFIG_PATH, *extra]


def _kubectl(namespace: str, context: str | None) -> str:
    return "kubectl" + (f" --context {shlex.quote(context)}" if context else "") + f" -n {shlex.quote(namespace)}"


def create_command(
    namespace: str, args: Sequence[str], context: str | None = None, checkpoint_claim: str | None = None
) -> str:
    """The shell command that makes Job `$JOB` from the CronJob, with these arguments: set in the Job before it is
    created, as kubectl takes no command beside `--from`. With `checkpoint_claim`, the Job also mounts that claim (the
    mirror's checkpoint PVC) where the driver does, so `adopt` and `handback` reach the flows' state."""
    kubectl = _kubectl(namespace, context)
    create = f'{kubectl} create job "$JOB" --from=cronjob/{TOOLBOX}'
    if list(args) == verb_args("status") and checkpoint_claim is None:
        return create
    patch: list[dict[str, Any]] = [
        {"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": list(args)}
    ]
    if checkpoint_claim is not None:
        volume = {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": checkpoint_claim}}
        patch += [
            {"op": "add", "path": "/spec/template/spec/volumes/-", "value": volume},
            {
                "op": "add",
                "path": "/spec/template/spec/containers/0/volumeMounts/-",
                "value": {"name": CHECKPOINT_VOLUME, "mountPath": CHECKPOINT_DIR},
            },
        ]
    return (
        f"{create} --dry-run=client -o json"
        f" | {kubectl} patch --local -f - --type=json -o json -p {shlex.quote(json.dumps(patch))}"
        f" | {kubectl} create -f -"
    )


def run_command(
    namespace: str, job: str, args: Sequence[str], context: str | None = None, checkpoint_claim: str | None = None
) -> str:
    """The shell command that runs the toolbox once with these arguments and shows what it prints: Job `job` made
    from the CronJob (create_command, mounting `checkpoint_claim` when given), then its log followed to the end. `job`
    may hold a shell expansion, such as `$(date +%s)`."""
    follow = f'{_kubectl(namespace, context)} logs -f --pod-running-timeout=10m "job/$JOB"'
    return f"JOB={job} && {create_command(namespace, args, context, checkpoint_claim)} && {follow}"


def commands(
    namespace: str,
    context: str | None,
    flows: Sequence[FlowConfig],
    profile: ProfileConfigMap,
    checkpoint_claim: str | None = None,
) -> dict[str, Any]:
    """What an operator runs from the site with kubectl alone: `status`, and per flow its failover's dry run and
    the failover itself, which publishes the applications' profile to `profile`. Where the site's checkpoints are on
    a PVC (`checkpoint_claim`), per flow also `adopt` and `handback`, in a Job that mounts it (run while the mirror is
    stopped: the volume is ReadWriteOnce, and both verbs want the mirror's state to themselves); a checkpoint in
    object storage is reached only with the mirror's Spark settings, which the toolbox does not have."""

    def job(verb: str) -> str:
        return f"{TOOLBOX}-{verb}-$(date +%s)"

    def run(verb: str, *extra: str, claim: str | None = None) -> str:
        return run_command(namespace, job(verb), verb_args(verb, *extra), context, claim)

    found: dict[str, Any] = {
        "status": run("status"),
        "failover_dry_run": {f.name: run("failover", "--flow", f.name, "--dry-run") for f in flows},
        "failover": {f.name: run("failover", "--flow", f.name, "--publish-configmap", str(profile)) for f in flows},
    }
    if checkpoint_claim is not None:
        for verb in ("adopt", "handback"):
            found[verb] = {f.name: run(verb, "--flow", f.name, claim=checkpoint_claim) for f in flows}
    return found


def profile_pieces(config_yaml: str) -> dict[str, Any]:
    """Per flow of the toolbox's config, what the applications' connection profile after its failover holds that the
    config alone tells (spark_app.dr.connection): the target, its bootstrap servers, how a client signs in there
    (where the kit's config finds the credential, never the credential), the naming policy, and each source topic's
    copy for a literal topic list (for patterns, `failover` lists the copies it finds on the target)."""
    config = parse_config(yaml.safe_load(config_yaml), source="toolbox config")
    pieces: dict[str, Any] = {}
    for flow in config.flows:
        target = config.cluster(flow.target)
        names = flow.topics.literal_names()
        policy = replication_policy(flow)
        pieces[flow.name] = {
            "cluster": target.alias,
            "bootstrap_servers": target.bootstrap_servers,
            "auth": dataclasses.asdict(auth_profile(target)),
            "replication_policy": flow.replication_policy,
            "topics": None
            if names is None
            else [dataclasses.asdict(TopicRoute(t, policy.target_topic(t))) for t in sorted(names)],
            "topic_patterns": [] if names is not None else list(flow.topics.include),
        }
    return pieces


class Toolbox(pulumi.ComponentResource):
    """The toolbox of one site: its service account, config, Role on the profile's ConfigMap, network policy and the
    suspended CronJob that runs the CLI."""

    def __init__(self, name: str, args: ToolboxArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("mirrorkit:k8s:Toolbox", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        ns = args.namespace
        account = k8s.core.v1.ServiceAccount(
            f"{name}-sa",
            metadata={
                "name": TOOLBOX,
                "namespace": ns,
                "labels": TOOLBOX_LABELS,
                "annotations": dict(args.service_account_annotations),
            },
            opts=child,
        )
        config_map = k8s.core.v1.ConfigMap(
            f"{name}-config",
            metadata={"name": TOOLBOX_CONFIG, "namespace": ns, "labels": TOOLBOX_LABELS},
            data={CONFIG_FILE: args.config_yaml},
            opts=child,
        )
        profile = args.profile
        role = k8s.rbac.v1.Role(  # type: ignore[call-overload]  # camelCase fields (module doc)
            f"{name}-profile",
            metadata={"name": TOOLBOX, "namespace": profile.namespace, "labels": TOOLBOX_LABELS},
            rules=[
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": [profile.name],
                    "verbs": PROFILE_VERBS,
                }
            ],
            opts=child,
        )
        k8s.rbac.v1.RoleBinding(  # type: ignore[call-overload]  # camelCase fields (module doc)
            f"{name}-profile",
            metadata={"name": TOOLBOX, "namespace": profile.namespace, "labels": TOOLBOX_LABELS},
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role.metadata.name},
            subjects=[{"kind": "ServiceAccount", "name": account.metadata.name, "namespace": ns}],
            opts=child,
        )
        k8s.networking.v1.NetworkPolicy(  # type: ignore[call-overload]  # camelCase fields (module doc)
            f"{name}-egress",
            metadata={"name": TOOLBOX, "namespace": ns, "labels": TOOLBOX_LABELS},
            spec=network_policy_spec(args),
            opts=child,
        )
        labels = {**args.pod_labels, **TOOLBOX_LABELS}
        spec: dict[str, Any] = {
            "schedule": NEVER,
            "suspend": True,
            "concurrencyPolicy": "Forbid",
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "metadata": {"labels": TOOLBOX_LABELS},
                "spec": {
                    "backoffLimit": 0,
                    "ttlSecondsAfterFinished": 7 * 24 * 3600,  # its log is the verb's record: kept a week
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": pod_spec(args, account.metadata.name, config_map.metadata.name),
                    },
                },
            },
        }
        cron = _cron_job(
            f"{name}-cronjob",
            metadata={"name": TOOLBOX, "namespace": ns, "labels": TOOLBOX_LABELS},
            spec=spec,
            opts=child,
        )
        self.name = cron.metadata.name
        self.service_account = account.metadata.name
        self.config_map = config_map.metadata.name
        self.register_outputs(
            {"name": self.name, "service_account": self.service_account, "config_map": self.config_map}
        )
