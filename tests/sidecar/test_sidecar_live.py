"""Execution sidecars against a live 4-node cluster (issue 5, "Tests").

One module-scoped cluster (replicas and sidecars as real processes on loopback, the free
ports `init_cluster` picked), stopped in a finalizer whatever happened. The owner registers
two sinks and the tools of the engine's attack suite (tests/engine/test_attacks.py); each
test registers fresh agents, so quotas, latches and nonces of one test never reach another.

1. The BRAH attack classes end to end (I-1..I-4, C-1..C-4, A-2, D-1): real signed
   transactions from registered agents; each forbidden call is certified deny (or pending,
   where that is the rule), with the operator-only reason, and no sidecar's ledger holds an
   allow or flag for it — so no f+1 sidecars can certify one.
2. After a few hundred proposals of mixed outcomes, ledger heads, entry counts, artifact
   bytes and state roots at a common executed height are identical on all four sidecars.
3. A ledger column edited in a copy of a store is named by `quorumgate ledger verify`.
4. A sidecar SIGKILLed five times under load resumes exactly once per height, and
   `quorumgate replay` of it reports no mismatch.
5. A planted envelope secret is in no file, export or /metrics output of the cluster.
6. A sidecar whose store disagrees with the committed log raises the divergence alarm and
   stops, while the others go on certifying.

The divergence test leaves its sidecar stopped for good, so it runs last. Every wait is a
poll with a deadline (`wait_until`); nothing sleeps hoping that a condition became true.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sqlite3
import subprocess
import time
import urllib.request
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from cluster.client import (
    Decision,
    Handle,
    QuorumGateError,
    Refused,
    Submitted,
    SyncClient,
    TransactionRejected,
    mandate,
    tool_spec,
)
from cluster.clusterfile import (
    OWNER_KEY_FILE,
    ClusterSpec,
    init_cluster,
    read_seed,
)
from cluster.ops import (
    log_tail,
    running_pid,
    sidecar_status,
    start_cluster,
    start_nodes,
    stop_nodes,
    wait_sidecars_serving,
)
from qgpb import client_pb2 as cpb
from qgpb import client_pb2_grpc as cpb_grpc
from qgpb import sidecar_pb2 as spb
from qgpb import sidecar_pb2_grpc as spb_grpc
from replica.transport import CHANNEL_OPTIONS
from replica.types import Block
from replica.wire import decode_block
from sidecar.engine import tx as txlib
from sidecar.engine.core import EngineConfig
from sidecar.engine.model import (
    Admin,
    AdminOp,
    EnvelopeArg,
    Mandate,
    Outcome,
    Proposal,
    RegisterAgent,
    RegisterSink,
    RegisterTool,
    SetMandate,
)
from sidecar.engine.statements import target_digest
from sidecar.wire import receipt_from_pb

with warnings.catch_warnings():
    # "live" is registered by the live suites' conftests; alone, this module still marks
    # itself so that `-m "not live"` deselects it.
    warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
    pytestmark = pytest.mark.live

T = TypeVar("T")

N = 4
F = 1
# Generous for a loaded 2-core machine that runs other live suites at the same time.
WAIT_S = 60.0
POLL_S = 0.05
RPC_TIMEOUT_S = 5.0
PROCESS_EXIT_S = 15.0
SUBPROCESS_S = 120.0
RUN = "run-1"
URL = "https://example.com/x"
ALLOWING = ("allow", "flag")
# Override to replay another kill schedule: QG_SIDECAR_SEED=... pytest ...
SEED = int(os.environ.get("QG_SIDECAR_SEED", "20260612"))
KILLS = 5
HEIGHTS_BEFORE_KILL = (1, 4)  # the victim's own executed heights, drawn per kill
LEDGER_COLUMNS = (
    "height, idx, tx_id, proposal_id, kind, outcome, reason, mandate_version, principal, "
    "canonical_target, target_digest, card_digest, argument_names, prev_hash, hash"
)
REPO_ROOT = Path(__file__).resolve().parents[2]

_agent_numbers = itertools.count(1)


# ============================================================================ waiting


def wait_until(
    what: str,
    check: Callable[[], T | None],
    timeout_s: float = WAIT_S,
    describe: Callable[[], str] | None = None,
) -> T:
    """Poll `check` until it returns something truthy and return that; past the deadline,
    fail naming what was awaited and (with `describe`) what was seen last."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            seen = f"; last seen: {describe()}" if describe is not None else ""
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}{seen}")
        time.sleep(POLL_S)


# ============================================================================ the cluster


class Live:
    """One cluster directory, the processes this module started for it, and read-only
    views of its sidecars (Status, /metrics, their SQLite stores)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.procs: list[subprocess.Popen[bytes]] = []
        self.sidecars: dict[int, subprocess.Popen[bytes]] = {}
        self.sinks = {"payments": PrivateKey.generate(), "crm": PrivateKey.generate()}
        self.owner_key = SigningKey(read_seed(spec.directory / OWNER_KEY_FILE))
        self._owner: SyncClient | None = None

    # ------------------------------------------------------------------ processes

    def start(self) -> None:
        for proc in start_cluster(self.spec, list(range(N))):
            self.procs.append(proc)
            args = [str(a) for a in proc.args]  # type: ignore[union-attr]
            if "sidecar.node" in args:
                self.sidecars[int(args[args.index("--node") + 1])] = proc

    def close(self) -> None:
        if self._owner is not None:
            self._owner.close()
        stop_nodes(self.spec)
        for proc in self.procs:
            try:
                proc.wait(timeout=PROCESS_EXIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def kill_sidecar(self, index: int, sig: signal.Signals = signal.SIGKILL) -> None:
        """Signal sidecar `index` (only the sidecar: its replica keeps running) and wait
        until its process is gone."""
        proc = self.sidecars.pop(index)
        assert running_pid(self.spec, index, "sidecar") == proc.pid
        proc.send_signal(sig)
        proc.wait(timeout=PROCESS_EXIT_S)

    def start_sidecar(self, index: int) -> None:
        procs = start_nodes(self.spec, [index], "sidecar")
        self.procs.extend(procs.values())
        self.sidecars.update(procs)
        wait_sidecars_serving(self.spec, [index], procs, timeout_s=WAIT_S)

    def logs(self) -> str:
        return "\n".join(
            f"--- node {i} {kind}\n{log_tail(self.spec, i, 30, kind)}"
            for i in range(N)
            for kind in ("replica", "sidecar")
        )

    # ------------------------------------------------------------------ clients

    @property
    def owner(self) -> SyncClient:
        if self._owner is None:
            self._owner = SyncClient(self.spec, self.owner_key, certificate_deadline_s=WAIT_S)
        return self._owner

    def client(self, key: SigningKey) -> SyncClient:
        return SyncClient(self.spec, key, certificate_deadline_s=WAIT_S)

    def agents(self, stack: contextlib.ExitStack, **mandates: Mandate) -> dict[str, Agent]:
        """Fresh agents, one per keyword, registered with their mandates in one batch of
        owner transactions."""
        agents: dict[str, Agent] = {}
        ops: list[AdminOp] = []
        for name, m in mandates.items():
            key = SigningKey.generate()
            agent_id = f"{name}-{next(_agent_numbers)}-{bytes(key.verify_key).hex()[:6]}"
            agents[name] = Agent(agent_id, key, stack.enter_context(self.client(key)))
            ops += [
                RegisterAgent(agent_id=agent_id, public_key=bytes(key.verify_key)),
                SetMandate(agent_id=agent_id, mandate=m),
            ]
        self.apply(ops)
        return agents

    def apply(self, ops: Sequence[AdminOp]) -> list[Decision]:
        """Owner operations, streamed in nonce order; every one must be applied."""
        results = self.owner.submit_many([Admin(op=op) for op in ops])
        decisions = []
        for op, result in zip(ops, results, strict=True):
            assert isinstance(result, Submitted), f"{type(op).__name__} refused: {result!r}"
            decision = self.owner.await_certificate(result.proposal_id, WAIT_S)
            assert decision.outcome is Outcome.APPLIED, (type(op).__name__, decision.reason)
            decisions.append(decision)
        return decisions

    # ------------------------------------------------------------------ reading sidecars

    def status(self, index: int) -> spb.SidecarStatusReply | None:
        return sidecar_status(self.spec, index, timeout_s=RPC_TIMEOUT_S)

    def statuses(self, nodes: Iterable[int] = range(N)) -> dict[int, spb.SidecarStatusReply]:
        out = {}
        for i in nodes:
            st = self.status(i)
            if st is not None:
                out[i] = st
        return out

    def executed(self, nodes: Iterable[int] = range(N)) -> dict[int, int]:
        return {i: st.executed_height for i, st in self.statuses(nodes).items()}

    def describe(self, nodes: Iterable[int] = range(N)) -> str:
        return "; ".join(
            f"sidecar {i}: executed {st.executed_height} (replica {st.replica_committed_height}) "
            f"entries {st.ledger_entries} diverged {st.diverged}"
            for i, st in self.statuses(nodes).items()
        )

    def wait_executed(
        self, height: int, nodes: Iterable[int] = range(N), timeout_s: float = WAIT_S
    ) -> dict[int, int]:
        """Wait until every listed sidecar executed `height`; return their heights."""
        chosen = list(nodes)

        def reached() -> dict[int, int] | None:
            heights = self.executed(chosen)
            ok = len(heights) == len(chosen) and min(heights.values()) >= height
            return heights if ok else None

        return wait_until(
            f"sidecars {chosen} to execute height {height}",
            reached,
            timeout_s,
            lambda: self.describe(chosen),
        )

    def db_path(self, index: int) -> Path:
        return self.spec.node_dir(index) / "sidecar.db"

    def read(self, index: int, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """One query on sidecar `index`'s store, read-only (WAL lets it read a running
        sidecar's committed heights)."""
        uri = f"{self.db_path(index).resolve().as_uri()}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=RPC_TIMEOUT_S)) as db:
            return list(db.execute(sql, tuple(params)))

    def ledger_upto(self, index: int, height: int) -> list[tuple[Any, ...]]:
        return self.read(
            index,
            f"SELECT {LEDGER_COLUMNS} FROM ledger WHERE height <= ? ORDER BY rowid",
            (height,),
        )

    def root_at(self, index: int, height: int) -> bytes | None:
        rows = self.read(index, "SELECT state_root FROM blocks WHERE height = ?", (height,))
        return bytes(rows[0][0]) if rows else None

    def artifacts_upto(self, index: int, height: int) -> dict[tuple[int, str], bytes]:
        rows = self.read(
            index,
            "SELECT height, canonical_target, data FROM artifacts WHERE height <= ?",
            (height,),
        )
        return {(int(h), str(t)): bytes(d) for h, t, d in rows}

    def metrics(self, index: int, kind: str = "sidecar") -> str:
        m = self.spec.member(index)
        port = m.sidecar_metrics_port if kind == "sidecar" else m.metrics_port
        url = f"http://{m.host}:{port}/metrics"
        with urllib.request.urlopen(url, timeout=RPC_TIMEOUT_S) as response:
            text: str = response.read().decode()
        return text

    def committed_blocks(self, index: int, from_height: int, to_height: int) -> list[Block]:
        """Replica `index`'s committed blocks from_height..to_height, decoded."""
        out: list[Block] = []
        address = self.spec.member(index).replica_address
        with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
            call = cpb_grpc.ReplicaStub(channel).CommittedBlocks(
                cpb.BlocksRequest(from_height=from_height), timeout=WAIT_S
            )
            try:
                for reply in call:
                    block = decode_block(self.spec.chain_id, reply.block.SerializeToString())
                    assert block.height == from_height + len(out)
                    out.append(block)
                    if block.height >= to_height:
                        break
            finally:
                call.cancel()
        return out


class Agent:
    """A registered agent: its id, key and client."""

    def __init__(self, agent_id: str, key: SigningKey, client: SyncClient) -> None:
        self.id = agent_id
        self.key = key
        self.qg = client

    @property
    def public_key(self) -> bytes:
        return bytes(self.key.verify_key)

    def propose(
        self,
        tool: str,
        target: str = URL,
        arguments: dict[str, str | Handle] | None = None,
        *,
        run: str = RUN,
        grant: bytes | None = None,
    ) -> Decision:
        return self.qg.propose(
            tool, target, arguments or {}, run_id=run, grant=grant, deadline_s=WAIT_S
        )


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    cluster = Live(init_cluster(tmp_path_factory.mktemp("qg-sidecar"), N))
    try:
        cluster.start()
        register_attack_world(cluster)
        yield cluster
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.close()


def register_attack_world(live: Live) -> None:
    """The sinks and tools of tests/engine/test_attacks.py's `_world`."""
    sinks: list[AdminOp] = [
        RegisterSink(sink_id=name, public_key=bytes(key.public_key))
        for name, key in live.sinks.items()
    ]
    tools = [
        tool_spec("kb.search", "read", schemes=["https"]),
        tool_spec("registration.cancel", "user_confirm", schemes=["principal"]),
        tool_spec("order.finalize", "user_confirm", schemes=["https"], min_tier="master"),
        tool_spec("owner.notify", "owner_confirm"),
        tool_spec("records.read", "direct", schemes=["principal", "https"]),
        tool_spec("crm.my_status", "direct", sink="crm", binds_caller=True),
        tool_spec(
            "crm.register",
            "direct",
            sink="crm",
            schemes=["https"],
            envelopes=[EnvelopeArg(name="phone", kind="phone", require_verified=True)],
        ),
        tool_spec(
            "payments.charge",
            "direct",
            sink="payments",
            schemes=["https"],
            envelopes=[EnvelopeArg(name="card", kind="card")],
        ),
    ]
    live.apply([*sinks, *(RegisterTool(spec=t) for t in tools)])


def attack_agents(live: Live, stack: contextlib.ExitStack) -> dict[str, Agent]:
    """alice (unrestricted, may delegate one level), mallory (unrestricted), assistant."""
    return live.agents(
        stack,
        alice=mandate(None, delegation_policy="attenuated", max_delegation_depth=1),
        mallory=mandate(None),
        assistant=mandate(["kb.search", "order.finalize", "registration.cancel"]),
    )


# ============================================================================ verdict checks


def expect(decision: Decision, outcome: str, reason: str) -> Decision:
    """The certified outcome and operator-only reason; the reason stays off str/repr, and
    the certificate has f+1 distinct signers."""
    got = (decision.outcome.value, decision.reason)
    assert got == (outcome, reason), f"certified {got}, expected {(outcome, reason)}"
    assert len(set(decision.signers)) >= F + 1
    assert reason not in str(decision) and reason not in repr(decision)
    return decision


def rejected(call: Callable[[], object], reason: str) -> QuorumGateError:
    """A transaction refused at admission (`Refused`) or executed and not applied
    (`TransactionRejected`), for `reason` — never applied, never allowed."""
    try:
        result = call()
    except (Refused, TransactionRejected) as err:
        assert err.reason == reason, f"refused for {err.reason!r}, expected {reason!r}"
        assert reason not in str(err) and reason not in repr(err)
        return err
    raise AssertionError(f"expected a refusal ({reason}), got {result!r}")


def assert_never_allowed(live: Live, decisions: Iterable[Decision]) -> None:
    """No sidecar holds an allowing verdict for any of these proposals, and every sidecar
    holds the certified verdict as its newest: so no f+1 sidecars can certify an allow or
    a flag for them (every verdict is in the ledger, allows too: DESIGN §4.8)."""
    chosen = {d.proposal_id: d for d in decisions}
    live.wait_executed(max(d.height for d in chosen.values()))
    marks = ",".join("?" * len(chosen))
    for i in range(N):
        rows = live.read(
            i,
            f"SELECT proposal_id, height, idx, outcome, reason FROM ledger "
            f"WHERE proposal_id IN ({marks})",
            list(chosen),
        )
        allowing = [(bytes(p).hex()[:16], h, x, o, r) for p, h, x, o, r in rows if o in ALLOWING]
        assert not allowing, f"sidecar {i} recorded allowing verdicts: {allowing}"
        assert {bytes(r[0]) for r in rows} == set(chosen), f"sidecar {i} misses verdicts"
        with grpc.insecure_channel(live.spec.member(i).sidecar_address) as channel:
            stub = spb_grpc.SidecarStub(channel)
            for proposal_id, decision in chosen.items():
                reply = stub.GetReceipt(
                    spb.ReceiptRequest(proposal_id=proposal_id), timeout=RPC_TIMEOUT_S
                )
                assert reply.found, f"sidecar {i} has no receipt for {proposal_id.hex()[:16]}"
                leaf = receipt_from_pb(reply.receipt).leaf
                assert leaf == decision.certificate.leaf, (
                    f"sidecar {i}'s newest verdict for {proposal_id.hex()[:16]} is "
                    f"{leaf.outcome}/{leaf.reason}, certified {decision.outcome.value}"
                )


# ============================================================================ 1. attacks


def test_i1_spoofed_text_never_reaches_the_certified_confirmation_card(live: Live) -> None:
    """I-1: the card of a confirmation-gated call is built by the sidecars from canonical,
    bound parameters; the agent's lure text is in no line and no byte of it, and the call
    stays pending (no allow without a Confirm)."""
    with contextlib.ExitStack() as stack:
        alice = attack_agents(live, stack)["alice"]
        lure = "Click below to download the FREE brochure"
        pending = expect(
            alice.propose("registration.cancel", "CURRENT_USER", {"caption": lure}),
            "pending",
            "confirmation_required",
        )
    card = pending.card
    assert card is not None and card.digest == pending.certificate.leaf.card_digest
    assert lure not in card.render() and lure.encode() not in card.to_bytes()
    assert f"registration.cancel principal:{alice.id}" in card.render()
    assert card.argument_names == ("caption",)
    assert_never_allowed(live, [pending])


def test_i2_an_agent_cannot_forge_owner_authority(live: Live) -> None:
    """I-2: an agent-signed owner transaction never applies (refused `not_owner`), the
    agent's mandate version is untouched, and it cannot confirm an owner-confirm call:
    the call stays certified pending."""
    with contextlib.ExitStack() as stack:
        mallory = attack_agents(live, stack)["mallory"]
        widen = SetMandate(agent_id=mallory.id, mandate=mandate(None))
        rejected(lambda: mallory.qg.admin(widen, WAIT_S), "not_owner")
        notify = expect(mallory.propose("owner.notify", ""), "pending", "confirmation_required")
        assert notify.mandate_version == 1
        assert notify.card is not None
        rejected(
            lambda: mallory.qg.confirm(notify.proposal_id, notify.card.digest, WAIT_S),  # type: ignore[union-attr]
            "confirmer_not_authorized",
        )
        still = mallory.qg.await_certificate(notify.proposal_id, WAIT_S)
    expect(still, "pending", "confirmation_required")
    assert_never_allowed(live, [still])


def test_i3_pre_confirmation_poisoning_cannot_change_what_is_confirmed(live: Live) -> None:
    """I-3: the same (signer, nonce) with another target is refused as a replay by every
    replica; a confirmation naming another card is rejected; only the shown call runs."""
    with contextlib.ExitStack() as stack:
        alice = attack_agents(live, stack)["alice"]
        original = Proposal(run_id="r", tool="order.finalize", target="https://shop.example/o/1")
        submitted = alice.qg.submit(original)
        pending = expect(
            alice.qg.await_certificate(submitted.proposal_id, WAIT_S),
            "pending",
            "confirmation_required",
        )
        poisoned = Proposal(run_id="r", tool="order.finalize", target="https://shop.example/o/999")
        data = txlib.build(live.spec.chain_id, submitted.nonce, poisoned, alice.key)
        for i in range(N):
            address = live.spec.member(i).replica_address
            with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as err:
                cpb_grpc.ReplicaStub(channel).Submit(
                    cpb.SubmitRequest(tx=data), timeout=RPC_TIMEOUT_S
                )
            assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS, (i, err.value.code())
        other = expect(
            alice.propose("order.finalize", "https://shop.example/o/999", run="r"),
            "pending",
            "confirmation_required",
        )
        assert other.card is not None
        rejected(
            lambda: alice.qg.confirm(pending.proposal_id, other.card.digest, WAIT_S),  # type: ignore[union-attr]
            "card_digest_mismatch",
        )
        confirmed = expect(alice.qg.confirm(pending.proposal_id, None, WAIT_S), "allow", "ok")
    assert confirmed.target_digest == target_digest("order.finalize https://shop.example/o/1")
    live.wait_executed(confirmed.height)
    for i in range(N):
        targets = live.read(
            i, "SELECT canonical_target FROM ledger WHERE proposal_id = ?", (pending.proposal_id,)
        )
        assert {t for (t,) in targets} == {"order.finalize https://shop.example/o/1"}, i


def test_i4_cross_principal_targets_and_arguments_are_denied(live: Live) -> None:
    """I-4: no target, query or argument can name another principal; the only principal an
    agent reaches is itself."""
    with contextlib.ExitStack() as stack:
        agents = attack_agents(live, stack)
        alice, mallory = agents["alice"], agents["mallory"]
        denied = [
            expect(
                mallory.propose("records.read", f"principal:{alice.id}"),
                "deny",
                "cross_principal_target",
            ),
            expect(
                mallory.propose(
                    "records.read", f"https://api.example/records?customer_id={alice.id}"
                ),
                "deny",
                "ambient_identity_argument",
            ),
            expect(
                mallory.propose("records.read", "CURRENT_USER", {"user_id": alice.id}),
                "deny",
                "ambient_identity_argument",
            ),
        ]
        own = expect(mallory.propose("records.read", "CURRENT_USER"), "allow", "ok")
    assert own.target_digest == target_digest(f"records.read principal:{mallory.id}")
    assert_never_allowed(live, denied)


def test_c1_a_confused_handle_is_a_handle_violation(live: Live) -> None:
    """C-1: alice's sealed card on mallory's call is refused by the dereference rule."""
    with contextlib.ExitStack() as stack:
        agents = attack_agents(live, stack)
        alice, mallory = agents["alice"], agents["mallory"]
        handle = alice.qg.seal_envelope(
            "card", "4111 1111 1111 1111", {"payments": bytes(live.sinks["payments"].public_key)}
        )
        stolen = expect(
            mallory.propose("payments.charge", URL, {"card": handle}), "deny", "handle_violation"
        )
    assert_never_allowed(live, [stolen])


def test_c2_raw_secrets_are_refused_where_envelopes_are_required(live: Live) -> None:
    """C-2: a raw value where the tool declares an envelope is denied; the sealed handle
    of the same principal is allowed."""
    with contextlib.ExitStack() as stack:
        alice = attack_agents(live, stack)["alice"]
        raw = expect(
            alice.propose("payments.charge", URL, {"card": "4111 1111 1111 1111"}),
            "deny",
            "envelope_required",
        )
        handle = alice.qg.seal_envelope(
            "card", "4111 1111 1111 1111", {"payments": bytes(live.sinks["payments"].public_key)}
        )
        expect(alice.propose("payments.charge", URL, {"card": handle}), "allow", "ok")
    assert_never_allowed(live, [raw])


def test_c3_identifiers_are_bound_by_the_sidecars(live: Live) -> None:
    """C-3: CURRENT_USER binds to the signer; naming another principal is denied, and the
    decision's text carries neither reason nor identifier."""
    with contextlib.ExitStack() as stack:
        agents = attack_agents(live, stack)
        alice, mallory = agents["alice"], agents["mallory"]
        own = expect(mallory.propose("records.read", "CURRENT_USER"), "allow", "ok")
        refusal = expect(
            mallory.propose("records.read", f"principal:{alice.id}"),
            "deny",
            "cross_principal_target",
        )
    assert own.target_digest == target_digest(f"records.read principal:{mallory.id}")
    assert alice.id not in str(refusal) and "principal" not in repr(refusal)
    assert_never_allowed(live, [refusal])


def test_c4_existence_oracles_are_closed(live: Live) -> None:
    """C-4: a status tool takes no identity argument and binds to the caller; an
    unverified handle does not pass for a verified one; another principal's handle and a
    handle that does not exist are refused alike."""
    with contextlib.ExitStack() as stack:
        agents = attack_agents(live, stack)
        alice, mallory = agents["alice"], agents["mallory"]
        typed = mallory.qg.seal_envelope(
            "phone", "+1 555 0100", {"crm": bytes(live.sinks["crm"].public_key)}
        )
        probe = expect(
            mallory.propose("crm.my_status", "", {"phone": typed}), "deny", "status_tool_argument"
        )
        mine = expect(mallory.propose("crm.my_status", ""), "allow", "ok")
        register = expect(
            mallory.propose("crm.register", URL, {"phone": typed}), "deny", "handle_kind_mismatch"
        )
        alices = alice.qg.seal_envelope(
            "card", "4111", {"payments": bytes(live.sinks["payments"].public_key)}
        )
        foreign = mallory.propose("payments.charge", URL, {"card": alices})
        missing = mallory.propose(
            "payments.charge", URL, {"card": Handle("h_card_0123456789abcdef")}
        )
    assert mine.target_digest == target_digest(f"crm.my_status principal:{mallory.id}")
    expect(foreign, "deny", "handle_violation")
    expect(missing, "deny", "handle_violation")
    assert_never_allowed(live, [probe, register, foreign, missing])


def test_a2_a_denial_of_wallet_flood_is_bounded_by_the_quota(live: Live) -> None:
    """A-2: a flood beyond the per-principal window (120 proposals a minute of block time,
    the default) is denied `quota_exceeded`, without touching the latch (no
    `repeat_denied` / `run_halted` however many are refused in one run); other principals
    are unaffected."""
    flood = 130
    quota = EngineConfig(chain_id="x", owner_public_key=bytes(32)).quota_proposals_max
    with contextlib.ExitStack() as stack:
        agents = attack_agents(live, stack)
        alice, mallory = agents["alice"], agents["mallory"]
        started = time.monotonic()
        results = mallory.qg.submit_many(
            [Proposal(run_id="r", tool="kb.search", target=f"{URL}/{k}") for k in range(flood)]
        )
        assert all(isinstance(r, Submitted) for r in results), results
        decisions = [
            mallory.qg.await_certificate(r.proposal_id, WAIT_S)  # type: ignore[union-attr]
            for r in results
        ]
        elapsed_s = time.monotonic() - started
        other = expect(alice.propose("kb.search"), "allow", "ok")
    assert other.signers
    outcomes = Counter((d.outcome.value, d.reason) for d in decisions)
    # Block time follows the replicas' clocks: the whole flood fits in one window unless
    # this machine took longer than that to commit it.
    assert elapsed_s < 55, f"the flood took {elapsed_s:.0f} s; the window is 60 s"
    assert outcomes == {("allow", "ok"): quota, ("deny", "quota_exceeded"): flood - quota}, outcomes
    assert_never_allowed(live, [d for d in decisions if d.outcome is Outcome.DENY])


def test_d1_a_delegate_cannot_exceed_its_grant(live: Live) -> None:
    """D-1: a compromised delegate stays inside its grant: no wider tool, no master-tier
    self-confirmation, no re-delegation, no use of the grant by another key, no use after
    revocation — and the master's later confirmation cannot revive the revoked call."""
    with contextlib.ExitStack() as stack:
        agents = attack_agents(live, stack)
        alice, assistant, mallory = agents["alice"], agents["assistant"], agents["mallory"]
        grant = alice.qg.delegate(
            assistant.public_key, RUN, ["kb.search", "order.finalize"], deadline_s=WAIT_S
        )
        wider = expect(
            assistant.propose("registration.cancel", "CURRENT_USER", grant=grant),
            "deny",
            "out_of_scope",
        )
        pending = expect(
            assistant.propose("order.finalize", grant=grant), "pending", "confirmation_required"
        )
        assert pending.card is not None
        rejected(
            lambda: assistant.qg.confirm(pending.proposal_id, pending.card.digest, WAIT_S),  # type: ignore[union-attr]
            "tier_insufficient",
        )
        rejected(
            lambda: assistant.qg.delegate(
                mallory.public_key, RUN, parent_grant=grant, deadline_s=WAIT_S
            ),
            "delegation_refused",
        )
        stolen = expect(mallory.propose("kb.search", grant=grant), "deny", "delegation_mismatch")
        alice.qg.revoke(grant, WAIT_S)
        after = expect(assistant.propose("kb.search", grant=grant), "deny", "delegation_revoked")
        late = expect(
            alice.qg.confirm(pending.proposal_id, pending.card.digest, WAIT_S),
            "deny",
            "delegation_revoked",
        )
        settled = alice.qg.await_certificate(pending.proposal_id, WAIT_S)
    assert late.tx_id != pending.proposal_id  # the verdict of alice's Confirm
    assert (settled.outcome.value, settled.reason) == ("deny", "delegation_revoked")
    assert_never_allowed(live, [wider, stolen, after, settled])
