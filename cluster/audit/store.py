"""The copy's tables in PostgreSQL (docs/audit.md, "The tables"), and the one transaction
that writes a batch: its verdicts, its batch row and the shipper's cursor together, so that
a batch is either wholly in the copy with the cursor past it, or not at all; a batch sent
again (after a crash, or a commit whose answer was lost) finds its key and writes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

import psycopg

from quorumgate.audit.records import Batch, Cursor, ShippedVerdict
from quorumgate.sidecar.ledger import (
    GENESIS_PREV_HASH,
    LedgerEntry,
    extra_from_column,
    extra_to_json,
)
from quorumgate.sidecar.wire import decode_certificate, encode_certificate

VERIFY_PAGE_ROWS_MAX = 1000  # rows `audit verify` reads per query

SCHEMA = """
CREATE TABLE IF NOT EXISTS qg_verdicts (
    chain_id text NOT NULL,
    height bigint NOT NULL,
    idx integer NOT NULL,
    tx_id bytea NOT NULL,
    proposal_id bytea NOT NULL,
    kind text NOT NULL,
    outcome text NOT NULL,
    reason text NOT NULL,
    mandate_version bigint NOT NULL,
    principal text NOT NULL,
    canonical_target text NOT NULL,
    target_digest bytea NOT NULL,
    card_digest bytea NOT NULL,
    argument_names text NOT NULL,
    prev_hash bytea NOT NULL,
    hash bytea NOT NULL,
    certificate bytea NOT NULL,
    batch_key text NOT NULL,
    PRIMARY KEY (chain_id, height, idx)
);
CREATE TABLE IF NOT EXISTS qg_batches (
    batch_key text PRIMARY KEY,
    chain_id text NOT NULL,
    first_height bigint NOT NULL,
    first_idx integer NOT NULL,
    last_height bigint NOT NULL,
    last_idx integer NOT NULL,
    verdicts integer NOT NULL,
    head bytea NOT NULL,
    shipped_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS qg_ship_cursor (
    chain_id text PRIMARY KEY,
    height bigint NOT NULL,
    idx integer NOT NULL,
    head bytea NOT NULL,
    entries bigint NOT NULL
);
ALTER TABLE qg_verdicts ADD COLUMN IF NOT EXISTS extension text NOT NULL DEFAULT '';
"""
# The one change to a copy made before argument commitments (docs/audit.md, "Argument
# commitments"): `extension`, a version-2 entry's commitments and sealed salts as one JSON
# object, "" for a version-1 entry. `connect` (the shipper) adds it; `audit verify` and
# `audit open` only read, and refuse a copy without it by name.
EXTENSION_COLUMN = "extension"
NEEDS_MIGRATION = (
    "the copy predates argument commitments (no qg_verdicts.extension column): run "
    "`quorumgate ship --once` against it once, which adds the column"
)


class CopyTooOld(Exception):
    """The copy's tables lack a column this build reads."""


_COLUMNS = (
    "height, idx, tx_id, proposal_id, kind, outcome, reason, mandate_version, principal, "
    "canonical_target, target_digest, card_digest, argument_names, prev_hash, hash, extension"
)


class Written(StrEnum):
    WRITTEN = "written"
    ALREADY = "already"  # the same batch key is in the copy: a resend, nothing written


class CursorMoved(Exception):
    """The copy's cursor is not where this batch starts: another shipper wrote, or the
    batch is not the next one. Nothing was written."""


def connect(dsn: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(SCHEMA)
    return conn


def read_cursor(conn: psycopg.Connection[Any], chain_id: str) -> Cursor:
    row = conn.execute(
        "SELECT height, idx, head, entries FROM qg_ship_cursor WHERE chain_id = %s", (chain_id,)
    ).fetchone()
    if row is None:
        return Cursor(0, 0, GENESIS_PREV_HASH, 0)
    return Cursor(int(row[0]), int(row[1]), bytes(row[2]), int(row[3]))


def _verdict_row(batch: Batch, verdict: ShippedVerdict) -> tuple[object, ...]:
    e = verdict.entry
    return (
        batch.chain_id, e.height, e.index, e.tx_id, e.proposal_id, e.kind, e.outcome, e.reason,
        e.mandate_version, e.principal, e.canonical_target, e.target_digest, e.card_digest,
        json.dumps(list(e.argument_names)), e.prev_hash, e.hash, extra_to_json(e),
        encode_certificate(verdict.certificate), batch.key,
    )  # fmt: skip


def write_batch(conn: psycopg.Connection[Any], batch: Batch, cursor: Cursor) -> Written:
    """Write `batch`, which starts after `cursor`, in one transaction with the new cursor."""
    first, last = batch.verdicts[0].entry, batch.verdicts[-1].entry
    after = batch.after(cursor)
    with conn.transaction():
        inserted = conn.execute(
            "INSERT INTO qg_batches (batch_key, chain_id, first_height, first_idx, last_height,"
            " last_idx, verdicts, head) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (batch_key) DO NOTHING RETURNING batch_key",
            (batch.key, batch.chain_id, first.height, first.index, last.height, last.index,
             len(batch.verdicts), last.hash),
        ).fetchone()  # fmt: skip
        if inserted is None:
            return Written.ALREADY
        moved = conn.execute(
            "INSERT INTO qg_ship_cursor AS c (chain_id, height, idx, head, entries)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (chain_id) DO UPDATE SET"
            " height = EXCLUDED.height, idx = EXCLUDED.idx, head = EXCLUDED.head,"
            " entries = EXCLUDED.entries WHERE c.head = %s AND c.entries = %s"
            " RETURNING chain_id",
            (batch.chain_id, after.height, after.index, after.head, after.entries,
             cursor.head, cursor.entries),
        ).fetchone()  # fmt: skip
        if moved is None:
            raise CursorMoved(f"the copy's cursor is not at {cursor.head.hex()[:16]}…")
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO qg_verdicts (chain_id, {_COLUMNS}, certificate, batch_key)"
                " VALUES (" + ", ".join(["%s"] * 19) + ")",
                [_verdict_row(batch, v) for v in batch.verdicts],
            )
    return Written.WRITTEN


def require_extension(conn: psycopg.Connection[Any]) -> None:
    """`CopyTooOld` for a copy whose verdict table has no `extension` column yet."""
    row = conn.execute(
        "SELECT 1 FROM information_schema.columns WHERE table_name = 'qg_verdicts'"
        " AND column_name = %s",
        (EXTENSION_COLUMN,),
    ).fetchone()
    if row is None:
        raise CopyTooOld(NEEDS_MIGRATION)


def read_rows(conn: psycopg.Connection[Any], chain_id: str) -> Iterator[tuple[Any, ...]]:
    """Every verdict row of a chain in (height, idx) order, a page at a time: the entry's
    columns then the certificate bytes."""
    require_extension(conn)
    height, index = -1, -1
    while True:
        rows = conn.execute(
            f"SELECT {_COLUMNS}, certificate FROM qg_verdicts WHERE chain_id = %s"
            " AND (height, idx) > (%s, %s) ORDER BY height, idx LIMIT %s",
            (chain_id, height, index, VERIFY_PAGE_ROWS_MAX),
        ).fetchall()
        if not rows:
            return
        yield from rows
        height, index = int(rows[-1][0]), int(rows[-1][1])


def entry_of(row: tuple[Any, ...]) -> LedgerEntry:
    """A row's ledger entry; ValueError for a row that is not one."""
    names = json.loads(row[12])
    if not isinstance(names, list):
        raise ValueError("argument_names is not a list")
    return LedgerEntry(
        height=int(row[0]), index=int(row[1]), tx_id=bytes(row[2]), proposal_id=bytes(row[3]),
        kind=row[4], outcome=row[5], reason=row[6], mandate_version=int(row[7]),
        principal=row[8], canonical_target=row[9], target_digest=bytes(row[10]),
        card_digest=bytes(row[11]), argument_names=tuple(names), prev_hash=bytes(row[13]),
        hash=bytes(row[14]), **extra_from_column(row[15]),
    )  # fmt: skip


def read_row(
    conn: psycopg.Connection[Any], chain_id: str, height: int, index: int
) -> tuple[Any, ...] | None:
    """One verdict row (as `read_rows` gives it), or None."""
    require_extension(conn)
    row = conn.execute(
        f"SELECT {_COLUMNS}, certificate FROM qg_verdicts WHERE chain_id = %s"
        " AND height = %s AND idx = %s",
        (chain_id, height, index),
    ).fetchone()
    return None if row is None else tuple(row)


def certificate_of(row: tuple[Any, ...]) -> Any:
    return decode_certificate(bytes(row[16]))


def cursor_leaf_count(conn: psycopg.Connection[Any], chain_id: str, cursor: Cursor) -> int | None:
    """How many verdicts the height of the cursor's entry holds, from that row's
    certificate (None before the first batch, or for a row that is not there)."""
    if not cursor.started:
        return None
    row = read_row(conn, chain_id, cursor.height, cursor.index)
    return None if row is None else int(certificate_of(row).leaf_count)
