"""Each site stack renders a toolbox (infra.k8s.toolbox) that runs the operator verbs from that site alone: in its own
namespace, mounting only what its own stack makes there, under restricted Pod Security, with a Role on the profile's
ConfigMap and nothing else, egress to the API server and the Kafka ports only, and the grants its verbs need; and the
site's stack outputs say how to run it and what the applications' profile will be, with another region down."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from infra.aws.identity import kafka_policy
from infra.k8s.labels import APP_LABELS
from infra.k8s.toolbox import (
    CONFIG_PATH,
    ENTRYPOINT,
    NEVER,
    PROFILE_VERBS,
    TOOLBOX,
    TOOLBOX_CONFIG,
    TOOLBOX_ENV,
    TOOLBOX_GRANTED,
    TOOLBOX_LABELS,
    run_command,
    verb_args,
)
from infra.kafka.acls import mirror_acls
from infra.naming import SECRETS_DIR
from spark_app.config import MirrorConfig, parse_config
from spark_app.dr.adopt import TOOLBOX_MARK
from spark_app.dr.connection import failover_profile
from tests.infra.harness import STACKS, Exports, Registered, Run, a_set_is_up, part_values, sentinel, up
from tests.infra.test_regions import survivors

CRONJOB = "kubernetes:batch/v1:CronJob"
ROLE = "kubernetes:rbac.authorization.k8s.io/v1:Role"
BINDING = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
SECRET = "kubernetes:core/v1:Secret"
ACCOUNT = "kubernetes:core/v1:ServiceAccount"
SETS = ("active-active", "dr-msk-to-eventhubs")
# Pod Security's restricted level (Kubernetes' "Pod Security Standards" page): the volume types it allows.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                      "secret"}  # fmt: skip


@pytest.fixture(scope="module")
def sets() -> dict[str, tuple[dict[str, Exports], dict[str, Run]]]:
    """Each shipped set of stacks brought up in order, once for the module."""
    return {topology: a_set_is_up(topology) for topology in SETS}


def site_runs(stack_runs: dict[str, Run], sets: dict[str, Any]) -> list[tuple[str, Run]]:
    """Every shipped stack that makes a site: the one-stack deployments and each set's site stacks."""
    found = [(name, run) for name, run in stack_runs.items() if run.result["settings"].part is None]
    for _, runs in sets.values():
        found += [(name, run) for name, run in runs.items() if "-site-" in name]
    return found


def made_sites(run: Run) -> list[str]:
    settings = run.result["settings"]
    return [s.name for s in settings.model.sites if settings.clusters_at(s.name) and settings.makes("site", s.name)]


def one(run: Run, typ: str, name: str) -> Registered:
    (found,) = [r for r in run.of_type(typ) if r.name == name]
    return found


def toolbox_of(run: Run, site: str) -> Registered:
    return one(run, CRONJOB, f"{site}-toolbox-cronjob")


def pod_of(cron: Registered) -> dict[str, Any]:
    return dict(cron.plain["spec"]["jobTemplate"]["spec"]["template"]["spec"])


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What Pod Security's restricted level (and the baseline under it) refuses in a pod spec."""
    out = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            out.append(key)
    security = pod.get("securityContext") or {}
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {volume['name']}: {sorted(kinds)}")
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        sc = c.get("securityContext") or {}
        where = f"container {c['name']}"
        if sc.get("privileged"):
            out.append(f"{where}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{where}: allowPrivilegeEscalation is not false")
        if sc.get("runAsNonRoot", security.get("runAsNonRoot")) is not True:
            out.append(f"{where}: runAsNonRoot is not true")
        if sc.get("runAsUser", security.get("runAsUser")) == 0:
            out.append(f"{where}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or security.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{where}: seccompProfile {seccomp}")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{where}: capabilities do not drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{where}: capabilities add {caps['add']}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            out.append(f"{where}: hostPort")
        if not sc.get("readOnlyRootFilesystem"):  # the kit's own rule beside the level's
            out.append(f"{where}: the root filesystem is writable")
    return out


def test_every_shipped_site_stack_renders_a_suspended_toolbox_of_the_mirror_image_in_its_own_namespace(
    stack_runs, sets
):
    runs = site_runs(stack_runs, sets)
    assert {name for name, _ in runs} >= {*(p.name.split(".")[1] for p in STACKS), "active-active-site-use1",
                                          "active-active-site-euw1", "dr-msk-to-eventhubs-site-euw1"}  # fmt: skip
    for name, run in runs:
        settings = run.result["settings"]
        sites = made_sites(run)
        assert sites, name
        assert len(run.of_type(CRONJOB)) == len(sites), name
        for site in sites:
            cron = toolbox_of(run, site)
            spec = cron.plain["spec"]
            assert cron.plain["metadata"] == {"name": TOOLBOX, "namespace": settings.namespace,
                                              "labels": TOOLBOX_LABELS}, name  # fmt: skip
            assert (spec["suspend"], spec["schedule"], spec["concurrencyPolicy"]) == (True, NEVER, "Forbid")
            assert spec["jobTemplate"]["spec"]["backoffLimit"] == 0  # a failover is never run again by itself
            (container,) = pod_of(cron)["containers"]
            assert container["image"] == settings.image and "@sha256:" in container["image"]
            assert container["command"] == [ENTRYPOINT]
            assert container["args"] == verb_args("status") == ["status", "--config", CONFIG_PATH]
            # On the site's own Kubernetes provider, the one its mirror's namespace is on.
            assert cron.provider == run.named(f"{site}-ns").provider and cron.provider, name


def test_the_toolbox_mounts_only_its_own_sites_objects_and_its_config_keeps_the_sites_stopped_flows(stack_runs, sets):
    for name, run in site_runs(stack_runs, sets):
        settings = run.result["settings"]
        for site in made_sites(run):
            cron = toolbox_of(run, site)
            pod = pod_of(cron)
            # What this stack makes in the toolbox's namespace on the site's own cluster (its provider).
            made = {
                (r.typ, r.plain["metadata"]["name"]): r
                for r in run.resources
                if r.typ in (CONFIG_MAP, SECRET)
                and r.plain["metadata"].get("namespace") == settings.namespace
                and r.provider == cron.provider
            }
            volumes = {v["name"]: v for v in pod["volumes"]}
            for volume in volumes.values():
                if "configMap" in volume:
                    assert (CONFIG_MAP, volume["configMap"]["name"]) in made, (name, volume)
                elif "secret" in volume:
                    assert (SECRET, volume["secret"]["secretName"]) in made, (name, volume)
                else:
                    assert set(volume) - {"name"} <= {"emptyDir", "projected"}, volume
            config_map = made[(CONFIG_MAP, TOOLBOX_CONFIG)]
            config = parse_config(yaml.safe_load(config_map.plain["data"]["mirror.yaml"]))
            assert [f.name for f in config.flows] == [f.name for f in settings.flows_at(site)], name
            # Each cluster's Secret mounted where the config reads its credential, and nothing else.
            (container,) = pod["containers"]
            mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
            for cluster in config.clusters:
                files = [r.file for r in (cluster.password, cluster.client_key) if r is not None and r.file]
                for path in [*files, *([cluster.client_cert_file] if cluster.client_cert_file else [])]:
                    folder = path.rsplit("/", 1)[0]
                    assert mounts[folder]["secret"]["secretName"] == f"mirrorkit-{cluster.alias}", path
            secrets = {p for p, v in mounts.items() if "secret" in v}
            assert secrets <= {f"{SECRETS_DIR}/{c.alias}" for c in config.clusters}, secrets


def test_stopping_the_sites_flows_keeps_the_toolbox_and_the_flows_in_its_config(sets):
    backend, runs = sets["active-active"]
    stack = "active-active-site-euw1"
    settings = runs[stack].result["settings"]
    own = [f.name for f in settings.flows_at("euw1")]
    stopped = up([stack], dict(backend), **{"mirrorkit:stopped": own})[stack]
    assert "euw1" not in stopped.result["configs"]  # the mirror stopped ...
    config_map = stopped.named("euw1-toolbox-config")  # ... and its toolbox still fails the flows over
    config = yaml.safe_load(config_map.plain["data"]["mirror.yaml"])
    assert [f"{f['source']}->{f['target']}" for f in config["flows"]] == own
    assert stopped.result["exports"].values["profile_euw1"].keys() == set(own)


def test_the_toolbox_pod_passes_restricted_pod_security(stack_runs, sets):
    for name, run in site_runs(stack_runs, sets):
        for site in made_sites(run):
            pod = pod_of(toolbox_of(run, site))
            assert restricted_violations(pod) == [], name
            assert pod["securityContext"]["runAsUser"] == 185  # the image's user
    # The check can fail: what the restricted level refuses, it finds.
    (_, run), *_ = site_runs(stack_runs, sets)
    bad = copy.deepcopy(pod_of(toolbox_of(run, made_sites(run)[0])))
    bad["securityContext"].pop("runAsNonRoot")
    bad["containers"][0]["securityContext"] = {"capabilities": {"add": ["NET_ADMIN"]}}
    bad["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    assert len(restricted_violations(bad)) == 6


def test_the_toolbox_may_write_the_profiles_configmap_and_nothing_else(stack_runs, sets):
    for name, run in site_runs(stack_runs, sets):
        settings = run.result["settings"]
        for site in made_sites(run):
            spec = settings.site(site)
            where = spec.profile_configmap or f"{settings.namespace}/kafka-connection"
            namespace, configmap = where.split("/")
            role = one(run, ROLE, f"{site}-toolbox-profile")
            bindings = [r for r in run.of_type(BINDING) if r.name == f"{site}-toolbox-profile"]
            assert role.plain["metadata"]["namespace"] == namespace
            assert role.plain["rules"] == [
                {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [configmap], "verbs": PROFILE_VERBS}
            ]
            (binding,) = bindings
            assert binding.plain["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                "name": TOOLBOX}  # fmt: skip
            assert binding.plain["subjects"] == [
                {"kind": "ServiceAccount", "name": TOOLBOX, "namespace": settings.namespace}
            ]
            # No other binding names the toolbox's account: it holds nothing of the driver's Role.
            others = [
                b
                for b in run.of_type(BINDING)
                if b is not binding
                and b.provider == binding.provider  # the same cluster
                and any(s.get("name") == TOOLBOX for s in b.plain.get("subjects", []))
            ]
            assert others == [], name
            (account,) = [a for a in run.of_type(ACCOUNT) if a.name == f"{site}-toolbox-sa"]
            mirror = run.named(f"{site}-sa")  # the site's identity: the toolbox signs in as the mirror does
            assert account.plain["metadata"]["annotations"] == mirror.plain["metadata"]["annotations"], name


def test_the_toolboxs_network_policy_lets_out_dns_the_api_server_and_the_kafka_ports_and_lets_nothing_in(
    stack_runs, sets
):
    for name, run in site_runs(stack_runs, sets):
        settings = run.result["settings"]
        for site in made_sites(run):
            spec = one(run, POLICY, f"{site}-toolbox-egress").plain["spec"]
            assert spec["podSelector"] == {"matchLabels": TOOLBOX_LABELS}
            assert spec["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in spec
            dns, api, kafka, *cloud = spec["egress"]
            assert dns["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
            assert api == {
                "to": [{"ipBlock": {"cidr": c}} for c in settings.site(site).api_server_cidrs],
                "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}],
            }
            ports = sorted({p for c in settings.clusters_at(site) for p in c.ports})
            assert kafka == {"ports": [{"protocol": "TCP", "port": p} for p in ports]}, name
            assert all({p["port"] for p in rule["ports"]} <= {80, 443} for rule in cloud), cloud
            # The mirror's own policy does not select the toolbox's pods, so it opens nothing more to them.
            mirror = one(run, POLICY, f"{site}-mirror").plain["spec"]
            assert mirror["podSelector"] == {"matchLabels": APP_LABELS} != {"matchLabels": TOOLBOX_LABELS}


def test_the_sites_identity_holds_what_the_toolboxs_verbs_need(stack_runs, sets):
    """failover commits each group's translated offsets on the flow's target, whether or not the flow syncs group
    offsets; drill makes and deletes its probe; adopt and handback use MM2's and Connect's topics: the IAM policy
    and the ACLs of the site's identity grant it, from the same access set (spark_app.policy.operator_access)."""
    assert TOOLBOX_GRANTED
    for name, run in site_runs(stack_runs, sets):
        settings = run.result["settings"]
        topology = run.result["topology"]
        for site in made_sites(run):
            flows = settings.flows_at(site)
            role = topology.roles.get(site)
            if role is None:
                continue
            (policy,) = [r for r in run.of_type("aws:iam/rolePolicy:RolePolicy") if r.name == f"{site}-mirror-kafka"]
            iam = {c.alias: c.msk for c in settings.clusters_at(site) if c.msk is not None and c.msk.auth == "iam"}
            rendered = json.loads(policy.plain["policy"])
            assert rendered == kafka_policy(flows, iam, operator=True), name
            assert rendered != kafka_policy(flows, iam), name  # MM2's offset syncs, for adopt and handback, at least
    # A flow that does not sync group offsets: the toolbox's grant adds AlterGroup on its groups, on its target.
    (flow,) = parse_config(yaml.safe_load(SPARE)).flows
    assert not flow.sync_group_offsets
    altered = {(a.resource_type, a.name, a.operation) for a in mirror_acls("d", [flow], operator=True)}
    plain = {(a.resource_type, a.name, a.operation) for a in mirror_acls("d", [flow])}
    assert altered - plain >= {("Group", "billing", "Read"), ("Group", "billing", "Describe")}


def test_the_toolbox_pod_is_marked_so_adopt_and_handback_refuse_there_without_the_checkpoint(stack_runs, sets):
    """The toolbox mounts no flow's checkpoint location: its container carries the mark that makes `adopt` and
    `handback` refuse there (spark_app.dr.adopt.unreached_checkpoint) rather than write state nowhere."""
    assert TOOLBOX_ENV == {TOOLBOX_MARK: "1"}
    for name, run in site_runs(stack_runs, sets):
        for site in made_sites(run):
            spec = toolbox_of(run, site).plain["spec"]
            (container,) = spec["jobTemplate"]["spec"]["template"]["spec"]["containers"]
            assert {"name": TOOLBOX_MARK, "value": "1"} in container["env"], name


SPARE = """
clusters:
  - {alias: p, bootstrap_servers: "p:9092", profile: kafka}
  - {alias: d, bootstrap_servers: "d:9092", profile: kafka}
flows:
  - {source: p, target: d, topics: {include: [orders]}, groups: {include: [billing]}, checkpoint_location: /c}
"""


def test_a_site_stacks_outputs_say_how_to_run_the_toolbox_and_give_the_profile_without_a_credential(stack_runs, sets):
    for name, run in site_runs(stack_runs, sets):
        settings = run.result["settings"]
        exports = run.result["exports"]
        for site in made_sites(run):
            spec = settings.site(site)
            toolbox = exports.values[f"toolbox_{site}"]
            assert (toolbox["namespace"], toolbox["cronjob"], toolbox["context"]) == (
                settings.namespace,
                TOOLBOX,
                spec.context,
            )
            flows = settings.flows_at(site)
            commands = toolbox["commands"]
            assert commands["status"] == run_command(
                settings.namespace, f"{TOOLBOX}-status-$(date +%s)", verb_args("status"), spec.context
            )
            assert set(commands["failover"]) == {f.name for f in flows}
            for flow in flows:
                assert f'"--publish-configmap", "{toolbox["profile_configmap"]}"' in commands["failover"][flow.name]
                assert '"--dry-run"' in commands["failover_dry_run"][flow.name]
            # adopt and handback mount the mirror's checkpoint claim, where it has one; else they are not offered.
            claims = [
                r.plain["metadata"]["name"]
                for r in run.resources
                if r.typ == "kubernetes:core/v1:PersistentVolumeClaim"
                and r.plain["metadata"]["name"] == f"{settings.app_name(site)}-checkpoints"
            ]
            if settings.model.mirror.checkpoint.pvc is None:
                assert not claims and not {"adopt", "handback"} & set(commands), (name, site)
            else:
                (claim,) = claims
                for verb in ("adopt", "handback"):
                    assert set(commands[verb]) == {f.name for f in flows}, (name, site, verb)
                    for flow in flows:
                        assert commands[verb][flow.name] == run_command(
                            settings.namespace, f"{TOOLBOX}-{verb}-$(date +%s)", verb_args(verb, "--flow", flow.name),
                            spec.context, claim,
                        )  # fmt: skip
                        assert f'"claimName": "{claim}"' in commands[verb][flow.name]
            # The profile pieces are what failover publishes, from the toolbox's own config and the target alone.
            config = MirrorConfig.model_validate(
                yaml.safe_load(run.named(f"{site}-toolbox-config").plain["data"]["mirror.yaml"])
            )
            profiles = exports.values[f"profile_{site}"]
            for flow in config.flows:
                target = config.cluster(flow.target)
                if flow.topics.literal_names() is None:
                    assert profiles[flow.name]["topics"] is None and profiles[flow.name]["topic_patterns"]
                    continue
                published = json.loads(failover_profile(target, flow, []).to_json())
                assert {
                    k: published[k] for k in ("cluster", "bootstrap_servers", "auth", "replication_policy", "topics")
                } == {  # fmt: skip
                    k: v for k, v in profiles[flow.name].items() if k != "topic_patterns"
                }
            # No credential in any output of the site's stack that is not a secret output.
            held = json.dumps({k: v for k, v in exports.values.items() if k not in exports.secret})
            sentinels = [sentinel(a, k) for a, files in settings.model.credentials.items() for k in files]
            assert [s for s in sentinels if s in held] == [], name
            assert "SharedAccessKey=" not in held, name


@pytest.mark.parametrize(
    ("topology", "region"),
    [
        ("active-active", "us-east-1"),
        ("active-active", "eu-west-1"),
        ("dr-msk-to-eventhubs", "us-east-1"),
        ("dr-msk-to-eventhubs", "westeurope"),
    ],
)
def test_with_a_region_down_the_survivors_site_stack_previews_its_toolbox_and_outputs_unchanged(sets, topology, region):
    backend, before = sets[topology]
    kept = survivors(topology, region)
    (site_stack,) = [s for s in kept if s.startswith(f"{topology}-site-")]
    site = site_stack.rsplit("-", 1)[1]
    for preview in (True, False):
        runs = up(kept, dict(backend), down=region, preview=preview)
        run = runs[site_stack]
        assert toolbox_of(run, site).plain == toolbox_of(before[site_stack], site).plain, preview
        for key in (f"toolbox_{site}", f"profile_{site}"):
            assert run.result["exports"].values[key] == before[site_stack].result["exports"].values[key], preview
    # The same with every flow of the site stopped (the lost region's flow into the survivor among them).
    settings = before[site_stack].result["settings"]
    own = [f.name for f in settings.flows_at(site)]
    values = part_values(site_stack)
    assert values["mirrorkit:part"] == f"site:{site}"
    stopped = up([site_stack], dict(backend), down=region, preview=True, **{"mirrorkit:stopped": own})[site_stack]
    assert stopped.result["exports"].values[f"profile_{site}"].keys() == set(own)


def test_with_the_primarys_region_down_the_dr_sets_survivors_render_the_mirrors_toolbox_and_failover_outputs(sets):
    """dr-msk-to-eventhubs loses us-east-1, its MSK primary's region: the stacks left (those outside it) still render
    the mirror's toolbox and the outputs `mirrorkit failover` is run from (how to run the toolbox, the applications'
    new profile), for the flow into the surviving Event Hubs namespace (ARCHITECTURE.md: operable from the survivor)."""
    topology, region = "dr-msk-to-eventhubs", "us-east-1"
    backend, before = sets[topology]
    kept = survivors(topology, region)
    site_stacks = [s for s in kept if s.startswith(f"{topology}-site-")]
    assert site_stacks, f"with {region} down only {kept} are left: no site stack renders the toolbox"
    flows = {f.name for s in site_stacks for f in before[s].result["settings"].mirror_config.flows}
    runs = up(kept, dict(backend), down=region, preview=True)
    failover: set[str] = set()
    for site_stack in site_stacks:
        site = site_stack.rsplit("-", 1)[1]
        run = runs[site_stack]
        assert toolbox_of(run, site).plain["spec"]["suspend"] is True
        exports = run.result["exports"].values
        assert exports[f"toolbox_{site}"]["context"] == run.result["settings"].site(site).context
        assert set(exports[f"toolbox_{site}"]["commands"]["failover"]) == set(exports[f"profile_{site}"])
        failover |= set(exports[f"profile_{site}"])
    assert failover == flows == {"primary->dr"}
