"""Runs the Pulumi program under Pulumi's mocks and records what it registered.

Each run sets fresh mocks and fresh config (as Pulumi's own unit-test examples do), so runs cannot leak into each
other. Credentials are test sentinels, so a test can look for them anywhere they must not be.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockMonitor

from infra.naming import PROJECT, operator_name

EVENTHUB = "azure-native:eventhub/v20240501preview"  # the API version infra/azure/eventhubs.py uses
SUBSCRIPTION = "00000000-0000-0000-0000-000000000001"
ROOT = Path(__file__).resolve().parents[2]
STACK_FILES = sorted((ROOT / "stacks").glob("Pulumi.*.yaml"))  # every shipped stack: Pulumi deploys these


def _config_of(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())["config"]


# Topologies deployed whole, each in one stack; the other files are the parts of a set, or platform stacks.
STACKS = [p for p in STACK_FILES if f"{PROJECT}:part" not in _config_of(p)]
PART_STACKS = [p for p in STACK_FILES if f"{PROJECT}:part" in _config_of(p)]
PLATFORM_STACKS = [p for p in PART_STACKS if f"{PROJECT}:platform" in _config_of(p)]  # one per Kubernetes cluster
# The topologies deployed as sets of per-region stacks: the keys each set's part stacks share (never a stack).
TOPOLOGY_FILES = sorted((ROOT / "stacks" / "topologies").glob("*.yaml"))
SETS = tuple(p.stem for p in TOPOLOGY_FILES)
# Every shipped deployment by its topology's name (the keys of the stack_runs fixture): those deployed whole, then the
# sets.
DEPLOYMENTS = [*(p.name.split(".")[1] for p in STACKS), *SETS]
CONNECTION_STRING = "Endpoint=sb://test.invalid/;SharedAccessKeyName=mirrorkit;SharedAccessKey=test-sentinel-sas"
BOOTSTRAPS = {
    "bootstrapBrokersSaslScram": "b-1.msk.test.invalid:9096,b-2.msk.test.invalid:9096",
    "bootstrapBrokersSaslIam": "b-1.msk.test.invalid:9098,b-2.msk.test.invalid:9098",
    "bootstrapBrokersTls": "b-1.msk.test.invalid:9094,b-2.msk.test.invalid:9094",
}


# An invoke's result, or a function of its arguments that gives it.
Answer = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]
# Each Kubernetes context's region, as the shipped stacks' sites say (a platform stack's context is its sites').
CONTEXT_REGIONS = {
    s["context"]: s["region"]
    for p in [*STACK_FILES, *TOPOLOGY_FILES]
    for s in _config_of(p).get(f"{PROJECT}:sites", [])
    if "context" in s
}
# Calls that reach no region: the backend, and Entra ID's sign-in (getClientConfig reads the provider's token).
NO_REGION = ("pulumi:pulumi:StackReference", "azure-native:authorization:getClientConfig")
# Inputs that name a resource the program made: a call on it goes to that resource's region.
NAMING = ("namespaceName", "resourceName", "scope")


class RegionDown(Exception):
    """What every call into a lost region gets."""


class Unplaced(AssertionError):
    """A call whose region the harness cannot tell: with a region down, a test must know where every call goes."""


@dataclass(frozen=True)
class Exports:
    """What the backend keeps of a stack: its outputs (plain values, and the names of the secret ones), and its
    resources' inputs, which tell the next run what it would change."""

    values: dict[str, Any] = field(default_factory=dict)
    secret: list[str] = field(default_factory=list)
    state: dict[str, dict[str, Any]] = field(default_factory=dict)  # each resource's inputs, by URN


def sentinel(alias: str, key: str) -> str:
    return f"test-sentinel-{alias}-{key}"


@dataclass(frozen=True)
class Registered:
    typ: str
    name: str
    inputs: dict[str, Any]  # wire (camelCase) names; secrets still wrapped as the engine would see them
    provider: str | None = None  # the explicit provider reference, `urn::id`
    urn: str = ""
    dependencies: tuple[str, ...] = ()  # URNs the engine waits for before creating it (explicit and implicit)
    protect: bool = False
    retain_on_delete: bool = False
    aliases: tuple[str, ...] = ()  # each as the engine gets it: a spec's text, or a URN
    parent: str = ""  # the parent's URN
    transforms: int = 0  # how many transforms the engine runs on the resource's children

    @property
    def plain(self) -> dict[str, Any]:
        return unwrap(self.inputs)


def is_secret(value: Any) -> bool:
    return rpc.is_rpc_secret(value)


def unwrap(value: Any) -> Any:
    if is_secret(value):
        return unwrap(value["value"])
    if isinstance(value, dict):
        return {k: unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrap(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)  # the wire carries every number as a double; JSON would carry 185, not 185.0
    return value


class RecordingMocks(pulumi.runtime.Mocks):
    """Echoes inputs as outputs, with the few computed outputs the program reads; with a region down, places every
    call in a region and fails those that reach it."""

    def __init__(self) -> None:
        self.resources: list[Registered] = []
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.call_results: dict[str, Answer] = {}  # a test's answers to invokes, by token
        # (type, name) -> what the engine gets beside the inputs
        self.options: dict[tuple[str, str], dict[str, Any]] = {}
        self.stacks: dict[str, Exports] = {}  # what the backend holds of other stacks, by stack name
        self.state: dict[str, dict[str, Any]] = {}  # what the backend holds of this stack: inputs by URN
        self.preview = False
        self.down: str | None = None  # the region that is down: every call that reaches it fails
        self.unplaced: list[str] = []  # calls whose region could not be told while a region is down
        self.placed: list[tuple[str, str]] = []  # (call, each region it reaches) while a region is down
        # Where each resource or provider made so far is, by its URN (and a resource's id and name too).
        self.regions: dict[str, str] = {}

    def _region_of(self, inputs: dict[str, Any], provider: str | None, parent: str = "") -> str | None:
        """Where a call goes: the region or location it names, its provider's, the region of the resource it acts
        on, or its parent's."""
        for key in ("region", "location"):
            if isinstance(inputs.get(key), str) and inputs[key] != rpc.UNKNOWN:
                return str(inputs[key])
        if provider:  # `urn::id`, the id unknown at preview until the provider exists
            return self.regions.get(provider.rsplit("::", 1)[0])
        for key in NAMING:
            if isinstance(named := inputs.get(key), str) and named in self.regions:
                return self.regions[named]
        return self.regions.get(parent)

    def _reaches_the_lost_region(self, what: str, region: str | None, peer: Any = None) -> None:
        if self.down is None:
            return
        if region is None:
            self.unplaced.append(what)
            return
        self.placed += [(what, r) for r in (region, peer) if isinstance(r, str)]
        if self.down in (region, peer):
            raise RegionDown(f"{what}: its region, {self.down}, is down")

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        options = self.options.get((args.typ, args.name), {})
        urn = options.get("urn", "")
        self.resources.append(Registered(args.typ, args.name, dict(args.inputs), args.provider, **options))
        if args.typ == "pulumi:pulumi:StackReference":  # read from the backend, whatever region is down
            stack = args.inputs["name"].rsplit("/", 1)[-1]
            if stack not in self.stacks:
                raise LookupError(f"no stack '{stack}' in the backend")
            held = self.stacks[stack]
            return stack, {"name": args.inputs["name"], "outputs": held.values, "secretOutputNames": held.secret}
        changed = self.state.get(urn) != dict(args.inputs)
        if args.typ.startswith("pulumi:providers:"):
            context = args.inputs.get("context")
            region = args.inputs.get("region") or CONTEXT_REGIONS.get(context if isinstance(context, str) else "")
            self._reaches_the_lost_region(f"{args.typ} {args.name}", region)
            if region is not None:
                self.regions[urn] = region
        elif args.custom:  # a component makes no call: its children do
            region = self._region_of(dict(args.inputs), args.provider, options.get("parent", ""))
            # A peering's peer region answers only its making (or a change): an unchanged one reaches it no more.
            peer = args.inputs.get("peerRegion") if changed else None
            self._reaches_the_lost_region(f"{args.typ} {args.name}", region, peer)
            if region is not None:
                self.regions |= {urn: region, f"{args.name}-id": region}
        if self.preview and changed and args.custom:
            return "", dict(args.inputs)  # as the engine previews a resource it would make or change: outputs unknown
        outputs = dict(args.inputs)
        outputs.setdefault("arn", f"arn:aws:test:::{args.name}")
        if args.typ.startswith("azure-native:"):
            for wire in ("namespaceName", "authorizationRuleName", "eventHubName", "resourceGroupName"):
                if wire in args.inputs and args.typ.lower().endswith(wire[:-4].lower()):
                    outputs["name"] = args.inputs[wire]
            outputs.setdefault("name", args.name)
            if urn in self.regions:  # ARM names a resource's children and keys by its name
                self.regions[outputs["name"]] = self.regions[urn]
        if args.typ == "aws:ec2/vpcPeeringConnectionAccepter:VpcPeeringConnectionAccepter":
            return args.inputs["vpcPeeringConnectionId"], outputs  # AWS: the accepter is the peering's other side
        if args.typ == "azure-native:managedidentity:UserAssignedIdentity":
            outputs |= {"clientId": f"client-{args.name}", "principalId": f"principal-{args.name}"}
        return f"{args.name}-id", outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        self.calls.append((args.token, dict(args.args)))
        if args.token not in NO_REGION:
            self._reaches_the_lost_region(args.token, self._region_of(dict(args.args), args.provider))
        if args.token in self.call_results:
            answer = self.call_results[args.token]
            return answer(dict(args.args)) if callable(answer) else answer
        if args.token == f"{EVENTHUB}:listNamespaceKeys":
            return {"primaryConnectionString": CONNECTION_STRING}
        if args.token == "azure-native:authorization:getClientConfig":
            return {"subscriptionId": SUBSCRIPTION, "tenantId": "t", "clientId": "c", "objectId": "o"}
        if args.token == "aws:msk/getBootstrapBrokers:getBootstrapBrokers":
            return dict(BOOTSTRAPS)
        return {}


class RecordingMonitor(MockMonitor):
    """The mock monitor, also keeping what mocks do not see: dependencies, protect and retain-on-delete."""

    def __init__(self, mocks: RecordingMocks) -> None:
        super().__init__(mocks)
        self.recording = mocks

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802  # the gRPC method's name
        self.recording.options[(request.type, request.name)] = {
            "urn": self.make_urn(request.parent, request.type, request.name),
            "parent": request.parent,
            "dependencies": tuple(request.dependencies),
            "protect": bool(request.protect),
            "retain_on_delete": bool(request.retainOnDelete),
            "aliases": tuple(str(a) for a in request.aliases) + tuple(request.aliasURNs),
            "transforms": len(request.transforms),
        }
        return super().RegisterResource(request)


def stack_values(path: Path) -> dict[str, Any]:
    return _config_of(path)


def stack_name(path: Path) -> str:
    return path.name.split(".")[1]


def topology_values(topology: str) -> dict[str, Any]:
    """The keys a set's part stacks share (stacks/topologies/<topology>.yaml), as a stack written by hand to deploy
    the whole topology would hold them."""
    from infra.settings import topology_file

    return _config_of(topology_file(topology))


def shared_values(stack: str) -> dict[str, Any]:
    """The topology a shipped stack deploys: its set's shared keys, or the stack's own file when it is the whole."""
    values = _config_of(ROOT / "stacks" / f"Pulumi.{stack}.yaml")
    topology = values.get(f"{PROJECT}:topology")
    return values if topology is None else topology_values(topology)


def part_values(stack: str) -> dict[str, Any]:
    """A shipped stack's config: its own file, and the secrets of its topology's clusters as `config set` holds them."""
    values = _config_of(ROOT / "stacks" / f"Pulumi.{stack}.yaml")
    creds = credentials_for(shared_values(stack))
    return values | ({f"{PROJECT}:credentials": creds} if creds else {})


def platforms_watching(namespace: str) -> dict[str, Exports]:
    """The shipped platform stacks as the backend would hold them after their `up`, each also acting in `namespace`
    (a test's own deployment, which no shipped platform stack lists)."""
    found = {}
    for path in PLATFORM_STACKS:
        stack = path.name.split(".")[1]
        watched = [*_config_of(path)[f"{PROJECT}:platform"]["job_namespaces"], namespace]
        found[stack] = Exports({"release": operator_name(stack), "job_namespaces": watched})
    return found


def credentials_for(values: dict[str, Any]) -> dict[str, dict[str, str]]:
    """What `pulumi config set --secret` would hold for a stack: a sentinel per credential it needs."""
    from infra.schema import ClusterSpec

    creds: dict[str, dict[str, str]] = {}
    for raw in values.get(f"{PROJECT}:clusters", []):
        keys = ClusterSpec.model_validate(raw).credential_keys()
        if keys:
            creds[raw["alias"]] = {k: sentinel(raw["alias"], k) for k in keys}
    return creds


def set_config(values: dict[str, Any]) -> None:
    """Load stack values into Pulumi's runtime config, as the engine would; `credentials` arrives as a secret."""
    pulumi.runtime.set_all_config(
        {k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()},
        secret_keys=[k for k in values if k in (f"{PROJECT}:credentials", f"{PROJECT}:kubeconfigs")],
    )


def with_secrets(values: dict[str, Any]) -> dict[str, Any]:
    creds = credentials_for(values)
    return values | ({f"{PROJECT}:credentials": creds} if creds else {})


@dataclass
class Run:
    mocks: RecordingMocks
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def resources(self) -> list[Registered]:
        return self.mocks.resources

    def of_type(self, typ: str) -> list[Registered]:
        return [r for r in self.resources if r.typ == typ]

    def named(self, name: str) -> Registered:
        (found,) = [r for r in self.resources if r.name == name]
        return found


def run_pulumi(
    body: Callable[[], Awaitable[dict[str, Any]]],
    values: dict[str, Any],
    stack: str = "test",
    calls: dict[str, Answer] | None = None,
    stacks: dict[str, Exports] | None = None,
    down: str | None = None,
    preview: bool = False,
) -> Run:
    """Set fresh mocks and config, then run `body` (which builds resources) to completion, engine-style. `calls`
    answers invokes by token, as the cloud would; `stacks` are the stacks the backend holds (this one's state
    too); `down` is a region that is down, which every call reaching it finds, and then a call the harness cannot
    place fails the run; `preview` runs as `pulumi preview`, with the outputs of what it would make or change
    unknown."""
    mocks = RecordingMocks()
    mocks.call_results = dict(calls or {})
    mocks.stacks = platforms_watching(f"{PROJECT}-{stack}") if stacks is None else dict(stacks)
    mocks.state = dict(mocks.stacks[stack].state) if stack in mocks.stacks else {}
    mocks.down, mocks.preview = down, preview
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack, preview=preview, monitor=RecordingMonitor(mocks))
    set_config(values)
    run = Run(mocks)

    @pulumi.runtime.test
    async def program() -> None:
        run.result = await body()

    try:
        program()
    finally:
        if mocks.unplaced:
            raise Unplaced(f"the harness cannot tell the region of: {', '.join(sorted(set(mocks.unplaced)))}")
    return run


def topology_settings(topology: str) -> Any:
    """A set's settings (infra.settings.StackSettings) as its first part stack reads them: the whole topology's
    model, parts and placement, read without running the program."""
    from infra.settings import load_settings

    (first, *_) = [p for p in PART_STACKS if _config_of(p).get(f"{PROJECT}:topology") == topology]

    async def body() -> dict[str, Any]:
        return {"settings": load_settings()}

    stack = stack_name(first)
    return run_pulumi(body, part_values(stack), stack=stack).result["settings"]


def order_of_up(topology: str) -> list[str]:
    """The stacks of a set, in the order docs/deploy/regions.md gives: its parts as infra.parts orders them, then the
    MSK parts again when a cluster policy merges the grants the sites export."""
    settings = topology_settings(topology)
    first = [p.stack(topology) for p in settings.parts]
    again = [p.stack(topology) for p in settings.parts if p.kind == "msk" and settings.references(p)]
    return first + again


def up(
    stacks: list[str],
    backend: dict[str, Exports],
    down: str | None = None,
    calls: dict[str, Answer] | None = None,
    preview: bool = False,
    **changes: Any,
) -> dict[str, Run]:
    """`pulumi up` (or `preview`) of each stack in turn against one backend, which keeps each stack's outputs and
    state for the next; `calls` answers the cloud's lookups, and `down` is a region that is down."""
    runs = {}
    for stack in stacks:
        values = part_values(stack) | changes
        runs[stack] = run = run_values(values, stack=stack, calls=calls, stacks=backend, down=down, preview=preview)
        if not preview:
            backend[stack] = run.result["exports"]
    return runs


def a_set_is_up(topology: str) -> tuple[dict[str, Exports], dict[str, Run]]:
    backend = {stack_name(p): Exports() for p in PART_STACKS}  # `pulumi stack init` of every stack first
    return backend, up(order_of_up(topology), backend)


def the_set(runs: dict[str, Run]) -> Run:
    """What a set's part stacks (its platform stacks aside) registered between them, read as one run: every resource
    of each, each site's mirror config, and every stack's outputs (the backend holds them apart; keys do not clash,
    as each names its part)."""
    parts = [run for run in runs.values() if "settings" in run.result]
    mocks = RecordingMocks()
    mocks.resources = [r for run in parts for r in run.resources]
    mocks.calls = [c for run in parts for c in run.mocks.calls]
    exports = [run.result["exports"] for run in parts]
    assert sum(len(e.values) for e in exports) == len({k for e in exports for k in e.values}), "outputs clash"
    tops = [run.result["topology"] for run in parts]
    # Each of the topology's maps, by what it is keyed by: a part's own wins over what a later part reads of it.
    topology = replace(
        tops[0],
        **{
            f.name: {k: v for t in reversed(tops) for k, v in getattr(t, f.name).items()}
            for f in fields(tops[0])
            if isinstance(getattr(tops[0], f.name), dict)
        },
        checkpoint_container=next((t.checkpoint_container for t in tops if t.checkpoint_container), None),
    )
    merged = Run(mocks)
    merged.result = {
        "settings": parts[0].result["settings"],
        "topology": topology,
        "configs": {site: c for run in parts for site, c in run.result["configs"].items()},
        "credential_is_secret": {k: v for run in parts for k, v in run.result["credential_is_secret"].items()},
        "exports": Exports(
            {k: v for e in exports for k, v in e.values.items()},
            [k for e in exports for k in e.secret],
            {u: i for e in exports for u, i in e.state.items()},
        ),
    }
    return merged


def run_stack(path: Path) -> Run:
    """The whole program (__main__'s build) with a stack file's config and sentinel secrets."""
    return run_values(with_secrets(stack_values(path)), stack=stack_name(path))


def run_values(
    values: dict[str, Any],
    stack: str = "test",
    calls: dict[str, Answer] | None = None,
    stacks: dict[str, Exports] | None = None,
    down: str | None = None,
    preview: bool = False,
) -> Run:
    """The whole program (as __main__ runs it) with these config values (secrets included); `result["exports"]` is
    what the backend would keep of the stack after an `up` (run_pulumi says what the other arguments do)."""
    from infra.settings import load_platform, load_settings, read_part
    from infra.topology import build, build_platform, exports

    async def body() -> dict[str, Any]:
        config = pulumi.Config(PROJECT)
        part = read_part(config)
        found: dict[str, Any] = {}
        if part is not None and part.kind == "platform":
            outputs = build_platform(load_platform(config))
        else:
            settings = load_settings()
            topology = build(settings)
            outputs = exports(topology)
            found = {
                "settings": settings,
                "topology": topology,
                "configs": {site: await out.future() for site, out in topology.mirror_configs.items()},
                "credential_is_secret": {
                    f"{alias}.{key}": await out.is_secret()
                    for alias, files in topology.credentials.items()
                    for key, out in files.items()
                },
            }
        held = {k: pulumi.Output.from_input(v) for k, v in outputs.items()}
        found["exports"] = Exports(
            {k: unwrap(await v.future()) for k, v in held.items()},
            [k for k, v in held.items() if await v.is_secret()],
        )
        return found

    run = run_pulumi(body, values, stack=stack, calls=calls, stacks=stacks, down=down, preview=preview)
    run.result["exports"] = replace(run.result["exports"], state={r.urn: r.inputs for r in run.resources})
    return run
