"""A small world for driving the engine with real signed transactions.

Keys are derived from names (no randomness), block time advances by a fixed step, and every
block is logged so a test can replay the same log into a second engine.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from nacl.public import PrivateKey, SealedBox
from nacl.signing import SigningKey

from quorumgate.proto import tx
from quorumgate.proto.chainversions import runs_opened_by_the_chain
from quorumgate.proto.model import (
    Admin,
    AdminOp,
    Argument,
    Confirm,
    Delegate,
    DelegationPolicy,
    Enforcement,
    EnvelopeArg,
    Mandate,
    Outcome,
    Proposal,
    RegisterAgent,
    RegisterPrincipal,
    RegisterSink,
    RegisterTool,
    Revoke,
    RoleTarget,
    SealedValue,
    SealEnvelope,
    SetMandate,
    TargetSlot,
    Tier,
    ToolMode,
    ToolRules,
    ToolSpec,
    TxPayload,
    canonical_tool_list,
)
from quorumgate.proto.runs import RunLabels
from quorumgate.sidecar.engine.config import EngineConfig
from quorumgate.sidecar.engine.core import Engine
from quorumgate.sidecar.engine.state import COUNTED_FIELDS, SECTIONS, assemble_state
from quorumgate.sidecar.engine.statements import BlockResult, Verdict

CHAIN = "qg-test"
START_MS = 1_000_000
STEP_MS = 1_000


def signing_key(name: str) -> SigningKey:
    return SigningKey(hashlib.sha256(b"qg-test/agent/" + name.encode()).digest())


def sink_private_key(name: str) -> PrivateKey:
    return PrivateKey(hashlib.sha256(b"qg-test/sink/" + name.encode()).digest())


@dataclass
class World:
    """An engine plus the keys, nonces and log of one test."""

    overrides: dict[str, int] = field(default_factory=dict)
    verify: bool = True
    raw_runs: bool = False  # send run labels as they are (no RunLabels binding)

    def __post_init__(self) -> None:
        self.owner = signing_key("owner")
        self.config = EngineConfig(
            chain_id=CHAIN, owner_public_key=bytes(self.owner.verify_key), **self.overrides
        )
        self.engine = Engine(self.config)
        self.height = 0
        self.time_ms = START_MS
        self.nonces: dict[bytes, int] = {}
        self.keys: dict[str, SigningKey] = {}
        self.sinks: dict[str, PrivateKey] = {}
        self.log: list[tuple[int, int, list[bytes]]] = []
        self.results: list[BlockResult] = []
        self.saved: dict[tuple[int, bytes], bytes] = {}  # what an entry-wise store would hold
        self.run_labels: dict[bytes, RunLabels] = {}  # signer -> its labels' runs

    # ---------------------------------------------------------------- raw blocks

    def next_nonce(self, key: SigningKey) -> int:
        signer = bytes(key.verify_key)
        self.nonces[signer] = self.nonces.get(signer, 0) + 1
        return self.nonces[signer]

    def tx(self, key: SigningKey, payload: TxPayload, nonce: int | None = None) -> bytes:
        nonce = nonce if nonce is not None else self.next_nonce(key)
        return tx.build(CHAIN, nonce, self.bind_run(key, payload, nonce), key)

    def bind_run(self, key: SigningKey, payload: TxPayload, nonce: int) -> TxPayload:
        """Tests name runs by label ("run-1"); on chains where runs are opened by the
        chain (`runs_opened_by_the_chain`) a run is named after the nonce of the
        transaction that opened it (proto/runs.py), so the label becomes that run, per
        signer, as an SDK client does. Under a grant, the label
        is looked up among the run owner's (a label it never used stays as it is, so a
        test can name a wrong run). `raw_runs = True` sends labels as they are (to attack)."""
        if not runs_opened_by_the_chain(self.config.authority_version) or self.raw_runs:
            return payload
        if isinstance(payload, Proposal | Delegate):
            grant_id = payload.grant if isinstance(payload, Proposal) else payload.parent_grant
            if grant_id is None:
                run = self._labels(key).bind(payload.run_id, nonce)
            else:
                grant = self.engine.state.grants.get(grant_id)
                owner = self.keys.get(grant.run_owner) if grant is not None else None
                found = self._labels(owner).get(payload.run_id) if owner is not None else None
                run = found or payload.run_id
            return dataclasses.replace(payload, run_id=run)
        return payload

    def _labels(self, key: SigningKey) -> RunLabels:
        return self.run_labels.setdefault(bytes(key.verify_key), RunLabels())

    def run_of(self, agent: str, label: str) -> str:
        """The run id a label names for an agent (the label itself on chains where the
        agent names its runs)."""
        if not runs_opened_by_the_chain(self.config.authority_version):
            return label
        found = self._labels(self.keys[agent]).get(label)
        assert found is not None, f"{agent} has not used run {label!r}"
        return found

    def block(self, txs: Sequence[bytes], advance_ms: int = STEP_MS) -> BlockResult:
        self.height += 1
        self.time_ms += advance_ms
        result = self.engine.execute_block(self.height, self.time_ms, list(txs), self.verify)
        # every engine test checks the per-entry caches and the incremental root against a
        # fresh encoding, and that a store writing only each height's changes holds the state
        delta = self.engine.state_delta()
        state = self.engine.state
        assert self.engine.state_bytes() == state.fresh_bytes(), self.height
        assert state.tree_root() == state.fresh_tree_root(), self.height
        for name, counted in COUNTED_FIELDS.items():  # the caps' counters, against a scan
            scan = Counter(getattr(entry, counted) for entry in dict.values(getattr(state, name)))
            assert state._counts[name] == dict(scan), (self.height, name)
        if delta.full:
            self.saved.clear()
        for section, key, data in delta.changes:
            if data is None:
                del self.saved[(section, key)]
            else:
                self.saved[(section, key)] = data
        sections: list[list[bytes]] = [[] for _ in SECTIONS]
        for section, key in sorted(self.saved):
            sections[section].append(self.saved[(section, key)])
        assert assemble_state(delta.header, sections) == self.engine.state_bytes()
        self.log.append((self.height, self.time_ms, list(txs)))
        self.results.append(result)
        return result

    def one(self, key: SigningKey, payload: TxPayload, advance_ms: int = STEP_MS) -> Verdict:
        return self.block([self.tx(key, payload)], advance_ms).verdicts[0]

    def advance(self, ms: int) -> None:
        """Let block time pass with an empty block."""
        self.block([], advance_ms=ms)

    # ---------------------------------------------------------------- administration

    def admin(self, op: AdminOp) -> Verdict:
        verdict = self.one(self.owner, Admin(op=op))
        assert verdict.outcome is Outcome.APPLIED, verdict
        return verdict

    def add_sink(self, name: str) -> PrivateKey:
        private = sink_private_key(name)
        self.sinks[name] = private
        self.admin(RegisterSink(sink_id=name, public_key=bytes(private.public_key)))
        return private

    def add_tool(
        self,
        name: str,
        mode: ToolMode = ToolMode.DIRECT,
        schemes: tuple[str, ...] = ("https",),
        sink: str | None = None,
        envelope_args: tuple[EnvelopeArg, ...] = (),
        min_tier: Tier = Tier.DELEGATE,
        binds_caller: bool = False,
        target_roles: tuple[TargetSlot, ...] = (),
        target_optional: bool = False,
    ) -> Verdict:
        return self.admin(
            RegisterTool(
                spec=ToolSpec(
                    name=name,
                    mode=mode,
                    sink=sink,
                    target_schemes=tuple(sorted(schemes)),
                    envelope_args=envelope_args,
                    min_tier=min_tier,
                    binds_caller=binds_caller,
                    target_roles=target_roles,
                    target_optional=target_optional,
                )
            )
        )

    def add_agent(
        self,
        name: str,
        tools: Sequence[str] | None = None,
        *,
        enforcement: Enforcement = Enforcement.ENFORCE,
        policy: DelegationPolicy = DelegationPolicy.NONE,
        depth: int | None = None,
        suspended: bool = False,
        rules: Sequence[ToolRules] = (),
        principal: str = "",
    ) -> SigningKey:
        key = signing_key(name)
        self.keys[name] = key
        self.admin(
            RegisterAgent(agent_id=name, public_key=bytes(key.verify_key), principal=principal)
        )
        self.set_mandate(
            name,
            tools,
            enforcement=enforcement,
            policy=policy,
            depth=depth,
            suspended=suspended,
            rules=rules,
        )
        return key

    def add_principal(self, name: str) -> SigningKey:
        """A principal (split authority): its key is `keys["principal:<name>"]`."""
        key = signing_key("principal/" + name)
        self.keys["principal:" + name] = key
        self.admin(RegisterPrincipal(principal_id=name, public_key=bytes(key.verify_key)))
        return key

    def set_mandate(
        self,
        name: str,
        tools: Sequence[str] | None,
        *,
        enforcement: Enforcement = Enforcement.ENFORCE,
        policy: DelegationPolicy = DelegationPolicy.NONE,
        depth: int | None = None,
        suspended: bool = False,
        rules: Sequence[ToolRules] = (),
    ) -> Verdict:
        mandate = Mandate(
            allowed_tools=None if tools is None else canonical_tool_list(list(tools)),
            enforcement=enforcement,
            suspended=suspended,
            delegation_policy=policy,
            max_delegation_depth=depth,
            rules=tuple(sorted(rules, key=lambda r: r.tool)),
        )
        return self.admin(SetMandate(agent_id=name, mandate=mandate))

    # ---------------------------------------------------------------- agent actions

    def propose(
        self,
        agent: str,
        tool: str,
        target: str = "https://example.com/x",
        *,
        run: str = "run-1",
        args: Sequence[Argument] = (),
        grant: bytes | None = None,
        advance_ms: int = STEP_MS,
        targets: Sequence[tuple[str, str]] = (),
    ) -> Verdict:
        payload = Proposal(
            run_id=run,
            tool=tool,
            target=target,
            arguments=tuple(args),
            grant=grant,
            targets=tuple(RoleTarget(role, value) for role, value in targets),
        )
        return self.one(self.keys[agent], payload, advance_ms)

    def delegate(
        self,
        parent: str,
        child: str,
        *,
        run: str = "run-1",
        tools: Sequence[str] | None = None,
        expires_in_ms: int = 600_000,
        parent_grant: bytes | None = None,
        rules: Sequence[ToolRules] = (),
    ) -> Verdict:
        payload = Delegate(
            child=bytes(self.keys[child].verify_key),
            run_id=run,
            tools=None if tools is None else canonical_tool_list(list(tools)),
            expires_at_ms=self.time_ms + STEP_MS + expires_in_ms,
            parent_grant=parent_grant,
            rules=tuple(sorted(rules, key=lambda r: r.tool)),
        )
        return self.one(self.keys[parent], payload)

    def revoke(self, signer: SigningKey, grant: bytes) -> Verdict:
        return self.one(signer, Revoke(grant=grant))

    def confirm(
        self, signer: SigningKey, proposal_id: bytes, card_digest: bytes, *, reject: bool = False
    ) -> Verdict:
        payload = Confirm(proposal_id=proposal_id, card_digest=card_digest, reject=reject)
        return self.one(signer, payload)

    def seal(
        self,
        signer: SigningKey,
        kind: str,
        plaintext: bytes,
        sinks: Sequence[str],
        owner_principal: str | None = None,
    ) -> Verdict:
        sealed = tuple(
            SealedValue(
                sink=sink, ciphertext=SealedBox(self.sinks[sink].public_key).encrypt(plaintext)
            )
            for sink in sinks
        )
        payload = SealEnvelope(kind=kind, sealed=sealed, owner_principal=owner_principal)
        return self.one(signer, payload)


def replay(world: World) -> tuple[Engine, list[BlockResult]]:
    """Run a world's whole log through a fresh engine with the same config."""
    engine = Engine(world.config)
    results = [engine.execute_block(h, t, txs, world.verify) for h, t, txs in world.log]
    return engine, results


def text(value: str) -> Argument:
    return Argument(name="q", text=value)
