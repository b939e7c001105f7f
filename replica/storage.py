"""Durable storage of one replica (aiosqlite): safety record, blocks, committed log, proofs.

This is the shell's half of the contract in replica/actions.py. `ReplicaStore.apply` takes
the actions of one core call and makes their durable part — `PersistSafety`, `StoreBlock`,
`Commit` — durable in ONE SQLite transaction, committed with an fsync before it returns.
What it returns is the durable safety epoch, which the caller hands to
`quorumgate.replica.actions.check_send_allowed` before letting any `Send` of that call
leave. So a vote or timeout never leaves before the safety state it was signed from is on
disk (docs/consensus/protocol.md, "The core and its shell"), and a restarted replica
reloads that state and never signs twice in a view.

The in-memory model of exactly this storage is `quorumgate.replica.sim.Disk`; the tests replay a
simulated node's actions into both and compare them.

Tables (schema version `SCHEMA_VERSION`):

- `meta`: the schema version, the chain id the file belongs to (another chain's file is
  refused at `open`) and the vote statement its certificates were signed over (a store of
  another is refused too: `certificates_verifiable`); once pruned (`prune_below`,
  docs/pruning.md), `keep_from_height`: no committed block or proof below it is here, and
  a read below it raises `PrunedError` (a catch-up answer carries it as `history_from`).
- `safety`: one row, the latest `SafetyState` (replica/wire.py's `encode_safety`) and its
  epoch. A trigger refuses any update that does not raise the epoch.
- `signed_votes(view, block_hash)` and `signed_timeouts(view, high_qc_view)`: append-only
  audit tables (triggers refuse UPDATE and DELETE) of every statement this replica's
  safety state recorded as signed. A second, different vote for a recorded view is our own
  broken invariant — we would be equivocating — so `apply` raises `AssertionError` and the
  transaction rolls back. They survive `wipe_blocks`: a wiped replica never forgets what
  it signed.
- `blocks(hash, height, view, data)`: blocks above the committed height (pending). Blocks
  at or below it that did not commit (forks) are deleted when the committed height passes
  them, as `Disk` drops them.
- `committed(height, hash, data)`: the committed log, height 0 (genesis) upwards, with the
  block data kept.
- `proofs(height, data)`: the commit proof (quorumgate.replica.types.CommitProof) of the last
  block of each `Commit`, keyed by that block's height. The commit that ends an epoch at
  its change block has none: the QC that committed it certifies a later block, kept in
  `epochs` instead.
- `epochs(epoch, boundary_height, keys, ended)` (schema 2): one row per epoch after 0,
  written in the same transaction as the commit of the change block that started it: its
  members' consensus keys and how the epoch before ended (the change block, its suffix
  and the QC of the suffix's last block), which is what a member still in that epoch is
  handed as proof (docs/consensus/epochs.md, "The live replica").
- `epoch_votes(epoch, view, block_hash)` and `epoch_timeouts(epoch, view, high_qc_view)`
  (schema 2): the audit tables of the epochs after 0, append-only like those of epoch 0
  (a view may be used in two epochs, so the epoch is part of the key).

A store of schema 1 gets the three empty tables of schema 2 when it is opened.

Durability settings, set on every connection:

- `journal_mode=WAL`: a commit appends its pages to the write-ahead log, one sequential
  write and one fsync, instead of rewriting the database in place behind a rollback journal.
- `synchronous=FULL`: in WAL mode SQLite then fsyncs the log at *every* commit. Under
  NORMAL, the usual choice with WAL, a commit is only synced at the next checkpoint, so it
  survives a process crash but not a power loss or kernel panic: a vote could leave, the
  machine lose power, and the replica reboot without the safety record of that vote —
  free to vote again in the same view. FULL is what makes "durable before send" true.
  Every transaction runs under FULL, those with only blocks and commits too: a `Commit`
  is reported (to the sidecar, to clients following the chain) only once it is durable,
  as replica/actions.py promises (under NORMAL, a power cut could lose a commit already
  reported).
- `fullfsync` and `checkpoint_fullfsync`: on macOS, where plain fsync does not flush the
  drive's cache; no effect elsewhere.
- `foreign_keys=ON`: proofs must name a committed height.
- `locking_mode=EXCLUSIVE`: the connection takes the file's lock at its first read and
  keeps it until closed, so a second process pointed at the same store (a replica started
  twice, a misconfigured twin) is refused at `open` instead of both signing from one
  safety record. The cost: no `-shm` file, and no other tool can read the file while the
  replica runs (stop it, or ask it through `signed_votes`).

Bytes on disk come from replica/wire.py (the one codec); block hashes are recomputed when
a block is decoded and must match the stored key, so a damaged row is reported as
`StorageError`, never served. Every read of a range is bounded (`RANGE_BLOCKS_MAX`,
`PENDING_BLOCKS_LOAD_MAX`).

One connection per store, and one asyncio lock around every use of it: a transaction may
span several awaits (opening, wiping), and a read interleaved on the same connection would
otherwise see (and could serve to a peer) rows that are not yet durable. `apply`, which
every block takes, runs its whole transaction in one trip to the connection's thread
(runtime/dbthread.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiosqlite

from quorumgate.proto import domains
from quorumgate.proto.canonical import TAG_VOTE
from quorumgate.proto.membership import PUBLIC_KEY_BYTES, Member, Membership
from quorumgate.replica.actions import Action, Commit, PersistSafety, StoreBlock
from quorumgate.replica.config import Limits
from quorumgate.replica.core import Core, Recovered
from quorumgate.replica.epochs import EpochEnd
from quorumgate.replica.pruning import PrunedError
from quorumgate.replica.safety import SafetyState
from quorumgate.replica.sync import (
    SYNC_PROOF_REACH_BLOCKS_MAX,
    assemble_sync_response,
    blocks_within,
    proof_height,
    sync_window,
)
from quorumgate.replica.types import (
    Block,
    CommitProof,
    QuorumCert,
    RemoteError,
    SyncRequest,
    SyncResponse,
    genesis_block,
)
from quorumgate.replica.wire import (
    decode_block,
    decode_epoch_end,
    decode_proof,
    decode_safety,
    encode_block,
    encode_epoch_end,
    encode_proof,
    encode_safety,
)
from quorumgate.runtime.dbthread import on_thread, transaction

SCHEMA_VERSION = 2
SCHEMA_VERSIONS_MIGRATED = ("1",)  # opened, then given the tables added since
# What the votes in this store's certificates signed (meta row `vote_statement`, written
# when the file is created). A store without the row was written before votes signed
# their block's height (`qg/vote/v1`): its certificates can be verified by no member of
# this build, so it is refused at open rather than served (docs/consensus/messages.md).
VOTE_STATEMENT = TAG_VOTE.decode()
VOTE_STATEMENT_BEFORE_THE_ROW = domains.VOTE_V1.decode()
# The most committed blocks one `committed_range` call returns; callers page for more.
RANGE_BLOCKS_MAX = 1024
# The newest committed blocks, kept in memory as they commit: the sidecar's stream and
# other followers read what was just committed without a SQLite round trip.
RECENT_COMMITTED_MAX = 256
SYNC_READ_PAGE_BLOCKS = 16  # catch-up answers read the committed log this many at a time
# The most pending blocks `load` hands back (lowest heights first). A core's block tree
# holds `Limits.pending_blocks_max` (1024 by default); more could not be used.
PENDING_BLOCKS_LOAD_MAX = 4096
# `load` reads at most this many committed blocks back from the head for the last one
# with transactions (quiescence needs it; replica/core.py `Recovered.payload_height`).
PAYLOAD_SCAN_BLOCKS_MAX = 1024

# What schema 2 added: a store of schema 1 gets it when opened.
_SCHEMA_2 = (
    """
    CREATE TABLE epoch_votes (
        epoch INTEGER NOT NULL,
        view INTEGER NOT NULL,
        block_hash BLOB NOT NULL,
        PRIMARY KEY (epoch, view)
    )
    """,
    """
    CREATE TRIGGER epoch_votes_no_change BEFORE UPDATE ON epoch_votes
    BEGIN
        SELECT RAISE(ABORT, 'epoch_votes is append-only');
    END
    """,
    """
    CREATE TRIGGER epoch_votes_no_delete BEFORE DELETE ON epoch_votes
    BEGIN
        SELECT RAISE(ABORT, 'epoch_votes is append-only');
    END
    """,
    """
    CREATE TABLE epoch_timeouts (
        epoch INTEGER NOT NULL,
        view INTEGER NOT NULL,
        high_qc_view INTEGER NOT NULL,
        PRIMARY KEY (epoch, view)
    )
    """,
    """
    CREATE TRIGGER epoch_timeouts_no_change BEFORE UPDATE ON epoch_timeouts
    BEGIN
        SELECT RAISE(ABORT, 'epoch_timeouts is append-only');
    END
    """,
    """
    CREATE TRIGGER epoch_timeouts_no_delete BEFORE DELETE ON epoch_timeouts
    BEGIN
        SELECT RAISE(ABORT, 'epoch_timeouts is append-only');
    END
    """,
    """
    CREATE TABLE epochs (
        epoch INTEGER PRIMARY KEY CHECK (epoch >= 1),
        boundary_height INTEGER NOT NULL REFERENCES committed (height),
        keys BLOB NOT NULL,
        ended BLOB NOT NULL
    )
    """,
)

# One statement per string, run in order inside the transaction that creates the file.
_SCHEMA = (
    """
    CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )
    """,
    """
    CREATE TABLE safety (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        epoch INTEGER NOT NULL,
        data BLOB NOT NULL
    )
    """,
    """
    CREATE TRIGGER safety_epoch_grows BEFORE UPDATE ON safety
        WHEN NEW.epoch <= OLD.epoch
    BEGIN
        SELECT RAISE(ABORT, 'safety epoch must grow');
    END
    """,
    """
    CREATE TABLE signed_votes (
        view INTEGER PRIMARY KEY,
        block_hash BLOB NOT NULL
    )
    """,
    """
    CREATE TRIGGER signed_votes_no_update BEFORE UPDATE ON signed_votes
    BEGIN
        SELECT RAISE(ABORT, 'signed_votes is append-only');
    END
    """,
    """
    CREATE TRIGGER signed_votes_no_delete BEFORE DELETE ON signed_votes
    BEGIN
        SELECT RAISE(ABORT, 'signed_votes is append-only');
    END
    """,
    """
    CREATE TABLE signed_timeouts (
        view INTEGER PRIMARY KEY,
        high_qc_view INTEGER NOT NULL
    )
    """,
    """
    CREATE TRIGGER signed_timeouts_no_update BEFORE UPDATE ON signed_timeouts
    BEGIN
        SELECT RAISE(ABORT, 'signed_timeouts is append-only');
    END
    """,
    """
    CREATE TRIGGER signed_timeouts_no_delete BEFORE DELETE ON signed_timeouts
    BEGIN
        SELECT RAISE(ABORT, 'signed_timeouts is append-only');
    END
    """,
    """
    CREATE TABLE blocks (
        hash BLOB PRIMARY KEY,
        height INTEGER NOT NULL,
        view INTEGER NOT NULL,
        data BLOB NOT NULL
    )
    """,
    """
    CREATE INDEX blocks_by_height ON blocks (height)
    """,
    """
    CREATE TABLE committed (
        height INTEGER PRIMARY KEY,
        hash BLOB NOT NULL UNIQUE,
        data BLOB NOT NULL
    )
    """,
    """
    CREATE TABLE proofs (
        height INTEGER PRIMARY KEY REFERENCES committed (height),
        data BLOB NOT NULL
    )
    """,
    *_SCHEMA_2,
)


def _epoch_row(stored: StoredEpoch) -> tuple[int, int, bytes, bytes]:
    ended = encode_epoch_end(stored.boundary, stored.suffix, stored.qc)
    return (stored.epoch, stored.boundary.height, b"".join(stored.keys), ended)


def certificates_verifiable(vote_statement: str) -> bool:
    """Certificates made of votes over `vote_statement` can be checked by this build (and
    by its peers): the statement is the one `vote_bytes` signs, tag for tag."""
    return vote_statement == VOTE_STATEMENT


@dataclass
class _Batch:
    """One apply's actions, sorted by what they write, each checked against the core's own
    invariants on the way (a safety epoch that grows, one vote per view, one chain)."""

    epoch: int
    safety: SafetyState | None = None
    votes: dict[int, bytes] = field(default_factory=dict)  # view -> block voted for
    timeouts: dict[int, int] = field(default_factory=dict)  # view -> its high QC's view
    stored: dict[bytes, Block] = field(default_factory=dict)
    commits: list[Commit] = field(default_factory=list)


def _sort_actions(actions: Sequence[Action], epoch: int, chain_id: str) -> _Batch:
    batch = _Batch(epoch)
    for action in actions:
        if isinstance(action, PersistSafety):
            state = action.state
            if state.epoch <= batch.epoch:
                raise AssertionError(
                    f"safety epoch must grow: {state.epoch} after {batch.epoch} "
                    "(a stale safety state would be made durable)"
                )
            batch.epoch, batch.safety = state.epoch, state
            vote = state.last_vote
            if vote is not None:
                prior = batch.votes.setdefault(vote.view, vote.block_hash)
                if prior != vote.block_hash:
                    raise AssertionError(
                        f"equivocation: two different votes for view {vote.view} in one batch"
                    )
            timeout = state.last_timeout
            if timeout is not None:
                batch.timeouts.setdefault(timeout.view, timeout.high_qc.view)
        elif isinstance(action, StoreBlock):
            block = action.block
            if block.chain_id != chain_id:
                raise AssertionError(f"storing a block of chain {block.chain_id!r}")
            batch.stored[block.hash] = block
        elif isinstance(action, Commit):
            batch.commits.append(action)
    return batch


@dataclass(frozen=True, slots=True)
class StoredEpoch:
    """An epoch after 0 as the store holds it: its members' keys and how the epoch before
    it ended (docs/consensus/epochs.md, "The live replica")."""

    epoch: int
    keys: tuple[bytes, ...]
    boundary: Block
    suffix: tuple[Block, ...]
    qc: QuorumCert

    def membership(self, genesis: Membership) -> Membership:
        """This epoch's member set: this epoch's keys, one member per key in index order
        (a live `add` appends indexes, a live `remove` takes the highest: no member is
        renumbered), each at the genesis set's address where it has one."""
        members = tuple(
            Member(i, key, genesis.members[i].address if i < genesis.n else "")
            for i, key in enumerate(self.keys)
        )
        return replace(genesis, members=members, epoch=self.epoch)

    def end(self, genesis: Membership) -> EpochEnd:
        """How the epoch before this one ended, as that epoch's core reported it."""
        return EpochEnd(self.boundary, self.membership(genesis), self.suffix, self.qc)


def decode_epoch_row(
    path: Path | str, chain_id: str, epoch: int, keys: bytes, ended: bytes
) -> StoredEpoch:
    """One row of `epochs`, decoded (a damaged one raises `StorageError` naming `path`,
    where it was read: the file, or the replica that served it)."""
    if not keys or len(keys) % PUBLIC_KEY_BYTES:
        raise StorageError(f"{path}: the keys of epoch {epoch} are damaged")
    try:
        boundary, suffix, qc = decode_epoch_end(chain_id, ended)
    except (RemoteError, ValueError) as err:
        raise StorageError(f"{path}: undecodable end of epoch {epoch - 1}") from err
    split = tuple(keys[i : i + PUBLIC_KEY_BYTES] for i in range(0, len(keys), PUBLIC_KEY_BYTES))
    return StoredEpoch(epoch, split, boundary, suffix, qc)


def _committed_rows(
    head: Block, commits: Sequence[Commit], boundary: bytes = b""
) -> tuple[Block, list[tuple[int, bytes, bytes]], list[tuple[int, bytes]]]:
    """The new committed head, and the `committed` and `proofs` rows of `commits`, each of
    which must extend the committed chain and end at the height its proof proves; the
    commit that ends at the change block `boundary` (if any) has no proof row (its QC
    certifies a block of the suffix: `epochs` keeps it)."""
    committed_rows: list[tuple[int, bytes, bytes]] = []
    proof_rows: list[tuple[int, bytes]] = []
    for commit in commits:
        if not commit.blocks:
            raise AssertionError("a commit without blocks")
        for block in commit.blocks:
            if block.height != head.height + 1 or block.parent_hash != head.hash:
                raise AssertionError(
                    f"commit of height {block.height} ({block.hash[:4].hex()}) does "
                    f"not extend the committed head at height {head.height} "
                    f"({head.hash[:4].hex()})"
                )
            committed_rows.append((block.height, block.hash, encode_block(block)))
            head = block
        if head.hash == boundary:
            continue
        if proof_height(commit.proof) != head.height:
            raise AssertionError(
                f"commit proof is for height {proof_height(commit.proof)}, "
                f"the commit ends at {head.height}"
            )
        if commit.proof.b1.parent_hash != head.hash:
            raise AssertionError(
                f"commit proof does not extend the committed block at {head.height}"
            )
        proof_rows.append((head.height, encode_proof(commit.proof)))
    return head, committed_rows, proof_rows


@dataclass(frozen=True)
class _Rows:
    """What one apply writes, in one transaction on the connection's thread."""

    safety: tuple[int, bytes] | None
    votes: dict[int, bytes]
    timeouts: dict[int, int]
    fresh: list[tuple[bytes, int, int, bytes]]  # uncommitted blocks above the head
    committed: list[tuple[int, bytes, bytes]]
    proofs: list[tuple[int, bytes]]
    committed_height: int
    epoch: tuple[int, int, bytes, bytes] | None = None  # an `epochs` row
    consensus_epoch: int = 0  # the epoch the votes and timeouts were signed in

    def write(self, c: sqlite3.Connection) -> None:
        if self.safety is not None:
            c.execute(
                "INSERT INTO safety (id, epoch, data) VALUES (1, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET epoch = excluded.epoch, "
                "data = excluded.data",
                self.safety,
            )
        if self.votes:
            ReplicaStore._record_votes(c, self.votes, self.consensus_epoch)
        if self.timeouts and self.consensus_epoch == 0:
            # First sighting only: a timeout re-sent for the same view is the same
            # statement (replica/safety.py returns the recorded one).
            c.executemany(
                "INSERT INTO signed_timeouts (view, high_qc_view) VALUES (?, ?) "
                "ON CONFLICT (view) DO NOTHING",
                list(self.timeouts.items()),
            )
        elif self.timeouts:
            c.executemany(
                "INSERT INTO epoch_timeouts (epoch, view, high_qc_view) VALUES (?, ?, ?) "
                "ON CONFLICT (epoch, view) DO NOTHING",
                [(self.consensus_epoch, v, h) for v, h in self.timeouts.items()],
            )
        # A block at or below the committed height can never be used again.
        if self.fresh:
            c.executemany(
                "INSERT INTO blocks (hash, height, view, data) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (hash) DO NOTHING",
                self.fresh,
            )
        if self.committed:
            c.executemany(
                "INSERT INTO committed (height, hash, data) VALUES (?, ?, ?)", self.committed
            )
            c.executemany("INSERT INTO proofs (height, data) VALUES (?, ?)", self.proofs)
            # The committed blocks moved to `committed`; the rest at those heights
            # are forks that can never commit.
            c.execute("DELETE FROM blocks WHERE height <= ?", (self.committed_height,))
        if self.epoch is not None:
            c.execute(
                "INSERT INTO epochs (epoch, boundary_height, keys, ended) VALUES (?, ?, ?, ?)",
                self.epoch,
            )
            # The old epoch's pending blocks are never committed (its suffix included).
            c.execute("DELETE FROM blocks")


class StorageError(Exception):
    """The database file cannot serve as this replica's store: unreadable, corrupt, from
    another chain or another schema version. Raised instead of guessing."""


class ReplicaStore:
    """One replica's durable state in one SQLite file. Build it with `ReplicaStore.open`."""

    def __init__(self, conn: Any, path: Path, chain_id: str) -> None:
        self._conn = conn
        self._path = path
        self._chain_id = chain_id
        self._lock = asyncio.Lock()
        self._durable_epoch = 0
        self._head = genesis_block(chain_id)
        self._recent: OrderedDict[int, Block] = OrderedDict()
        self._epochs: dict[int, StoredEpoch] = {}  # every epoch after 0 (a handful)
        self._closed = False
        # The lowest committed height above genesis still held: 1 until the log is pruned
        # below a snapshot (meta row `keep_from_height`; docs/pruning.md).
        self._history_from = 1

    # ================================================================== open / close

    @classmethod
    async def open(cls, path: Path, chain_id: str) -> ReplicaStore:
        """Open (creating if needed) the store at `path` for chain `chain_id`."""
        if not chain_id:
            raise ValueError("chain id must not be empty")
        try:
            # Autocommit mode: `apply` writes its own BEGIN IMMEDIATE ... COMMIT. No busy
            # wait: the lock is held for the store's lifetime, so waiting gains nothing.
            conn = await aiosqlite.connect(path, isolation_level=None, timeout=0)
        except sqlite3.Error as err:
            raise StorageError(f"{path}: cannot open the replica store: {err}") from err
        store = cls(conn, path, chain_id)
        try:
            await store._initialise()
        except sqlite3.OperationalError as err:
            await conn.close()
            if "locked" in str(err):
                raise StorageError(f"{path}: in use by another process ({err})") from err
            raise StorageError(f"{path}: not a readable replica store: {err}") from err
        except sqlite3.DatabaseError as err:
            await conn.close()
            raise StorageError(f"{path}: not a readable replica store: {err}") from err
        except BaseException:
            await conn.close()
            raise
        return store

    async def _initialise(self) -> None:
        conn = self._conn
        await conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        # Before any table exists, so a new store gives back the pages pruning frees
        # (docs/pruning.md); on an existing file it changes nothing until a VACUUM.
        await conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        # The first statement to read the file: it fails here for a file that is not SQLite
        # and for a store another process holds.
        mode = await self._scalar("PRAGMA journal_mode=WAL")
        if str(mode).lower() != "wal":
            raise StorageError(f"{self._path}: cannot use WAL journaling (got {mode!r})")
        await conn.execute("PRAGMA synchronous=FULL")
        await conn.execute("PRAGMA fullfsync=ON")
        await conn.execute("PRAGMA checkpoint_fullfsync=ON")
        await conn.execute("PRAGMA foreign_keys=ON")
        if await self._scalar("PRAGMA synchronous") != 2:  # 2 = FULL
            raise StorageError(f"{self._path}: SQLite refused synchronous=FULL")

        tables = {
            str(row[0])
            for row in await conn.execute_fetchall(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
            )
        }
        if not tables:
            await self._create_schema()
        elif "meta" not in tables:
            raise StorageError(f"{self._path}: an SQLite file, but not a replica store")
        meta = {
            str(key): str(value)
            for key, value in await conn.execute_fetchall("SELECT key, value FROM meta")
        }
        version = meta.get("schema_version")
        if version in SCHEMA_VERSIONS_MIGRATED:
            await self._migrate()
            version = str(SCHEMA_VERSION)
        if version != str(SCHEMA_VERSION):
            raise StorageError(
                f"{self._path}: schema version {version!r}, this build reads {SCHEMA_VERSION}"
            )
        signed = meta.get("vote_statement", VOTE_STATEMENT_BEFORE_THE_ROW)
        if not certificates_verifiable(signed):
            raise StorageError(
                f"{self._path}: its certificates are made of {signed} votes, and this build "
                f"verifies {VOTE_STATEMENT} (a vote signs its block's height too): no member "
                "of this build can check them. A chain changes vote statement with all its "
                "members at once, on new data directories (docs/consensus/messages.md)"
            )
        stored_chain = meta.get("chain_id")
        if stored_chain != self._chain_id:
            raise StorageError(
                f"{self._path}: the store belongs to chain {stored_chain!r}, not {self._chain_id!r}"
            )
        genesis = await self._read_committed_block(0)
        if genesis is None or genesis.hash != genesis_block(self._chain_id).hash:
            raise StorageError(f"{self._path}: the stored genesis block is missing or wrong")
        epoch = await self._scalar("SELECT epoch FROM safety WHERE id = 1")
        self._durable_epoch = int(epoch) if epoch is not None else 0
        self._head = await self._read_head()
        kept = meta.get("keep_from_height")
        self._history_from = int(kept) if kept is not None and kept.isdigit() else 1
        for row in await conn.execute_fetchall(
            "SELECT epoch, keys, ended FROM epochs ORDER BY epoch"
        ):
            stored = self._decode_epoch(int(row[0]), bytes(row[1]), bytes(row[2]))
            self._epochs[stored.epoch] = stored

    async def _migrate(self) -> None:
        """A store of an earlier schema: add what schema `SCHEMA_VERSION` added, in one
        transaction (its rows stay as they are)."""
        conn = self._conn
        await conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA_2:
                await conn.execute(statement)
            await conn.execute(
                "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),)
            )
            await conn.execute("COMMIT")
        except BaseException:
            await self._rollback()
            raise

    async def _create_schema(self) -> None:
        conn = self._conn
        genesis = genesis_block(self._chain_id)
        await conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA:
                await conn.execute(statement)
            await conn.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?)",
                [
                    ("schema_version", str(SCHEMA_VERSION)),
                    ("chain_id", self._chain_id),
                    ("vote_statement", VOTE_STATEMENT),
                ],
            )
            await conn.execute(
                "INSERT INTO committed (height, hash, data) VALUES (0, ?, ?)",
                (genesis.hash, encode_block(genesis)),
            )
            await conn.execute("COMMIT")
        except BaseException:
            await self._rollback()
            raise

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        async with self._lock:
            await self._conn.close()

    # ================================================================== state in memory

    @property
    def durable_epoch(self) -> int:
        """The epoch of the safety record on disk: every signature from a safety state of
        this epoch or lower may be sent."""
        return self._durable_epoch

    @property
    def committed_height(self) -> int:
        return self._head.height

    @property
    def committed_head(self) -> Block:
        """The highest durable committed block (what `Status` names, height and hash)."""
        return self._head

    @property
    def epoch(self) -> StoredEpoch | None:
        """The newest epoch this store started (None: still epoch 0)."""
        return self._epochs[max(self._epochs)] if self._epochs else None

    def _consensus_epoch(self) -> int:
        return max(self._epochs, default=0)

    def started(self, epoch: int) -> StoredEpoch | None:
        """Epoch `epoch` as stored, if this store started it (0 never is)."""
        return self._epochs.get(epoch)

    @property
    def epoch_ends(self) -> tuple[StoredEpoch, ...]:
        """Every epoch this store started, oldest first (`quorumgate replay` proves the
        chain of epochs with them: docs/drills.md, "Replay across epochs")."""
        return tuple(self._epochs[epoch] for epoch in sorted(self._epochs))

    @property
    def chain_id(self) -> str:
        return self._chain_id

    @property
    def history_from(self) -> int:
        """The lowest committed height above genesis this store holds (1 unless pruned)."""
        return self._history_from

    # ================================================================== recovery

    async def load(self) -> Recovered:
        """What a restarting replica builds its core from: the safety state (the initial
        one if none was ever persisted), the committed head, and the pending blocks."""
        async with self._lock:
            data = await self._scalar("SELECT data FROM safety WHERE id = 1")
            safety = (
                self._decode_safety(bytes(data))
                if data is not None
                else SafetyState.initial(self._chain_id)
            )
            head = await self._read_head()
            rows = await self._conn.execute_fetchall(
                "SELECT hash, data FROM blocks WHERE height > ? ORDER BY height, hash LIMIT ?",
                (head.height, PENDING_BLOCKS_LOAD_MAX),
            )
            pending = tuple(self._decode_block(bytes(h), bytes(d)) for h, d in rows)
            payload_height = await self._payload_height(head)
        latest = self.epoch
        return Recovered(
            safety=safety,
            committed=head,
            pending=pending,
            payload_height=payload_height,
            boundary=None if latest is None else latest.boundary,
        )

    async def _payload_height(self, head: Block) -> int | None:
        """The highest committed height with transactions above the head's state-root
        height, or that height if none above it has any (the same for quiescence); None
        if `PAYLOAD_SCAN_BLOCKS_MAX` blocks back from the head hold none."""
        floor = max(
            head.state_root_height, head.height - PAYLOAD_SCAN_BLOCKS_MAX, self._history_from - 1
        )
        end = head.height
        while end > floor:
            start = max(floor + 1, end - SYNC_READ_PAGE_BLOCKS + 1)
            for block in reversed(await self._read_range(start, end)):
                if block.payload:
                    return block.height
            end = start - 1
        return head.state_root_height if floor == head.state_root_height else None

    # ================================================================== applying actions

    async def apply(self, actions: Sequence[Action], ended: EpochEnd | None = None) -> int:
        """Make the durable part of one core call's actions durable, in one transaction
        committed (fsync) before this returns; return the durable safety epoch.

        `ended`: the actions commit the change block of the current epoch, which ended
        there; the next epoch (its members' keys, how this one ended) is written in the
        same transaction, and the pending blocks are dropped. The actions must then also
        carry the next epoch's first safety state (replica/epochs.py `epoch_safety_state`).

        `Send` and `ScheduleTimeout` are the caller's business and ignored here. Raises
        `AssertionError` (and rolls everything back) if the actions would break one of our
        own invariants: a second vote in a recorded view, a safety epoch going backwards, a
        commit that does not extend the committed chain.
        """
        if not any(isinstance(a, PersistSafety | StoreBlock | Commit) for a in actions):
            return self._durable_epoch
        # Shielded: if the caller is cancelled mid-transaction the transaction still ends
        # (committed or rolled back) and the in-memory epoch and head still match the disk.
        return await asyncio.shield(self._apply_locked(tuple(actions), ended))

    async def _apply_locked(self, actions: tuple[Action, ...], ended: EpochEnd | None) -> int:
        async with self._lock:
            self._check_open()
            batch = _sort_actions(actions, self._durable_epoch, self._chain_id)
            boundary = ended.boundary.hash if ended is not None else b""
            head, committed_rows, proof_rows = _committed_rows(self._head, batch.commits, boundary)
            stored = None
            if ended is not None:
                if head.hash != boundary or batch.safety is None:
                    raise AssertionError("an epoch ends with its change block's commit")
                stored = StoredEpoch(
                    ended.membership.epoch,
                    tuple(m.public_key for m in ended.membership.members),
                    ended.boundary,
                    ended.suffix,
                    ended.qc,
                )
            fresh = [b for b in batch.stored.values() if b.height > self._head.height]
            safety = batch.safety
            rows = _Rows(
                safety=None if safety is None else (safety.epoch, encode_safety(safety)),
                votes=batch.votes,
                timeouts=batch.timeouts,
                fresh=[(b.hash, b.height, b.view, encode_block(b)) for b in fresh],
                committed=committed_rows,
                proofs=proof_rows,
                committed_height=head.height,
                epoch=None if stored is None else _epoch_row(stored),
                consensus_epoch=self._consensus_epoch(),
            )
            # synchronous=FULL (set at open, never changed): this transaction is fsynced
            # before apply returns, whether it carries a safety record or only commits.
            # One trip to the connection's thread for all of it (runtime/dbthread.py).
            await transaction(self._conn, rows.write, "BEGIN IMMEDIATE")
            self._durable_epoch = batch.epoch
            self._head = head
            if stored is not None:
                self._epochs[stored.epoch] = stored
            for commit in batch.commits:  # durable now: served from memory from here on
                for block in commit.blocks:
                    self._recent[block.height] = block
            while len(self._recent) > RECENT_COMMITTED_MAX:
                self._recent.popitem(last=False)
            return batch.epoch

    @staticmethod
    def _record_votes(c: sqlite3.Connection, votes: dict[int, bytes], epoch: int = 0) -> None:
        """(On the connection's thread, inside `apply`'s transaction.) Votes of epoch 0 go
        to `signed_votes`, those of a later epoch to `epoch_votes`: a view may be used in
        two epochs (docs/consensus/epochs.md, "How the next epoch starts")."""
        views = sorted(votes)
        marks = ",".join("?" * len(views))
        if epoch == 0:
            sql = f"SELECT view, block_hash FROM signed_votes WHERE view IN ({marks})"
            rows = c.execute(sql, views).fetchall()
        else:
            sql = f"SELECT view, block_hash FROM epoch_votes WHERE epoch = ? AND view IN ({marks})"
            rows = c.execute(sql, [epoch, *views]).fetchall()
        known = {int(view): bytes(block_hash) for view, block_hash in rows}
        for view, block_hash in known.items():
            if block_hash != votes[view]:
                # Not `assert`: this must hold under `python -O` too.
                raise AssertionError(
                    f"equivocation: already signed a vote for {block_hash[:4].hex()} in view "
                    f"{view}, now asked to record {votes[view][:4].hex()}"
                )
        new = [(view, votes[view]) for view in views if view not in known]
        if new and epoch == 0:
            c.executemany("INSERT INTO signed_votes (view, block_hash) VALUES (?, ?)", new)
        elif new:
            c.executemany(
                "INSERT INTO epoch_votes (epoch, view, block_hash) VALUES (?, ?, ?)",
                [(epoch, view, block_hash) for view, block_hash in new],
            )

    # ================================================================== the committed log

    async def committed_range(self, start: int, end: int) -> list[Block]:
        """Committed blocks with heights start..end inclusive, in height order, at most
        `RANGE_BLOCKS_MAX` of them (from `start`); page for more."""
        start = max(start, 0)
        if 0 < start < self._history_from:
            raise PrunedError(start, self._history_from)
        end = min(end, start + RANGE_BLOCKS_MAX - 1, self._head.height)
        recent = self._recent
        if start <= end and start in recent and end in recent:
            return [recent[h] for h in range(start, end + 1)]  # committed, hence contiguous
        async with self._lock:
            return await self._read_range(start, end)

    async def committed_block(self, height: int) -> Block | None:
        async with self._lock:
            return await self._read_committed_block(height)

    async def proof_at_or_before(self, height: int, floor: int) -> CommitProof | None:
        """The proof with the largest committed height in [floor, height], if any."""
        async with self._lock:
            return await self._read_proof(
                "SELECT height, data FROM proofs WHERE height <= ? AND height >= ? "
                "ORDER BY height DESC LIMIT 1",
                height,
                floor,
            )

    async def proof_at_or_after(self, height: int, limit: int) -> CommitProof | None:
        """The proof with the smallest committed height in [height, limit], if any."""
        async with self._lock:
            return await self._read_proof(
                "SELECT height, data FROM proofs WHERE height >= ? AND height <= ? "
                "ORDER BY height LIMIT 1",
                height,
                limit,
            )

    async def sync_response(
        self, request: SyncRequest, core: Core | None, limits: Limits
    ) -> SyncResponse:
        """Answer a catch-up request from disk, as
        `quorumgate.replica.sync.build_sync_response` does for a synchronous store: the same
        window, the same proof choice, the same reply.

        All reads happen under one hold of the lock, so the reply is one consistent view.
        """
        async with self._lock:
            top = self._head.height
            kept = self._history_from if self._history_from > 1 else 0
            window = sync_window(request, top, limits)
            committed: list[Block] = []
            proof: CommitProof | None = None
            if window is not None and window.start < self._history_from:
                # Pruned below (docs/pruning.md): no blocks, and `history_from` says why.
                return assemble_sync_response(request, (), None, top, None, limits, kept)
            if window is not None:
                proof = await self._read_proof(
                    "SELECT height, data FROM proofs WHERE height <= ? AND height >= ? "
                    "ORDER BY height DESC LIMIT 1",
                    window.want_end,
                    window.start,
                )
                if proof is None:
                    proof = await self._read_proof(
                        "SELECT height, data FROM proofs WHERE height >= ? AND height <= ? "
                        "ORDER BY height LIMIT 1",
                        window.want_end,
                        window.reach_end,
                    )
                if proof is not None:
                    end = proof_height(proof)
                    # Bounded by the window: sync_blocks_max plus the proof reach.
                    assert end - window.start < limits.sync_blocks_max + (
                        SYNC_PROOF_REACH_BLOCKS_MAX
                    ), "sync window wider than its limits"
                    committed = await self._read_range_within(
                        window.start, end, limits.sync_bytes_max
                    )
                    # as build_sync_response: end at the last proof within the byte budget
                    fit = blocks_within(committed, limits.sync_bytes_max)
                    if fit < end - window.start + 1:
                        proof = await self._read_proof(
                            "SELECT height, data FROM proofs WHERE height <= ? AND height >= ? "
                            "ORDER BY height DESC LIMIT 1",
                            window.start + fit - 1,
                            window.start,
                        )
                        keep = proof_height(proof) - window.start + 1 if proof else 0
                        committed = committed[:keep]
        return assemble_sync_response(request, committed, proof, top, core, limits, kept)

    async def prune_below(self, height: int) -> tuple[int, int, int]:
        """Drop the committed blocks and commit proofs below `height` (genesis stays), in
        one transaction, and give the freed pages back to the file system (docs/pruning.md).
        `height` comes from this node's sidecar, which pruned its own history at that
        snapshot (replica/pruning.py); the block at `height` stays, for the sidecar's
        replay to link to. Each change block stays too: its epoch row names it, and the
        end of its epoch (its suffix and QC, in that row) is what a peer checks the chain
        of epochs with (docs/pruning.md, "Past an epoch boundary"). Returns (blocks
        dropped, file bytes before, after); nothing happens for a height at or below the
        current start, or above the committed head."""
        async with self._lock:
            self._check_open()
            if height <= self._history_from or height > self._head.height:
                return 0, 0, 0
            before = _file_bytes(self._path)

            def write(c: sqlite3.Connection) -> int:
                c.execute("DELETE FROM proofs WHERE height < ?", (height,))
                dropped = c.execute(
                    "DELETE FROM committed WHERE height > 0 AND height < ? "
                    "AND height NOT IN (SELECT boundary_height FROM epochs)",
                    (height,),
                ).rowcount
                c.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('keep_from_height', ?)",
                    (str(height),),
                )
                return int(dropped)

            dropped = await transaction(self._conn, write, "BEGIN IMMEDIATE")
            self._history_from = height
            for old in [h for h in self._recent if h < height]:
                del self._recent[old]
            await on_thread(self._conn, _give_back_pages)
            return dropped, before, _file_bytes(self._path)

    async def install_base(
        self,
        blocks: Sequence[Block],
        proof: CommitProof,
        epochs: Sequence[StoredEpoch] = (),
        safety: SafetyState | None = None,
    ) -> None:
        """Make `blocks`, a chain whose last block `proof` proves committed (checked by
        replica/base.py `check_base`), the committed log, starting where they start, as
        a store pruned below it (docs/pruning.md, "A wiped replica behind pruned peers").

        In one transaction: what the log held (all of it below the base's first height)
        goes, with every proof and pending block at or below the base's top; the safety
        record and the audit tables stay, as `wipe_blocks` keeps them. Only for a log
        whose head is below the base's parent (ordinary catch-up goes on from anything
        else). A base of a later epoch than the store's comes with `epochs`, the rows of
        every epoch from the store's next through the base's (each link checked by
        replica/base.py `ChainedBases`), and `safety`, the member's first safety state of
        the base's epoch (replica/epochs.py `epoch_safety_state`), written with it."""
        async with self._lock:
            self._check_open()
            start, top = blocks[0].height, blocks[-1].height
            if start <= self._head.height + 1:
                raise AssertionError(
                    f"a base at height {start} over a log that reaches {self._head.height}"
                )
            if proof_height(proof) != top or proof.b1.parent_hash != blocks[-1].hash:
                raise AssertionError(f"the base's proof does not prove height {top}")
            numbers = [e.epoch for e in epochs]
            first = self._consensus_epoch() + 1
            if numbers != list(range(first, first + len(numbers))):
                raise AssertionError(f"epochs {numbers} do not follow the store's {first - 1}")
            if bool(epochs) != (safety is not None) or (
                safety is not None and safety.epoch <= self._durable_epoch
            ):
                raise AssertionError("a base of a later epoch comes with its safety state")
            if epochs and epochs[-1].boundary.height >= start:
                raise AssertionError("the base lies below the start of its epoch")
            rows = [(b.height, b.hash, encode_block(b)) for b in blocks]
            epoch_rows = [_epoch_row(e) for e in epochs]
            # Each change block stays below the base, as a pruned store keeps it: its
            # epoch row names it (`prune_below`).
            boundaries = [
                (e.boundary.height, e.boundary.hash, encode_block(e.boundary)) for e in epochs
            ]

            def write(c: sqlite3.Connection) -> None:
                c.execute("DELETE FROM proofs")
                c.execute(
                    "DELETE FROM committed WHERE height > 0 "
                    "AND height NOT IN (SELECT boundary_height FROM epochs)"
                )
                c.executemany(
                    "INSERT INTO committed (height, hash, data) VALUES (?, ?, ?)", boundaries
                )
                if epochs:  # (an older epoch's pending blocks never commit)
                    c.execute("DELETE FROM blocks")
                else:
                    c.execute("DELETE FROM blocks WHERE height <= ?", (top,))
                c.executemany("INSERT INTO committed (height, hash, data) VALUES (?, ?, ?)", rows)
                proof_row = (top, encode_proof(proof))
                c.execute("INSERT INTO proofs (height, data) VALUES (?, ?)", proof_row)
                c.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('keep_from_height', ?)",
                    (str(start),),
                )
                c.executemany(
                    "INSERT INTO epochs (epoch, boundary_height, keys, ended) VALUES (?, ?, ?, ?)",
                    epoch_rows,
                )
                if safety is not None:
                    c.execute(
                        "INSERT INTO safety (id, epoch, data) VALUES (1, ?, ?) "
                        "ON CONFLICT (id) DO UPDATE SET epoch = excluded.epoch, "
                        "data = excluded.data",
                        (safety.epoch, encode_safety(safety)),
                    )

            await transaction(self._conn, write, "BEGIN IMMEDIATE")
            self._recent.clear()
            for block in blocks[-RECENT_COMMITTED_MAX:]:
                self._recent[block.height] = block
            self._head = blocks[-1]
            self._history_from = start
            for stored in epochs:
                self._epochs[stored.epoch] = stored
            if safety is not None:
                self._durable_epoch = safety.epoch

    # ================================================================== audit and operations

    async def signed_votes(self) -> dict[int, bytes]:
        """Every vote this replica recorded as signed: view -> block hash."""
        async with self._lock:
            rows = await self._conn.execute_fetchall(
                "SELECT view, block_hash FROM signed_votes ORDER BY view"
            )
        return {int(view): bytes(block_hash) for view, block_hash in rows}

    async def votes_of_every_epoch(self) -> dict[tuple[int, int], bytes]:
        """Every vote this replica recorded as signed, in every epoch it ran: (epoch, view)
        -> block hash. Views start again in each epoch (docs/consensus/epochs.md), so a
        view alone does not name a vote once the member set changed."""
        async with self._lock:
            rows = await self._conn.execute_fetchall(
                "SELECT 0, view, block_hash FROM signed_votes "
                "UNION ALL SELECT epoch, view, block_hash FROM epoch_votes ORDER BY 1, 2"
            )
        return {(int(epoch), int(view)): bytes(block_hash) for epoch, view, block_hash in rows}

    async def signed_timeouts(self) -> dict[int, int]:
        """Every timeout this replica recorded as signed: view -> its high QC's view."""
        async with self._lock:
            rows = await self._conn.execute_fetchall(
                "SELECT view, high_qc_view FROM signed_timeouts ORDER BY view"
            )
        return {int(view): int(high) for view, high in rows}

    async def wipe_blocks(self) -> None:
        """Forget every block, the committed log above genesis and every proof, in one
        transaction — but keep the safety record and the audit tables: the replica catches
        up from its peers and still never signs against what it signed before
        (docs/drills.md, `wipe-replica`).

        An operator's step, taken while no core runs on this store: a core built before the
        wipe would go on extending the committed chain the store no longer has."""
        async with self._lock:
            self._check_open()
            if self._epochs:
                # Its catch-up would start in epoch 0, whose members may hold keys no
                # longer in use (docs/consensus/epochs.md, "The live replica": limits).
                raise StorageError(f"{self._path}: a store past epoch 0 is not wiped")
            conn = self._conn
            await conn.execute("BEGIN IMMEDIATE")
            try:
                await conn.execute("DELETE FROM proofs")
                await conn.execute("DELETE FROM committed WHERE height > 0")
                await conn.execute("DELETE FROM blocks")
                await conn.execute("DELETE FROM meta WHERE key = 'keep_from_height'")
                await conn.execute("COMMIT")
            except BaseException:
                await self._rollback()
                raise
            self._recent.clear()
            self._head = genesis_block(self._chain_id)
            self._history_from = 1

    # ================================================================== internals

    def _check_open(self) -> None:
        assert not self._closed, "the replica store is closed"

    async def _rollback(self) -> None:
        if self._conn.in_transaction:
            await self._conn.execute("ROLLBACK")

    async def _scalar(self, sql: str, params: Iterable[Any] = ()) -> Any:
        rows = list(await self._conn.execute_fetchall(sql, tuple(params)))
        return rows[0][0] if rows else None

    async def _read_head(self) -> Block:
        rows = list(
            await self._conn.execute_fetchall(
                "SELECT height, hash, data FROM committed ORDER BY height DESC LIMIT 1"
            )
        )
        if not rows:
            raise StorageError(f"{self._path}: the committed log is empty (no genesis)")
        height, block_hash, data = rows[0]
        return self._decode_committed(int(height), bytes(block_hash), bytes(data))

    async def _read_committed_block(self, height: int) -> Block | None:
        rows = list(
            await self._conn.execute_fetchall(
                "SELECT hash, data FROM committed WHERE height = ?", (height,)
            )
        )
        if not rows:
            return None
        block_hash, data = rows[0]
        return self._decode_committed(height, bytes(block_hash), bytes(data))

    async def _read_range_within(self, start: int, end: int, budget: int) -> list[Block]:
        """Committed blocks from `start` towards `end`, read a page at a time, stopping
        once their payload passes `budget` (so a catch-up answer never reads much more
        than it sends)."""
        blocks: list[Block] = []
        total = 0
        page = start
        while page <= end and total <= budget:
            chunk = await self._read_range(page, min(end, page + SYNC_READ_PAGE_BLOCKS - 1))
            blocks += chunk
            total += sum(b.payload_bytes for b in chunk)
            page += SYNC_READ_PAGE_BLOCKS
        return blocks

    async def _read_range(self, start: int, end: int) -> list[Block]:
        if end < start:
            return []
        rows = await self._conn.execute_fetchall(
            "SELECT height, hash, data FROM committed WHERE height >= ? AND height <= ? "
            "ORDER BY height",
            (start, end),
        )
        blocks = [self._decode_committed(int(h), bytes(k), bytes(d)) for h, k, d in rows]
        for offset, block in enumerate(blocks):
            if block.height != start + offset:
                raise StorageError(f"{self._path}: the committed log has a gap at {block.height}")
        return blocks

    async def _read_proof(self, sql: str, a: int, b: int) -> CommitProof | None:
        rows = list(await self._conn.execute_fetchall(sql, (a, b)))
        if not rows:
            return None
        height, data = rows[0]
        try:
            proof = decode_proof(self._chain_id, bytes(data))
        except (RemoteError, ValueError) as err:
            raise StorageError(f"{self._path}: undecodable proof at height {height}") from err
        if proof_height(proof) != int(height):
            raise StorageError(f"{self._path}: the proof stored at {height} proves another height")
        return proof

    def _decode_block(self, block_hash: bytes, data: bytes) -> Block:
        try:
            block = decode_block(self._chain_id, data)
        except (RemoteError, ValueError) as err:
            raise StorageError(
                f"{self._path}: undecodable block {block_hash[:4].hex()}: {err}"
            ) from err
        if block.hash != block_hash:
            raise StorageError(
                f"{self._path}: block stored as {block_hash[:4].hex()} hashes to "
                f"{block.hash[:4].hex()}"
            )
        return block

    def _decode_committed(self, height: int, block_hash: bytes, data: bytes) -> Block:
        block = self._decode_block(block_hash, data)
        if block.height != height:
            raise StorageError(
                f"{self._path}: committed block at {height} says height {block.height}"
            )
        return block

    def _decode_epoch(self, epoch: int, keys: bytes, ended: bytes) -> StoredEpoch:
        return decode_epoch_row(self._path, self._chain_id, epoch, keys, ended)

    def _decode_safety(self, data: bytes) -> SafetyState:
        try:
            return decode_safety(data)
        except Exception as err:  # protobuf DecodeError, or a state failing its checks
            raise StorageError(f"{self._path}: undecodable safety record: {err}") from err


def _file_bytes(path: Path) -> int:
    total = 0
    for name in (path, path.with_name(path.name + "-wal")):
        with contextlib.suppress(OSError):
            total += name.stat().st_size
    return total


def _give_back_pages(c: sqlite3.Connection) -> None:
    """Return freed pages to the file system: in place on a store made with incremental
    vacuum, by one VACUUM on an older file (which turns it on; it rewrites the whole
    file). Then checkpoint and truncate the write-ahead log. (On the connection's thread,
    outside any transaction.)"""
    if int(c.execute("PRAGMA auto_vacuum").fetchone()[0]) != 2:  # 2 = INCREMENTAL
        c.execute("PRAGMA auto_vacuum=INCREMENTAL")
        c.execute("VACUUM")
    else:
        c.executescript("PRAGMA incremental_vacuum;")  # stepped to the end: a page a step
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
