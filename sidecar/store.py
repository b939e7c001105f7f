"""Durable storage of one execution sidecar (aiosqlite): what each executed height produced.

`SidecarStore.record` takes everything one height produced — the engine's verdicts and
rejection artifacts, the receipt leaves with their inclusion paths, this sidecar's signed
block statement and the engine state after the height — and makes it durable in ONE SQLite
transaction, committed with an fsync before it returns, or not at all. The executed height
lives in the same transaction, so a sidecar killed at any point restarts from the last
height it recorded whole: no height executed twice, none skipped (docs/drills.md).

Tables (schema version `SCHEMA_VERSION`, all STRICT so a value of the wrong type is refused
at write time):

- `meta`: the schema version and the chain id the file belongs to (another chain's file is
  refused at `open`); in a store installed from a snapshot (docs/snapshots.md), also the
  checkpoint local history starts from (`checkpoint_*`: height, state root, ledger head
  and entry count, block hash and time): no ledger entry, receipt or statement below it is
  here, and the first ledger entry after it chains to its ledger head. A store that pruned
  its history there (`prune_to`, docs/pruning.md) also holds this sidecar's signature
  over the checkpoint (`checkpoint_signer`, `checkpoint_signature`). A new file is made
  with incremental auto-vacuum, so pruning gives its pages back to the file system.
- `head`: one row — the executed height, the ledger head and entry count, and the engine
  state after the executed height: either whole in `engine_state`, or (what the sidecar
  writes) as its header in `state_header` and one row per entry in `state_entries`
  (`quorumgate.sidecar.engine.state.StateDelta`). NULL before the first height.
  (`state_prefix`, `state_suffix` and `state_agents` are schema 3's parts, read until the
  first height this build records.)
- `state_entries`: each entry of the engine state — (section, key form, bytes), the key
  form ordering as the key does. A height writes only the entries it changed and deletes
  those it removed, so recording costs what the height changed, not the size of the state
  (the grants and pending cards, rewritten whole at every height, were 3.5 MB a height
  with 10,000 grants and 5,000 cards). Reading it back, `engine_state` reassembles the
  bytes and checks them against the state root this sidecar signed for the executed
  height: a store whose entries do not add up to what was signed is refused, never loaded.
- `ledger`: the verdict ledger (sidecar/ledger.py), one row per verdict in execution order,
  every field of `LedgerEntry` in its own column (a version-2 entry's commitments and
  sealed salts in `extension`, as one JSON object; "" for a version-1 entry).
  `verify_ledger` walks it in insertion (rowid) order — an order no column edit can
  change — recomputing each hash from the stored columns, so an edit to any column of
  any row is named at that row.
- `receipts`: one row per verdict: the receipt leaf's fields and its Merkle inclusion path
  (the concatenated sibling hashes), indexed by proposal id.
- `blocks`: this sidecar's signed statement per height (sidecar/receipts.py), with the
  replica's block hash and block time: the verdict root, the state root, the signature,
  and on a chain whose receipts expire the end of the validity window it signed (with the
  block time; NULL where the statement signs no window).
- `cards`: the confirmation card bytes of each pending verdict, by proposal id.
- `artifacts`: the rejection artifacts (docs/sidecar.md), PRIMARY KEY (height, canonical
  target): never two for one key. `data` is `RejectionArtifact.to_bytes()`, the authority;
  `denials` is a JSON copy of the denials for the operator's listing.

Artifacts are written idempotently: if a row for the key holds the same bytes, recording
moves on; with different bytes, `record` raises `DivergenceError` naming the key and writes
nothing (the whole height rolls back). That case arises when a store replays a log over
artifacts it kept (`wipe(keep_artifacts=True)`, the replay drill of docs/drills.md): every
artifact is then checked byte for byte against what the replay produces.

Argument values never reach this file: verdicts, receipts, cards and artifacts carry
argument *names* only, and the engine state holds sealed envelopes as ciphertext.

Durability settings, set on every connection (the same as replica/storage.py, which says
why at length): `journal_mode=WAL`; `synchronous=FULL`, so WAL is fsynced at every commit
and a recorded height survives power loss, not only a process crash; `fullfsync` for macOS;
and one writer: the writing store holds an exclusive `flock` on `<db>.lock` for its
lifetime, so a second writer (a sidecar started twice) is refused at `open` with a clear
error instead of both writing one ledger. Operator commands open the store `read_only`:
WAL lets them read a running sidecar's committed heights while it goes on writing.

One connection per store, and one asyncio lock around every use of it: a transaction may
span several awaits (opening, upgrading, wiping), and a read interleaved on the same
connection would otherwise see rows that are not yet durable. `record`, the path every
height takes, runs its whole transaction in one trip to the connection's thread, and the
self-audit reads a height in one (runtime/dbthread.py: each trip costs about 40 µs of CPU).
Every read is bounded by a named page size.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import sqlite3
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite

from quorumgate.proto.canonical import HASH_BYTES, sha256
from quorumgate.runtime.dbthread import on_thread, transaction, transaction_then
from quorumgate.sidecar.engine.state import (
    SECTIONS,
    EngineState,
    StateDelta,
    assemble_state,
)
from quorumgate.sidecar.engine.statements import BlockResult, RejectionArtifact
from quorumgate.sidecar.ledger import (
    GENESIS_PREV_HASH,
    ChainVerifier,
    LedgerEntry,
    LedgerExtra,
    LedgerProblem,
    extra_from_column,
    extra_to_json,
)
from quorumgate.sidecar.receipts import (
    PATH_HASHES_MAX,
    Receipt,
    ReceiptLeaf,
    SignedBlock,
    Validity,
    leaf_from_verdict,
)

# 2: receipts bind the signed body's digest; 3: the state in parts; 4: the state by entry;
# 5: a block statement's validity window (chains whose receipts expire)
SCHEMA_VERSION = 7
# a writer upgrades these in place on open
SCHEMA_VERSIONS_MIGRATED = {2: 3, 3: 4, 4: 5, 5: 6, 6: 7}
# The most ledger entries one `ledger` call returns, and the page `verify_ledger` reads
# at a time (memory stays bounded however long the ledger grows).
LEDGER_PAGE_ROWS_MAX = 1024
# The most receipts one `receipts_from` call returns: above any block's transaction count
# (the replica's `batch_txs_max` is 4,096 by default), so one page always holds a whole
# height; callers page by height.
RECEIPTS_PAGE_MAX = 1 << 16
# The most artifacts one `artifacts` call returns; callers page with `offset`.
ARTIFACTS_PAGE_MAX = 1024
# Above every index a height can hold: the position after a checkpoint's last entry, so
# the first entry after it is index 0 of a later height (ChainVerifier's order check).
LEDGER_INDEX_AFTER_ALL = 1 << 32

_SCHEMA = (
    """
    CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    ) STRICT
    """,
    """
    CREATE TABLE head (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        executed_height INTEGER NOT NULL CHECK (executed_height >= 0),
        ledger_head BLOB NOT NULL,
        ledger_entries INTEGER NOT NULL CHECK (ledger_entries >= 0),
        engine_state BLOB,
        state_prefix BLOB,
        state_suffix BLOB,
        state_header BLOB
    ) STRICT
    """,
    """
    CREATE TABLE state_entries (
        section INTEGER NOT NULL,
        key BLOB NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (section, key)
    ) STRICT, WITHOUT ROWID
    """,
    """
    CREATE TABLE state_agents (
        agent_id TEXT PRIMARY KEY,
        data BLOB NOT NULL
    ) STRICT, WITHOUT ROWID
    """,
    """
    CREATE TABLE ledger (
        height INTEGER NOT NULL,
        idx INTEGER NOT NULL,
        tx_id BLOB NOT NULL,
        proposal_id BLOB NOT NULL,
        kind TEXT NOT NULL,
        outcome TEXT NOT NULL,
        reason TEXT NOT NULL,
        mandate_version INTEGER NOT NULL,
        principal TEXT NOT NULL,
        canonical_target TEXT NOT NULL,
        target_digest BLOB NOT NULL,
        card_digest BLOB NOT NULL,
        argument_names TEXT NOT NULL,
        prev_hash BLOB NOT NULL,
        hash BLOB NOT NULL,
        extension TEXT NOT NULL DEFAULT '',
        UNIQUE (height, idx)
    ) STRICT
    """,
    """
    CREATE TABLE receipts (
        height INTEGER NOT NULL,
        idx INTEGER NOT NULL,
        tx_id BLOB NOT NULL,
        proposal_id BLOB NOT NULL,
        kind TEXT NOT NULL,
        outcome TEXT NOT NULL,
        reason TEXT NOT NULL,
        target_digest BLOB NOT NULL,
        card_digest BLOB NOT NULL,
        mandate_version INTEGER NOT NULL,
        body_digest BLOB NOT NULL,
        path BLOB NOT NULL,
        PRIMARY KEY (height, idx)
    ) STRICT, WITHOUT ROWID
    """,
    """
    CREATE INDEX receipts_by_proposal ON receipts (proposal_id)
    """,
    """
    CREATE TABLE blocks (
        height INTEGER PRIMARY KEY,
        block_hash BLOB NOT NULL,
        block_time_ms INTEGER NOT NULL,
        verdict_root BLOB NOT NULL,
        state_root BLOB NOT NULL,
        leaf_count INTEGER NOT NULL,
        signer INTEGER NOT NULL,
        signature BLOB NOT NULL,
        valid_until_ms INTEGER,
        epoch INTEGER NOT NULL DEFAULT 0
    ) STRICT
    """,
    """
    CREATE TABLE cards (
        proposal_id BLOB PRIMARY KEY,
        height INTEGER NOT NULL,
        data BLOB NOT NULL
    ) STRICT
    """,
    """
    CREATE TABLE artifacts (
        height INTEGER NOT NULL,
        canonical_target TEXT NOT NULL,
        data BLOB NOT NULL,
        denials TEXT NOT NULL,
        PRIMARY KEY (height, canonical_target)
    ) STRICT, WITHOUT ROWID
    """,
)

OWN_TX_IDS_MAX = 64  # transactions one `heights_holding` read looks for
# The newest recorded heights whose state roots `root_at` answers from memory: the
# divergence check of every block asks for a recent one (docs/benchmarks.md, "What a
# block costs each process").
RECENT_ROOTS_MAX = 64
_LEDGER_COLUMNS = (
    "height, idx, tx_id, proposal_id, kind, outcome, reason, mandate_version, principal, "
    "canonical_target, target_digest, card_digest, argument_names, prev_hash, hash, extension"
)
_BLOCK_COLUMNS = (
    "height, verdict_root, state_root, leaf_count, signer, signature, block_time_ms, "
    "valid_until_ms, epoch"
)
_RECEIPT_SELECT = (
    "SELECT r.height, r.idx, r.tx_id, r.proposal_id, r.kind, r.outcome, r.reason, "
    "r.target_digest, r.card_digest, r.mandate_version, r.body_digest, r.path, b.verdict_root, "
    "b.state_root, b.leaf_count, b.signer, b.signature, b.block_time_ms, b.valid_until_ms, "
    "b.epoch "
    "FROM receipts AS r JOIN blocks AS b ON b.height = r.height "
)


class SidecarStoreError(Exception):
    """The file cannot serve as this sidecar's store: missing, unreadable, corrupt, held by
    another process, from another chain or another schema version. Raised, never guessed
    around."""


class DivergenceError(Exception):
    """A rejection artifact already stored under `key` holds different bytes than this
    execution produced: this sidecar's past and present disagree about one committed log,
    so one of them is faulty. Nothing of the height was written."""

    def __init__(self, key: tuple[int, str], stored: bytes, produced: bytes) -> None:
        height, target = key
        super().__init__(
            f"artifact (height {height}, {target!r}) exists with different bytes "
            f"(stored sha256 {sha256(stored).hex()[:16]}…, "
            f"this execution {sha256(produced).hex()[:16]}…)"
        )
        self.key = key


@dataclass(frozen=True)
class ExecutedHeight:
    """Everything one executed height produced, recorded together by `SidecarStore.record`.

    `leaves[i]` is `leaf_from_verdict(height, i, result.verdicts[i])` and `paths[i]` its
    inclusion path under `signed.verdict_root`. The state after the height is either
    `state_delta`, what it changed (`Engine.state_delta()`, what a sidecar records), or
    `engine_state`, the whole bytes (`Engine.state_bytes()`); with both, the delta is
    recorded."""

    height: int
    block_hash: bytes
    block_time_ms: int
    result: BlockResult
    leaves: tuple[ReceiptLeaf, ...]
    paths: tuple[tuple[bytes, ...], ...]
    signed: SignedBlock
    engine_state: bytes | None = None
    state_delta: StateDelta | None = None
    # One per verdict on a chain that commits arguments (sidecar/execution.py
    # `ledger_extras`); None: the height's entries are of version 1.
    ledger_extras: tuple[LedgerExtra, ...] | None = None


@dataclass(frozen=True)
class Checkpoint:
    """Where a sidecar stands after one height, without its history: the state root f+1
    members signed for `height`, the ledger head and entry count there, the replica's block
    hash and time. A store installed from a snapshot starts its local history here."""

    height: int
    state_root: bytes
    ledger_head: bytes
    ledger_entries: int
    block_hash: bytes
    block_time_ms: int


_CHECKPOINT_KEYS = (
    "checkpoint_height", "checkpoint_state_root", "checkpoint_ledger_head",
    "checkpoint_ledger_entries", "checkpoint_block_hash", "checkpoint_block_time_ms",
)  # fmt: skip
# A checkpoint this sidecar pruned at carries its own signature over it (sidecar/pruning.py)
_SIGNATURE_KEYS = ("checkpoint_signer", "checkpoint_signature")


@dataclass(frozen=True)
class CheckpointSignature:
    """The signature a sidecar made over the checkpoint it pruned its history at."""

    signer: int
    signature: bytes


@dataclass(frozen=True)
class PruneResult:
    """One pruning of the store: the rows dropped and the file's size before and after
    (the main file with its write-ahead log, bytes)."""

    height: int
    ledger_rows: int
    receipts: int
    artifacts: int
    bytes_before: int
    bytes_after: int
    vacuumed: bool  # a one-time VACUUM turned an older file's incremental vacuum on


def _signature_from_meta(meta: dict[str, str], path: Path) -> CheckpointSignature | None:
    if "checkpoint_signature" not in meta:
        return None
    try:
        return CheckpointSignature(
            int(meta["checkpoint_signer"]), bytes.fromhex(meta["checkpoint_signature"])
        )
    except (KeyError, ValueError) as err:
        raise SidecarStoreError(f"{path}: an unreadable checkpoint signature: {err}") from err


def _file_bytes(path: Path) -> int:
    total = 0
    for name in (path, path.with_name(path.name + "-wal")):
        with contextlib.suppress(OSError):
            total += name.stat().st_size
    return total


def _checkpoint_from_meta(meta: dict[str, str], path: Path) -> Checkpoint | None:
    if "checkpoint_height" not in meta:
        return None
    try:
        return _checkpoint_fields(meta)
    except (KeyError, ValueError) as err:
        raise SidecarStoreError(f"{path}: an unreadable checkpoint: {err}") from err


def _checkpoint_fields(meta: dict[str, str]) -> Checkpoint:
    return Checkpoint(
        int(meta["checkpoint_height"]),
        bytes.fromhex(meta["checkpoint_state_root"]),
        bytes.fromhex(meta["checkpoint_ledger_head"]),
        int(meta["checkpoint_ledger_entries"]),
        bytes.fromhex(meta["checkpoint_block_hash"]),
        int(meta["checkpoint_block_time_ms"]),
    )


def _checkpoint_rows(c: Checkpoint) -> list[tuple[str, str]]:
    values = (
        str(c.height), c.state_root.hex(), c.ledger_head.hex(), str(c.ledger_entries),
        c.block_hash.hex(), str(c.block_time_ms),
    )  # fmt: skip
    return list(zip(_CHECKPOINT_KEYS, values, strict=True))


class SidecarStore:
    """One sidecar's durable state in one SQLite file. Build it with `SidecarStore.open`."""

    def __init__(
        self, conn: Any, path: Path, chain_id: str, writer_lock: int | None = None
    ) -> None:
        self._conn = conn
        self._path = path
        self._chain_id = chain_id
        self._lock = asyncio.Lock()
        self._closed = False
        self._writer_lock = writer_lock
        self._read_only = writer_lock is None
        self._executed_height = 0
        self._ledger_head = GENESIS_PREV_HASH
        self._ledger_entries = 0
        self._artifact_count = 0
        self._state_by_entry = False  # the state is in state_entries (else whole, or none)
        self._checkpoint: Checkpoint | None = None  # where local history starts, if not at 1
        self._checkpoint_signature: CheckpointSignature | None = None  # set when pruned
        # height -> the state root of its statement, as its committed record wrote it
        self._recent_roots: OrderedDict[int, bytes] = OrderedDict()

    # ================================================================== open / close

    @classmethod
    async def open(
        cls, path: Path, chain_id: str, *, create: bool = True, read_only: bool = False
    ) -> SidecarStore:
        """Open the store at `path` for chain `chain_id`, creating it if needed (unless
        `create` is False: operator commands never create an empty store by mistake).
        `read_only` stores take no writer lock and can only read."""
        if not chain_id:
            raise ValueError("chain id must not be empty")
        writer_lock: int | None = None
        if not read_only:
            writer_lock = _take_writer_lock(path)
        try:
            if read_only:
                uri = f"{path.resolve().as_uri()}?mode=ro"
                conn = await aiosqlite.connect(uri, uri=True, isolation_level=None, timeout=5)
            elif create:
                # Autocommit mode: `record` writes its own BEGIN IMMEDIATE ... COMMIT. No
                # busy wait: the lock is held for the store's lifetime, so waiting gains
                # nothing.
                conn = await aiosqlite.connect(path, isolation_level=None, timeout=0)
            else:
                uri = f"{path.resolve().as_uri()}?mode=rw"
                conn = await aiosqlite.connect(uri, uri=True, isolation_level=None, timeout=0)
        except sqlite3.Error as err:
            _release_writer_lock(writer_lock)
            raise SidecarStoreError(f"{path}: cannot open the sidecar store: {err}") from err
        store = cls(conn, path, chain_id, writer_lock)
        try:
            await store._initialise()
        except sqlite3.OperationalError as err:
            await conn.close()
            _release_writer_lock(writer_lock)
            if "locked" in str(err):
                raise SidecarStoreError(
                    f"{path}: in use by another process (a running sidecar holds its store "
                    f"exclusively; stop it, or work on a copy taken while it was stopped) ({err})"
                ) from err
            raise SidecarStoreError(f"{path}: not a readable sidecar store: {err}") from err
        except sqlite3.DatabaseError as err:
            await conn.close()
            _release_writer_lock(writer_lock)
            raise SidecarStoreError(f"{path}: not a readable sidecar store: {err}") from err
        except BaseException:
            await conn.close()
            _release_writer_lock(writer_lock)
            raise
        return store

    async def _initialise(self) -> None:
        conn = self._conn
        if self._read_only:
            await conn.execute("PRAGMA query_only=ON")
        if not self._read_only:
            # Before any table exists, so a new store gives pages back when pruning frees
            # them (docs/pruning.md); on an existing file it changes nothing until VACUUM.
            await conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        # The first statement to read the file: it fails here for a file that is not SQLite.
        mode = await self._scalar(
            "PRAGMA journal_mode" if self._read_only else "PRAGMA journal_mode=WAL"
        )
        if str(mode).lower() != "wal":
            raise SidecarStoreError(f"{self._path}: cannot use WAL journaling (got {mode!r})")
        await conn.execute("PRAGMA synchronous=FULL")
        await conn.execute("PRAGMA fullfsync=ON")
        await conn.execute("PRAGMA checkpoint_fullfsync=ON")
        if await self._scalar("PRAGMA synchronous") != 2:  # 2 = FULL
            raise SidecarStoreError(f"{self._path}: SQLite refused synchronous=FULL")
        if self._read_only and not await self._scalar(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'"
        ):
            raise SidecarStoreError(f"{self._path}: an empty file, not a sidecar store")

        tables = {
            str(row[0])
            for row in await conn.execute_fetchall(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
            )
        }
        if not tables:
            await self._create_schema()
        elif "meta" not in tables or "head" not in tables:
            raise SidecarStoreError(f"{self._path}: an SQLite file, but not a sidecar store")
        meta = {
            str(key): str(value)
            for key, value in await conn.execute_fetchall("SELECT key, value FROM meta")
        }
        version = meta.get("schema_version")
        if version is not None and version.isdigit() and int(version) in SCHEMA_VERSIONS_MIGRATED:
            if self._read_only:
                raise SidecarStoreError(
                    f"{self._path}: schema version {version}, this build reads "
                    f"{SCHEMA_VERSION}; start the sidecar once (it upgrades the file in place)"
                )
            await self._migrate(int(version))
            version = str(SCHEMA_VERSION)
        if version != str(SCHEMA_VERSION):
            raise SidecarStoreError(
                f"{self._path}: schema version {version!r}, this build reads {SCHEMA_VERSION}"
            )
        self._checkpoint = _checkpoint_from_meta(meta, self._path)
        self._checkpoint_signature = _signature_from_meta(meta, self._path)
        stored_chain = meta.get("chain_id")
        if stored_chain != self._chain_id:
            raise SidecarStoreError(
                f"{self._path}: the store belongs to chain {stored_chain!r}, not {self._chain_id!r}"
            )
        rows = list(
            await conn.execute_fetchall(
                "SELECT executed_height, ledger_head, ledger_entries FROM head WHERE id = 1"
            )
        )
        if not rows:
            raise SidecarStoreError(f"{self._path}: the head record is missing")
        height, head, entries = rows[0]
        if not isinstance(head, bytes) or len(head) != HASH_BYTES:
            raise SidecarStoreError(f"{self._path}: the recorded ledger head is not a hash")
        self._executed_height = int(height)
        self._ledger_head = bytes(head)
        self._ledger_entries = int(entries)
        self._artifact_count = int(await self._scalar("SELECT COUNT(*) FROM artifacts"))
        self._state_by_entry = (
            await self._scalar("SELECT state_header IS NOT NULL FROM head WHERE id = 1")
        ) == 1

    async def _migrate(self, version: int) -> None:
        """Upgrade an older schema in one transaction (2 -> 3: the state in parts; 3 -> 4:
        the state by entry; 4 -> 5: a column for validity windows, NULL in every row
        recorded before, whose statements signed none; 5 -> 6: the ledger's `extension`,
        "" in every row recorded before, version-1 entries all; 6 -> 7: the epoch each
        block statement names, 0 in every row recorded before). The state stays as it was stored
        until the next height is recorded: an engine loaded from it gives a full delta
        first, which replaces it."""
        conn = self._conn
        await conn.execute("BEGIN IMMEDIATE")
        try:
            while version != SCHEMA_VERSION:
                if version == 2:
                    await conn.execute("ALTER TABLE head ADD COLUMN state_prefix BLOB")
                    await conn.execute("ALTER TABLE head ADD COLUMN state_suffix BLOB")
                    await conn.execute(
                        "CREATE TABLE state_agents (agent_id TEXT PRIMARY KEY, "
                        "data BLOB NOT NULL) STRICT, WITHOUT ROWID"
                    )
                elif version == 3:
                    await conn.execute("ALTER TABLE head ADD COLUMN state_header BLOB")
                    await conn.execute(
                        "CREATE TABLE state_entries (section INTEGER NOT NULL, key BLOB NOT "
                        "NULL, data BLOB NOT NULL, PRIMARY KEY (section, key)) STRICT, "
                        "WITHOUT ROWID"
                    )
                elif version == 4:
                    await conn.execute("ALTER TABLE blocks ADD COLUMN valid_until_ms INTEGER")
                elif version == 5:
                    await conn.execute(
                        "ALTER TABLE ledger ADD COLUMN extension TEXT NOT NULL DEFAULT ''"
                    )
                elif version == 6:
                    await conn.execute(
                        "ALTER TABLE blocks ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0"
                    )
                version = SCHEMA_VERSIONS_MIGRATED[version]
            await conn.execute(
                "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),)
            )
            await conn.execute("COMMIT")
        except BaseException:
            await self._rollback()
            raise
        self._state_by_entry = False

    async def _create_schema(self) -> None:
        conn = self._conn
        await conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA:
                await conn.execute(statement)
            await conn.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?)",
                [("schema_version", str(SCHEMA_VERSION)), ("chain_id", self._chain_id)],
            )
            await conn.execute(
                "INSERT INTO head (id, executed_height, ledger_head, ledger_entries, "
                "engine_state) VALUES (1, 0, ?, 0, NULL)",
                (GENESIS_PREV_HASH,),
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
        _release_writer_lock(self._writer_lock)
        self._writer_lock = None

    # ================================================================== state in memory

    @property
    def chain_id(self) -> str:
        return self._chain_id

    @property
    def path(self) -> Path:
        return self._path

    @property
    def executed_height(self) -> int:
        """The last height recorded whole (0 before the first)."""
        return self._executed_height

    @property
    def ledger_head(self) -> bytes:
        """The hash of the last ledger entry (32 zero bytes for an empty ledger)."""
        return self._ledger_head

    @property
    def ledger_entries(self) -> int:
        return self._ledger_entries

    @property
    def artifact_count(self) -> int:
        return self._artifact_count

    @property
    def checkpoint(self) -> Checkpoint | None:
        """Where local history starts when the store was installed from a snapshot (None:
        it holds every height from 1)."""
        return self._checkpoint

    @property
    def checkpoint_signature(self) -> CheckpointSignature | None:
        """Our signature over the checkpoint when we pruned at it (None: the store was
        installed from a snapshot there, or never pruned)."""
        return self._checkpoint_signature

    @property
    def history_from(self) -> int:
        """The first height whose ledger, receipts and statement this store holds."""
        return 1 if self._checkpoint is None else self._checkpoint.height + 1

    async def engine_state(self) -> bytes | None:
        """The engine state's bytes after `executed_height` (None before the first
        height), checked against the state root this sidecar signed for that height (of
        either state version: SHA-256 of the bytes, or the hash tree over the entries)."""
        loaded = await self.loaded_state()
        return None if loaded is None else loaded[0]

    async def loaded_state(self) -> tuple[bytes, EngineState] | None:
        """`engine_state`, with the state decoded once (the check of a version-2 root
        decodes it anyway): what a sidecar builds its engine from at start."""
        async with self._lock:
            self._check_open()
            rows = list(
                await self._conn.execute_fetchall(
                    "SELECT engine_state, state_prefix, state_suffix, state_header "
                    "FROM head WHERE id = 1"
                )
            )
            whole, prefix, suffix, header = rows[0]
            if header is not None:
                sections: list[list[bytes]] = [[] for _ in SECTIONS]
                async with self._conn.execute(
                    "SELECT section, data FROM state_entries ORDER BY section, key"
                ) as cursor:
                    async for section, data in cursor:
                        if not 0 <= section < len(SECTIONS):
                            raise SidecarStoreError(
                                f"{self._path}: a state entry of unknown section {section}: "
                                "the store is damaged; replay it"
                            )
                        sections[section].append(bytes(data))
                state = assemble_state(bytes(header), sections)
            elif whole is not None:
                state = bytes(whole)
            elif prefix is not None and suffix is not None:  # schema 3's parts
                agents = [
                    bytes(row[0])
                    for row in await self._conn.execute_fetchall(
                        "SELECT data FROM state_agents ORDER BY agent_id"
                    )
                ]
                state = b"".join(
                    (bytes(prefix), len(agents).to_bytes(4, "big"), *agents, bytes(suffix))
                )
            else:
                return None
            height = self._executed_height
            signed = await self._scalar("SELECT state_root FROM blocks WHERE height = ?", (height,))
            checkpoint = self._checkpoint
            if signed is None and checkpoint is not None and checkpoint.height == height:
                signed = checkpoint.state_root  # what f+1 members signed for the checkpoint
        try:
            decoded: EngineState | None = EngineState.from_bytes(state)
        except ValueError:  # StateDecodeError, or a field out of its range
            decoded = None
        if signed is not None and bytes(signed) not in (
            sha256(state),
            None if decoded is None else decoded.tree_root(),
        ):
            raise SidecarStoreError(
                f"{self._path}: the stored engine state does not hash to the state root "
                f"signed for height {height} (signed {bytes(signed).hex()[:16]}…): the store "
                "is damaged; replay it"
            )
        if decoded is None:
            raise SidecarStoreError(
                f"{self._path}: the stored engine state does not decode: the store is "
                "damaged; replay it"
            )
        return state, decoded

    # ================================================================== recording

    async def record(
        self, h: ExecutedHeight, then_read: int | None = None
    ) -> HeightRows | SidecarStoreError | None:
        """Make one executed height durable, whole, in one transaction (fsync before this
        returns), or write nothing.

        `h.height` must be `executed_height + 1`: a height already recorded, or one that
        skips a height, is our own broken invariant and raises `AssertionError` naming
        both. An artifact key already stored with different bytes raises
        `DivergenceError` and rolls the height back; with the same bytes it is kept as is.

        `then_read`: a height whose rows (as `height_rows` gives them) are read once the
        transaction committed, in the same trip to the connection's thread, and returned:
        the self-audit's next height (sidecar/audit.py), which otherwise costs a trip of its
        own for every block (docs/benchmarks.md, "What a block costs each process"). A
        ledger row there that is not an entry comes back as the `SidecarStoreError`
        `height_rows` would raise.
        """
        _check_shape(self._chain_id, h)
        # Shielded: if the caller is cancelled mid-transaction the transaction still ends
        # (committed or rolled back) and the in-memory head still matches the disk.
        raw = await asyncio.shield(self._record_locked(h, then_read))
        if then_read is None or raw is None:
            return None
        try:
            return self._height_rows_of(then_read, raw)
        except SidecarStoreError as err:  # the height is recorded all the same
            return err

    async def _record_locked(self, h: ExecutedHeight, then_read: int | None) -> _RawHeight | None:
        async with self._lock:
            self._check_open()
            if h.height <= self._executed_height:
                raise AssertionError(
                    f"height {h.height} is already recorded (executed height "
                    f"{self._executed_height}): a height is executed exactly once"
                )
            if h.height != self._executed_height + 1:
                raise AssertionError(
                    f"height {h.height} does not follow executed height "
                    f"{self._executed_height}: a height would be skipped"
                )
            entries = LedgerEntry.chain(
                self._chain_id, h.height, h.result.verdicts, self._ledger_head, h.ledger_extras
            )
            head = entries[-1].hash if entries else self._ledger_head
            state_by_entry, total = self._state_by_entry, self._ledger_entries + len(entries)

            def write(c: sqlite3.Connection) -> list[RejectionArtifact]:
                fresh = SidecarStore._check_artifacts(c, h.height, h.result.artifacts)
                SidecarStore._insert_rows(c, h, entries, fresh)
                SidecarStore._update_head(c, h, head, total, state_by_entry)
                return fresh

            def read(c: sqlite3.Connection) -> _RawHeight | None:
                return None if then_read is None else _read_height(c, then_read)

            # One trip to the connection's thread for the whole height and the read after
            # it (runtime/dbthread.py).
            fresh, raw = await transaction_then(self._conn, write, read, "BEGIN IMMEDIATE")
            # committed: the statement's root is now what the file holds for this height
            self._recent_roots[h.height] = h.signed.state_root
            while len(self._recent_roots) > RECENT_ROOTS_MAX:
                self._recent_roots.popitem(last=False)
            self._executed_height = h.height
            self._ledger_head = head
            self._state_by_entry = h.state_delta is not None
            self._ledger_entries += len(entries)
            self._artifact_count += len(fresh)
        return raw

    @staticmethod
    def _check_artifacts(
        c: sqlite3.Connection, height: int, artifacts: Sequence[RejectionArtifact]
    ) -> list[RejectionArtifact]:
        """The artifacts not yet stored; `DivergenceError` for a key stored with other
        bytes. Every artifact of a height shares that height, so one read covers them.
        (This and the next two run on the connection's thread, inside `record`'s
        transaction.)"""
        rows = c.execute(
            "SELECT canonical_target, data FROM artifacts WHERE height = ?", (height,)
        ).fetchall()
        stored = {str(target): bytes(data) for target, data in rows}
        fresh: list[RejectionArtifact] = []
        for artifact in artifacts:
            data = artifact.to_bytes()
            prior = stored.get(artifact.canonical_target)
            if prior is None:
                stored[artifact.canonical_target] = data
                fresh.append(artifact)
            elif prior != data:
                raise DivergenceError(artifact.key, prior, data)
        return fresh

    @staticmethod
    def _insert_rows(
        conn: sqlite3.Connection,
        h: ExecutedHeight,
        entries: Sequence[LedgerEntry],
        fresh: Sequence[RejectionArtifact],
    ) -> None:
        conn.executemany(
            f"INSERT INTO ledger ({_LEDGER_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [_ledger_row(e) for e in entries],
        )
        conn.executemany(
            "INSERT INTO receipts (height, idx, tx_id, proposal_id, kind, outcome, reason, "
            "target_digest, card_digest, mandate_version, body_digest, path) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    leaf.height, leaf.index, leaf.tx_id, leaf.proposal_id, leaf.kind,
                    leaf.outcome, leaf.reason, leaf.target_digest, leaf.card_digest,
                    leaf.mandate_version, leaf.body_digest, b"".join(path),
                )
                for leaf, path in zip(h.leaves, h.paths, strict=True)
            ],
        )  # fmt: skip
        cards = [
            (v.proposal_id, h.height, v.card.to_bytes())
            for v in h.result.verdicts
            if v.card is not None
        ]
        if cards:
            conn.executemany(
                "INSERT INTO cards (proposal_id, height, data) VALUES (?, ?, ?)", cards
            )
        s = h.signed
        conn.execute(
            "INSERT INTO blocks (height, block_hash, block_time_ms, verdict_root, state_root, "
            "leaf_count, signer, signature, valid_until_ms, epoch) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (h.height, h.block_hash, h.block_time_ms, s.verdict_root, s.state_root,
             s.leaf_count, s.signer, s.signature,
             None if s.validity is None else s.validity.valid_until_ms, s.epoch),
        )  # fmt: skip
        if fresh:
            conn.executemany(
                "INSERT INTO artifacts (height, canonical_target, data, denials) "
                "VALUES (?, ?, ?, ?)",
                [(a.height, a.canonical_target, a.to_bytes(), _denials_json(a)) for a in fresh],
            )

    @staticmethod
    def _update_head(
        conn: sqlite3.Connection,
        h: ExecutedHeight,
        ledger_head: bytes,
        entries: int,
        state_by_entry: bool,
    ) -> None:
        """Write the head and the state: the entries the height changed, or the whole."""
        delta = h.state_delta
        if delta is None or delta.full:
            conn.execute("DELETE FROM state_entries")
            conn.execute("DELETE FROM state_agents")
        elif not state_by_entry:
            # The delta was cut by an engine that had already handed entries to someone
            # else (it executed heights not recorded here): our own broken invariant.
            raise AssertionError(
                f"height {h.height}: a partial state delta for a store that does not hold "
                "the state by entry; an engine loaded from this store gives a full one"
            )
        if delta is None:
            conn.execute(
                "UPDATE head SET executed_height = ?, ledger_head = ?, ledger_entries = ?, "
                "engine_state = ?, state_prefix = NULL, state_suffix = NULL, "
                "state_header = NULL WHERE id = 1",
                (h.height, ledger_head, entries, h.engine_state),
            )
            return
        conn.executemany(
            "INSERT INTO state_entries (section, key, data) VALUES (?, ?, ?) "
            "ON CONFLICT (section, key) DO UPDATE SET data = excluded.data",
            [change for change in delta.changes if change[2] is not None],
        )
        conn.executemany(
            "DELETE FROM state_entries WHERE section = ? AND key = ?",
            [(section, key) for section, key, data in delta.changes if data is None],
        )
        conn.execute(
            "UPDATE head SET executed_height = ?, ledger_head = ?, ledger_entries = ?, "
            "engine_state = NULL, state_prefix = NULL, state_suffix = NULL, "
            "state_header = ? WHERE id = 1",
            (h.height, ledger_head, entries, delta.header),
        )

    async def install_checkpoint(self, checkpoint: Checkpoint, state: EngineState) -> None:
        """Start an empty store at `checkpoint` with `state` (the state after its height,
        fetched from a snapshot and checked against the root f+1 members signed: sidecar/
        snapshots.py), in one transaction: the state by entry, the head, the checkpoint.
        The next height recorded is `checkpoint.height + 1`."""
        if state.last_height != checkpoint.height:
            raise ValueError(
                f"a state after height {state.last_height} for a checkpoint at {checkpoint.height}"
            )
        state.restart_delta()
        delta = state.take_delta()
        state.restart_delta()  # the engine built on this state records everything first
        async with self._lock:
            self._check_open()
            if self._executed_height != 0 or self._checkpoint is not None:
                raise SidecarStoreError(
                    f"{self._path}: holds heights up to {self._executed_height}; a snapshot "
                    "is installed into an empty store only"
                )

            def write(c: sqlite3.Connection) -> None:
                c.execute("DELETE FROM state_entries")
                c.executemany(
                    "INSERT INTO state_entries (section, key, data) VALUES (?, ?, ?)",
                    [change for change in delta.changes if change[2] is not None],
                )
                c.execute(
                    "UPDATE head SET executed_height = ?, ledger_head = ?, ledger_entries = ?, "
                    "engine_state = NULL, state_prefix = NULL, state_suffix = NULL, "
                    "state_header = ? WHERE id = 1",
                    (checkpoint.height, checkpoint.ledger_head, checkpoint.ledger_entries,
                     delta.header),
                )  # fmt: skip
                c.executemany(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                    _checkpoint_rows(checkpoint),
                )

            await transaction(self._conn, write, "BEGIN IMMEDIATE")
            self._executed_height = checkpoint.height
            self._ledger_head = checkpoint.ledger_head
            self._ledger_entries = checkpoint.ledger_entries
            self._state_by_entry = True
            self._checkpoint = checkpoint

    async def prune_to(self, checkpoint: Checkpoint, signature: CheckpointSignature) -> PruneResult:
        """Drop the ledger rows, receipts, block statements and rejection artifacts of every
        height at and below `checkpoint.height`, and start local history after it
        (docs/pruning.md), in one transaction; then give the freed pages back to the file
        system. The checkpoint must be where this store stands at that height (its ledger
        head and entry count, its own signed state root and block): a checkpoint that
        disagrees is refused and nothing is dropped. Pending cards stay (a card still
        awaiting its confirmation is read by proposal id)."""
        async with self._lock:
            self._check_open()
            base = self._checkpoint.height if self._checkpoint is not None else 0
            if not base < checkpoint.height <= self._executed_height:
                raise SidecarStoreError(
                    f"{self._path}: cannot prune at height {checkpoint.height}: local history "
                    f"holds heights {base + 1} to {self._executed_height}"
                )
            before = _file_bytes(self._path)
            floor = self._checkpoint

            def write(c: sqlite3.Connection) -> tuple[int, int, int]:
                problem = _checkpoint_problem(c, checkpoint, floor)
                if problem is not None:
                    raise SidecarStoreError(f"{self._path}: {problem}; nothing pruned")
                counts = tuple(
                    c.execute(
                        f"DELETE FROM {table} WHERE height <= ?", (checkpoint.height,)
                    ).rowcount
                    for table in ("ledger", "receipts", "artifacts")
                )
                c.execute("DELETE FROM blocks WHERE height <= ?", (checkpoint.height,))
                rows = [
                    *_checkpoint_rows(checkpoint),
                    ("checkpoint_signer", str(signature.signer)),
                    ("checkpoint_signature", signature.signature.hex()),
                ]
                c.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", rows)
                return counts[0], counts[1], counts[2]

            ledger_rows, receipts, artifacts = await transaction(
                self._conn, write, "BEGIN IMMEDIATE"
            )
            self._checkpoint = checkpoint
            self._checkpoint_signature = signature
            self._artifact_count -= artifacts
            for pruned in [k for k in self._recent_roots if k <= checkpoint.height]:
                del self._recent_roots[pruned]
            vacuumed = await on_thread(self._conn, _give_back_pages)
        return PruneResult(
            checkpoint.height, ledger_rows, receipts, artifacts, before,
            _file_bytes(self._path), vacuumed,
        )  # fmt: skip

    async def attestation_at(self, height: int) -> tuple[SignedBlock, Checkpoint] | None:
        """This sidecar's signed statement for an executed `height` and where it stood
        there (ledger head and entry count, block hash and time): what it says to a peer
        fetching a snapshot of that height (sidecar/snapshots.py). None for a height it
        holds no statement of."""

        def read(c: sqlite3.Connection) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
            c.execute("BEGIN")  # one read snapshot: a pruning writer moves the checkpoint
            try:
                block = c.execute(
                    f"SELECT {_BLOCK_COLUMNS}, block_hash FROM blocks WHERE height = ?", (height,)
                ).fetchall()
                last = c.execute(
                    "SELECT hash FROM ledger WHERE height <= ? "
                    "ORDER BY height DESC, idx DESC LIMIT 1",
                    (height,),
                ).fetchall()
                count = c.execute(
                    "SELECT COUNT(*) FROM ledger WHERE height <= ?", (height,)
                ).fetchall()
                meta = c.execute("SELECT key, value FROM meta").fetchall()
            finally:
                c.execute("COMMIT")
            return block, last, count, meta

        if height < 1:
            return None
        async with self._lock:
            self._check_open()
            block, last, count, meta = await on_thread(self._conn, read)
        if not block:
            return None
        signed = _signed_from_row(block[0][:-1])
        # The checkpoint as read with the rows (a store read while its writer prunes:
        # docs/pruning.md), not as this connection found it at open.
        base = _checkpoint_from_meta({str(k): str(v) for k, v in meta}, self._path)
        head = (
            bytes(last[0][0])
            if last
            else (base.ledger_head if base is not None else GENESIS_PREV_HASH)
        )
        entries = int(count[0][0]) + (base.ledger_entries if base is not None else 0)
        time_ms = int(block[0][6])
        return signed, Checkpoint(
            height, signed.state_root, head, entries, bytes(block[0][-1]), time_ms
        )

    def _before_history(self, height: int) -> bytes:
        """The ledger head below `height` when no entry below it is stored: the
        checkpoint's above the checkpoint, else the genesis value."""
        base = self._checkpoint
        return base.ledger_head if base is not None and height > base.height else GENESIS_PREV_HASH

    # ================================================================== reading

    async def root_at(self, height: int) -> bytes | None:
        """The state root after `height`, from this sidecar's signed block statement: for
        the `RECENT_ROOTS_MAX` newest heights this process recorded, kept by `record` once
        its transaction committed (a recorded height never changes; pruning drops it here
        too), without a trip to the connection's thread; else read now."""
        self._check_open()
        root = self._recent_roots.get(height)
        if root is not None:
            return root
        async with self._lock:
            self._check_open()
            value = await self._scalar("SELECT state_root FROM blocks WHERE height = ?", (height,))
        return None if value is None else bytes(value)

    async def signed_block(self, height: int) -> SignedBlock | None:
        async with self._lock:
            self._check_open()
            rows = list(
                await self._conn.execute_fetchall(
                    f"SELECT {_BLOCK_COLUMNS} FROM blocks WHERE height = ?",
                    (height,),
                )
            )
        return _signed_from_row(rows[0]) if rows else None

    async def height_rows(self, height: int) -> HeightRows:
        """What the self-audit of one height reads, in one trip to the connection's thread:
        the signed block statement, the receipts and the ledger entries of the height (as
        `signed_block`, `receipts_at` and `ledger_at`), and `ledger_hash_before(height)`.
        Raises `SidecarStoreError` for a ledger row that is not an entry."""
        async with self._lock:
            self._check_open()
            raw = await on_thread(self._conn, lambda c: _read_height(c, height))
        return self._height_rows_of(height, raw)

    def _height_rows_of(self, height: int, raw: _RawHeight) -> HeightRows:
        block, receipt_rows, ledger_rows, before = raw
        signed = _signed_from_row(block[0]) if block else None
        receipts = [self._receipt_from_row(row) for row in receipt_rows]
        try:
            entries = [_entry_from_row(row) for row in ledger_rows]
        except (TypeError, ValueError) as err:
            raise SidecarStoreError(
                f"{self._path}: a ledger row at height {height}: {err}"
            ) from err
        previous = self._before_history(height) if not before else bytes(before[0][0])
        return signed, receipts, entries, previous

    async def receipt(self, proposal_id: bytes) -> Receipt | None:
        """The newest verdict answering `proposal_id`: a pending proposal later confirmed
        has two, and the confirmation's is returned.

        A *rejected* verdict never supersedes an earlier one: a Confirm that settles
        nothing (wrong card digest, unauthorized confirmer) is rejected with the proposal
        id it named, and a replayed copy of a transaction is rejected under its original
        id; neither answers the proposal, so anyone able to get such a transaction
        committed cannot mask its real verdict. A rejection is returned only when it is
        all there is (an unattributable or refused transaction's own receipt)."""
        async with self._lock:
            self._check_open()
            rows = list(
                await self._conn.execute_fetchall(
                    _RECEIPT_SELECT + "WHERE r.proposal_id = ? "
                    "ORDER BY (r.outcome = 'rejected'), r.height DESC, r.idx DESC LIMIT 1",
                    (proposal_id,),
                )
            )
        return self._receipt_from_row(rows[0]) if rows else None

    async def receipts_from(self, height: int, limit: int) -> list[Receipt]:
        """Receipts from `height` upwards in (height, index) order, at most `limit` and
        at most `RECEIPTS_PAGE_MAX` of them."""
        limit = _page(limit, RECEIPTS_PAGE_MAX)
        async with self._lock:
            self._check_open()
            rows = await self._conn.execute_fetchall(
                _RECEIPT_SELECT + "WHERE r.height >= ? ORDER BY r.height, r.idx LIMIT ?",
                (max(height, 0), limit),
            )
        return [self._receipt_from_row(row) for row in rows]

    async def receipts_at(self, height: int) -> list[Receipt]:
        """Every receipt of one height, in leaf order (a height's receipts are bounded by
        its block's transaction count)."""
        async with self._lock:
            self._check_open()
            rows = await self._conn.execute_fetchall(
                _RECEIPT_SELECT + "WHERE r.height = ? ORDER BY r.idx", (height,)
            )
        return [self._receipt_from_row(row) for row in rows]

    async def card(self, proposal_id: bytes) -> bytes | None:
        """The confirmation card bytes of `proposal_id`'s pending verdict, if it had one
        (kept after it is confirmed or expires: it is what was approved)."""
        async with self._lock:
            self._check_open()
            value = await self._scalar(
                "SELECT data FROM cards WHERE proposal_id = ?", (proposal_id,)
            )
        return None if value is None else bytes(value)

    async def artifacts(self, limit: int, offset: int = 0) -> list[tuple[int, str, bytes]]:
        """(height, canonical target, artifact bytes) in key order, at most `limit` and at
        most `ARTIFACTS_PAGE_MAX`, skipping the first `offset`."""
        return [(h, t, d) for h, t, d, _ in await self.artifact_rows(limit, offset)]

    async def artifacts_at(self, height: int) -> dict[str, bytes]:
        """The artifacts of one height, by canonical target (a block's denials are bounded
        by its transaction count)."""
        async with self._lock:
            self._check_open()
            rows = await self._conn.execute_fetchall(
                "SELECT canonical_target, data FROM artifacts WHERE height = ?", (height,)
            )
        return {str(target): bytes(data) for target, data in rows}

    async def artifact_rows(
        self, limit: int, offset: int = 0
    ) -> list[tuple[int, str, bytes, list[dict[str, Any]]]]:
        """As `artifacts`, with each artifact's denials as JSON objects (for listings)."""
        limit = _page(limit, ARTIFACTS_PAGE_MAX)
        if offset < 0:
            raise ValueError("offset must not be negative")
        async with self._lock:
            self._check_open()
            rows = await self._conn.execute_fetchall(
                "SELECT height, canonical_target, data, denials FROM artifacts "
                "ORDER BY height, canonical_target LIMIT ? OFFSET ?",
                (limit, offset),
            )
        result: list[tuple[int, str, bytes, list[dict[str, Any]]]] = []
        for height, target, data, denials in rows:
            try:
                decoded = json.loads(denials)
            except (TypeError, ValueError) as err:
                raise SidecarStoreError(
                    f"{self._path}: artifact (height {height}, {target!r}) has an "
                    f"unreadable denial list: {err}"
                ) from err
            result.append((int(height), str(target), bytes(data), list(decoded)))
        return result

    async def ledger(self, from_height: int, limit: int, from_index: int = 0) -> list[LedgerEntry]:
        """Ledger entries from (from_height, from_index) onwards in (height, index) order,
        at most `limit` and at most `LEDGER_PAGE_ROWS_MAX`. Raises `SidecarStoreError` for a
        row that is not an entry (use `verify_ledger` to find the first bad one)."""
        limit = _page(limit, LEDGER_PAGE_ROWS_MAX)
        async with self._lock:
            self._check_open()
            rows = await self._conn.execute_fetchall(
                f"SELECT {_LEDGER_COLUMNS} FROM ledger "
                "WHERE height > ? OR (height = ? AND idx >= ?) ORDER BY height, idx LIMIT ?",
                (from_height, from_height, from_index, limit),
            )
        entries: list[LedgerEntry] = []
        for row in rows:
            try:
                entries.append(_entry_from_row(row))
            except (TypeError, ValueError) as err:
                raise SidecarStoreError(
                    f"{self._path}: ledger row at height {row[0]}, index {row[1]} is not an "
                    f"entry: {err}"
                ) from err
        return entries

    async def ledger_at(self, height: int) -> list[LedgerEntry]:
        """The ledger entries of one height, in index order (bounded by its block's
        transaction count). Raises `SidecarStoreError` for a row that is not an entry."""
        async with self._lock:
            self._check_open()
            rows = await self._conn.execute_fetchall(
                f"SELECT {_LEDGER_COLUMNS} FROM ledger WHERE height = ? ORDER BY idx", (height,)
            )
        try:
            return [_entry_from_row(row) for row in rows]
        except (TypeError, ValueError) as err:
            raise SidecarStoreError(
                f"{self._path}: a ledger row at height {height}: {err}"
            ) from err

    async def heights_holding(
        self, low: int, high: int, principal: str | None, tx_ids: Collection[bytes]
    ) -> list[int]:
        """The heights from `low` to `high` with a ledger entry whose principal is
        `principal` or whose transaction is in `tx_ids` (at most `OWN_TX_IDS_MAX` of
        them), ascending: one range read where a reader would otherwise read every
        height's ledger to find its own."""
        ids = list(tx_ids)[:OWN_TX_IDS_MAX]
        terms = ["tx_id IN (" + ", ".join("?" * len(ids)) + ")"] if ids else []
        if principal is not None:
            terms.append("principal = ?")
        if not terms:
            return []
        async with self._lock:
            self._check_open()
            rows = await self._conn.execute_fetchall(
                "SELECT DISTINCT height FROM ledger WHERE height BETWEEN ? AND ? AND ("
                + " OR ".join(terms)
                + ") ORDER BY height",
                (low, high, *ids, *([principal] if principal is not None else [])),
            )
        return [int(row[0]) for row in rows]

    async def principal_at(self, height: int, index: int) -> str | None:
        """The principal of the verdict at (height, index), from the ledger."""
        async with self._lock:
            self._check_open()
            value = await self._scalar(
                "SELECT principal FROM ledger WHERE height = ? AND idx = ?", (height, index)
            )
        return None if value is None else str(value)

    async def ledger_hash_before(self, height: int) -> bytes:
        """The hash of the last ledger entry below `height` (the genesis value if none):
        what the first entry of `height` must chain after."""
        async with self._lock:
            self._check_open()
            value = await self._scalar(
                "SELECT hash FROM ledger WHERE height < ? ORDER BY height DESC, idx DESC LIMIT 1",
                (height,),
            )
        return self._before_history(height) if value is None else bytes(value)

    async def verify_ledger(self) -> LedgerProblem | None:
        """The first bad ledger entry, or None when the whole chain holds.

        Walks the table in insertion order, `LEDGER_PAGE_ROWS_MAX` rows at a time,
        recomputing every hash from the stored columns (sidecar/ledger.py's
        `ChainVerifier`), and finally checks that the chain ends at the recorded head with
        the recorded number of entries (which catches rows cut off the end). Holds the
        store for the whole walk, so it sees one consistent ledger. A store installed from
        a snapshot is walked from its checkpoint: the first entry chains to the
        checkpoint's ledger head, and its entries count after the checkpoint's."""
        async with self._lock:
            self._check_open()
            # One read transaction for the walk: a reader opened beside the running sidecar
            # (`ledger verify`, the tests) would otherwise see each page, the checkpoint and
            # the head at different moments while the sidecar appends and prunes.
            await self._conn.execute("BEGIN")
            try:
                return await self._walk_ledger()
            finally:
                await self._conn.execute("COMMIT")

    async def _walk_ledger(self) -> LedgerProblem | None:
        meta = {
            str(key): str(value)
            for key, value in await self._conn.execute_fetchall("SELECT key, value FROM meta")
        }
        base = _checkpoint_from_meta(meta, self._path)
        verifier = ChainVerifier(self._chain_id)
        if base is not None:
            verifier.head, verifier.count = base.ledger_head, base.ledger_entries
            verifier.last = (base.height, LEDGER_INDEX_AFTER_ALL)
        after = 0
        while True:
            rows = list(
                await self._conn.execute_fetchall(
                    f"SELECT rowid, {_LEDGER_COLUMNS} FROM ledger WHERE rowid > ? "
                    "ORDER BY rowid LIMIT ?",
                    (after, LEDGER_PAGE_ROWS_MAX),
                )
            )
            for row in rows:
                try:
                    entry = _entry_from_row(row[1:])
                except (TypeError, ValueError) as err:
                    height = row[1] if isinstance(row[1], int) else -1
                    index = row[2] if isinstance(row[2], int) else -1
                    return verifier.unreadable(height, index, f"not an entry: {err}")
                problem = verifier.feed(entry)
                if problem is not None:
                    return problem
            if len(rows) < LEDGER_PAGE_ROWS_MAX:
                break
            after = int(rows[-1][0])
        rows = list(
            await self._conn.execute_fetchall(
                "SELECT ledger_head, ledger_entries FROM head WHERE id = 1"
            )
        )
        if not rows:
            raise SidecarStoreError(f"{self._path}: the head record is missing")
        head, count = rows[0]
        return verifier.finish(expected_head=bytes(head), expected_count=int(count))

    # ================================================================== operations

    async def wipe(self, *, keep_artifacts: bool = False) -> None:
        """Forget every executed height — ledger, receipts, signed blocks, cards, engine
        state — in one transaction, keeping the chain id: an operator's replay from
        scratch. With `keep_artifacts`, the rejection artifacts stay, and the replay
        checks every one of them byte for byte (`DivergenceError` on a difference): the
        replay drill of docs/drills.md.

        An operator's step, taken while no engine runs on this store."""
        async with self._lock:
            self._check_open()
            conn = self._conn
            await conn.execute("BEGIN IMMEDIATE")
            try:
                for table in (
                    "ledger", "receipts", "blocks", "cards", "state_agents", "state_entries",
                ):  # fmt: skip
                    await conn.execute(f"DELETE FROM {table}")
                if not keep_artifacts:
                    await conn.execute("DELETE FROM artifacts")
                await conn.executemany(
                    "DELETE FROM meta WHERE key = ?",
                    [(key,) for key in _CHECKPOINT_KEYS + _SIGNATURE_KEYS],
                )
                await conn.execute(
                    "UPDATE head SET executed_height = 0, ledger_head = ?, ledger_entries = 0, "
                    "engine_state = NULL, state_prefix = NULL, state_suffix = NULL, "
                    "state_header = NULL WHERE id = 1",
                    (GENESIS_PREV_HASH,),
                )
                await conn.execute("COMMIT")
            except BaseException:
                await self._rollback()
                raise
            self._executed_height = 0
            self._ledger_head = GENESIS_PREV_HASH
            self._ledger_entries = 0
            self._state_by_entry = False
            self._checkpoint = None
            self._checkpoint_signature = None
            if not keep_artifacts:
                self._artifact_count = 0

    # ================================================================== internals

    def _check_open(self) -> None:
        if self._closed:
            raise AssertionError("the sidecar store is closed")

    async def _rollback(self) -> None:
        if self._conn.in_transaction:
            await self._conn.execute("ROLLBACK")

    async def _scalar(self, sql: str, params: Iterable[Any] = ()) -> Any:
        rows = list(await self._conn.execute_fetchall(sql, tuple(params)))
        return rows[0][0] if rows else None

    def _receipt_from_row(self, row: Sequence[Any]) -> Receipt:
        (height, index, tx_id, proposal_id, kind, outcome, reason, target_digest,
         card_digest, mandate_version, body_digest, path, *block) = row  # fmt: skip
        path = bytes(path)
        if len(path) % HASH_BYTES or len(path) // HASH_BYTES > PATH_HASHES_MAX:
            raise SidecarStoreError(
                f"{self._path}: receipt at height {height}, index {index} has a damaged path"
            )
        leaf = ReceiptLeaf(
            height=int(height),
            index=int(index),
            tx_id=bytes(tx_id),
            proposal_id=bytes(proposal_id),
            kind=str(kind),
            outcome=str(outcome),
            reason=str(reason),
            target_digest=bytes(target_digest),
            card_digest=bytes(card_digest),
            mandate_version=int(mandate_version),
            body_digest=bytes(body_digest),
        )
        hashes = tuple(path[i : i + HASH_BYTES] for i in range(0, len(path), HASH_BYTES))
        return Receipt(leaf=leaf, path=hashes, block=_signed_from_row([height, *block]))


# ==================================================================== helpers


def _take_writer_lock(path: Path) -> int:
    """An exclusive, non-blocking flock on `<db>.lock`, held while the store is open."""
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        raise SidecarStoreError(
            f"{path}: in use by another process (a running sidecar writes this store; "
            f"operator commands read it with read_only=True)"
        ) from err
    return fd


def _release_writer_lock(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _page(limit: int, maximum: int) -> int:
    if limit < 0:
        raise ValueError("limit must not be negative")
    return min(limit, maximum)


def _check_shape(chain_id: str, h: ExecutedHeight) -> None:
    """The caller's half of the contract: what it hands over belongs together. A mismatch
    is our own broken invariant, which stops the process (docs/development.md, "Habits"),
    raised even under `python -O`."""
    result, signed = h.result, h.signed
    problems: list[str] = []
    if result.height != h.height or signed.height != h.height:
        problems.append(
            f"heights disagree (record {h.height}, result {result.height}, signed {signed.height})"
        )
    if result.block_time_ms != h.block_time_ms:
        problems.append("block time disagrees with the result's")
    if signed.validity is not None and signed.validity.block_time_ms != h.block_time_ms:
        problems.append("the signed validity window starts at another block time")
    count = len(result.verdicts)
    if not len(h.leaves) == len(h.paths) == signed.leaf_count == count:
        problems.append(
            f"{count} verdicts, {len(h.leaves)} leaves, {len(h.paths)} paths, "
            f"signed leaf count {signed.leaf_count}"
        )
    if signed.state_root != result.state_root:
        problems.append("the signed state root is not the result's")
    if len(h.block_hash) != HASH_BYTES:
        problems.append("the block hash is not a SHA-256 hash")
    delta = h.state_delta
    if delta is None and not h.engine_state:
        problems.append("no engine state")
    if delta is not None and any(
        not 0 <= section < len(SECTIONS) for section, _, _ in delta.changes
    ):
        problems.append("a state change names no section")
    for index, (verdict, leaf) in enumerate(zip(result.verdicts, h.leaves, strict=False)):
        if leaf != leaf_from_verdict(h.height, index, verdict):
            problems.append(f"leaf {index} does not match verdict {index}")
            break
    for index, path in enumerate(h.paths):
        if len(path) > PATH_HASHES_MAX or any(len(p) != HASH_BYTES for p in path):
            problems.append(f"path {index} is not a list of at most {PATH_HASHES_MAX} hashes")
            break
    keys: set[str] = set()
    for artifact in result.artifacts:
        if artifact.height != h.height or artifact.chain_id != chain_id:
            problems.append(f"artifact {artifact.key} is not of this height and chain")
            break
        keys.add(artifact.canonical_target)
    if len(keys) != len(result.artifacts):
        problems.append("two artifacts for one key in one height")
    cards = [v.proposal_id for v in result.verdicts if v.card is not None]
    if len(set(cards)) != len(cards):
        problems.append("two confirmation cards for one proposal in one height")
    if problems:
        raise AssertionError(f"executed height {h.height} is inconsistent: " + "; ".join(problems))


def _ledger_row(entry: LedgerEntry) -> tuple[Any, ...]:
    return (
        entry.height, entry.index, entry.tx_id, entry.proposal_id, entry.kind, entry.outcome,
        entry.reason, entry.mandate_version, entry.principal, entry.canonical_target,
        entry.target_digest, entry.card_digest,
        json.dumps(list(entry.argument_names), ensure_ascii=False, separators=(",", ":")),
        entry.prev_hash, entry.hash, extra_to_json(entry),
    )  # fmt: skip


# One height's rows as `_read_height` reads them, and as `height_rows` parses them: the
# signed block statement, the receipts, the ledger entries and the hash before them.
_RawHeight = tuple[list[Any], list[Any], list[Any], list[Any]]
HeightRows = tuple[SignedBlock | None, list[Receipt], list[LedgerEntry], bytes]


def _read_height(c: sqlite3.Connection, height: int) -> _RawHeight:
    """One height's rows (on the connection's thread)."""
    block = c.execute(f"SELECT {_BLOCK_COLUMNS} FROM blocks WHERE height = ?", (height,)).fetchall()
    receipts = c.execute(
        _RECEIPT_SELECT + "WHERE r.height = ? ORDER BY r.idx", (height,)
    ).fetchall()
    ledger = c.execute(
        f"SELECT {_LEDGER_COLUMNS} FROM ledger WHERE height = ? ORDER BY idx", (height,)
    ).fetchall()
    before = c.execute(
        "SELECT hash FROM ledger WHERE height < ? ORDER BY height DESC, idx DESC LIMIT 1",
        (height,),
    ).fetchall()
    return block, receipts, ledger, before


def _signed_from_row(row: Sequence[Any]) -> SignedBlock:
    """A `_BLOCK_COLUMNS` row as the statement this sidecar signed."""
    (height, verdict_root, state_root, leaf_count, signer, signature, time_ms, until_ms,
     epoch) = row  # fmt: skip
    validity = None if until_ms is None else Validity(int(time_ms), int(until_ms))
    return SignedBlock(
        int(height), bytes(verdict_root), bytes(state_root), int(leaf_count), int(signer),
        bytes(signature), validity, int(epoch),
    )  # fmt: skip


def _entry_from_row(row: Sequence[Any]) -> LedgerEntry:
    """A stored row as an entry; `ValueError` / `TypeError` for one that is not (the
    entry's own checks refuse a wrong type, length or range)."""
    (height, index, tx_id, proposal_id, kind, outcome, reason, mandate_version, principal,
     canonical_target, target_digest, card_digest, argument_names, prev_hash,
     hash_, extension) = row  # fmt: skip
    names = json.loads(argument_names) if isinstance(argument_names, str) else None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError("argument_names is not a JSON list of text")
    return LedgerEntry(
        height=height,
        index=index,
        tx_id=tx_id,
        proposal_id=proposal_id,
        kind=kind,
        outcome=outcome,
        reason=reason,
        mandate_version=mandate_version,
        principal=principal,
        canonical_target=canonical_target,
        target_digest=target_digest,
        card_digest=card_digest,
        argument_names=tuple(names),
        prev_hash=prev_hash,
        hash=hash_,
        **extra_from_column(extension),
    )


def _denials_json(artifact: RejectionArtifact) -> str:
    return json.dumps(
        [
            {
                "proposal_id": d.proposal_id.hex(),
                "principal": d.principal,
                "reason": d.reason.value,
                "mandate_version": d.mandate_version,
                "argument_names": list(d.argument_names),
            }
            for d in artifact.denials
        ],
        ensure_ascii=False,
        separators=(",", ":"),
    )


def _checkpoint_problem(
    c: sqlite3.Connection, checkpoint: Checkpoint, floor: Checkpoint | None
) -> str | None:
    """Why `checkpoint` is not where this store stands at its height, or None. (On the
    connection's thread, inside `prune_to`'s transaction.)"""
    height = checkpoint.height
    block = c.execute(
        "SELECT state_root, block_hash, block_time_ms FROM blocks WHERE height = ?", (height,)
    ).fetchall()
    if not block:
        return f"no block statement of height {height}"
    last = c.execute(
        "SELECT hash FROM ledger WHERE height <= ? ORDER BY height DESC, idx DESC LIMIT 1",
        (height,),
    ).fetchall()
    count = int(c.execute("SELECT COUNT(*) FROM ledger WHERE height <= ?", (height,)).fetchone()[0])
    head = bytes(last[0][0]) if last else (floor.ledger_head if floor else GENESIS_PREV_HASH)
    count += floor.ledger_entries if floor is not None else 0
    state_root, block_hash, time_ms = block[0]
    stood = Checkpoint(height, bytes(state_root), head, count, bytes(block_hash), int(time_ms))
    if stood != checkpoint:
        return f"the checkpoint of height {height} is not where this store stands there"
    return None


def _give_back_pages(c: sqlite3.Connection) -> bool:
    """Return the pages pruning freed to the file system (docs/pruning.md): a store made
    with incremental vacuum frees them in place; an older file is rebuilt once by VACUUM,
    which turns incremental vacuum on (it rewrites the whole file, holding the store for
    as long). Then the write-ahead log is checkpointed and truncated. True when a VACUUM
    ran. (On the connection's thread, outside any transaction.)"""
    vacuumed = int(c.execute("PRAGMA auto_vacuum").fetchone()[0]) != 2  # 2 = INCREMENTAL
    if vacuumed:
        c.execute("PRAGMA auto_vacuum=INCREMENTAL")
        c.execute("VACUUM")
    else:
        # Stepped to the end by executescript: one step frees one page.
        c.executescript("PRAGMA incremental_vacuum;")
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    return vacuumed
