"""The operator's policy test kit: prove that every rule you write can fire.

    quorumgate policy test FILE [--json]

A policy file is TOML: sinks, tools, agents with their mandates, optional envelopes and
delegations, and a list of calls, each with the verdict it must get. The kit runs the
calls through the real governance engine (no cluster, no network, no clock), compares, and
warns about every mandate entry that no call ever makes fire - a rule without a test that
proves it can fire is a rule nobody knows works.

Operators write names, never keys: every key is derived from the name (a fixed seed per
name), so a file means the same thing on every machine. Exit codes: 0 when every
expectation holds, 1 when any fails, 2 when the file is malformed (the message names the
line, or the field, that is wrong).

The file's shape, and how it is read and checked: sidecar/policyfile.py (the same file
`policy plan` and `policy apply` make a live cluster match).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from nacl.public import PrivateKey, SealedBox
from nacl.signing import SigningKey

from quorumgate.proto import names, tx
from quorumgate.proto.model import (
    Admin,
    Argument,
    Confirm,
    Delegate,
    Outcome,
    Proposal,
    Reason,
    RegisterAgent,
    RegisterPrincipal,
    RegisterSink,
    RegisterTool,
    RoleTarget,
    SealedValue,
    SealEnvelope,
    SetEntries,
    SetMandate,
    SetSettings,
    TxPayload,
)
from quorumgate.proto.runs import RunLabels
from quorumgate.sidecar.engine.core import Engine, EngineConfig
from quorumgate.sidecar.engine.rules import rule_matches
from quorumgate.sidecar.engine.statements import OWNER_PRINCIPAL, PRINCIPAL_PREFIX, Verdict
from quorumgate.sidecar.engine.targets import UNCHECKED_TARGET, split_call
from quorumgate.sidecar.engine.trace import Trace
from quorumgate.sidecar.policyfile import (
    CONFIG_FIELDS,
    STEP_MS,
    CallSpec,
    Policy,
    PolicyFileError,
    load_policy,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_MALFORMED = 2

SEED = b"quorumgate/policykit/v1/"
START_MS = 1_700_000_000_000
# Reasons a call can only get after its scope check passed: the mandate entry fired.
_AFTER_SCOPE = frozenset(
    {
        Reason.OK, Reason.CONFIRMATION_REQUIRED, Reason.TIER_INSUFFICIENT,
        Reason.MALFORMED_TARGET, Reason.TARGET_SCHEME_NOT_ALLOWED,
        Reason.CROSS_PRINCIPAL_TARGET, Reason.MALFORMED_ARGUMENT,
        Reason.AMBIENT_IDENTITY_ARGUMENT, Reason.ENVELOPE_REQUIRED, Reason.HANDLE_VIOLATION,
        Reason.HANDLE_KIND_MISMATCH, Reason.STATUS_TOOL_ARGUMENT, Reason.PENDING_LIMIT,
    }
)  # fmt: skip
_OUT_OF_SCOPE = frozenset({Reason.OUT_OF_SCOPE, Reason.OUT_OF_SCOPE_OBSERVED, Reason.REPEAT_DENIED})


def _key(kind: str, name: str) -> bytes:
    return hashlib.sha256(SEED + kind.encode() + b"/" + name.encode()).digest()


def agent_key(name: str) -> SigningKey:
    return SigningKey(_key("agent", name))


def principal_key(name: str) -> SigningKey:
    return SigningKey(_key("principal", name))


def owner_key() -> SigningKey:
    return SigningKey(_key("owner", "owner"))


def sink_key(name: str) -> PrivateKey:
    return PrivateKey(_key("sink", name))


# ------------------------------------------------------------------------ running


@dataclass
class CallResult:
    name: str
    expect: str
    expect_reason: str | None
    outcome: str
    reason: str
    passed: bool
    confirm: dict[str, Any] | None = None


@dataclass
class Report:
    path: str
    results: list[CallResult]
    warnings: list[str]
    setup_failures: list[str]

    @property
    def ok(self) -> bool:
        return not self.setup_failures and all(r.passed for r in self.results)

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.path,
            "ok": self.ok,
            "passed": sum(r.passed for r in self.results),
            "failed": sum(not r.passed for r in self.results) + len(self.setup_failures),
            "setup_failures": self.setup_failures,
            "results": [dataclasses.asdict(r) for r in self.results],
            "warnings": self.warnings,
        }


class _Runner:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.owner = owner_key()
        try:
            config = EngineConfig(
                chain_id=policy.chain_id,
                owner_public_key=bytes(self.owner.verify_key),
                **{k: v for k, v in policy.settings.items() if k in CONFIG_FIELDS},
            )
        except ValueError as exc:
            raise PolicyFileError(f"settings: {exc}") from None
        self.engine = Engine(config)
        self.height = 0
        self.time_ms = START_MS
        self.nonces: dict[bytes, int] = {}
        self.keys = {name: agent_key(name) for name in policy.agents}
        self.handles: dict[str, str] = {}
        self.grants: dict[str, bytes] = {}
        self.fired: set[tuple[str, str]] = set()  # (agent, rule)
        self.run_labels: dict[bytes, RunLabels] = {}  # signer -> its labels' runs

    def _signed(self, key: SigningKey, payload: TxPayload) -> bytes:
        signer = bytes(key.verify_key)
        self.nonces[signer] = self.nonces.get(signer, 0) + 1
        nonce = self.nonces[signer]
        return tx.build(self.policy.chain_id, nonce, self._bind_run(signer, payload, nonce), key)

    def _bind_run(self, signer: bytes, payload: TxPayload, nonce: int) -> TxPayload:
        """Runs are named by label in the file; on chains of authority version 2 each label
        is the run its signer's first transaction in it opened (proto/runs.py), as an SDK
        client does; under a grant, the run owner's run of that label."""
        if not self.engine.config.split_authority:
            return payload
        if not isinstance(payload, Proposal | Delegate):
            return payload
        grant_id = payload.grant if isinstance(payload, Proposal) else payload.parent_grant
        if grant_id is None:
            run = self.run_labels.setdefault(signer, RunLabels()).bind(payload.run_id, nonce)
        else:
            grant = self.engine.state.grants.get(grant_id)
            owner = bytes(self.keys[grant.run_owner].verify_key) if grant is not None else b""
            labels = self.run_labels.get(owner)
            run = (labels.get(payload.run_id) if labels is not None else None) or payload.run_id
        return dataclasses.replace(payload, run_id=run)

    def block(
        self, txs: list[bytes], advance_ms: int = STEP_MS, trace: Trace | None = None
    ) -> list[Verdict]:
        self.height += 1
        self.time_ms += advance_ms
        result = self.engine.execute_block(self.height, self.time_ms, txs, trace=trace)
        return list(result.verdicts)

    def setup(self) -> list[str]:
        p = self.policy
        admin: list[tuple[str, TxPayload]] = []
        # settings only the log holds (the quotas): set there, as `policy apply` would
        logged = tuple((k, v) for k, v in sorted(p.settings.items()) if k not in CONFIG_FIELDS)
        if logged:
            admin.append(("settings", Admin(SetSettings(values=logged))))
        for sink in p.sinks:
            public = bytes(sink_key(sink).public_key)
            admin.append((f"sinks.{sink}", Admin(RegisterSink(sink, public))))
        for name, spec in p.tools.items():
            admin.append((f"tools.{name}", Admin(RegisterTool(spec))))
        for name in p.principals:
            public = bytes(principal_key(name).verify_key)
            admin.append((f"principals.{name}", Admin(RegisterPrincipal(name, public))))
        for name, mandate in p.agents.items():
            key = bytes(self.keys[name].verify_key)
            principal = p.agent_principal.get(name, "")
            admin.append((f"agents.{name}", Admin(RegisterAgent(name, key, principal))))
            admin.append((f"agents.{name}", Admin(SetMandate(name, mandate))))
        for (owner, name), entries in sorted(p.sets.items()):
            admin.append((f"sets.{owner}.{name}", Admin(SetEntries(owner, name, entries))))
        verdicts = self.block([self._signed(self.owner, payload) for _, payload in admin])
        for (where, _), verdict in zip(admin, verdicts, strict=True):
            if verdict.outcome is not Outcome.APPLIED:
                raise PolicyFileError(f"{where}: the engine refuses it ({verdict.reason.value})")

        for name, env in p.envelopes.items():
            placeholder = f"policykit placeholder for {name}".encode()
            sealed = tuple(
                SealedValue(sink, SealedBox(sink_key(sink).public_key).encrypt(placeholder))
                for sink in env["sinks"]
            )
            payload: TxPayload
            if env["verified"]:
                payload = SealEnvelope(env["kind"], sealed, owner_principal=env["owner"])
                signer = self.owner
            else:
                payload = SealEnvelope(env["kind"], sealed)
                signer = self.keys[env["owner"]]
            verdict = self.block([self._signed(signer, payload)])[0]
            if verdict.outcome is not Outcome.APPLIED:
                raise PolicyFileError(
                    f"envelopes.{name}: the engine refuses it ({verdict.reason.value})"
                )
            self.handles[name] = verdict.subject

        failures = []
        for name, d in p.delegations.items():
            parent_grant = self.grants.get(d["parent_grant"]) if d["parent_grant"] else None
            payload = Delegate(
                child=bytes(self.keys[d["child"]].verify_key),
                run_id=d["run"],
                tools=None if d["tools"] is None else tuple(d["tools"]),
                expires_at_ms=max(1, self.time_ms + STEP_MS + d["expires_in_ms"]),
                parent_grant=parent_grant,
                rules=d["rules"],
            )
            verdict = self.block([self._signed(self.keys[d["parent"]], payload)])[0]
            if verdict.outcome is Outcome.APPLIED:
                self.grants[name] = verdict.tx_id
            got = verdict.outcome.value
            if got != d["expect"] or (d["reason"] and d["reason"] != verdict.reason.value):
                failures.append(
                    f"delegations.{name}: expected {d['expect']}"
                    + (f" ({d['reason']})" if d["reason"] else "")
                    + f", got {got} ({verdict.reason.value})"
                )
        return failures

    def _chain(self, via: str | None) -> list[str]:
        agents = []
        while via is not None:
            d = self.policy.delegations[via]
            agents.append(d["parent"])
            via = d["parent_grant"]
        return agents

    def run_call(self, call: CallSpec, trace: Trace | None = None) -> CallResult:
        verdict = self.propose(call, trace)
        passed = verdict.outcome.value == call.expect and (
            call.reason is None or call.reason == verdict.reason.value
        )
        result = CallResult(
            call.name, call.expect, call.reason, verdict.outcome.value, verdict.reason.value, passed
        )
        if call.confirm is not None and verdict.outcome is Outcome.PENDING:
            result.confirm = self._confirm(call, verdict)
            result.passed = result.passed and result.confirm["passed"]
        return result

    def propose(self, call: CallSpec, trace: Trace | None = None) -> Verdict:
        """Submit the call as its agent in a block of its own, and record which rules it
        made fire; `trace` records how the engine judged it (`policy explain`)."""
        arguments = [Argument(name=k, text=v) for k, v in sorted(call.args.items())]
        arguments += [
            Argument(name=k, handle=self.handles[v]) for k, v in sorted(call.handles.items())
        ]
        grant = None
        if call.via is not None:
            # an expected-refused delegation has no grant id: a random-looking stand-in
            grant = self.grants.get(call.via, hashlib.sha256(call.via.encode()).digest())
        try:
            further = tuple(RoleTarget(role, value) for role, value in call.also)
            payload = Proposal(call.run, call.tool, call.target, tuple(arguments), grant, further)
        except ValueError as exc:
            raise PolicyFileError(f"calls[{call.index}]: {exc}") from None
        signed = self._signed(self.keys[call.agent], payload)
        verdict = self.block([signed], call.advance_ms, trace)[0]
        self._record_firing(call, verdict)
        return verdict

    def _confirm(self, call: CallSpec, pending: Verdict) -> dict[str, Any]:
        spec = call.confirm
        assert spec is not None
        by = spec["by"]
        signer = self._confirmer(call, pending, by)
        digest = pending.card_digest if spec["digest"] == "card" else hashlib.sha256(b"x").digest()
        payload = Confirm(pending.proposal_id, digest, reject=spec["reject"])
        verdict = self.block([self._signed(signer, payload)], spec["after_ms"])[0]
        passed = verdict.outcome.value == spec["expect"] and (
            spec["reason"] is None or spec["reason"] == verdict.reason.value
        )
        return {
            "by": by, "expect": spec["expect"], "expect_reason": spec["reason"],
            "outcome": verdict.outcome.value, "reason": verdict.reason.value, "passed": passed,
        }  # fmt: skip

    def _confirmer(self, call: CallSpec, pending: Verdict, by: str) -> SigningKey:
        """`by`: "owner", an agent's or a principal's name, or "principal": the one the
        card names (authority version 2), or the proposing agent (version 1)."""
        if by == "principal":
            confirmer = pending.card.confirmer if pending.card is not None else ""
            if not confirmer:
                return self.keys[call.agent]
            if confirmer == OWNER_PRINCIPAL:
                return self.owner
            return principal_key(confirmer.removeprefix(PRINCIPAL_PREFIX))
        if by == "owner":
            return self.owner
        if by in self.policy.principals:
            return principal_key(by)
        return self.keys[by]

    def _record_firing(self, call: CallSpec, verdict: Verdict) -> None:
        tool = names.canonical_tool_name(call.tool) or call.tool
        involved = [call.agent, *self._chain(call.via)]
        if verdict.reason in _AFTER_SCOPE:
            for agent in involved:
                self.fired.add((agent, f"tool:{tool}"))
        if verdict.reason in _OUT_OF_SCOPE:
            for agent in involved:
                self.fired.add((agent, "out_of_scope"))
        if verdict.reason is Reason.SUSPENDED:
            for agent in involved:
                self.fired.add((agent, "suspended"))
        self.fired.add(("", f"called:{tool}"))
        if call.via is not None:
            self.fired.add(("", f"via:{call.via}"))
        self._record_target_rule(call.agent, tool, verdict)

    def _record_target_rule(self, agent: str, tool: str, verdict: Verdict) -> None:
        """Which of the agent's own target rules for `tool` decided the call: the first
        that matches its canonical target (as the engine reads them), when the call got
        as far as the rules (in scope by tool, the target canonical)."""
        mandate = self.policy.agents.get(agent)
        entry = None if mandate is None else mandate.rules_for(tool)
        reached = verdict.reason in _AFTER_SCOPE or verdict.reason in _OUT_OF_SCOPE
        prefix = tool + " "
        if entry is None or not reached or not verdict.canonical_target.startswith(prefix):
            return
        target, further = split_call(tool, verdict.canonical_target)
        if target == UNCHECKED_TARGET:
            return
        sets = self.engine.state.sets_of(agent)
        for role, each in (("", target), *further):  # each target: the first rule of its role
            for index, rule in enumerate(entry.targets):
                if rule.role == role and rule_matches(rule, each, agent, sets):
                    self.fired.add((agent, f"target:{tool}:{index}"))
                    break

    def warnings(self) -> list[str]:
        p = self.policy
        out = []
        for agent, mandate in p.agents.items():
            if mandate.allowed_tools is None:
                if not any(a == agent and r.startswith("tool:") for a, r in self.fired):
                    out.append(f"agents.{agent}.allowed_tools: unrestricted, and no call tests it")
            else:
                for tool in mandate.allowed_tools:
                    if (agent, f"tool:{tool}") not in self.fired:
                        out.append(
                            f'agents.{agent}.allowed_tools["{tool}"]: no call makes this rule fire'
                        )
                if (agent, "out_of_scope") not in self.fired and not mandate.suspended:
                    out.append(
                        f"agents.{agent}.enforcement ({mandate.enforcement.value}): no call "
                        "tries a tool outside the mandate"
                    )
            if mandate.suspended and (agent, "suspended") not in self.fired:
                out.append(f"agents.{agent}.suspended: no call shows the suspension denies")
            for entry in mandate.rules:
                for index, _ in enumerate(entry.targets):
                    if (agent, f"target:{entry.tool}:{index}") not in self.fired:
                        out.append(
                            f'agents.{agent}.rules."{entry.tool}".targets[{index}]: no call '
                            "makes this rule fire"
                        )
        for tool in p.tools:
            if ("", f"called:{tool}") not in self.fired:
                out.append(f"tools.{tool}: no call uses this tool")
        for name in p.delegations:
            if ("", f"via:{name}") not in self.fired and name in self.grants:
                out.append(f"delegations.{name}: no call acts under this delegation")
        return out


def check_policy(path: str) -> Report:
    """Run a policy file; PolicyFileError when it is malformed."""
    policy = load_policy(path)
    runner = _Runner(policy)
    setup_failures = runner.setup()
    results = [runner.run_call(call) for call in policy.calls]
    return Report(path, results, runner.warnings(), setup_failures)


def _print_text(report: Report, out: TextIO) -> None:
    write: Callable[[str], object] = out.write
    write(f"policy test: {report.path}\n")
    for failure in report.setup_failures:
        write(f"  FAIL  {failure}\n")
    for r in report.results:
        want = r.expect + (f" ({r.expect_reason})" if r.expect_reason else "")
        got = f"{r.outcome} ({r.reason})"
        line = f"  {'PASS' if r.passed else 'FAIL'}  {r.name}: "
        line += got if r.passed else f"expected {want}, got {got}"
        if r.confirm is not None:
            c = r.confirm
            cwant = c["expect"] + (f" ({c['expect_reason']})" if c["expect_reason"] else "")
            line += f"; confirmed by {c['by']}: {c['outcome']} ({c['reason']})"
            if not c["passed"]:
                line += f", expected {cwant}"
        write(line + "\n")
    if report.warnings:
        write("warnings:\n")
        for warning in report.warnings:
            write(f"  WARN  {warning}\n")
    passed = sum(r.passed for r in report.results)
    failed = len(report.results) - passed + len(report.setup_failures)
    write(
        f"{len(report.results)} calls, {passed} passed, {failed} failed, "
        f"{len(report.warnings)} warnings\n"
    )


def run_policy_test(path: str, *, json_output: bool = False, out: TextIO = sys.stdout) -> int:
    """`quorumgate policy test FILE [--json]`: 0 all hold, 1 some fail, 2 malformed file."""
    try:
        report = check_policy(path)
    except PolicyFileError as exc:
        if json_output:
            out.write(json.dumps({"file": path, "ok": False, "error": str(exc)}, indent=2) + "\n")
        else:
            out.write(f"policy test: malformed policy file\n  {exc}\n")
        return EXIT_MALFORMED
    if json_output:
        out.write(json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")
    else:
        _print_text(report, out)
    return EXIT_OK if report.ok else EXIT_FAILED
