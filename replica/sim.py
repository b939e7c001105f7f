"""A seeded simulator of whole clusters of consensus cores (TigerBeetle's VOPR, in spirit).

N cores run on a simulated network with delay, loss, duplication, reordering, partitions
and a heal; members crash (possibly half-way through one step's actions) and restart from
what they had made durable; up to f members are Byzantine. After every step the simulator
checks safety:

- no two honest replicas commit different blocks at one height, and each honest replica
  commits heights in order without gaps (so honest committed chains are prefixes of one
  another);
- every block an honest replica holds a QC for, certified in a view above the highest
  block an honest replica committed, extends that block (the lemma of replica/safety.py's
  argument: a broken rule fails here before, or instead of, forking a commit);
- no honest replica ever signs two different votes in one view, nor a vote in a view
  after a timeout for it, across restarts too (judged on what reaches peers);
- no `Send` leaves before the safety state it depends on is durable.

After the network heals it checks liveness: every honest replica commits a block proposed
after the heal within `liveness_views_max` views. Every failure raises `SimulationFailure`
whose message carries the seed and options that reproduce it.

Byzantine behaviours wrap honest cores and override one thing each (as relab/hotstuff's
twins and Byzantine wrappers do): an equivocating leader, twins (two honest instances with
one key), a voter that signs every block it sees (no safety rules), a silent leader,
invalid signatures, and forged certificates. One honest member (the victim) may be restored
from a backup (safety Rule 6): right after it proposed, voted or timed out, with what it
signed still in flight, from a backup taken on entering that view or some views earlier;
docs/consensus/fencing.md says what a restore may and may not do.

Nothing here is used by a production process; it lives in `cluster/` because the demo and
`scripts/simulate.py` drive it as well as the tests.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from quorumgate.proto.canonical import Encoder
from quorumgate.proto.crypto import Ed25519Signer, Signer, Verifier, ed25519_verify
from quorumgate.proto.membership import Member, Membership
from quorumgate.replica.actions import (
    Action,
    Commit,
    PersistSafety,
    Send,
    StoreBlock,
    check_send_allowed,
)
from quorumgate.replica.config import Limits
from quorumgate.replica.core import Core, Recovered
from quorumgate.replica.safety import SafetyError, SafetyRules, SafetyState, Signed
from quorumgate.replica.sync import build_sync_response
from quorumgate.replica.types import (
    HELLO_NONCE_BYTES,
    Block,
    CommitProof,
    Envelope,
    Hello,
    HelloReply,
    Message,
    Proposal,
    QuorumCert,
    RemoteError,
    SyncRequest,
    SyncResponse,
    Timeout,
    TimeoutCert,
    Vote,
    genesis_block,
    proposal_bytes,
    timeout_bytes,
    vote_bytes,
)

BEHAVIOURS = (
    "equivocate",  # as leader, sends two conflicting blocks to two halves of the cluster
    "twins",  # two honest instances share one key, each seeing part of the network
    "double_vote",  # signs a vote for every block it sees, ignoring the safety rules
    "silent_leader",  # never sends its proposals
    "bad_signatures",  # corrupts the signature of everything it sends
    "forge_certs",  # sends forged QCs and TCs and proposals built on them
    "fork_leader",  # leads from a stale QC to fork the chain, votes for anything, and
    # sends its votes to one victim only, so commits diverge: what locks exist to stop
    "malform",  # sends every kind of message truncated, oversized, stale, far ahead, with
    # forged or repeated signatures, in another member's or a non-member's name, plus
    # catch-up answers and hello replies nobody asked for (issue 14)
)
# Behaviours that never help the honest members leave a view (their votes and timeouts
# are invalid or withheld): with f of them, liveness has no fault left for a restore.
WITHHOLDING_BEHAVIOURS = ("bad_signatures", "fork_leader")
MALFORM_COPIES = 2  # mutated copies of each message a `malform` member sends
FAR_AHEAD_VIEWS = 1_000_000
UNSAFE_VARIANTS = (
    "no_safe_to_vote",
    "tc_ignores_high_qc",
    "three_chain_lock",
    "double_vote",
    "no_fence",
    "reported_fence",
)
SIM_TICK_MS = 10
TX_BYTES = 48
RESTORE_BACKUP_VIEWS_MAX = 8  # the victim's backups kept, one per view it entered
# Proposals the network keeps, by view, to hand a restored victim again (the newest views).
SENT_PROPOSAL_VIEWS_MAX = 32


class SimulationFailure(AssertionError):
    pass


@dataclass(frozen=True)
class SimOptions:
    seed: int
    n: int = 4
    byzantine: tuple[str, ...] = ()  # one behaviour per Byzantine member, at most f
    ticks: int = 1_500  # ticks of adversarial network before the heal
    delay_ticks_max: int = 3
    loss_permille: int = 0
    dup_permille: int = 0
    partition_ticks: int = 0  # 0: none; else a new random partition about this often
    victim_delay_ticks: int = 0  # extra delay on everything one honest member sends
    crash_permille: int = 0  # per node per tick, before the heal
    crash_ticks_max: int = 200
    stale_restore_permille: int = 0  # a restart from an older copy of the disk (drill)
    tx_per_tick_permille: int = 500
    liveness_views_max: int = 40
    liveness_ticks_max: int = 6_000
    unsafe: str | None = None  # a deliberately broken rule, for testing the tester
    fast_crypto: bool = True
    # Twins-style enumerated schedules: which members are the Byzantine ones (their places
    # in the round-robin leader order; empty: drawn from the seed), and per phase of
    # `schedule_phase_ticks` a split of every node instance into side 0 or 1 (instances in
    # (member, instance) order); after the last phase the network is whole.
    byzantine_members: tuple[int, ...] = ()
    partition_schedule: tuple[tuple[int, ...], ...] = ()
    schedule_phase_ticks: int = 40
    # The stale-restore drill, aimed: this many times, right after the victim proposed in a
    # view it leads, it is killed, its data put back to what it held on entering that view,
    # and restarted at once — into the very view it signed in and forgot (safety Rule 6).
    restores_when_leading: int = 0
    # The same right after it voted (in a view a Byzantine member leads, if there is one)
    # or timed out: what it signed is delayed `restore_in_flight_ticks`, not lost, so its
    # peers answer its hello before they see it; once its fencing ends the network hands
    # it every other proposal of that view it had sent (after a timeout: every proposal).
    restores_when_voting: int = 0
    restores_when_timing_out: int = 0
    # The backup an aimed restore puts back: taken on entering the view it signed in (0)
    # or this many views before it (at most RESTORE_BACKUP_VIEWS_MAX).
    restore_backup_views: int = 0

    def __post_init__(self) -> None:
        f = (self.n - 1) // 3
        if len(self.byzantine) > f:
            raise ValueError(f"{len(self.byzantine)} Byzantine members but f = {f}")
        for b in self.byzantine:
            if b not in BEHAVIOURS:
                raise ValueError(f"unknown behaviour {b!r}")
        if self.unsafe is not None and self.unsafe not in UNSAFE_VARIANTS:
            raise ValueError(f"unknown unsafe variant {self.unsafe!r}")
        if self.byzantine_members and len(self.byzantine_members) != len(self.byzantine):
            raise ValueError("one member index per Byzantine behaviour")
        if not 0 <= self.restore_backup_views <= RESTORE_BACKUP_VIEWS_MAX:
            raise ValueError(f"restore_backup_views above {RESTORE_BACKUP_VIEWS_MAX}")

    @property
    def aimed_restores(self) -> int:
        return (
            self.restores_when_leading + self.restores_when_voting + (self.restores_when_timing_out)
        )

    def reproduce(self) -> str:
        fields = ", ".join(
            f"{k}={getattr(self, k)!r}"
            for k in self.__dataclass_fields__
            if getattr(self, k) != SimOptions.__dataclass_fields__[k].default or k == "seed"
        )
        return f"SimOptions({fields})"


SIM_LIMITS = Limits(
    view_timeout_ticks_base=20,
    view_timeout_ticks_max=160,
    idle_propose_ticks=4,
    timestamp_behind_ms_max=60_000,
    sync_blocks_max=64,
    sync_retry_ticks=15,
    fence_wait_ticks=40,
    pending_blocks_max=512,
    batch_txs_max=32,
)


# ============================================================================ crypto


class FastKeys:
    """A keyed-hash stand-in for Ed25519 with the property that matters here: nobody can
    produce a member's signature without that member's secret. 50x cheaper, so thousands
    of scenarios fit in CI; some scenarios run real Ed25519 (`fast_crypto=False`)."""

    def __init__(self) -> None:
        self._secrets: dict[bytes, bytes] = {}

    def signer(self, seed: bytes) -> Signer:
        secret = hashlib.sha256(b"sim-secret" + seed).digest()
        public = hashlib.sha256(b"sim-public" + secret).digest()
        self._secrets[public] = secret
        return _FastSigner(secret, public)

    def verify(self, public_key: bytes, message: bytes, signature: bytes) -> bool:
        secret = self._secrets.get(public_key)
        if secret is None:
            return False
        return hashlib.blake2b(message, key=secret, digest_size=64).digest() == signature


@dataclass(frozen=True)
class _FastSigner:
    secret: bytes
    public: bytes

    @property
    def public_key(self) -> bytes:
        return self.public

    def sign(self, message: bytes) -> bytes:
        return hashlib.blake2b(message, key=self.secret, digest_size=64).digest()


# ============================================================================ unsafe variants


class NoSafeToVoteRules(SafetyRules):
    """Broken on purpose: Rule 2 (safe to vote) never refuses."""

    def _check_safe_to_vote(self, block: Block, tc: TimeoutCert | None) -> None:
        pass


class TcIgnoresHighQcRules(SafetyRules):
    """Broken on purpose: Rule 2's TC branch forgets the TC's highest QC — any block of the
    view after a TC is voted for, whatever QC it extends (the classic 2-chain mistake)."""

    def _check_safe_to_vote(self, block: Block, tc: TimeoutCert | None) -> None:
        if tc is not None and tc.view + 1 == block.view:
            return
        super()._check_safe_to_vote(block, tc)


class ThreeChainLockRules(SafetyRules):
    """Broken on purpose: HotStuff's 3-chain voting rules (safeNode: a justify at least as
    new as the lock; lock on the parent's justify) kept under the 2-chain commit count,
    the shortcut issue 19 warns against. Its lock lags one view behind the 2-chain's."""

    def _check_safe_to_vote(self, block: Block, tc: TimeoutCert | None) -> None:
        if block.justify.view < self._state.locked_qc.view:
            raise SafetyError(2, f"justify view {block.justify.view} below the lock")

    def vote(
        self,
        block: Block,
        parent: Block,
        high_qc: QuorumCert | None = None,
        high_tc: TimeoutCert | None = None,
    ) -> Signed[Vote]:
        before = self._state.locked_qc
        signed = super().vote(block, parent, high_qc, high_tc)
        lock = parent.justify if parent.justify.view > before.view else before
        self._state = replace(self._state, locked_qc=lock)
        return signed

    def timeout(
        self, view: int, high_qc: QuorumCert, high_tc: TimeoutCert | None
    ) -> Signed[Timeout]:
        before = self._state.locked_qc
        signed = super().timeout(view, high_qc, high_tc)
        self._state = replace(self._state, locked_qc=before)  # a 3-chain timeout locks nothing
        return signed


class DoubleVoteSafetyRules(SafetyRules):
    """Broken on purpose: Rule 1 forgotten — votes again in a view it already voted in."""

    def vote(
        self,
        block: Block,
        parent: Block,
        high_qc: QuorumCert | None = None,
        high_tc: TimeoutCert | None = None,
    ) -> Signed[Vote]:
        state = self._state
        if state.last_voted_view >= block.view:
            self._state = replace(
                state, last_vote=None, last_timeout=None, last_voted_view=block.view - 1
            )
        return super().vote(block, parent, high_qc, high_tc)


class NoSafeToVoteCore(Core):
    safety_rules_cls = NoSafeToVoteRules


class TcIgnoresHighQcCore(Core):
    safety_rules_cls = TcIgnoresHighQcRules


class ThreeChainLockCore(Core):
    safety_rules_cls = ThreeChainLockRules


class DoubleVoteCore(Core):
    """Broken on purpose: votes for a second block in a view (its safety rules skip Rule 1
    and it takes a leader's second proposal for a view instead of counting it)."""

    safety_rules_cls = DoubleVoteSafetyRules

    def _on_proposal(self, sender: int, proposal: Proposal) -> None:
        self._proposal_seen.pop(proposal.block.view, None)
        super()._on_proposal(sender, proposal)


class NoFenceCore(Core):
    """Broken on purpose: Rule 6 forgotten — a replica restored from old data neither asks
    its peers which views it signed in nor fences the ones its own signatures show."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["fence_on_start"] = False
        kwargs["restored"] = False
        super().__init__(*args, **kwargs)

    def _fence_on_own_signatures(self, qc: QuorumCert, tc: TimeoutCert | None) -> None:
        pass

    def _echo_of_own(self, voter: int, view: int, kind: str) -> None:
        if voter == self.me:
            raise RemoteError("own_echo", f"view {view}")


class ReportedFenceCore(Core):
    """Broken on purpose: Rule 6 as it was — a restore is fenced as a plain start is, at the
    highest view its peers saw it sign in (capped at the certified view + 2), and after
    `fence_wait_ticks` on f+1 answers. A vote or timeout still in flight when they
    answered is in no report, so the restored replica signs again in that view."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["restored"] = False
        super().__init__(*args, **kwargs)


CORE_CLASSES: dict[str | None, type[Core]] = {
    None: Core,
    "no_safe_to_vote": NoSafeToVoteCore,
    "tc_ignores_high_qc": TcIgnoresHighQcCore,
    "three_chain_lock": ThreeChainLockCore,
    "double_vote": DoubleVoteCore,
    "no_fence": NoFenceCore,
    "reported_fence": ReportedFenceCore,
}


# ============================================================================ a node and its disk


@dataclass
class Disk:
    """What survives a crash: exactly what the node's actions made durable."""

    safety: SafetyState
    committed: list[Block]
    proofs: dict[int, CommitProof] = field(default_factory=dict)
    blocks: dict[bytes, Block] = field(default_factory=dict)

    def copy(self) -> Disk:
        return Disk(self.safety, list(self.committed), dict(self.proofs), dict(self.blocks))

    def payload_height(self) -> int:
        """The highest committed height whose block carries transactions (0: none)."""
        return next((b.height for b in reversed(self.committed) if b.payload), 0)

    # CommittedStore, for serving sync requests
    def committed_height(self) -> int:
        return len(self.committed) - 1

    def committed_range(self, start: int, end: int) -> list[Block]:
        return self.committed[start : end + 1]

    def proof_at_or_after(self, height: int, limit: int) -> CommitProof | None:
        for h in range(height, limit + 1):
            if h in self.proofs:
                return self.proofs[h]
        return None

    def proof_at_or_before(self, height: int, floor: int) -> CommitProof | None:
        for h in range(height, floor - 1, -1):
            if h in self.proofs:
                return self.proofs[h]
        return None


class SimPool:
    """The transactions clients submitted, as every replica's mempool would hold them
    after gossip; each node tracks which it has seen committed."""

    def __init__(self) -> None:
        self.txs: list[bytes] = []
        self.valid: set[bytes] = set()

    def add(self, tx: bytes) -> None:
        self.txs.append(tx)
        self.valid.add(tx)


class SimMempool:
    def __init__(self, pool: SimPool, committed: set[bytes]) -> None:
        self._pool = pool
        self._committed = committed
        self._cursor = 0

    def _advance(self) -> None:
        while (
            self._cursor < len(self._pool.txs) and self._pool.txs[self._cursor] in self._committed
        ):
            self._cursor += 1

    def pending(self) -> bool:
        self._advance()
        return self._cursor < len(self._pool.txs)

    def take(self, chain: Sequence[Block], txs_max: int, bytes_max: int) -> tuple[bytes, ...]:
        self._advance()
        in_chain = {tx for block in chain for tx in block.payload}
        out: list[bytes] = []
        size = 0
        for tx in self._pool.txs[self._cursor :]:
            if len(out) >= txs_max or size + len(tx) > bytes_max:
                break
            if tx not in self._committed and tx not in in_chain:
                out.append(tx)
                size += len(tx)
        return tuple(out)

    def check(self, block: Block) -> str | None:
        if any(tx not in self._pool.valid for tx in block.payload):
            return "unknown transaction"
        return None

    def on_commit(self, blocks: Sequence[Block]) -> None:
        for block in blocks:
            self._committed.update(block.payload)


class SimExecution:
    """An instant 'sidecar': the state root after height h folds in the block hashes."""

    def __init__(self, disk: Disk) -> None:
        self._disk = disk
        self._roots: list[bytes] = [b""]

    def _catch_up(self) -> None:
        while len(self._roots) < len(self._disk.committed):
            block = self._disk.committed[len(self._roots)]
            self._roots.append(hashlib.sha256(self._roots[-1] + block.hash).digest())

    def latest_root(self) -> tuple[int, bytes]:
        self._catch_up()
        return len(self._roots) - 1, self._roots[-1]

    def root_at(self, height: int) -> bytes | None:
        self._catch_up()
        return self._roots[height] if 0 <= height < len(self._roots) else None


class SimNode:
    """One instance of a member: a core plus its disk. Twins are two of these, one index."""

    def __init__(self, sim: Simulation, index: int, signer: Signer, instance: int = 0) -> None:
        self.sim = sim
        self.index = index
        self.instance = instance
        self.signer = signer
        chain = sim.membership.chain_id
        self.disk = Disk(SafetyState.initial(chain), [genesis_block(chain)])
        self.durable_epoch = 0
        self.committed_txs: set[bytes] = set()
        self.up = True
        self.down_until = 0
        self.snapshots: list[Disk] = []
        self.force_stale = False  # the next restart is from `snapshots[0]`, whatever the draw
        # (view entered, the disk then): the aimed restores' backups, newest last
        self.backups: list[tuple[int, Disk]] = []
        # The restore marker (replica/node.py RESTORE_MARKER_FILE): set when a backup is
        # put back, cleared once the core is past its fence, so that a crash before then
        # restarts it as a restore again.
        self.restore_marker = False
        self.starts = 0
        self.dropped_before: Counter[str] = Counter()  # by the cores of earlier starts
        self.core = self._make_core(None)

    def _make_core(self, recovered: Recovered | None, restored: bool = False) -> Core:
        sim = self.sim
        cls = CORE_CLASSES[sim.options.unsafe] if self.index not in sim.byzantine else Core
        self.starts += 1
        # A fresh nonce per start, as the replica shell draws one (the default is derived
        # from the safety epoch, which a restore from old data repeats).
        nonce = Encoder(b"qg/sim/hello").u64(sim.options.seed).u32(self.index).u32(self.starts)
        core = cls(
            sim.membership,
            self.index,
            self.signer,
            limits=SIM_LIMITS,
            verifier=Verifier(SIM_LIMITS.verified_cache_max, sim.verify_fn),
            payload=SimMempool(sim.pool, self.committed_txs),
            execution=SimExecution(self.disk),
            recovered=recovered,
            now_ms=sim.now_ms(self.index),
            hello_nonce=nonce.digest()[:HELLO_NONCE_BYTES],
            # An operator who puts a backup back declares it (docs/consensus/fencing.md).
            restored=restored,
        )
        return core

    def start(self) -> list[Action]:
        return self.core.start()

    def crash(self, until_tick: int) -> None:
        self.up = False
        self.down_until = until_tick
        self.snapshots.append(self.disk.copy())

    def restart(self, stale: bool = False) -> list[Action]:
        if self.restore_marker:
            self.sim.restores_resumed += 1  # crashed while still fencing after a restore
        if stale and (len(self.snapshots) > 1 or self.force_stale):
            # Restored from an old copy of the data directory: it forgot what it signed since.
            self.disk = self.snapshots[0].copy()
            self.sim.stale_restores += 1
            self.sim.amnesiac.add(self.index)
            self.restore_marker = True
        restored = self.restore_marker
        disk = self.disk
        committed = disk.committed[-1]
        pending = tuple(b for b in disk.blocks.values() if b.height > committed.height)
        self.durable_epoch = disk.safety.epoch
        self.dropped_before += self.core.dropped
        recovered = Recovered(disk.safety, committed, pending, payload_height=disk.payload_height())
        self.core = self._make_core(recovered, restored=restored)
        self.up = True
        return self.core.start()

    def keep_backup(self) -> None:
        """The aimed restores' backups: the disk as it entered each of its last views."""
        view = self.core.view
        if self.backups and self.backups[-1][0] >= view:
            return
        self.backups.append((view, self.disk.copy()))
        del self.backups[: -(RESTORE_BACKUP_VIEWS_MAX + 1)]

    def backup_before(self, view: int, views_back: int) -> Disk | None:
        """The newest backup taken at least `views_back` views before `view`."""
        older = [disk for entered, disk in self.backups if entered <= view - views_back]
        return older[-1].copy() if older else None

    @property
    def dropped(self) -> Counter[str]:
        """What this member dropped, by reason, over all its starts."""
        return self.dropped_before + self.core.dropped


# ============================================================================ the simulation


@dataclass
class SimResult:
    options: SimOptions
    ticks: int
    committed_heights: dict[int, int]
    views: dict[int, int]
    dropped: Counter[str]
    messages: int
    liveness_views: int


@dataclass(order=True)
class _InFlight:
    deliver_tick: int
    order: int
    to: int = field(compare=False)
    instance: int | None = field(compare=False)  # None: every instance of `to`
    envelope: Envelope = field(compare=False)


class Simulation:
    def __init__(self, options: SimOptions) -> None:
        self.options = options
        self.rng = random.Random(options.seed)
        n = options.n
        chain = f"sim-{options.seed}"
        fast = FastKeys()
        self.verify_fn = fast.verify if options.fast_crypto else ed25519_verify
        signers: list[Signer] = []
        for i in range(n):
            seed = hashlib.sha256(f"{chain}/{i}".encode()).digest()
            signers.append(fast.signer(seed) if options.fast_crypto else Ed25519Signer(seed))
        self.membership = Membership(
            chain, tuple(Member(i, signers[i].public_key) for i in range(n))
        )
        members = list(range(n))
        self.rng.shuffle(members)
        if options.byzantine_members:
            members = list(options.byzantine_members)
        self.byzantine: dict[int, str] = dict(zip(members, options.byzantine, strict=False))
        self.honest = [i for i in range(n) if i not in self.byzantine]
        self.clock_skew_ms = {i: self.rng.randint(-200, 200) for i in range(n)}
        self.tick = 0
        self.pool = SimPool()
        self.nodes: dict[int, list[SimNode]] = {}
        for i in range(n):
            self.nodes[i] = [SimNode(self, i, signers[i])]
            if self.byzantine.get(i) == "twins":
                self.nodes[i].append(SimNode(self, i, signers[i], instance=1))
        self.signers = signers
        self._queue: list[_InFlight] = []
        self._order = 0
        self.messages = 0
        # safety oracles
        self.committed_by_height: dict[int, bytes] = {0: genesis_block(chain).hash}
        self.committed_tip = genesis_block(chain)  # the highest block an honest node committed
        self.blocks_by_hash: dict[bytes, Block] = {self.committed_tip.hash: self.committed_tip}
        self.honest_votes: dict[tuple[int, int], bytes] = {}
        # (member, instance) -> side; None when the network is whole
        self.partition: dict[tuple[int, int], int] | None = None
        self.next_partition_tick = 0
        self.healed = False
        self.quiet = False  # no more transactions (the run's last phase)
        self.forge_seq = 0
        self.fork_pending: dict[int, Proposal] = {}
        self.stale_restores = 0
        self.restores_resumed = 0  # restarts of a restored member not yet past its fence
        self.aimed: Counter[str] = Counter()  # aimed restores done, by kind
        self.amnesiac: set[int] = set()
        self.delivered_votes: dict[tuple[int, int], bytes] = {}
        self.delivered_timeouts: set[tuple[int, int]] = set()  # (honest member, view)
        # view -> block hash -> a proposal of that view as sent (the newest views only)
        self.sent_proposals: dict[int, dict[bytes, Envelope]] = {}
        # an aimed restore's victim -> (view, block hash it voted for): the proposals of
        # that view to hand it once its fencing ends
        self.redeliveries: dict[int, tuple[int, bytes]] = {}
        self.holding: int | None = None  # whose votes and timeouts are held in flight
        self.forks_made = 0
        self.fork_timeouts: dict[int, dict[int, Timeout]] = {}
        # The victim leads three views after a fork_leader, so the two views between can
        # extend a fork while the victim's word is delayed.
        self.fork_leaders = [i for i, b in self.byzantine.items() if b == "fork_leader"]
        self.fork_victim = (self.fork_leaders[0] + 3) % n if self.fork_leaders else -1

    # ------------------------------------------------------------------ helpers

    def fail(self, message: str) -> SimulationFailure:
        return SimulationFailure(
            f"{message}\n  at tick {self.tick}; reproduce with: "
            f"Simulation({self.options.reproduce()}).run()"
        )

    def now_ms(self, index: int) -> int:
        return 1_000_000 + self.tick * SIM_TICK_MS + self.clock_skew_ms[index]

    def _connected(self, src: int, src_instance: int, dst: int, dst_instance: int) -> bool:
        if self.partition is None:
            return True
        return self.partition[(src, src_instance)] == self.partition[(dst, dst_instance)]

    def _victim_message(self, src: int, msg: Message) -> bool:
        """The network adversary's target: the victim's votes and timeouts around a view
        that a fork_leader leads (from two views before it to three after) arrive late."""
        if src != self.fork_victim or not self.fork_leaders:
            return False
        if not isinstance(msg, Vote | Timeout):
            return False
        view = msg.view
        n = self.options.n
        return any((view - lead) % n in (n - 2, n - 1, 0, 1, 2, 3) for lead in self.fork_leaders)

    def _enqueue(self, src: int, src_instance: int, to: int, envelope: Envelope) -> None:
        opts = self.options
        for instance, _node in enumerate(self.nodes[to]):
            if not self._connected(src, src_instance, to, instance):
                continue
            copies = 1
            if not self.healed:
                if self.rng.randrange(1000) < opts.loss_permille:
                    continue
                if self.rng.randrange(1000) < opts.dup_permille:
                    copies = 2
            msg = envelope.message
            if src not in self.byzantine:
                self._check_reaching_peers(src, msg)
            for _ in range(copies):
                delay = self.rng.randint(0, opts.delay_ticks_max) if not self.healed else 1
                if not self.healed and self._victim_message(src, envelope.message):
                    delay += opts.victim_delay_ticks
                if src == self.holding and isinstance(msg, Vote | Timeout):
                    delay += self.restore_in_flight_ticks
                self._order += 1
                self._queue.append(
                    _InFlight(self.tick + 1 + delay, self._order, to, instance, envelope)
                )

    def _check_reaching_peers(self, src: int, msg: Message) -> None:
        """An honest member's votes and timeouts as they reach the network, before and
        after any restore. A restored node may re-sign what it forgot only if the first
        copy reached nobody, so judge what reaches peers, not what leaves: one vote per
        view, and no vote in a view after a timeout for it (Rule 1: a TC of that view
        could then hide the QC the vote helps form)."""
        who = "restored node" if src in self.amnesiac else "honest node"
        if isinstance(msg, Timeout):
            self.delivered_timeouts.add((src, msg.view))
            return
        if not isinstance(msg, Vote):
            return
        key = (src, msg.view)
        if key in self.delivered_timeouts and key not in self.delivered_votes:
            raise self.fail(
                f"SAFETY: {who} {src} voted in view {msg.view} after its timeout for that "
                "view reached peers"
            )
        prior = self.delivered_votes.setdefault(key, msg.block_hash)
        if prior != msg.block_hash:
            raise self.fail(
                f"SAFETY: {who} {src} equivocated: two votes for view {msg.view} reached peers"
            )

    def _check_certified(self, qc: QuorumCert) -> None:
        """The lemma the safety argument rests on (replica/safety.py): once B0 of view r
        commits, every block certified in a view above r extends it. Checked on each
        honest replica's highest QC against the highest block an honest replica
        committed (the last block of a commit is the B0 of its 2-chain), so a conflicting
        certificate fails the run before any fork commits, or stalls everyone instead."""
        tip = self.committed_tip
        if qc.view <= tip.view:
            return
        block = self.blocks_by_hash.get(qc.block_hash)
        while block is not None and block.height > tip.height:
            block = self.blocks_by_hash.get(block.parent_hash)
        if block is not None and block.hash != tip.hash:
            raise self.fail(
                f"SAFETY: a block certified in view {qc.view} does not extend the block "
                f"committed at height {tip.height} (view {tip.view})"
            )

    @property
    def restore_in_flight_ticks(self) -> int:
        """How long an aimed restore's last vote or timeout is delayed: past the restart,
        the hello and its answers, and the proposals handed to the victim after them."""
        return 4 * self.options.delay_ticks_max + 12

    # ------------------------------------------------------------------ actions

    def _apply(self, node: SimNode, actions: list[Action], crash_cut: int | None = None) -> None:
        """Carry out a node's actions in order, as a shell must; a crash may cut them."""
        for i, action in enumerate(actions):
            if crash_cut is not None and i >= crash_cut:
                return
            if isinstance(action, PersistSafety):
                node.disk.safety = action.state
                node.durable_epoch = action.state.epoch
            elif isinstance(action, StoreBlock):
                node.disk.blocks[action.block.hash] = action.block
            elif isinstance(action, Send):
                try:
                    check_send_allowed(action, node.durable_epoch)
                except AssertionError as err:
                    raise self.fail(f"node {node.index}: {err}") from err
                self._send(node, action)
            elif isinstance(action, Commit):
                self._commit(node, action)

    def _send(self, node: SimNode, send: Send) -> None:
        behaviour = self.byzantine.get(node.index)
        msg = send.message
        if behaviour is None and isinstance(msg, Vote) and node.index not in self.amnesiac:
            key = (node.index, msg.view)
            prior = self.honest_votes.setdefault(key, msg.block_hash)
            if prior != msg.block_hash:
                raise self.fail(f"SAFETY: honest node {node.index} voted twice in view {msg.view}")
        if behaviour == "malform":
            for claimed, to, out in self._malformed(node, send):
                self._deliver_from(node.index, to, out, node.instance, claimed)
            return
        if behaviour is not None:
            for to, out in self._byzantine_rewrite(node, behaviour, send):
                self._deliver_from(node.index, to, out, node.instance)
            return
        self._deliver_from(node.index, send.to, msg)

    def _deliver_from(
        self,
        src: int,
        to: int | None,
        msg: Message,
        src_instance: int = 0,
        claimed: int | None = None,
    ) -> None:
        """`claimed`: the sender the envelope names, when a Byzantine member lies about it
        (on the wire the authenticated stream would give it away; the core must not
        depend on that)."""
        envelope = Envelope(self.membership.chain_id, src if claimed is None else claimed, msg)
        if isinstance(msg, Proposal) and claimed is None:
            self._keep_proposal(envelope, msg)
        targets = [to] if to is not None else [i for i in range(self.options.n) if i != src]
        for dst in targets:
            self.messages += 1
            self._enqueue(src, src_instance, dst, envelope)

    def _keep_proposal(self, envelope: Envelope, proposal: Proposal) -> None:
        """The network remembers what it carried, to hand a restored victim again."""
        view = proposal.block.view
        self.blocks_by_hash.setdefault(proposal.block.hash, proposal.block)
        self.sent_proposals.setdefault(view, {}).setdefault(proposal.block.hash, envelope)
        if len(self.sent_proposals) > SENT_PROPOSAL_VIEWS_MAX:
            del self.sent_proposals[min(self.sent_proposals)]

    def _commit(self, node: SimNode, commit: Commit) -> None:
        disk = node.disk
        for block in commit.blocks:
            if block.height != len(disk.committed):
                raise self.fail(
                    f"node {node.index} committed height {block.height} "
                    f"after {len(disk.committed) - 1}"
                )
            if block.parent_hash != disk.committed[-1].hash:
                raise self.fail(f"SAFETY: node {node.index} committed a block off its own chain")
            if node.index not in self.byzantine:
                known = self.committed_by_height.setdefault(block.height, block.hash)
                if known != block.hash:
                    raise self.fail(
                        f"SAFETY: two blocks committed at height {block.height} "
                        f"({known[:4].hex()} and {block.hash[:4].hex()}, node {node.index})"
                    )
                if block.height > self.committed_tip.height:
                    self.committed_tip = block
            disk.committed.append(block)
            node.committed_txs.update(block.payload)
            disk.blocks.pop(block.hash, None)
        disk.proofs[commit.blocks[-1].height] = commit.proof
        for h in [h for h, b in disk.blocks.items() if b.height <= len(disk.committed) - 1]:
            del disk.blocks[h]

    # ------------------------------------------------------------------ Byzantine behaviours

    def _sign(self, index: int, message: bytes) -> bytes:
        return self.signers[index].sign(message)

    def _byzantine_rewrite(
        self, node: SimNode, behaviour: str, send: Send
    ) -> list[tuple[int | None, Message]]:
        msg = send.message
        chain = self.membership.chain_id
        me = node.index
        if behaviour == "silent_leader" and isinstance(msg, Proposal):
            return []
        if behaviour == "bad_signatures":
            bad = bytes(64)
            if isinstance(msg, Vote):
                return [(send.to, replace(msg, signature=bad))]
            if isinstance(msg, Timeout):
                return [(send.to, replace(msg, signature=bad))]
            if isinstance(msg, Proposal):
                return [(send.to, replace(msg, signature=bad))]
        if behaviour == "equivocate" and isinstance(msg, Proposal):
            block = msg.block
            alt = Block.create(
                chain,
                block.parent_hash,
                block.view,
                block.height,
                block.justify,
                block.timestamp_ms + 1,
                block.proposer,
                tuple(reversed(block.payload))[:-1] if block.payload else (),
                block.state_root_height,
                block.state_root,
            )
            alt_prop = Proposal(alt, self._sign(me, proposal_bytes(chain, alt.view, alt.hash)))
            others = [i for i in range(self.options.n) if i != me]
            self.rng.shuffle(others)
            half = len(others) // 2
            out: list[tuple[int | None, Message]] = [(i, msg) for i in others[:half]]
            out += [(i, alt_prop) for i in others[half:]]
            # One member of the first half sees both: a replica must vote for one only.
            out += [(others[0], alt_prop)] if half else []
            # and vote for the alternative too
            out += [
                (
                    None,
                    Vote(
                        alt.view,
                        alt.height,
                        alt.hash,
                        me,
                        self._sign(me, vote_bytes(chain, alt.view, alt.height, alt.hash)),
                    ),
                )
            ]
            return out
        if behaviour == "double_vote" and isinstance(msg, Vote):
            return [(send.to, msg)]
        if behaviour == "fork_leader":
            if isinstance(msg, Proposal) and not self._forks_in(msg.block.view):
                return [(send.to, msg)]  # a teammate forked the view before: extend it
            if isinstance(msg, Proposal):
                fork = self._fork_block(node, msg)
                if fork is None:
                    return [(send.to, msg)]
                self.fork_pending[me] = fork  # sent once a TC for the view before admits it
                return []
            if isinstance(msg, Timeout | TimeoutCert):
                return []  # its certificates would tell the others what the victim knows
            if isinstance(msg, Vote) and self._forks_in(msg.view):
                return []  # its vote goes to the fork, not to the block it replaced
            if isinstance(msg, Vote):
                # Withhold the vote for the block just before a view the team forks from
                # all but the victim: only the victim can then certify it (and commit).
                # Every member of the team does, or the others' votes certify it anyway.
                if self._forks_in(msg.view + 1):
                    return [(self.fork_victim, msg)]
                return [(send.to, msg)]
        if behaviour == "forge_certs":
            return [(send.to, msg), *self._forgeries(node)]
        return [(send.to, msg)]

    def _malformed(self, node: SimNode, send: Send) -> list[tuple[int, int | None, Message]]:
        """What a `malform` member sends for one message: the message itself half the
        time, `MALFORM_COPIES` mutations of it, each in its own name or another's, and now
        and then a catch-up answer or a hello reply nobody asked for."""
        rng, n, me = self.rng, self.options.n, node.index
        out: list[tuple[int, int | None, Message]] = []
        if rng.randrange(2):
            out.append((me, send.to, send.message))
        for _ in range(MALFORM_COPIES):
            try:
                mutated = self._mutate(node, send.message)
            except (RemoteError, ValueError, OverflowError):
                continue  # a shape the wire codec could not even carry
            claimed = me if rng.randrange(3) else rng.choice((*range(n), n, n + 7))
            out.append((claimed, send.to if rng.randrange(2) else None, mutated))
        core = node.core
        if rng.randrange(8) == 0:
            poison = SyncResponse((), (), core.high_qc, (), 10**12)
            out.append((me, rng.randrange(n), poison))
        if rng.randrange(8) == 0:
            asker = rng.randrange(n)
            nonce = bytes(rng.getrandbits(8) for _ in range(HELLO_NONCE_BYTES))
            reply = HelloReply(0, core.view, core.high_qc, None, asker, nonce, bytes(64))
            out.append((rng.choice((me, asker, (asker + 1) % n)), asker, reply))
        return out

    def _mutate(self, node: SimNode, msg: Message) -> Message:
        rng = self.rng
        chain, me = self.membership.chain_id, node.index
        garbage = bytes(rng.getrandbits(8) for _ in range(64))
        pick = rng.randrange(6)

        def qc_mutation(qc: QuorumCert) -> QuorumCert:
            if pick == 0:
                return replace(qc, signatures=qc.signatures[:1])  # under-signed
            if pick == 1 and qc.signatures:
                signer, _ = qc.signatures[0]
                return replace(qc, signatures=((signer, garbage), *qc.signatures[1:]))
            return replace(qc, view=qc.view + FAR_AHEAD_VIEWS)

        if isinstance(msg, Vote):
            if pick < 2:
                return replace(msg, view=msg.view + FAR_AHEAD_VIEWS * pick, signature=garbage)
            if pick == 2:
                return replace(msg, block_hash=garbage[:32])
            if pick == 3:  # stale, and genuinely signed
                view = max(1, msg.view - 5)
                return replace(
                    msg,
                    view=view,
                    signature=self._sign(me, vote_bytes(chain, view, msg.height, msg.block_hash)),
                )
            return replace(msg, height=2**62)
        if isinstance(msg, Timeout):
            if pick < 3:
                return replace(msg, high_qc=qc_mutation(msg.high_qc))
            return replace(msg, view=msg.view + FAR_AHEAD_VIEWS, signature=garbage)
        if isinstance(msg, TimeoutCert):
            if pick < 3:
                return replace(msg, signatures=msg.signatures[:1])
            return replace(msg, high_qc=qc_mutation(msg.high_qc))
        if isinstance(msg, Proposal):
            block = msg.block

            def rebuilt(**changes: Any) -> Block:
                fields: dict[str, Any] = {
                    "parent_hash": block.parent_hash,
                    "view": block.view,
                    "height": block.height,
                    "justify": block.justify,
                    "timestamp_ms": block.timestamp_ms,
                    "proposer": block.proposer,
                    "payload": block.payload,
                    "state_root_height": block.state_root_height,
                    "state_root": block.state_root,
                }
                fields.update(changes)
                return Block.create(chain, **fields)

            def signed(b: Block) -> Proposal:
                return Proposal(b, self._sign(me, proposal_bytes(chain, b.view, b.hash)))

            if pick == 0:
                return replace(msg, signature=garbage)
            if pick == 1:  # the payload changed under the signature
                return replace(msg, block=rebuilt(payload=(*block.payload, garbage)))
            if pick == 2:  # genuinely signed, on a broken certificate
                return signed(rebuilt(justify=qc_mutation(block.justify)))
            if pick == 3:  # far ahead, genuinely signed, on a parent nobody holds
                return signed(rebuilt(parent_hash=garbage[:32], view=block.view + FAR_AHEAD_VIEWS))
            if pick == 4:
                return signed(rebuilt(timestamp_ms=2**62))
            return signed(rebuilt(state_root_height=block.height + 50, state_root=garbage[:32]))
        if isinstance(msg, SyncRequest):
            return replace(msg, from_height=2**62, max_blocks=rng.choice((0, 2**31)))
        if isinstance(msg, SyncResponse):
            return replace(msg, proof=(), committed=msg.committed[:1])
        if isinstance(msg, Hello):
            return replace(msg, signature=garbage)
        if isinstance(msg, HelloReply):
            return replace(msg, last_signed_view=0, signature=garbage)
        return msg

    def _forgeries(self, node: SimNode) -> list[tuple[int | None, Message]]:
        """Certificates no honest member signed, pointing far ahead and at fake blocks."""
        self.forge_seq += 1
        if self.forge_seq % 7:
            return []
        chain = self.membership.chain_id
        me = node.index
        core = node.core
        fake_hash = hashlib.sha256(b"fake" + self.forge_seq.to_bytes(8, "big")).digest()
        view = core.view + 1 + self.rng.randrange(5)
        my_sig = self._sign(me, vote_bytes(chain, view, core.committed_height + 5, fake_hash))
        forged: list[QuorumCert] = []
        q = self.membership.quorum
        # under-signed: only my signature
        forged.append(QuorumCert(view, core.committed_height + 5, fake_hash, ((me, my_sig),)))
        # enough signers, but only mine is real
        sigs = tuple(sorted((i, my_sig if i == me else bytes(64)) for i in range(q)))
        forged.append(QuorumCert(view, core.committed_height + 5, fake_hash, sigs))
        # a non-member signer
        sigs2 = tuple(sorted([(me, my_sig), *((self.options.n + k, my_sig) for k in range(q))]))
        forged.append(QuorumCert(view, core.committed_height + 5, fake_hash, sigs2))
        out: list[tuple[int | None, Message]] = []
        for qc in forged:
            t_sig = self._sign(me, timeout_bytes(chain, view + 1, qc.view))
            out.append((None, Timeout(view + 1, qc, me, t_sig)))
        tc_sigs = tuple(
            sorted(
                (
                    i,
                    core.high_qc.view,
                    bytes(64)
                    if i != me
                    else self._sign(me, timeout_bytes(chain, view, core.high_qc.view)),
                )
                for i in range(q)
            )
        )
        out.append((None, TimeoutCert(view, core.high_qc, tc_sigs)))
        # a proposal from a fake parent, justified by a forged QC (sent if we lead that view)
        if self.membership.leader(view + 1) == me:
            fake_parent_qc = forged[1]
            block = Block.create(
                chain,
                fake_hash,
                view + 1,
                fake_parent_qc.height + 1,
                fake_parent_qc,
                self.now_ms(me),
                me,
                (),
                0,
                b"",
            )
            sig = self._sign(me, proposal_bytes(chain, block.view, block.hash))
            out.append((None, Proposal(block, sig)))
        return out

    def _forks_in(self, view: int) -> bool:
        """The `fork_leader` members act as one team: a view one of them leads is forked
        unless a teammate led the view before it (then it extends that fork, which needs a
        child in the next view to commit)."""
        leader = self.membership.leader
        return leader(view) in self.fork_leaders and leader(view - 1) not in self.fork_leaders

    def _fork_block(self, node: SimNode, honest: Proposal) -> Proposal | None:
        """The same view, but extending the QC three (or, every other time, two) blocks
        below the highest: a sibling of the block the victim alone has seen committed (or
        would have, under a 2-chain commit rule)."""
        chain = self.membership.chain_id
        tree = node.core.tree
        qc = honest.block.justify
        disk = node.disk

        def find(block_hash: bytes, height: int) -> Block | None:
            found = tree.get(block_hash) or disk.blocks.get(block_hash)
            if found is None and height < len(disk.committed):
                found = disk.committed[height]
            return found if found is not None and found.hash == block_hash else None

        self.forks_made += 1
        for _ in range(3 if self.forks_made % 2 else 2):
            block = find(qc.block_hash, qc.height)
            if block is None or block.height == 0:
                return None
            qc = block.justify
        parent = find(qc.block_hash, qc.height)
        if parent is None:
            return None
        me = node.index
        view = honest.block.view
        block = Block.create(
            chain,
            parent.hash,
            view,
            parent.height + 1,
            qc,
            max(self.now_ms(me), parent.timestamp_ms + 1),
            me,
            (),
            parent.state_root_height,
            parent.state_root,
        )
        sig = self._sign(me, proposal_bytes(chain, view, block.hash))
        return Proposal(block, sig, honest.high_tc)

    def _fork_watch(self, node: SimNode, envelope: Envelope) -> None:
        """Vote for every block, and once honest members give up on the view before a
        pending fork, sign a timeout too and send the fork with the TC that admits it."""
        msg = envelope.message
        me = node.index
        chain = self.membership.chain_id
        if isinstance(msg, Proposal):
            block = msg.block
            sig = self._sign(me, vote_bytes(chain, block.view, block.height, block.hash))
            vote = Vote(block.view, block.height, block.hash, me, sig)
            to = self.fork_victim if self._forks_in(block.view + 1) else None
            self._deliver_from(me, to, vote, node.instance)
            return
        fork = self.fork_pending.get(me)
        if not isinstance(msg, Timeout) or fork is None or msg.view != fork.block.view - 1:
            return
        statement = timeout_bytes(chain, msg.view, msg.high_qc.view)
        if not self.verify_fn(self.membership.key(msg.voter), statement, msg.signature):
            return  # another Byzantine member's forgery: a TC built on it would be forged too
        seen = self.fork_timeouts.setdefault(msg.view, {})
        seen[msg.voter] = msg
        if len(seen) + 1 < self.membership.quorum:
            return
        timeouts = list(seen.values())[: self.membership.quorum - 1]
        high = max((t.high_qc for t in timeouts), key=lambda q: q.view)
        mine = Timeout(
            msg.view, high, me, self._sign(me, timeout_bytes(chain, msg.view, high.view))
        )
        signers = sorted([*timeouts, mine], key=lambda t: t.voter)
        tc = TimeoutCert(
            msg.view, high, tuple((t.voter, t.high_qc.view, t.signature) for t in signers)
        )
        block = fork.block
        if block.justify.view >= tc.view:
            return
        del self.fork_pending[me]
        self._deliver_from(me, None, Proposal(block, fork.signature, tc), node.instance)
        # and vote for it, to everyone
        sig = self._sign(me, vote_bytes(chain, block.view, block.height, block.hash))
        self._deliver_from(me, None, Vote(block.view, block.height, block.hash, me, sig))

    def _double_vote_extra(self, node: SimNode, envelope: Envelope) -> None:
        """A `double_vote` member also signs every proposal it receives, rules or not."""
        msg = envelope.message
        if not isinstance(msg, Proposal):
            return
        chain = self.membership.chain_id
        block = msg.block
        sig = self._sign(node.index, vote_bytes(chain, block.view, block.height, block.hash))
        vote = Vote(block.view, block.height, block.hash, node.index, sig)
        self._deliver_from(node.index, None, vote, node.instance)

    # ------------------------------------------------------------------ running

    def _maybe_crash(self, node: SimNode) -> int | None:
        opts = self.options
        if self.healed or opts.crash_permille == 0 or node.index in self.byzantine:
            return None
        # (Other members crash in stale-restore scenarios too: a restore's fence rests on
        # the certificates its peers persisted, not on what they remember in memory.)
        if self.rng.randrange(1000) >= opts.crash_permille:
            return None
        return 1 + self.rng.randrange(opts.crash_ticks_max)

    def _step_node(self, node: SimNode, actions_fn: str, envelope: Envelope | None) -> None:
        before = self._aimed_restore_victim(node)
        if envelope is not None:
            actions = node.core.on_message(envelope)
        elif actions_fn == "tick":
            actions = node.core.on_tick(self.now_ms(node.index))
        else:
            actions = node.core.on_transactions()
        if before is not None and self._aimed_restore(node, before, actions):
            return
        down = self._maybe_crash(node)
        if down is not None:
            cut = self.rng.randrange(len(actions) + 1)
            self._apply(node, actions, crash_cut=cut)
            node.crash(self.tick + down)
            return
        self._apply(node, actions)
        if node.restore_marker and not node.core.restoring:
            node.restore_marker = False  # as the shell removes the file
        if node.index not in self.byzantine:
            self._check_certified(node.core.high_qc)
        if before is not None:
            node.keep_backup()
        if node.index in self.redeliveries and node.instance == 0:
            self._redeliver(node)

    def _aimed_restore_victim(self, node: SimNode) -> SafetyState | None:
        """For the aimed restores: the victim's safety state before this step, to restore
        it from if the step signs what the restore aims at."""
        if (
            self.options.aimed_restores <= sum(self.aimed.values())
            or self.healed
            or node.index != self.honest[-1]
            or node.instance != 0
        ):
            return None
        return node.disk.safety

    def _restore_aim(self, actions: list[Action]) -> tuple[str, int, bytes] | None:
        """What in this step an aimed restore fires on, if anything: (kind, view, the
        block voted for or b"")."""
        opts, done = self.options, self.aimed
        sent = [a.message for a in actions if isinstance(a, Send)]
        for msg in sent:
            if isinstance(msg, Proposal) and done["leading"] < opts.restores_when_leading:
                return "leading", msg.block.view, b""
        for msg in sent:
            if isinstance(msg, Vote) and done["voting"] < opts.restores_when_voting:
                leader = self.membership.leader(msg.view)
                if leader in self.byzantine or not self.byzantine:
                    return "voting", msg.view, msg.block_hash
            if isinstance(msg, Timeout) and done["timing_out"] < opts.restores_when_timing_out:
                return "timing_out", msg.view, b""
        return None

    def _aimed_restore(self, node: SimNode, prior: SafetyState, actions: list[Action]) -> bool:
        aim = self._restore_aim(actions)
        if aim is None:
            return False
        kind, view, voted = aim
        # What it signs leaves: a proposal (and its vote) at once, a vote or a timeout
        # held in flight until the restored victim has asked its peers and been answered.
        self.holding = None if kind == "leading" else node.index
        self._apply(node, actions)
        self.holding = None
        backup = node.backup_before(view, self.options.restore_backup_views)
        if self.options.restore_backup_views == 0 or backup is None:
            # The copy kept holds the certificates that let it enter the view, but not what
            # it signed in it, nor its own block.
            backup = node.disk.copy()
            backup.safety = replace(
                backup.safety,
                last_voted_view=prior.last_voted_view,
                last_proposed_view=prior.last_proposed_view,
                last_vote=prior.last_vote,
                last_timeout=prior.last_timeout,
                locked_qc=prior.locked_qc,
            )
            if kind == "leading":
                for msg in (a.message for a in actions if isinstance(a, Send)):
                    if isinstance(msg, Proposal):
                        backup.blocks.pop(msg.block.hash, None)
        node.snapshots = [backup]
        node.force_stale = True
        self.aimed[kind] += 1
        if kind == "leading":
            # Down for longer than a message takes, as a restore from backup is: what it
            # sent before has reached its peers when it asks them (Rule 6 at start).
            node.crash(self.tick + self.options.delay_ticks_max + 2)
        else:
            node.crash(self.tick + 1)
            self.redeliveries[node.index] = (view, voted)
        return True

    def _redeliver(self, node: SimNode) -> None:
        """Once a victim restored after voting or timing out has ended its fencing, the
        network hands it the proposals of that view it has not voted for: the Byzantine
        leader's other block, or the block it timed out waiting for, delivered late."""
        if node.core.fencing:
            return
        view, voted = self.redeliveries.pop(node.index)
        if node.core.view != view:
            return
        for block_hash, envelope in self.sent_proposals.get(view, {}).items():
            if block_hash != voted and envelope.sender != node.index:  # (not its own)
                self._order += 1
                self._queue.append(_InFlight(self.tick + 1, self._order, node.index, 0, envelope))

    def _deliver(self, item: _InFlight) -> None:
        envelope = item.envelope
        for instance, node in enumerate(self.nodes[item.to]):
            if item.instance is not None and instance != item.instance:
                continue
            if not node.up:
                continue
            msg = envelope.message
            if isinstance(msg, SyncRequest):
                # As the replica's shell does: members only, never ourselves. (On the
                # wire the sender is the stream's authenticated one; here, as with
                # `init --insecure`, it is whatever the envelope says.)
                asker = envelope.sender
                if not self.membership.is_member(asker) or asker == node.index:
                    continue
                response = build_sync_response(msg, node.disk, node.core, SIM_LIMITS)
                self._deliver_from(node.index, envelope.sender, response, node.instance)
                continue
            self._step_node(node, "msg", envelope)
            if self.byzantine.get(node.index) == "double_vote":
                self._double_vote_extra(node, envelope)
            if self.byzantine.get(node.index) == "fork_leader":
                self._fork_watch(node, envelope)

    def _all_nodes(self) -> list[SimNode]:
        return [node for i in range(self.options.n) for node in self.nodes[i]]

    def _one_tick(self) -> None:
        self.tick += 1
        opts = self.options
        if not self.quiet and self.rng.randrange(1000) < opts.tx_per_tick_permille:
            seq = len(self.pool.txs)
            self.pool.add(f"tx-{opts.seed}-{seq}".encode().ljust(TX_BYTES, b"."))
            for node in self._all_nodes():
                if node.up:
                    self._apply(node, node.core.on_transactions())
        due = [m for m in self._queue if m.deliver_tick <= self.tick]
        if due:
            self._queue = [m for m in self._queue if m.deliver_tick > self.tick]
            self.rng.shuffle(due)  # reordering among messages due in the same tick
            for item in due:
                self._deliver(item)
        for node in self._all_nodes():
            if not node.up:
                if self.tick >= node.down_until:
                    # Amnesia is survivable only while enough peers remember: at most one
                    # member (the drill's stale-restore victim) ever restarts from old data.
                    stale = node.force_stale or (
                        node.index == self.honest[-1]
                        and self.rng.randrange(1000) < self.options.stale_restore_permille
                    )
                    node.force_stale = False
                    self._apply(node, node.restart(stale))
                continue
            self._step_node(node, "tick", None)

    def _repartition(self) -> None:
        """Twins-style: every so often the instances (twins are two) split anew, or heal;
        with a `partition_schedule`, exactly the enumerated splits, phase by phase."""
        opts = self.options
        if opts.partition_schedule:
            phase = self.tick // opts.schedule_phase_ticks
            if phase < len(opts.partition_schedule):
                instances = sorted((node.index, node.instance) for node in self._all_nodes())
                sides = opts.partition_schedule[phase]
                self.partition = dict(zip(instances, sides, strict=True))
            else:
                self.partition = None
            return
        if opts.partition_ticks == 0 or self.tick < self.next_partition_tick:
            return
        span = opts.partition_ticks
        self.next_partition_tick = self.tick + span // 2 + self.rng.randrange(span + 1)
        if self.rng.randrange(3) == 0:
            self.partition = None
            return
        instances = [(node.index, node.instance) for node in self._all_nodes()]
        self.rng.shuffle(instances)
        cut = 1 + self.rng.randrange(len(instances) - 1)
        self.partition = {inst: (0 if k < cut else 1) for k, inst in enumerate(instances)}

    def heal(self) -> None:
        self.healed = True
        self.partition = None
        for node in self._all_nodes():
            if not node.up:
                self._apply(node, node.restart())

    def run(self) -> SimResult:
        opts = self.options
        for node in self._all_nodes():
            self._apply(node, node.start())
        while self.tick < opts.ticks:
            self._repartition()
            self._one_tick()
        self.heal()
        # Liveness: every honest replica commits a block proposed after the heal.
        heal_view = max(self._honest_core(i).view for i in self.honest)
        done: dict[int, int] = {}
        deadline = self.tick + opts.liveness_ticks_max
        while len(done) < len(self.honest) and self.tick < deadline:
            self._one_tick()
            for i in self.honest:
                if i in done:
                    continue
                disk = self.nodes[i][0].disk
                if disk.committed[-1].view > heal_view:
                    done[i] = self._honest_core(i).view
        if len(done) < len(self.honest):
            stuck = [i for i in self.honest if i not in done]
            views = {i: self._honest_core(i).view for i in self.honest}
            raise self.fail(
                f"LIVENESS: nodes {stuck} committed nothing new after the heal; views {views}"
            )
        liveness_views = max(done.values()) - heal_view
        if liveness_views > opts.liveness_views_max:
            raise self.fail(
                f"LIVENESS: {liveness_views} views after the heal before every honest node "
                f"committed (bound {opts.liveness_views_max})"
            )
        self._settle_quietly()
        dropped: Counter[str] = Counter()
        for i in self.honest:
            dropped.update(self.nodes[i][0].dropped)
        return SimResult(
            options=opts,
            ticks=self.tick,
            committed_heights={i: len(self.nodes[i][0].disk.committed) - 1 for i in self.honest},
            views={i: self._honest_core(i).view for i in self.honest},
            dropped=dropped,
            messages=self.messages,
            liveness_views=liveness_views,
        )

    def _honest_core(self, index: int) -> Core:
        return self.nodes[index][0].core

    def _settle_quietly(self) -> None:
        """After liveness, no more transactions: every honest member must end quiescent
        (needing no ticks) at one committed height. One left behind, by a lost message, a
        restart or a view the others ended without it, has to catch up with nothing else
        happening (stop 27; tests/consensus/test_quiescence.py has the cases one by one)."""
        self.quiet = True
        deadline = self.tick + self.options.liveness_ticks_max
        while True:
            cores = [self._honest_core(i) for i in self.honest]
            heights = {i: self._honest_core(i).committed_height for i in self.honest}
            if len(set(heights.values())) == 1 and not any(c.needs_ticks() for c in cores):
                return
            if self.tick >= deadline:
                busy = [i for i in self.honest if self._honest_core(i).needs_ticks()]
                raise self.fail(
                    f"QUIET: no transactions for {self.options.liveness_ticks_max} ticks, and "
                    f"the honest members did not settle: committed heights {heights}, "
                    f"still needing ticks {busy}"
                )
            self._one_tick()


def scenario(seed: int, n: int) -> SimOptions:
    """The scenario a seed stands for: faults and Byzantine members drawn from the seed.
    About half the seeds also restore the victim from a backup (the restore counts drawn
    last, so the draws before them stay what they were for every seed); not while f
    Byzantine members withhold what the honest ones need to leave a view, because a
    restored replica sits out the views it fences, which makes one fault more than
    liveness tolerates (docs/consensus/fencing.md)."""
    rng = random.Random(seed * 7919 + n)
    f = (n - 1) // 3
    k = rng.randint(0, f)
    byzantine = tuple(rng.choice(BEHAVIOURS) for _ in range(k))
    options = SimOptions(
        seed=seed,
        n=n,
        byzantine=byzantine,
        ticks=rng.choice((300, 600, 900)),
        delay_ticks_max=rng.choice((0, 1, 3, 6)),
        loss_permille=rng.choice((0, 0, 50, 200)),
        dup_permille=rng.choice((0, 50, 200)),
        partition_ticks=rng.choice((0, 0, 10, 40, 200)),
        victim_delay_ticks=rng.choice((0, 30, 60)) if "fork_leader" in byzantine else 0,
        crash_permille=rng.choice((0, 0, 1, 3)),
        crash_ticks_max=rng.choice((30, 150)),
        tx_per_tick_permille=rng.choice((100, 500, 900)),
    )
    restores = replace(
        options,
        restores_when_leading=rng.choice((0, 1, 2)),
        restores_when_voting=rng.choice((0, 1, 2)),
        restores_when_timing_out=rng.choice((0, 1)),
        restore_backup_views=rng.choice((0, 1, 2, 4)),
    )
    withholding = sum(b in WITHHOLDING_BEHAVIOURS for b in byzantine)
    return restores if rng.randrange(2) and withholding < f else options


# ============================================================================ Twins


TWINS_PHASES = 3  # phases of enumerated partitions before the network heals
TWINS_PHASE_TICKS = 100  # about five views each
TWINS_BEHAVIOURS = ("twins", "equivocate", "fork_leader")


def twins_splits(instances: int) -> list[tuple[int, ...]]:
    """Every way to split `instances` node instances into two non-empty sides (each split
    once: the first instance is always on side 0)."""
    out = []
    for mask in range(1, 2 ** (instances - 1)):
        sides = (0, *((mask >> k) & 1 for k in range(instances - 1)))
        if any(sides):
            out.append(sides)
    return out


def twins_scenarios(
    n: int = 4, *, per_behaviour: int | None = None, restores: int = 3
) -> list[SimOptions]:
    """The enumerated adversary (Twins, Bano et al. 2020). For each Byzantine behaviour
    (twin instances of each of f keys, f equivocating leaders, a team of f forking
    leaders, each time at f consecutive places of the round-robin leader order), every
    place in that order times every partition schedule of `TWINS_PHASES` phases (each
    phase a two-way split of the node instances); and, beside twins and equivocation, a
    victim restored from a backup (taken on entering the view, or one or two views
    before) up to `restores` times each just after it proposed, voted in a Byzantine
    member's view, or timed out, with what it signed still in flight. With
    `per_behaviour`, that many scenarios of each behaviour, evenly spaced through its
    enumeration, so that no behaviour outweighs the others by the number of its
    instances. Each scenario is a plain `SimOptions`: a failure prints what reproduces it.
    """
    f = (n - 1) // 3
    out = []
    for behaviour in TWINS_BEHAVIOURS:
        instances = n + f if behaviour == "twins" else n
        splits = twins_splits(instances)
        total = n * len(splits) ** TWINS_PHASES  # (place, schedule) pairs, by index
        step = max(1, total // per_behaviour) if per_behaviour else 1
        for case in range(0, total, step)[:per_behaviour]:
            place, k = case % n, case // n
            schedule = tuple(
                splits[(k // len(splits) ** phase) % len(splits)] for phase in range(TWINS_PHASES)
            )
            out.append(
                SimOptions(
                    seed=k,
                    n=n,
                    byzantine=(behaviour,) * f,
                    byzantine_members=tuple((place + j) % n for j in range(f)),
                    partition_schedule=schedule,
                    schedule_phase_ticks=TWINS_PHASE_TICKS,
                    ticks=(TWINS_PHASES + 2) * TWINS_PHASE_TICKS,
                    delay_ticks_max=2,
                    victim_delay_ticks=60 if behaviour == "fork_leader" else 0,
                    # The forking leader's victim is the restore drill's too: one at a time.
                    restores_when_leading=0 if behaviour == "fork_leader" else restores,
                    restores_when_voting=0 if behaviour == "fork_leader" else restores,
                    restores_when_timing_out=0 if behaviour == "fork_leader" else restores,
                    restore_backup_views=case % 3,
                )
            )
    return out
