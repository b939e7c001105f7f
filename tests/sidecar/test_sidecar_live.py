"""Execution sidecars against a live 4-node cluster.

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

import asyncio
import base64
import contextlib
import io
import itertools
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from nacl.public import PrivateKey, SealedBox
from nacl.signing import SigningKey
from prometheus_client.parser import text_string_to_metric_families

from quorumgate.ops.nodes import (
    log_tail,
    running_pid,
    sidecar_status,
    start_cluster,
    start_nodes,
    stop_nodes,
    wait_sidecars_serving,
)
from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto import sidecar_pb2_grpc as spb_grpc
from quorumgate.proto import tx as txlib
from quorumgate.proto.clusterfile import (
    CLUSTER_FILE,
    OWNER_KEY_FILE,
    RECEIPT_KEY_FILE,
    ClusterSpec,
    init_cluster,
    read_seed,
)
from quorumgate.proto.model import (
    Admin,
    AdminOp,
    Argument,
    EnvelopeArg,
    Mandate,
    Outcome,
    Proposal,
    RegisterAgent,
    RegisterPrincipal,
    RegisterSink,
    RegisterTool,
    SealEnvelope,
    SetMandate,
)
from quorumgate.replica.types import Block, QuorumCert
from quorumgate.replica.wire import decode_block
from quorumgate.runtime.channels import sync_channel
from quorumgate.sdk.builders import mandate, tool_spec
from quorumgate.sdk.client import (
    Decision,
    Handle,
    QuorumGateError,
    Refused,
    Submitted,
    TransactionRejected,
)
from quorumgate.sdk.owner import owner_reader
from quorumgate.sdk.sync import SyncClient
from quorumgate.sidecar import operator
from quorumgate.sidecar import replay as replay_module
from quorumgate.sidecar.engine.core import Engine, EngineConfig
from quorumgate.sidecar.engine.statements import target_digest
from quorumgate.sidecar.execution import execute_block
from quorumgate.sidecar.store import SidecarStore
from quorumgate.sidecar.wire import receipt_from_pb
from tests import polling
from tests.support import forkserver

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
MID_BLOCK_WAIT_S = 5.0  # for a moment the victim holds a block it has not recorded yet
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
    """`tests.polling.wait_until` with this module's deadline and step."""
    return polling.wait_until(what, check, timeout_s, POLL_S, describe)


def poll_for(check: Callable[[], T | None], timeout_s: float) -> T | None:
    """As `wait_until`, but None at the deadline (for a moment worth waiting for)."""
    return polling.poll_for(check, timeout_s, POLL_S)


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
        self.diverged: set[int] = set()  # sidecars a test made faulty on purpose
        self.restarted: set[int] = set()  # sidecars whose metrics count from a restart
        self.principal_of: dict[str, Agent] = {}  # agent id -> the person it acts for

    # ------------------------------------------------------------------ processes

    def start(self) -> None:
        for proc in start_cluster(self.spec, list(range(N))):
            self.procs.append(proc)
            args = [str(a) for a in proc.args]  # type: ignore[union-attr]
            if "quorumgate.sidecar.node" in args:
                self.sidecars[int(args[args.index("--node") + 1])] = proc

    def close(self) -> None:
        try:
            if self._owner is not None:
                self._owner.close()
        finally:
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
        self.restarted.add(index)
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
        owner transactions, all acting for one fresh principal (`principal_of[agent id]`:
        the person who alone answers their `user_confirm` cards)."""
        agents: dict[str, Agent] = {}
        person_key = SigningKey.generate()
        person = f"person-{next(_agent_numbers)}-{bytes(person_key.verify_key).hex()[:6]}"
        person_client = stack.enter_context(self.client(person_key))
        principal = Agent(person, person_key, person_client)
        ops: list[AdminOp] = [
            RegisterPrincipal(principal_id=person, public_key=bytes(person_key.verify_key))
        ]
        for name, m in mandates.items():
            key = SigningKey.generate()
            agent_id = f"{name}-{next(_agent_numbers)}-{bytes(key.verify_key).hex()[:6]}"
            agents[name] = Agent(agent_id, key, stack.enter_context(self.client(key)))
            self.principal_of[agent_id] = principal
            ops += [
                RegisterAgent(
                    agent_id=agent_id, public_key=bytes(key.verify_key), principal=person
                ),
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
        # Certified means f+1 sidecars executed them; the others' admission checks would
        # refuse a new agent until they have too (`unknown_signer`), so wait for them.
        healthy = [i for i in range(N) if i not in self.diverged]
        self.wait_executed(max(d.height for d in decisions), healthy)
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
        replies = read_stream(
            lambda: sync_channel(self.spec, index, reader=owner_reader(self.spec)),
            lambda ch: cpb_grpc.ReplicaStub(ch).CommittedBlocks(
                cpb.BlocksRequest(from_height=from_height), timeout=WAIT_S
            ),
            lambda reply: reply.height >= to_height,
        )
        out = [decode_block(self.spec.chain_id, r.block.SerializeToString()) for r in replies]
        assert [b.height for b in out] == list(range(from_height, from_height + len(out)))
        return out

    def receipt_batches(self, index: int, to_height: int) -> list[spb.ReceiptBatch]:
        """Sidecar `index`'s `Receipts` stream from height 1 until it passes `to_height`."""
        return read_stream(
            lambda: sync_channel(self.spec, index, "sidecar", reader=owner_reader(self.spec)),
            lambda ch: spb_grpc.SidecarStub(ch).Receipts(
                spb.ReceiptsRequest(from_height=1), timeout=WAIT_S
            ),
            lambda batch: batch.height >= to_height,
        )


def read_stream(
    channel_of: Callable[[], grpc.Channel],
    open_call: Callable[[grpc.Channel], Any],
    last: Callable[[Any], bool],
) -> list[Any]:
    """The messages of a server stream up to and including the first one `last` accepts
    (these streams never end by themselves: they follow new heights), then cancelled."""
    out: list[Any] = []
    with channel_of() as channel:
        call = open_call(channel)
        try:
            for message in call:
                out.append(message)
                if last(message):
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
def live(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Live]:
    """The cluster, stopped in the finalizer whatever happened; when a test of the module
    failed, the processes' log tails go to stderr (the whole logs stay in the directory)."""
    cluster = Live(init_cluster(tmp_path_factory.mktemp("qg-sidecar"), N))
    failed_before = request.session.testsfailed
    try:
        cluster.start()
        register_attack_world(cluster)
        yield cluster
    finally:
        try:
            if request.session.testsfailed > failed_before:
                sys.__stderr__.write(f"\n{cluster.spec.directory}\n{cluster.logs()}\n")
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
        tool_spec(
            "registration.cancel", "user_confirm", schemes=["principal"], min_tier="delegate"
        ),
        tool_spec("order.finalize", "user_confirm", schemes=["https"], min_tier="master"),
        tool_spec("owner.notify", "owner_confirm", min_tier="delegate"),
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
    a flag for them (every verdict is in the ledger, allows too: sidecar/ledger.py)."""
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
        with sync_channel(live.spec, i, "sidecar", reader=owner_reader(live.spec)) as channel:
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
    assert card.canonical_target == f"registration.cancel principal:{alice.id}"
    assert f'Target: "principal:{alice.id}"' in card.render()
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
        agents = attack_agents(live, stack)
        alice = agents["alice"]
        person = live.principal_of[alice.id]
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
            with sync_channel(live.spec, i) as channel, pytest.raises(grpc.RpcError) as err:
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
        rejected(  # the proposer's own key answers no card (split authority)
            lambda: alice.qg.confirm(pending.proposal_id, pending.card.digest, WAIT_S),  # type: ignore[union-attr]
            "confirmer_not_authorized",
        )
        rejected(
            lambda: person.qg.confirm(pending.proposal_id, other.card.digest, WAIT_S),  # type: ignore[union-attr]
            "card_digest_mismatch",
        )
        confirmed = expect(person.qg.confirm(pending.proposal_id, None, WAIT_S), "allow", "ok")
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
        # each in a run of its own: a probe of another principal is latched (canonical v2)
        denied = [
            expect(
                mallory.propose("records.read", f"principal:{alice.id}", run="i4-target"),
                "deny",
                "cross_principal_target",
            ),
            expect(
                mallory.propose(
                    "records.read",
                    f"https://api.example/records?customer_id={alice.id}",
                    run="i4-query",
                ),
                "deny",
                "ambient_identity_argument",
            ),
            expect(
                mallory.propose(
                    "records.read", "CURRENT_USER", {"user_id": alice.id}, run="i4-argument"
                ),
                "deny",
                "ambient_identity_argument",
            ),
        ]
        own = expect(mallory.propose("records.read", "CURRENT_USER", run="i4-own"), "allow", "ok")
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
    """C-2: a raw value where the tool declares an envelope is refused before ordering
    (canonical version 2: a raw secret never enters a block), and so is a card
    number in an argument that is not declared; the sealed handle of the same principal
    is allowed."""
    with contextlib.ExitStack() as stack:
        alice = attack_agents(live, stack)["alice"]
        declared = rejected(
            lambda: alice.propose("payments.charge", URL, {"card": "4111 1111 1111 1111"}),
            "envelope_required",
        )
        shaped = rejected(
            lambda: alice.propose("kb.search", URL, {"q": "card 4111 1111 1111 1111"}),
            "secret_in_plaintext",
        )
        assert declared.code == shaped.code == "INVALID_ARGUMENT"
        handle = alice.qg.seal_envelope(
            "card", "4111 1111 1111 1111", {"payments": bytes(live.sinks["payments"].public_key)}
        )
        sealed = expect(alice.propose("payments.charge", URL, {"card": handle}), "allow", "ok")
    # Neither raw value is in the chain, up to the sealed call's height.
    for block in live.committed_blocks(0, 1, sealed.height):
        assert not any(b"4111 1111 1111 1111" in tx for tx in block.payload), block.height


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
        missing = mallory.propose(  # a run of its own: a handle probe is latched (canonical v2)
            "payments.charge", URL, {"card": Handle("h_card_0123456789abcdef")}, run="c4-missing"
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
        rejected(  # no agent key answers a card: not the delegate's, not its master's
            lambda: assistant.qg.confirm(pending.proposal_id, pending.card.digest, WAIT_S),  # type: ignore[union-attr]
            "confirmer_not_authorized",
        )
        rejected(
            lambda: alice.qg.confirm(pending.proposal_id, pending.card.digest, WAIT_S),  # type: ignore[union-attr]
            "confirmer_not_authorized",
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
            live.principal_of[alice.id].qg.confirm(
                pending.proposal_id, pending.card.digest, WAIT_S
            ),
            "deny",
            "delegation_revoked",
        )
        settled = assistant.qg.await_certificate(pending.proposal_id, WAIT_S)  # the proposer
    assert late.tx_id != pending.proposal_id  # the verdict of the principal's Confirm
    assert (settled.outcome.value, settled.reason) == ("deny", "delegation_revoked")
    assert_never_allowed(live, [wider, stolen, after, settled])


# ============================================================================ load


LOAD_TOOLS = ["kb.search", "records.read", "order.finalize"]


def mixed_payloads(start: int, count: int) -> list[Proposal]:
    """Proposals of every outcome, by sequence number: allow (kb.search, own records),
    deny with an artifact (another principal's records, an identity argument, an
    out-of-scope tool — a flag for an agent in observe mode), pending (order.finalize).
    Runs change every six proposals, so the latch halts none of them."""
    out = []
    for k in range(start, start + count):
        run = f"load-{k // 6}"
        choice = k % 6
        if choice == 0:
            call = Proposal(run_id=run, tool="kb.search", target=f"{URL}/{k}")
        elif choice == 1:
            call = Proposal(run_id=run, tool="records.read", target="CURRENT_USER")
        elif choice == 2:
            call = Proposal(run_id=run, tool="records.read", target=f"principal:other-{k % 3}")
        elif choice == 3:
            call = Proposal(run_id=run, tool="owner.notify", target="")
        elif choice == 4:
            call = Proposal(run_id=run, tool="order.finalize", target=f"{URL}/order/{k}")
        else:
            args = (Argument(name="user_id", text=f"u{k % 5}"),)
            call = Proposal(run_id=run, tool="kb.search", target=f"{URL}/q", arguments=args)
        out.append(call)
    return out


class Load:
    """Mixed proposals from some agents, in batches, on a background thread, until
    stopped. Each agent stays under `PER_AGENT_MAX` proposals (below the nonce window),
    so none is ever refused for running ahead of execution."""

    PER_AGENT_MAX = 900

    def __init__(self, agents: Sequence[Agent], batch: int = 5, pause_s: float = 0.15) -> None:
        self.agents = list(agents)
        self.batch = batch
        self.pause_s = pause_s
        self.accepted: list[Submitted] = []
        self.refused: list[QuorumGateError] = []
        self.sent = dict.fromkeys(range(len(self.agents)), 0)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            for k in itertools.count():
                if self._stop.is_set():
                    return
                a = k % len(self.agents)
                if self.sent[a] + self.batch > self.PER_AGENT_MAX:
                    if all(n + self.batch > self.PER_AGENT_MAX for n in self.sent.values()):
                        return
                    continue
                payloads = mixed_payloads(self.sent[a], self.batch)
                self.sent[a] += self.batch
                for result in self.agents[a].qg.submit_many(payloads):
                    if isinstance(result, Submitted):
                        self.accepted.append(result)
                    else:
                        self.refused.append(result)
                self._stop.wait(self.pause_s)  # pacing, not waiting for a condition
        except BaseException as err:
            self._error = err

    def wait_accepted(self, count: int) -> None:
        wait_until(f"{count} proposals admitted", lambda: len(self.accepted) >= count)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=WAIT_S)
        assert not self._thread.is_alive(), "the load thread did not stop"
        if self._error is not None:
            raise AssertionError(f"the load thread failed: {self._error!r}") from self._error


def load_agents(live: Live, stack: contextlib.ExitStack, count: int) -> list[Agent]:
    mandates = {f"load{k}": mandate(LOAD_TOOLS) for k in range(count - 1)}
    mandates["observer"] = mandate(["kb.search"], enforcement="observe")
    return list(live.agents(stack, **mandates).values())


def wait_agreement(live: Live, height: int) -> dict[int, spb.SidecarStatusReply]:
    """Once all four executed `height` and nothing more is submitted: their Status."""
    live.wait_executed(height)

    def agreed() -> dict[int, spb.SidecarStatusReply] | None:
        statuses = live.statuses()
        seen = {(st.ledger_head, st.ledger_entries, st.artifacts) for st in statuses.values()}
        return statuses if len(statuses) == N and len(seen) == 1 else None

    return wait_until("the four sidecars' ledgers to agree", agreed, describe=live.describe)


# ============================================================================ 2. agreement


def test_ledgers_artifacts_and_state_roots_agree_on_all_sidecars_after_load(
    live: Live, tmp_path: Path
) -> None:
    """Three hundred proposals of every outcome from four agents (one in observe mode),
    each certified; then at a common executed height every sidecar holds the same ledger
    (every column of every entry, so the same head and count), the same rejection
    artifacts byte for byte, and the same state root — which is also the root the
    committed blocks carry for that height. Status, the stores (read-only), `quorumgate
    artifacts --json` (a subprocess per node) and `ledger export` all say so."""
    per_agent = 75
    with contextlib.ExitStack() as stack:
        agents = load_agents(live, stack, 4)
        decisions: list[Decision] = []
        for agent in agents:
            results = agent.qg.submit_many(mixed_payloads(0, per_agent))
            assert all(isinstance(r, Submitted) for r in results), results
            decisions += [
                agent.qg.await_certificate(r.proposal_id, WAIT_S)  # type: ignore[union-attr]
                for r in results
            ]
    outcomes = Counter(d.outcome.value for d in decisions)
    assert len(decisions) == 4 * per_agent
    assert all(outcomes[o] > 0 for o in ("allow", "flag", "deny", "pending")), outcomes

    statuses = wait_agreement(live, max(d.height for d in decisions))
    height = min(st.executed_height for st in statuses.values())
    status = statuses[0]
    ledgers = {i: live.ledger_upto(i, height) for i in range(N)}
    artifacts = {i: live.artifacts_upto(i, height) for i in range(N)}
    roots = {i: live.root_at(i, height) for i in range(N)}
    assert len(ledgers[0]) == status.ledger_entries and ledgers[0][-1][-1] == status.ledger_head
    assert len(artifacts[0]) == status.artifacts > 0
    assert roots[0] is not None
    for i in range(1, N):
        assert ledgers[i] == ledgers[0], f"sidecar {i}'s ledger differs at height {height}"
        assert artifacts[i] == artifacts[0], f"sidecar {i}'s artifacts differ"
        assert roots[i] == roots[0], f"sidecar {i}'s state root differs at height {height}"
    # The roots the committed chain carries (each voted on by 2f+1 replicas, each checking
    # its own sidecar) are the sidecars' roots.
    carried = {
        b.state_root_height: b.state_root
        for b in live.committed_blocks(0, 1, height)
        if b.state_root_height > 0
    }
    assert carried, "no committed block carries a state root"
    for root_height, root in carried.items():
        assert live.root_at(0, root_height) == root, f"committed root at {root_height} differs"

    # The Receipts stream: one message per height that has verdicts, heights in order,
    # each with every receipt of its height in leaf order; the leaves are the ledger's.
    last = max(d.height for d in decisions)
    batches = live.receipt_batches(0, last)
    heights = [b.height for b in batches]
    assert heights == sorted(set(heights)) and heights[-1] == last, heights
    streamed: dict[tuple[int, int], bytes] = {}
    for batch in batches:
        leaves = [r.leaf for r in batch.receipts]
        assert [leaf.index for leaf in leaves] == list(range(len(leaves))), batch.height
        assert all(leaf.height == batch.height for leaf in leaves)
        assert all(r.leaf_count == len(leaves) for r in batch.receipts), batch.height
        streamed.update({(leaf.height, leaf.index): leaf.tx_id for leaf in leaves})
    for d in decisions:
        leaf = d.certificate.leaf
        assert streamed[(leaf.height, leaf.index)] == leaf.tx_id, (leaf.height, leaf.index)

    # The operator's views: `quorumgate artifacts --json` and `ledger export`.
    procs = [
        subprocess.Popen(
            [*quorumgate(), "artifacts", "--dir", str(live.spec.directory), "--node", str(i),
             "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO_ROOT,
        )
        for i in range(N)
    ]  # fmt: skip
    listings = []
    for proc in procs:
        out, err = proc.communicate(timeout=SUBPROCESS_S)
        assert proc.returncode == 0, err.decode()
        listings.append(json.loads(out))
    assert listings[0]["count"] == status.artifacts
    assert {(a["height"], a["canonical_target"]) for a in listings[0]["artifacts"]} == set(
        artifacts[0]
    )
    assert all(listing == listings[0] for listing in listings), "artifact listings differ"
    exports = [ledger_export_text(live, i) for i in range(N)]
    assert len(exports[0].splitlines()) == status.ledger_entries
    assert all(text == exports[0] for text in exports), "ledger exports differ"
    # /metrics: verdicts by outcome and reason, and artifacts written,
    # as the ledger and the artifact table hold them (counters start with the process).
    by_kind = {
        (str(o), str(r)): float(n)
        for o, r, n in live.read(0, "SELECT outcome, reason, COUNT(*) FROM ledger GROUP BY 1, 2")
    }
    for i in sorted(set(range(N)) - live.restarted):
        text = live.metrics(i)
        verdicts = {
            (labels["outcome"], labels["reason"]): value
            for labels, value in samples(text, "qg_sidecar_verdicts_total")
        }
        assert verdicts == by_kind, f"sidecar {i}'s verdict counters differ from its ledger"
        written = samples(text, "qg_sidecar_artifacts_written_total")
        assert written == [({}, float(status.artifacts))], (i, written)
    path = tmp_path / "ledger.jsonl"
    path.write_text(exports[0])
    out = io.StringIO()
    assert (
        operator.verify_ledger_file(
            path, live.spec.chain_id, out, expected_head=status.ledger_head, err=out
        )
        == operator.EXIT_OK
    ), out.getvalue()


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """A /metrics page's samples called `name`: (labels, value)."""
    return [
        (dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def quorumgate() -> list[str]:
    """The CLI, forked from a fork server that imported it (tests/support/forkserver.py)."""
    return forkserver.quorumgate()


def ledger_export_text(live: Live, index: int) -> str:
    out, err = io.StringIO(), io.StringIO()
    status = operator.ledger_export(live.db_path(index), live.spec.chain_id, out, err=err)
    assert status == operator.EXIT_OK, err.getvalue()
    return out.getvalue()


# ============================================================================ 3. tampering


def backup(live: Live, index: int, directory: Path) -> Path:
    """A consistent copy of a running sidecar's store (SQLite's online backup from a
    read-only connection) laid out as a cluster directory: `cluster.json` and
    `node-0/sidecar.db`, so the CLI can be pointed at it."""
    (directory / "node-0").mkdir(parents=True)
    (directory / CLUSTER_FILE).write_bytes((live.spec.directory / CLUSTER_FILE).read_bytes())
    copy = directory / "node-0" / "sidecar.db"
    uri = f"{live.db_path(index).resolve().as_uri()}?mode=ro"
    with (
        contextlib.closing(sqlite3.connect(uri, uri=True, timeout=RPC_TIMEOUT_S)) as source,
        contextlib.closing(sqlite3.connect(copy)) as target,
    ):
        source.backup(target)
        target.execute("PRAGMA journal_mode=WAL")
    return copy


def test_a_tampered_ledger_entry_is_named_by_ledger_verify(live: Live, tmp_path: Path) -> None:
    """A copy of a sidecar's store with one column of one ledger entry edited (a denial
    turned into an allow, its reason, its principal) fails `quorumgate ledger verify`
    (exit 1) naming that entry; an untouched copy and the running sidecar's own store
    verify (exit 0)."""
    chain = live.spec.chain_id
    with contextlib.ExitStack() as stack:
        [agent] = load_agents(live, stack, 1)  # observe mode: flags and some denials
        [denier] = live.agents(stack, denier=mandate([])).values()  # every call denied
        for who in (agent, denier):
            results = who.qg.submit_many(mixed_payloads(0, 12))
            last = who.qg.await_certificate(results[-1].proposal_id, WAIT_S)  # type: ignore[union-attr]
    live.wait_executed(last.height, [2])
    clean = backup(live, 2, tmp_path / "clean")
    entries = live.read(2, "SELECT COUNT(*) FROM ledger")[0][0]
    out = io.StringIO()
    assert operator.ledger_verify(clean, chain, out, err=out) == operator.EXIT_OK, out.getvalue()
    assert f"ledger ok: {entries} entries" in out.getvalue()

    edits = {"outcome": "allow", "reason": "ok", "principal": "someone-else"}
    for k, (column, value) in enumerate(edits.items()):
        copy = backup(live, 2, tmp_path / f"tampered-{column}")
        with contextlib.closing(sqlite3.connect(copy)) as db:
            rowid, height, index = db.execute(
                "SELECT rowid, height, idx FROM ledger WHERE outcome = 'deny' "
                "ORDER BY rowid LIMIT 1 OFFSET ?",
                (5 + k,),
            ).fetchone()
            position = db.execute("SELECT COUNT(*) FROM ledger WHERE rowid < ?", (rowid,))
            position = position.fetchone()[0]
            db.execute(f"UPDATE ledger SET {column} = ? WHERE rowid = ?", (value, rowid))
            db.commit()
        out = io.StringIO()
        status = operator.ledger_verify(copy, chain, out, err=out)
        named = f"entry #{position} (height {height}, index {index})"
        assert status == operator.EXIT_PROBLEM, (column, out.getvalue())
        assert "FAILED" in out.getvalue() and named in out.getvalue(), (column, out.getvalue())

    # The command line, on a tampered copy, the clean copy, and the running sidecar.
    cli = [*quorumgate(), "ledger", "verify", "--node"]
    tampered = subprocess.run(
        [*cli, "0", "--dir", str(tmp_path / "tampered-outcome")],
        capture_output=True, text=True, timeout=SUBPROCESS_S, cwd=REPO_ROOT, check=False,
    )  # fmt: skip
    assert tampered.returncode == 1, tampered.stdout + tampered.stderr
    assert "FAILED" in tampered.stdout and "(height " in tampered.stdout
    for directory, node in ((tmp_path / "clean", 0), (live.spec.directory, 2)):
        ok = subprocess.run(
            [*cli, str(node), "--dir", str(directory)],
            capture_output=True, text=True, timeout=SUBPROCESS_S, cwd=REPO_ROOT, check=False,
        )  # fmt: skip
        assert ok.returncode == 0 and "ledger ok" in ok.stdout, ok.stdout + ok.stderr


# ============================================================================ 5. secrets


def encoded_forms(marker: bytes) -> list[bytes]:
    """The marker raw, as hex (both cases), and in base64 (standard and URL-safe) at each
    of the three alignments it can take inside a longer encoded blob."""
    forms = [marker, marker.hex().encode(), marker.hex().upper().encode()]
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        for shift in range(3):
            encoded = encode(b"\0" * shift + marker)
            # Drop the characters that also depend on the bytes around the marker.
            head = (shift * 8 + 5) // 6
            tail = (len(marker) + shift) % 3
            middle = encoded.rstrip(b"=")[head : len(encoded.rstrip(b"=")) - (1 if tail else 0)]
            forms.append(middle)
    return forms


def find_forms(forms: Sequence[bytes], data: bytes) -> list[bytes]:
    return [form for form in forms if form in data]


def test_the_secret_search_finds_every_form() -> None:
    """The search of the secrets test can fail: it finds a marker in each form it names,
    embedded at every offset in longer data."""
    marker = b"QGPLANT-0123456789abcdef"
    forms = encoded_forms(marker)
    for pad in range(4):
        blob = b"x" * pad + b"card " + marker + b" tail"
        for encoded in (
            blob,
            blob.hex().encode(),
            blob.hex().upper().encode(),
            base64.b64encode(blob),
            base64.urlsafe_b64encode(blob),
        ):
            assert find_forms(forms, b"<<" + encoded + b">>"), (pad, encoded)
    assert not find_forms(forms, base64.b64encode(b"QGPLANT-0123456789abcdeX" * 3))


def test_a_planted_envelope_secret_is_in_no_file_export_or_metric(
    live: Live, tmp_path: Path
) -> None:
    """A value sealed to a registered sink, with a unique marker, travels through the
    cluster (its SealEnvelope is committed, and the sink opens it to the marker), and its
    handle is used in allowed, pending and denied proposals. Afterwards the marker — raw,
    hex, base64 — is in no file of the cluster directory (databases with their -wal and
    -shm, logs, outputs, pid files), no artifact export or listing, no ledger export and
    no /metrics page of any replica or sidecar."""
    marker = f"QGPLANT-{os.urandom(8).hex()}".encode()
    secret = b"4111 " + marker + b" 1111"
    sinks = {name: bytes(key.public_key) for name, key in live.sinks.items()}
    before = min(live.executed().values())
    with contextlib.ExitStack() as stack:
        agents = attack_agents(live, stack)
        alice, mallory = agents["alice"], agents["mallory"]
        handle = alice.qg.seal_envelope("card", secret, {"payments": sinks["payments"]})
        decisions = [
            expect(alice.propose("payments.charge", URL, {"card": handle}), "allow", "ok"),
            expect(
                mallory.propose("payments.charge", URL, {"card": handle}),
                "deny",
                "handle_violation",
            ),
            alice.propose("crm.register", URL, {"phone": handle}),
            alice.propose("crm.my_status", "", {"card": handle}),
            alice.propose("order.finalize", URL, {"card": handle}),
            mallory.propose("records.read", "CURRENT_USER", {"card": handle}),
        ]
    assert sum(d.outcome is Outcome.DENY for d in decisions) >= 3, [
        (d.outcome.value, d.reason) for d in decisions
    ]
    top = max(d.height for d in decisions)
    live.wait_executed(top)

    # The secret did travel: sealed in a committed block, opened by the sink's key.
    opened = []
    for block in live.committed_blocks(0, max(1, before), top):
        for data in block.payload:
            parsed = txlib.parse(data, verify=False)
            payload = parsed.body.payload
            if isinstance(payload, SealEnvelope) and payload.kind == "card":
                for value in payload.sealed:
                    box = SealedBox(live.sinks[value.sink])
                    opened.append(box.decrypt(value.ciphertext))
    assert secret in opened, "the sealed secret was not found in the committed log"

    forms = encoded_forms(marker)
    found: dict[str, list[bytes]] = {}

    def search(what: str, data: bytes) -> None:
        hits = find_forms(forms, data)
        if hits:
            found[what] = hits

    searched = 0
    for path in sorted(live.spec.directory.rglob("*")):
        if path.is_file():
            search(str(path.relative_to(live.spec.directory)), path.read_bytes())
            searched += 1
    names = {p.name for p in live.spec.directory.rglob("*")}
    for name in ("sidecar.db", "sidecar.db-wal", "sidecar.db-shm", "replica.db", "sidecar.log"):
        assert name in names, f"no {name} to search"
    for i in range(N):
        out, err = io.StringIO(), io.StringIO()
        assert operator.list_artifacts(live.db_path(i), live.spec.chain_id, True, out, err=err) == 0
        search(f"artifacts --json node {i}", out.getvalue().encode())
        export = tmp_path / f"artifacts-{i}"
        assert (
            operator.export_artifacts(live.db_path(i), live.spec.chain_id, export, out=out, err=err)
            == operator.EXIT_OK
        ), err.getvalue()
        for path in sorted(export.iterdir()):
            search(f"artifact export node {i}: {path.name}", path.read_bytes())
        search(f"ledger export node {i}", ledger_export_text(live, i).encode())
        for kind in ("replica", "sidecar"):
            search(f"/metrics of {kind} {i}", live.metrics(i, kind).encode())
    assert not found, f"the planted secret appears in plaintext: {found}"
    assert searched > 4 * 6, f"only {searched} files searched"


# ============================================================================ 4. SIGKILL


def audit_exactly_once(live: Live, index: int, height: int) -> None:
    """Sidecar `index`'s store against the committed log, heights 1..`height`: one signed
    block statement per height, contiguous; one ledger entry per (height, index), in
    order, contiguous from 0 within a height; and the entries of each height are the
    transactions of the committed block at that height, in block order."""
    blocks = live.read(
        index, "SELECT height, leaf_count FROM blocks WHERE height <= ? ORDER BY height", (height,)
    )
    assert [h for h, _ in blocks] == list(range(1, height + 1)), (
        f"sidecar {index}'s executed heights are not 1..{height}: "
        f"{len(blocks)} statements, first gap near "
        f"{next((h for k, (h, _) in enumerate(blocks, 1) if h != k), None)}"
    )
    rows = live.read(
        index, "SELECT height, idx, tx_id FROM ledger WHERE height <= ? ORDER BY rowid", (height,)
    )
    keys = [(h, x) for h, x, _ in rows]
    twice = [key for key, n in Counter(keys).items() if n > 1]
    assert not twice, f"sidecar {index} has ledger entries twice: {twice[:5]}"
    assert keys == sorted(keys), f"sidecar {index}'s ledger is out of (height, index) order"
    by_height: dict[int, list[bytes]] = {}
    for h, x, tx_id in rows:
        assert x == len(by_height.setdefault(h, [])), f"sidecar {index}: gap at ({h}, {x})"
        by_height[h].append(bytes(tx_id))
    for block, (h, leaf_count) in zip(live.committed_blocks(index, 1, height), blocks, strict=True):
        expected = [txlib.parse(data, verify=False).tx_id for data in block.payload]
        assert by_height.get(h, []) == expected, (
            f"sidecar {index}'s ledger at height {h} holds {len(by_height.get(h, []))} "
            f"entries; the committed block has {len(expected)} transactions (or other ones)"
        )
        assert leaf_count == len(expected), f"sidecar {index}: leaf count at height {h}"


def ledger_head_at(live: Live, index: int, height: int) -> tuple[int, bytes]:
    """(entries, head) of sidecar `index`'s ledger through `height`."""
    [(count, head)] = live.read(
        index,
        "SELECT COUNT(*), (SELECT hash FROM ledger WHERE height <= ?1 ORDER BY rowid DESC "
        "LIMIT 1) FROM ledger WHERE height <= ?1",
        (height,),
    )
    return int(count), bytes(head or b"")


def test_a_sidecar_sigkilled_under_load_resumes_exactly_once(live: Live) -> None:
    """Five times, under a steady mixed load, sidecar 1 is SIGKILLed at a moment drawn
    from its own observed progress (a seeded number of heights it must execute first, then
    the first moment its Status shows a committed block it has not recorded yet, i.e.
    while it executes one); the others go on; it is restarted and catches up. Afterwards
    its store holds exactly one ledger entry per (height, index), one statement per height
    1..H, contiguous, each height's entries being the committed block's transactions in
    order; its ledger head and state root at H equal the other sidecars'. Then, stopped,
    `quorumgate replay` of it compares every height against the committed log and reports
    no mismatch."""
    rng = random.Random(SEED)
    victim, others = 1, [0, 2, 3]
    where = f"(seed {SEED})"
    with contextlib.ExitStack() as stack:
        load = stack.enter_context(Load(load_agents(live, stack, 4)))
        load.wait_accepted(40)
        for k in range(KILLS):
            start = live.executed([victim])[victim]
            live.wait_executed(start + rng.randint(*HEIGHTS_BEFORE_KILL), [victim])
            # Then the first moment it holds a committed block it has not recorded yet
            # (it is executing one), if one comes within a short bound.
            busy = poll_for(
                lambda: (
                    (st := live.status(victim)) is not None
                    and st.replica_committed_height > st.executed_height
                ),
                MID_BLOCK_WAIT_S,
            )
            live.kill_sidecar(victim)
            killed_at = live.read(victim, "SELECT executed_height FROM head")[0][0]
            live.wait_executed(max(live.executed(others).values()) + 2, others)
            live.start_sidecar(victim)
            goal = max(live.executed(others).values())
            live.wait_executed(goal, [victim])
            print(
                f"kill {k + 1} {where}: sidecar {victim} at height {killed_at}"
                f"{' while executing' if busy else ''}, caught up to {goal}"
            )
        load.stop()
        assert len(load.accepted) > 100, f"only {len(load.accepted)} proposals admitted"
        # Each agent's proposals are ordered by nonce: its last one certified means all of
        # its admitted ones are committed.
        lasts = {s.signer: s for s in load.accepted}
        settled = [
            next(a for a in load.agents if a.public_key == signer).qg.await_certificate(
                s.proposal_id, WAIT_S
            )
            for signer, s in lasts.items()
        ]

    live.wait_executed(max(d.height for d in settled))
    height = min(live.executed().values())
    audit_exactly_once(live, victim, height)
    heads = {i: ledger_head_at(live, i, height) for i in range(N)}
    roots = {i: live.root_at(i, height) for i in range(N)}
    for i in others:
        assert heads[i] == heads[victim], f"ledger through {height}: {heads} {where}"
        assert roots[i] == roots[victim], f"state roots at {height} differ {where}"
    ids = [s.proposal_id for s in load.accepted]
    [(found, distinct)] = live.read(
        victim,
        f"SELECT COUNT(*), COUNT(DISTINCT tx_id) FROM ledger "
        f"WHERE tx_id IN ({','.join('?' * len(ids))})",
        ids,
    )
    assert (found, distinct) == (len(ids), len(ids)), (
        f"{len(ids)} admitted proposals, {found} ledger entries ({distinct} distinct) {where}"
    )

    live.kill_sidecar(victim, signal.SIGTERM)
    try:
        replay = subprocess.run(
            [*quorumgate(), "replay", "--dir", str(live.spec.directory), "--node", str(victim),
             "--json", "--quiet"],
            capture_output=True, text=True, timeout=SUBPROCESS_S, cwd=REPO_ROOT, check=False,
        )  # fmt: skip
    finally:
        live.start_sidecar(victim)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    report = json.loads(replay.stdout)
    assert report["mismatches"] == [], report["mismatches"][:5]
    assert report["heights_compared"] >= height and report["certificates_checked"] >= height
    # Restarted after the replay, it catches up, in a cluster that has gone quiet: its
    # replica may have fallen behind meanwhile (with its sidecar stopped it could not check
    # the last heartbeat blocks' state roots), and fetches what it lacks without waiting
    # for another transaction (tests/consensus/test_quiescence.py).
    live.wait_executed(max(live.executed(others).values()), [victim])


def test_an_interrupted_replay_resumes_from_its_checkpoint_and_rebuilds_the_same_ledger(
    live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sidecar 2 stopped and its store deleted; `replay` (in process, a checkpoint every 4
    heights, each height's record overlapping the next height's execution) is cut off
    part-way by an exception from its progress callback, then run again: it resumes from
    its last checkpoint, compares the heights recorded after it (the ledger head in the
    checkpoint must be the store's for the comparison to pass), records the rest, and ends
    with the ledger and state root the other sidecars have."""
    victim = 2
    heights_wanted = 24
    with contextlib.ExitStack() as stack:
        [agent] = load_agents(live, stack, 1)
        for k in range(heights_wanted * 2):  # each certified proposal is a later height
            if min(live.executed().values()) >= heights_wanted:
                break
            [r] = agent.qg.submit_many(mixed_payloads(k, 1))
            assert isinstance(r, Submitted), r
            agent.qg.await_certificate(r.proposal_id, WAIT_S)
    height = min(live.executed().values())
    assert height >= heights_wanted, f"only {height} heights: too few to cut a replay"
    every = 4
    stop_at = height // 2 // every * every + every - 1  # 3 heights past a checkpoint

    class Cut(Exception):
        pass

    def progress(at: int, top: int, seconds: float) -> None:
        if at >= stop_at:
            raise Cut

    monkeypatch.setattr(replay_module, "CHECKPOINT_HEIGHTS", every)
    live.kill_sidecar(victim, signal.SIGTERM)
    try:
        for name in ("sidecar.db", "sidecar.db-wal", "sidecar.db-shm"):
            (live.spec.node_dir(victim) / name).unlink(missing_ok=True)
        with pytest.raises(Cut):
            asyncio.run(replay_module.replay(live.spec, victim, progress=progress))
        report = asyncio.run(replay_module.replay(live.spec, victim))
    finally:
        live.start_sidecar(victim)
    assert report.mismatches == [], report.mismatches[:5]
    assert report.resumed_from == stop_at - every + 1, (report.resumed_from, stop_at)
    assert report.heights_compared == every - 1, report.as_dict()
    assert report.heights_recorded == report.top_height - stop_at, report.as_dict()
    live.wait_executed(height, [victim])
    assert ledger_head_at(live, victim, height) == ledger_head_at(live, 0, height)
    assert live.root_at(victim, height) == live.root_at(0, height)


# ============================================================================ 6. divergence


def metric(text: str, name: str) -> float | None:
    """The value of the unlabelled sample `name` on a /metrics page."""
    return next((value for labels, value in samples(text, name) if not labels), None)


def fork_store(live: Live, index: int) -> tuple[int, bytes]:
    """With sidecar `index` stopped: execute and record in its store one more height than
    it executed, built from a block that is not the committed one — it carries an owner
    transaction (registering a tool) that no other sidecar ever sees. Returns the height
    and the state root recorded for it."""
    spec = live.spec
    config = EngineConfig(chain_id=spec.chain_id, owner_public_key=spec.owner_public_key)
    key = SigningKey(read_seed(spec.node_dir(index) / RECEIPT_KEY_FILE))
    # A nonce far above the owner's, so the owner's own later transactions never meet it.
    nonce = live.owner.sync_nonce() + 500
    foreign = txlib.build(
        spec.chain_id, nonce, Admin(op=RegisterTool(spec=tool_spec("divergent.only"))),
        live.owner_key,
    )  # fmt: skip

    async def fork() -> tuple[int, bytes]:
        store = await SidecarStore.open(live.db_path(index), spec.chain_id, create=False)
        try:
            executed = store.executed_height
            state = await store.engine_state()
            assert state is not None
            engine = Engine.from_state_bytes(config, state)
            [parent] = live.committed_blocks(index, executed, executed)
            block = Block.create(
                spec.chain_id,
                parent.hash,
                parent.view + 1,
                executed + 1,
                QuorumCert(view=parent.view, height=executed, block_hash=parent.hash),
                parent.timestamp_ms + 1,
                index,
                (foreign,),
            )
            result = execute_block(engine, key, index, spec.chain_id, block)
            [verdict] = result.result.verdicts
            assert verdict.outcome is Outcome.APPLIED, verdict.reason
            await store.record(result)
            return executed + 1, result.result.state_root
        finally:
            await store.close()

    return asyncio.run(fork())


def certified_calls(agent: Agent, victim: int) -> dict[int, str]:
    """N calls of `agent`: the client offers each first to the next replica in turn, so
    every replica — the faulty sidecar's included — is asked first once. What became of
    each: "certified" (allow, not signed by `victim`) or the client's error."""
    outcomes: dict[int, str] = {}
    for k in range(N):
        try:
            decision = agent.propose("kb.search", f"{URL}/{k}")
        except QuorumGateError as err:
            outcomes[k] = f"{type(err).__name__}: {err.reason}"
            continue
        expect(decision, "allow", "ok")
        assert victim not in decision.signers, decision.signers
        outcomes[k] = "certified"
    return outcomes


def test_a_sidecar_whose_store_was_edited_raises_the_alarm_when_it_starts(
    live: Live, tmp_path: Path
) -> None:
    """A store edited at rest: a stored `deny` receipt and its ledger entry turned into
    `allow`, which a sidecar that trusted its store would serve as a forged receipt with
    `diverged=false`. It audits its newest heights against its own signed statements when
    it starts: it raises the divergence alarm, executes nothing, and refuses to serve
    receipts. Put back as it was, it starts clean and catches up."""
    victim = 1
    with contextlib.ExitStack() as stack:
        [denier] = live.agents(stack, edited=mandate([])).values()
        denied = denier.qg.propose("kb.search", "https://kb.example/q", run_id="run-edit")
    assert denied.outcome.value == "deny"
    live.wait_executed(denied.height, [victim])
    live.kill_sidecar(victim, signal.SIGTERM)
    files = [live.db_path(victim).with_name(live.db_path(victim).name + s) for s in ("", "-wal")]
    saved = {f: f.read_bytes() for f in files if f.exists()}
    try:
        with contextlib.closing(sqlite3.connect(live.db_path(victim))) as db:
            for table in ("receipts", "ledger"):
                changed = db.execute(
                    f"UPDATE {table} SET outcome = 'allow', reason = 'ok' "
                    "WHERE proposal_id = ? AND outcome = 'deny'",
                    (denied.proposal_id,),
                ).rowcount
                assert changed == 1, table
            db.commit()
        live.start_sidecar(victim)
        alarmed = wait_until(
            f"sidecar {victim} to find its edited store",
            lambda: (st := live.status(victim)) is not None and st.diverged and st,
            describe=live.describe,
        )
        assert "does not match our signed statements" in alarmed.divergence
        assert f"height {denied.height}" in alarmed.divergence
        assert metric(live.metrics(victim), "qg_sidecar_divergence") == 1.0
        with (
            sync_channel(live.spec, victim, "sidecar") as channel,
            pytest.raises(grpc.RpcError) as refused,
        ):
            spb_grpc.SidecarStub(channel).GetReceipt(
                spb.ReceiptRequest(proposal_id=denied.proposal_id), timeout=RPC_TIMEOUT_S
            )
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        live.kill_sidecar(victim, signal.SIGTERM)
        for f in files:
            f.unlink(missing_ok=True)
        for f, data in saved.items():
            f.write_bytes(data)
        live.start_sidecar(victim)
    clean = live.status(victim)
    assert clean is not None and not clean.diverged
    live.wait_executed(denied.height + 2, [victim])


def test_a_sidecar_fed_a_different_log_raises_the_divergence_alarm_and_stops(
    live: Live,
) -> None:
    """Sidecar 3 is stopped and its store made to disagree with the committed log (one
    extra height executed from a block the others never saw). Restarted under a little
    load, it must report `diverged` in its Status, set `qg_sidecar_divergence 1`, log an
    `event=divergence_alarm` ERROR line, and stop executing: its executed height stays
    while the others go on. The other sidecars are unaffected, and certificates still form
    from f+1 of them — for agents registered before the alarm and after it (which the
    stopped sidecar can never learn of: one faulty sidecar of f must not cost a client
    its calls). (Runs last: the sidecar stays diverged.)"""
    victim, others = 3, [0, 1, 2]
    live.kill_sidecar(victim, signal.SIGTERM)
    live.diverged.add(victim)
    forked_height, forked_root = fork_store(live, victim)

    with contextlib.ExitStack() as stack:
        # The load also commits the forked height when sidecar 3 had executed everything
        # committed: an idle cluster proposes nothing, so waiting first could wait forever.
        agents = load_agents(live, stack, 2)
        stack.enter_context(Load(agents, batch=2, pause_s=0.2))
        live.wait_executed(forked_height, others)
        honest = {live.root_at(i, forked_height) for i in others}
        assert len(honest) == 1 and forked_root not in honest, "the fork did not change the root"
        live.start_sidecar(victim)
        diverged = wait_until(
            f"sidecar {victim} to raise the divergence alarm",
            lambda: (st := live.status(victim)) is not None and st.diverged and st,
            describe=live.describe,
        )
        stopped_at = diverged.executed_height
        assert "state root" in diverged.divergence, diverged.divergence
        assert metric(live.metrics(victim), "qg_sidecar_divergence") == 1.0
        log = (live.spec.node_dir(victim) / "sidecar.log").read_text()
        alarms = [line for line in log.splitlines() if "event=divergence_alarm" in line]
        assert alarms and all("level=ERROR" in line for line in alarms), alarms

        # The others go on, unaffected, and still certify (f+1 of them suffice).
        live.wait_executed(stopped_at + 8, others)
        before = certified_calls(agents[0], victim)
        assert set(before.values()) == {"certified"}, before
        fresh = live.agents(stack, fresh=mandate(["kb.search"]))["fresh"]
        after_alarm = certified_calls(fresh, victim)
        live.wait_executed(max(live.executed(others).values()) + 2, others)

    after = live.status(victim)
    assert after is not None and after.diverged
    assert after.executed_height == stopped_at, (
        f"sidecar {victim} went on executing after its alarm: {stopped_at} -> "
        f"{after.executed_height}"
    )
    for i, st in live.statuses(others).items():
        assert not st.diverged and st.executed_height > stopped_at, live.describe()
        assert metric(live.metrics(i), "qg_sidecar_divergence") == 0.0
    # Last, since it fails today: the replica beside the stopped sidecar refuses every
    # call of the new agent (`unknown_signer`, from its sidecar's frozen view), and the
    # client takes that refusal as final instead of offering the call to another replica.
    assert set(after_alarm.values()) == {"certified"}, (
        f"calls of an agent registered after sidecar {victim}'s alarm: {after_alarm}"
    )
