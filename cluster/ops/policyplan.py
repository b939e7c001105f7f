"""`quorumgate policy plan FILE --dir D` and `policy apply`: make a live cluster match a
policy file (docs/policies.md; the file's format: sidecar/policyfile.py).

    quorumgate policy plan  rules.toml --dir run/c4 [--json]
    quorumgate policy apply rules.toml --dir run/c4 [--json]

The file is the one `quorumgate policy test` reads. `plan` reads the live registry (what
f+1 sidecars agree on, `Client.registry`) and prints the owner operations that would make
the cluster match the file; `apply` submits them, one certified operation at a time, and
stops at the first one the cluster rejects. Applying twice changes nothing: every step is
planned from a difference, and a cluster that matches has none.

The file is authoritative for what it names, and for the settings:

- `[settings]`: every setting of the log (`SETTING_NAMES`) is set to the file's value, or
  cleared back to cluster.json's when the file leaves it out; any other engine limit is
  fixed in cluster.json, and a file that asks another value is an error;
- sinks, tools, principals and agents it names are registered, or registered again where
  they differ (a tool's spec, a principal's deputies, the principal an agent acts for, a
  sink's key), and each agent's mandate set where it differs (a new mandate version, which
  clears that agent's latch, only then); a new sink, principal or agent needs its
  `public_key` in the file; a key that differs from a registered principal's or agent's
  is an error (keys are not rotated: a new key is a new id);
- the named sets of every agent it names are set to the file's, and sets the file does not
  list for those agents are deleted;
- what is registered and not in the file is left alone (and listed); envelopes,
  delegations and calls are test fixtures and are not applied.

Exit codes: 0 planned or applied (nothing left to do), 1 a step was rejected, 2 a bad file,
a plan with errors, or the cluster unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quorumgate.proto.clusterfile import ClusterFileError, ClusterSpec, load_cluster
from quorumgate.proto.model import (
    SETTING_NAMES,
    Admin,
    AdminOp,
    Outcome,
    RegisterAgent,
    RegisterPrincipal,
    RegisterSink,
    RegisterTool,
    SetEntries,
    SetMandate,
    SetSettings,
)
from quorumgate.sdk.client import Client, QuorumGateError
from quorumgate.sdk.registry import Registry
from quorumgate.sidecar.engine.core import EngineConfig, config_for_cluster
from quorumgate.sidecar.policyfile import Policy, PolicyFileError, load_policy

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_ERROR = 2
# Keys of a policy file's [settings] that describe the test's own chain, not a limit.
TEST_ONLY_SETTINGS = frozenset({"chain_id"})


@dataclass(frozen=True)
class Step:
    """One owner operation of a plan, and why it is needed."""

    op: AdminOp
    what: str  # "register-tool payments.send"
    why: str  # "new" / "differs: mode, schemes"

    def line(self) -> str:
        return f"{self.what} ({self.why})"


@dataclass
class Plan:
    steps: list[Step] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    untouched: list[str] = field(default_factory=list)  # registered, not in the file

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": [{"operation": s.what, "why": s.why} for s in self.steps],
            "errors": list(self.errors),
            "left_alone": list(self.untouched),
        }


# ---------------------------------------------------------------------------- planning


def plan(policy: Policy, registry: Registry, config: EngineConfig) -> Plan:
    """The owner operations that make a cluster with `registry` (and engine `config`,
    cluster.json's) match `policy`, in an order the engine accepts: settings, sinks,
    tools, principals, agents, mandates, sets. A pure function."""
    out = Plan()
    _plan_settings(policy, registry, config, out)
    _plan_sinks(policy, registry, out)
    _plan_tools(policy, registry, out)
    _plan_principals(policy, registry, out)
    _plan_agents(policy, registry, out)
    _plan_sets(policy, registry, out)
    return out


def _plan_settings(policy: Policy, registry: Registry, config: EngineConfig, out: Plan) -> None:
    live = dict(registry.settings)
    values: dict[str, int] = {}
    clear: list[str] = []
    for name, wanted in sorted(policy.settings.items()):
        if name in TEST_ONLY_SETTINGS or name in SETTING_NAMES:
            continue
        fixed = getattr(config, name, None)
        if fixed != wanted:
            out.errors.append(
                f"settings.{name}: fixed in cluster.json ({fixed}); the file asks {wanted}, "
                "which only a new cluster can have"
            )
    for name in SETTING_NAMES:
        wanted = policy.settings.get(name)
        static = getattr(config, name, None)
        if wanted is None or wanted == static:
            if name in live:
                clear.append(name)  # back to cluster.json's value
        elif live.get(name) != wanted:
            values[name] = wanted
    if values or clear:
        changed = ", ".join([*(f"{k}={v}" for k, v in sorted(values.items())), *clear])
        op = SetSettings(values=tuple(sorted(values.items())), clear=tuple(sorted(clear)))
        out.steps.append(Step(op, "set-settings", changed))


def _plan_sinks(policy: Policy, registry: Registry, out: Plan) -> None:
    live = dict(registry.sinks)
    for name in policy.sinks:
        key = policy.public_keys.get(("sink", name))
        if name not in live:
            if key is None:
                out.errors.append(f"sinks.{name}: not registered, and the file gives no public_key")
            else:
                out.steps.append(Step(RegisterSink(name, key), f"register-sink {name}", "new"))
        elif key is not None and key != live[name]:
            out.steps.append(Step(RegisterSink(name, key), f"register-sink {name}", "new key"))
    out.untouched += [f"sink {s}" for s in sorted(set(live) - set(policy.sinks))]


def _plan_tools(policy: Policy, registry: Registry, out: Plan) -> None:
    live = {t.name: t for t in registry.tools}
    for name, spec in sorted(policy.tools.items()):
        current = live.get(name)
        if current == spec:
            continue
        why = "new" if current is None else "differs: " + _differences(current, spec)
        out.steps.append(Step(RegisterTool(spec), f"register-tool {name}", why))
    out.untouched += [f"tool {t}" for t in sorted(set(live) - set(policy.tools))]


def _plan_principals(policy: Policy, registry: Registry, out: Plan) -> None:
    live = {p.principal_id: p for p in registry.principals}
    later: list[Step] = []
    for name in policy.principals:
        key = policy.public_keys.get(("principal", name))
        deputies = policy.deputies.get(name, ())
        current = live.get(name)
        if current is None:
            if key is None:
                out.errors.append(
                    f"principals.{name}: not registered, and the file gives no public_key"
                )
                continue
            out.steps.append(
                Step(RegisterPrincipal(name, key), f"register-principal {name}", "new")
            )
            if deputies:  # named once every principal of the file is registered
                later.append(
                    Step(
                        RegisterPrincipal(name, key, deputies),
                        f"register-principal {name}",
                        "deputies " + ",".join(deputies),
                    )
                )
            continue
        if key is not None and key != current.public_key:
            out.errors.append(
                f"principals.{name}: registered with another key (keys are not rotated: "
                "a new key is a new principal id)"
            )
            continue
        if current.deputies != deputies:
            later.append(
                Step(
                    RegisterPrincipal(name, current.public_key, deputies),
                    f"register-principal {name}",
                    "deputies " + (",".join(deputies) or "none"),
                )
            )
    out.steps += later
    out.untouched += [f"principal {p}" for p in sorted(set(live) - set(policy.principals))]


def _plan_agents(policy: Policy, registry: Registry, out: Plan) -> None:
    live = {a.agent_id: a for a in registry.agents}
    mandates: list[Step] = []
    for name, mandate in sorted(policy.agents.items()):
        key = policy.public_keys.get(("agent", name))
        principal = policy.agent_principal.get(name, "")
        current = live.get(name)
        if current is None:
            if key is None:
                out.errors.append(
                    f"agents.{name}: not registered, and the file gives no public_key"
                )
                continue
            out.steps.append(
                Step(RegisterAgent(name, key, principal), f"register-agent {name}", "new")
            )
        elif key is not None and key != current.public_key:
            out.errors.append(
                f"agents.{name}: registered with another key (keys are not rotated: a new key "
                "is a new agent id)"
            )
            continue
        elif current.principal != principal:
            out.steps.append(
                Step(
                    RegisterAgent(name, current.public_key, principal),
                    f"register-agent {name}",
                    f"acts for {principal or 'the owner'}",
                )
            )
        if current is None or current.mandate != mandate:
            why = (
                "new"
                if current is None or current.mandate is None
                else "differs: " + _differences(current.mandate, mandate)
            )
            mandates.append(Step(SetMandate(name, mandate), f"set-mandate {name}", why))
    out.steps += mandates
    out.untouched += [f"agent {a}" for a in sorted(set(live) - set(policy.agents))]


def _plan_sets(policy: Policy, registry: Registry, out: Plan) -> None:
    live = {(s.principal, s.name): s.entries for s in registry.sets}
    named = set(policy.agents)
    for (agent, name), entries in sorted(policy.sets.items()):
        if live.get((agent, name)) != entries:
            why = "new" if (agent, name) not in live else "entries differ"
            op = SetEntries(agent, name, entries)
            out.steps.append(Step(op, f"set-entries {agent}.{name}", why))
    for agent, name in sorted(live):
        if agent in named and (agent, name) not in policy.sets:
            op = SetEntries(agent, name, ())
            out.steps.append(Step(op, f"set-entries {agent}.{name}", "not in the file: deleted"))


def _differences(current: object, wanted: object) -> str:
    fields = getattr(current, "__dataclass_fields__", {})
    changed = [f for f in fields if getattr(current, f) != getattr(wanted, f)]
    return ", ".join(changed) or "equal"


# ---------------------------------------------------------------------------- I/O shell


async def read_registry(client: Client) -> Registry:
    return await client.registry()


async def apply_plan(client: Client, steps: list[Step]) -> tuple[int, list[dict[str, Any]]]:
    """Submit each step as an owner operation and wait for its certificate; stop at the
    first rejected one. Returns (exit code, one record per step submitted)."""
    done: list[dict[str, Any]] = []
    for step in steps:
        decision = await client.decide(Admin(op=step.op))
        record = {
            "operation": step.what,
            "why": step.why,
            "outcome": decision.outcome.value,
            "reason": decision.reason,
            "height": decision.height,
        }
        done.append(record)
        if decision.outcome is not Outcome.APPLIED:
            return EXIT_REJECTED, done
    return EXIT_OK, done


def _print_plan(result: Plan, file: str, out: Any) -> None:
    for error in result.errors:
        out.write(f"error: {error}\n")
    if not result.steps:
        out.write(f"nothing to do: the cluster matches {file}\n")
    for k, step in enumerate(result.steps, 1):
        out.write(f"{k:3d}. {step.line()}\n")
    if result.untouched:
        out.write(f"left alone (registered, not in the file): {', '.join(result.untouched)}\n")


def run_plan_command(args: argparse.Namespace, *, apply: bool, out: Any = None) -> int:
    """`quorumgate policy plan|apply FILE --dir D [--json]`."""
    out = out or sys.stdout
    try:
        policy = load_policy(args.file)
    except PolicyFileError as err:
        out.write(f"policy {'apply' if apply else 'plan'}: malformed policy file\n  {err}\n")
        return EXIT_ERROR
    try:
        spec: ClusterSpec = load_cluster(Path(args.dir))
    except ClusterFileError as err:
        sys.stderr.write(f"quorumgate: {err}\n")
        return EXIT_ERROR

    async def main() -> int:
        async with Client.as_owner(spec.directory) as client:
            result = plan(policy, await read_registry(client), config_for_cluster(spec))
            doc: dict[str, Any] = {"file": args.file, **result.to_json()}
            if result.errors:
                if args.json:
                    out.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
                else:
                    _print_plan(result, args.file, out)
                return EXIT_ERROR
            if not apply:
                if args.json:
                    out.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
                else:
                    _print_plan(result, args.file, out)
                return EXIT_OK
            code, done = await apply_plan(client, result.steps)
            doc["applied"] = done
            if args.json:
                out.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
            else:
                if not done:
                    out.write(f"nothing to do: the cluster matches {args.file}\n")
                for k, record in enumerate(done, 1):
                    out.write(
                        f"{k:3d}. {record['operation']}: {record['outcome']} ({record['reason']}) "
                        f"at height {record['height']}\n"
                    )
                if code != EXIT_OK:
                    out.write("stopped at the first rejected operation\n")
            return code

    try:
        return asyncio.run(main())
    except QuorumGateError as err:
        sys.stderr.write(f"quorumgate: {err} ({err.reason})\n")
        return EXIT_ERROR


def add_policy_plan_commands(policy_sub: Any) -> None:
    for name, apply, what in (
        ("plan", False, "print the owner operations that make a live cluster match a file"),
        ("apply", True, "submit them (idempotent: applying twice changes nothing)"),
    ):
        command = policy_sub.add_parser(name, help=what)
        command.add_argument("file")
        command.add_argument("--dir", required=True, help="the cluster directory")
        command.add_argument("--json", action="store_true")
        command.set_defaults(func=lambda args, apply=apply: run_plan_command(args, apply=apply))
