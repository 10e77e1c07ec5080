"""The mirror as a Kubernetes application: its rendered config, the SparkApplication running the image, and its
alerting rules.

Objects are spelt in Kubernetes' own camelCase field names, as the API reference and the policy pack read them.
pulumi-kubernetes sends such dicts unchanged, but its type hints describe only its snake_case keys; each call that
passes one carries `# type: ignore[call-overload]` for that reason alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.azure.identity import TokenByHand
from infra.k8s.dashboard import dashboard
from infra.k8s.labels import APP_LABELS
from infra.k8s.series import (
    CHECKPOINT_AGE_METRIC,
    DR_UNUSABLE_METRIC,
    ERRORS_METRIC,
    HEARTBEAT_AGE_METRIC,
    LAG_METRIC,
    LAST_BATCH_METRIC,
    RECORDS_METRIC,
)
from infra.naming import CHECKPOINT_DIR, SECRETS_DIR
from infra.schema import Alerts, CheckpointStore, ExecutorResources, Resources
from spark_app.config import SPARK_DEFAULTS, STOP_GRACE_S, spark_jvm_conf

CONFIG_DIR = "/etc/mirrorkit/config"
CONFIG_FILE = "mirror.yaml"
# The operator resubmits an application when its spec changes, not when a mounted ConfigMap does: the rendered
# config's hash in the spec makes a config edit restart the mirror.
CONFIG_HASH_ANNOTATION = "mirrorkit.io/config-sha256"
# Likewise for the credentials: a rotated secret changes its Kubernetes Secret, which the mounted files follow but
# the running mirror's clients read once, at start, so the Secrets' versions are in the spec too. Hashed from each
# Secret's resourceVersion (the API server's counter of its writes), never from its values: a hash of the values,
# on a pod anyone may read, would let them test guesses of a weak password offline; a version carries nothing of
# them.
SECRETS_HASH_ANNOTATION = "mirrorkit.io/secrets-version-sha256"
MAIN_FILE = "local:///opt/mirrorkit/main.py"  # images/mirror/main.py: `python -m spark_app` under spark-submit
ALERT_METRICS = (
    RECORDS_METRIC,
    LAG_METRIC,
    CHECKPOINT_AGE_METRIC,
    HEARTBEAT_AGE_METRIC,
    LAST_BATCH_METRIC,
    ERRORS_METRIC,
    DR_UNUSABLE_METRIC,
)
# Restricted Pod Security: the image runs as its non-root user 185 (images/mirror/Dockerfile), on a read-only root;
# what Spark and Python write goes to /tmp and Spark's local dirs, each an emptyDir.
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 185, "fsGroup": 185, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
}
SCRATCH_DIR = "/tmp"
# Spark's own authentication and encryption between the driver and its executors. On Kubernetes Spark makes a secret
# for each application and gives it to the executor pods itself (SecurityManager; `_SPARK_AUTH_SECRET` in their
# environment): every RPC and block transfer between them is then authenticated (and, with the second key, AES
# encrypted), and the real-time slots derive their report channel's key from that secret instead of carrying one in
# their tasks (spark_app.channel). Set after every other key, so nothing turns them off.
SPARK_SECURITY = {"spark.authenticate": "true", "spark.network.crypto.enabled": "true"}
# `pulumi up` waits until the operator reports the application running, and fails when it does not within the
# timeout: otherwise it is green while the mirror never starts (pulumi-kubernetes' await annotations, v4.18 and later).
AWAIT_RUNNING = {
    "pulumi.com/waitFor": "jsonpath={.status.applicationState.state}=RUNNING",
    "pulumi.com/timeoutSeconds": "900",
}
# Spark's own driver NetworkPolicy (spark-submit 4.2 makes one per application) is left out: the stack's policy is
# the one (infra.k8s.namespace), and the operator's RBAC may not make NetworkPolicies, so that step fails the
# submission.
EXCLUDED_DRIVER_STEPS = "org.apache.spark.deploy.k8s.features.NetworkPolicyFeatureStep"


@dataclass(frozen=True)
class MirrorApplicationArgs:
    namespace: pulumi.Input[str]
    service_account: pulumi.Input[str]  # the driver's: it makes the executor pods
    executor_service_account: pulumi.Input[str]  # the executors': no Kubernetes rights at all
    image: str
    spark_version: str
    # spark_app MirrorConfig.to_yaml(); secrets only referenced. None: every flow of the site is stopped, so no
    # ConfigMap and no SparkApplication; the checkpoint PVC stays with the flows' state.
    config_yaml: pulumi.Input[str] | None
    secret_names: Mapping[str, str]  # alias -> Kubernetes Secret, mounted at SECRETS_DIR/<alias>
    driver: Resources
    executor: ExecutorResources
    checkpoint: CheckpointStore
    metrics_port: int
    monitoring: bool
    alerts: Alerts
    monitoring_namespace: str = "monitoring"  # where Grafana's dashboard sidecar looks
    # kube-prometheus-stack's Prometheus selects PodMonitors and rules by its release label, and ignores the rest.
    monitoring_labels: Mapping[str, str] = field(default_factory=lambda: {"release": "kube-prometheus-stack"})
    dashboard_labels: Mapping[str, str] = field(default_factory=lambda: {"grafana_dashboard": "1"})  # the sidecar's
    pod_labels: Mapping[str, str] = field(default_factory=dict)  # e.g. Azure workload identity's opt-in label
    # What must exist before the first submission: the operator (its CRD and webhook), pod identity associations,
    # role assignments and policies; without them the first driver starts unable to sign in.
    depends_on: Sequence[pulumi.Resource] = ()
    spark_conf: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)  # e.g. object storage sign-in
    image_pull_secrets: Sequence[str] = ()  # Secrets in the namespace the image is pulled with, on every pod
    # Entra ID sign-in where Azure workload identity's webhook does not run: the token and AZURE_* on every pod.
    token_by_hand: TokenByHand | None = None
    protect: bool = True  # the checkpoint PVC holds the mirror's positions: `pulumi destroy` must not lose it
    # alias -> its Secret's metadata.resourceVersion: a write to the Secret (a rotated secret) resubmits the mirror.
    secret_versions: Mapping[str, pulumi.Input[str | None]] = field(default_factory=dict)


def config_hash(config_yaml: str) -> str:
    return hashlib.sha256(config_yaml.encode()).hexdigest()


def secrets_version_hash(versions: Mapping[str, str | None]) -> str:
    """One value for the versions of the mirror's Secrets, by alias; nothing of their contents goes in."""
    return hashlib.sha256(
        "\n".join(f"{alias}@{versions[alias] or ''}" for alias in sorted(versions)).encode()
    ).hexdigest()


def spark_application_spec(
    name: str, config_map: str, pvc: str | None, args: MirrorApplicationArgs, config_yaml: pulumi.Input[str]
) -> dict[str, Any]:
    """The v1beta2 spec: restarted forever with backoff, checkpoint on the driver's PVC or in object storage."""
    labels = {**args.pod_labels, **APP_LABELS, "app.kubernetes.io/instance": name}
    secrets = [
        {"name": secret, "path": f"{SECRETS_DIR}/{alias}", "secretType": "Generic"}
        for alias, secret in sorted(args.secret_names.items())
    ]
    config_mount = {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}
    scratch_mount = {"name": "scratch", "mountPath": SCRATCH_DIR}
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": config_map}},
        {"name": "scratch", "emptyDir": {}},
    ]
    driver_mounts = [config_mount, scratch_mount]
    executor_mounts = [config_mount, scratch_mount]
    if pvc is not None:
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": pvc}})
        driver_mounts.append({"name": "checkpoints", "mountPath": CHECKPOINT_DIR})
    pod: dict[str, Any] = {
        "labels": labels,
        "secrets": secrets,
        "podSecurityContext": POD_SECURITY,
        "securityContext": CONTAINER_SECURITY,
    }
    token = args.token_by_hand
    if token is not None:  # both pods sign in: the driver's and the executors' Kafka clients, and abfss
        volumes.append(token.volume)
        driver_mounts.append(token.mount)
        executor_mounts.append(token.mount)
        pod["env"] = [{"name": k, "value": v} for k, v in token.env.items()]
    # The operator hands these to spark-submit as spark.kubernetes.container.image.pullSecrets, which Spark puts on
    # the driver's pod and on each executor pod it makes; v1beta2 has no per-pod field for them.
    pull_secrets = {"imagePullSecrets": list(args.image_pull_secrets)} if args.image_pull_secrets else {}
    return {
        "type": "Python",
        "pythonVersion": "3",
        "mode": "cluster",
        "image": args.image,
        "imagePullPolicy": "IfNotPresent",
        **pull_secrets,
        "mainApplicationFile": MAIN_FILE,
        "arguments": ["run", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}"],
        "sparkVersion": args.spark_version,
        "restartPolicy": {
            "type": "Always",
            "onFailureRetryInterval": 30,
            "onSubmissionFailureRetryInterval": 60,
        },
        "sparkConf": {
            "spark.kubernetes.executor.deleteOnTermination": "true",
            "spark.kubernetes.driver.pod.excludedFeatureSteps": EXCLUDED_DRIVER_STEPS,
            **spark_jvm_conf(None),  # the image has no class archive
            **SPARK_DEFAULTS,
            **args.spark_conf,
            **SPARK_SECURITY,
        },
        "volumes": volumes,
        "driver": {
            **pod,
            "serviceAccount": args.service_account,
            "cores": args.driver.cores,
            "memory": args.driver.memory,
            "volumeMounts": driver_mounts,
            # On SIGTERM the mirror stops each flow between copies, then exits 0 (Mirror.stop_on_sigterm); within
            # STOP_GRACE_S, where Kubernetes' default 30 s would SIGKILL it mid-batch.
            "terminationGracePeriodSeconds": STOP_GRACE_S,
            "ports": [{"name": "metrics", "protocol": "TCP", "containerPort": args.metrics_port}],
            "annotations": {
                CONFIG_HASH_ANNOTATION: pulumi.Output.from_input(config_yaml).apply(config_hash),
                **(
                    {SECRETS_HASH_ANNOTATION: pulumi.Output.all(**args.secret_versions).apply(secrets_version_hash)}
                    if args.secret_versions
                    else {}
                ),
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(args.metrics_port),
                "prometheus.io/path": "/metrics",
            },
        },
        "executor": {
            **pod,
            "serviceAccount": args.executor_service_account,
            "instances": args.executor.instances,
            "cores": args.executor.cores,
            "memory": args.executor.memory,
            "volumeMounts": executor_mounts,
        },
    }


def alert_rules(name: str, alerts: Alerts) -> list[dict[str, Any]]:
    """Per flow: lag, a stalled or vanished mirror, stale checkpoints and heartbeats, DR topics it cannot use,
    errors. Each links its runbook (docs/operations/alerts.md, one section per alert). They are evaluated where the
    mirror runs, in its target's region: the region that is left when the source's is lost."""
    sel = f'{{app_kubernetes_io_instance="{name}"}}'
    window = f"{alerts.stalled_minutes}m"
    stalled_s = alerts.stalled_minutes * 60

    def rule(alert: str, expr: str, severity: str, summary: str, wait: str = "5m") -> dict[str, Any]:
        return {
            "alert": alert,
            "expr": expr,
            "for": wait,
            "labels": {"severity": severity},
            "annotations": {"summary": summary, "runbook_url": f"{alerts.runbook_url}#{alert.lower()}"},
        }

    return [
        rule(
            "MirrorkitLagHigh",
            f"sum by (flow) ({LAG_METRIC}{sel}) > {alerts.lag_records}",
            "warning",
            "Mirror {{ $labels.flow }} is {{ $value }} records behind",
            "10m",
        ),
        rule(
            "MirrorkitStalled",
            f"(time() - max by (flow) ({LAST_BATCH_METRIC}{sel}) > {stalled_s})"
            f" or (sum by (flow) (rate({RECORDS_METRIC}{sel}[{window}])) == 0"
            f" and on (flow) sum by (flow) ({LAG_METRIC}{sel}) > 0)",
            "critical",
            "Mirror {{ $labels.flow }} has finished no batch, or copied nothing despite lag, for " + window,
        ),
        rule(
            "MirrorkitAbsent",
            f"absent({LAST_BATCH_METRIC}{sel})",
            "critical",
            f"Mirror {name} serves no metrics: its driver is down or not scraped",
            window,
        ),
        rule(
            "MirrorkitCheckpointStale",
            f"max by (flow) ({CHECKPOINT_AGE_METRIC}{sel}) > {alerts.checkpoint_age_s}",
            "warning",
            "Consumer-group checkpoints on {{ $labels.flow }} are {{ $value }}s old",
        ),
        rule(
            "MirrorkitHeartbeatStale",
            f"max by (flow) ({HEARTBEAT_AGE_METRIC}{sel}) > {alerts.heartbeat_age_s}",
            "warning",
            "The newest heartbeat mirrored on {{ $labels.flow }} is {{ $value }}s old",
        ),
        rule(
            "MirrorkitDrUnusable",
            f"max by (flow) ({DR_UNUSABLE_METRIC}{sel}) > 0",
            "critical",
            "Mirror {{ $labels.flow }} keeps no DR state in {{ $value }} of its DR topics: failover would translate"
            " no group there",
            "0m",
        ),
        rule(
            "MirrorkitErrors",
            f"sum by (flow) (increase({ERRORS_METRIC}{sel}[{window}])) > 0",
            "warning",
            "Mirror {{ $labels.flow }} reported {{ $value }} errors in " + window,
            "0m",
        ),
    ]


class MirrorApplication(pulumi.ComponentResource):
    """One SparkApplication running the packaged mirror with its rendered config.

    Disruption: no PodDisruptionBudget. The driver is owned by its SparkApplication and the executors by the driver,
    and neither owner has a /scale subresource, so a PDB with maxUnavailable gets `disruptionsAllowed: 0` and blocks
    every node drain (as a minAvailable on the single driver would). A drained driver comes back through the
    operator's restart policy and resumes from its checkpoint, which outlives the pod.
    """

    def __init__(self, name: str, args: MirrorApplicationArgs, opts: pulumi.ResourceOptions | None = None):
        # The type token keeps the class's old name: a changed token would replace every deployed mirror on `pulumi up`.
        super().__init__("mirrorkit:k8s:Mirror", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        pvc_name = None
        if args.checkpoint.pvc is not None:
            pvc = k8s.core.v1.PersistentVolumeClaim(  # type: ignore[call-overload]  # camelCase fields (module doc)
                f"{name}-checkpoints",
                metadata={"name": f"{name}-checkpoints", "namespace": args.namespace, "labels": APP_LABELS},
                spec={
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": args.checkpoint.pvc.size}},
                    # Named only when the stack names one: otherwise the cluster's default class.
                    **({"storageClassName": sc} if (sc := args.checkpoint.pvc.storage_class) else {}),
                },
                opts=pulumi.ResourceOptions(parent=self, protect=args.protect, retain_on_delete=args.protect),
            )
            pvc_name = f"{name}-checkpoints"
            child = pulumi.ResourceOptions(parent=self, depends_on=[pvc])
        self.checkpoint_claim = pvc_name  # the toolbox's `adopt` and `handback` runs mount it (infra.k8s.toolbox)
        self.app_name: pulumi.Output[str] | None = None
        if args.config_yaml is not None:
            config_map = k8s.core.v1.ConfigMap(
                f"{name}-config",
                metadata={"name": f"{name}-config", "namespace": args.namespace, "labels": APP_LABELS},
                data={CONFIG_FILE: args.config_yaml},
                opts=pulumi.ResourceOptions(parent=self),
            )
            app = k8s.apiextensions.CustomResource(
                f"{name}-app",
                api_version="sparkoperator.k8s.io/v1beta2",
                kind="SparkApplication",
                metadata={
                    "name": name,
                    "namespace": args.namespace,
                    "labels": APP_LABELS,
                    "annotations": AWAIT_RUNNING,
                },
                spec=spark_application_spec(name, f"{name}-config", pvc_name, args, args.config_yaml),
                opts=pulumi.ResourceOptions.merge(
                    child, pulumi.ResourceOptions(depends_on=[config_map, *args.depends_on])
                ),
            )
            # The engine sets a CustomResource's outputs as attributes at run time; the class declares none of them.
            self.app_name = app.metadata["name"]  # type: ignore[attr-defined]
        instance = {**APP_LABELS, "app.kubernetes.io/instance": name}
        if args.monitoring and args.config_yaml is not None:  # a stopped mirror's alerts would only say it is gone
            monitoring_labels = {**args.monitoring_labels, **APP_LABELS}
            k8s.core.v1.ConfigMap(
                f"{name}-dashboard",
                metadata={
                    "name": f"{name}-dashboard",
                    "namespace": args.monitoring_namespace,
                    "labels": {**args.dashboard_labels, **APP_LABELS},
                },
                data={f"{name}.json": json.dumps(dashboard(name), indent=1, sort_keys=True)},
                opts=child,
            )
            k8s.apiextensions.CustomResource(
                f"{name}-podmonitor",
                api_version="monitoring.coreos.com/v1",
                kind="PodMonitor",
                metadata={"name": name, "namespace": args.namespace, "labels": monitoring_labels},
                spec={
                    "selector": {"matchLabels": {**instance, "spark-role": "driver"}},
                    "podTargetLabels": ["app.kubernetes.io/instance"],  # the alerts select on it
                    "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "30s"}],
                },
                opts=child,
            )
            k8s.apiextensions.CustomResource(
                f"{name}-rules",
                api_version="monitoring.coreos.com/v1",
                kind="PrometheusRule",
                metadata={"name": name, "namespace": args.namespace, "labels": monitoring_labels},
                spec={"groups": [{"name": "mirrorkit", "rules": alert_rules(name, args.alerts)}]},
                opts=child,
            )
        self.register_outputs({"app_name": self.app_name})
