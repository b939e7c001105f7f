"""What `quorumgate artifacts` and `quorumgate ledger verify|export` do (docs/operating.md).

Synchronous functions the CLI calls with a sidecar's database path and chain id; each
returns the process exit status and writes what a person (or, with `--json`, a program)
reads to `out`, and errors to `err` (stderr by default):

- `EXIT_OK` (0): done; the ledger verifies.
- `EXIT_PROBLEM` (1): the ledger or an export does not verify (the first bad entry is
  named), or an export would overwrite a different file.
- `EXIT_UNUSABLE` (2): no store to read: missing, of another chain, or not a sidecar
  store.

These commands open the store read-only (sidecar/store.py): they read a running sidecar's
committed heights (WAL lets readers and the one writer work at once), a stopped sidecar's
database, or a copy of its files (`sidecar.db`, and `sidecar.db-wal` if present). They
never create a store: a wrong path is an error, not a new empty ledger that verifies.

Output never holds an argument value (the store has none) and reason codes are shown,
because these are operator tools: an agent is never shown a reason code (it would learn
which rule to dodge; docs/architecture/0007-one-denial-sentence.md), an operator needs it.
Text a verdict carries (canonical targets, principals) is printed with control and
formatting characters escaped, so that a hostile target cannot rewrite the operator's
terminal.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from quorumgate.sidecar.ledger import JSON_LINE_CHARS_MAX, ChainVerifier, LedgerEntry
from quorumgate.sidecar.pruning import checkpoint_signed_by
from quorumgate.sidecar.store import (
    ARTIFACTS_PAGE_MAX,
    LEDGER_INDEX_AFTER_ALL,
    LEDGER_PAGE_ROWS_MAX,
    Checkpoint,
    CheckpointSignature,
    SidecarStore,
    SidecarStoreError,
)

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_UNUSABLE = 2

INDEX_FILE = "index.json"
ARTIFACT_SUFFIX = ".artifact"
FILE_DIGEST_HEX_CHARS = 16  # of sha256(canonical target) in an artifact's file name
# Denials listed per artifact in the human listing; the rest are counted.
LISTED_DENIALS_MAX = 3
# The largest index.json an export reads back (to check it only grows).
INDEX_BYTES_MAX = 256 * 1024 * 1024


def printable(text: str) -> str:
    """`text` with every non-printable character (controls, bidi and other formatting
    characters, line separators) escaped as `\\uXXXX`, and backslashes doubled."""
    out: list[str] = []
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif char.isprintable():
            out.append(char)
        else:
            out.append(f"\\u{ord(char):04x}")
    return "".join(out)


def artifact_file_name(height: int, canonical_target: str) -> str:
    """`<height>-<first 16 hex of sha256(target)>.artifact`: safe on every file system
    whatever the target holds, and sorted by height within a directory listing."""
    digest = hashlib.sha256(canonical_target.encode("utf-8")).hexdigest()
    return f"{height}-{digest[:FILE_DIGEST_HEX_CHARS]}{ARTIFACT_SUFFIX}"


# ==================================================================== artifacts


def list_artifacts(
    db_path: Path, chain_id: str, json_output: bool, out: TextIO, *, err: TextIO | None = None
) -> int:
    """List every rejection artifact in key order (height, canonical target).

    Human output: one line per artifact — height, denial count, the first 16 hex of the
    SHA-256 of its bytes, the canonical target, and who was denied why. `json_output`:
    one JSON object `{"chain_id", "count", "artifacts": [...]}` whose items carry the
    artifact bytes as hex (`data_hex`), their SHA-256, and the denials."""

    async def run(store: SidecarStore) -> int:
        count = 0
        if json_output:
            out.write(f'{{"chain_id":{json.dumps(chain_id)},"artifacts":[')
        else:
            out.write(f"{'height':>8}  {'denials':>7}  {'sha256':<16}  target\n")
        async for height, target, data, denials in _artifact_pages(store):
            digest = hashlib.sha256(data).hexdigest()
            if json_output:
                item = {
                    "height": height,
                    "canonical_target": target,
                    "target_digest": hashlib.sha256(target.encode("utf-8")).hexdigest(),
                    "sha256": digest,
                    "size": len(data),
                    "denials": denials,
                    "data_hex": data.hex(),
                }
                out.write(("," if count else "") + json.dumps(item, separators=(",", ":")))
            else:
                out.write(
                    f"{height:>8}  {len(denials):>7}  {digest[:16]}  {printable(target)}"
                    f"  ({_who_and_why(denials)})\n"
                )
            count += 1
        if json_output:
            out.write(f'],"count":{count}}}\n')
        else:
            out.write(f"{count} artifact{'' if count == 1 else 's'} (chain {chain_id})\n")
        return EXIT_OK

    return _with_store(db_path, chain_id, run, err)


def export_artifacts(
    db_path: Path,
    chain_id: str,
    out_dir: Path,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Write every artifact's bytes to `out_dir/<height>-<sha256(target)[:16]>.artifact`,
    and `out_dir/index.json` mapping each file to its key and digest.

    Idempotent: a file already there with the same bytes is left alone, so an export can
    be repeated as the ledger grows. A file there with *different* bytes is never
    overwritten: the export stops, names the file and the key, and returns
    `EXIT_PROBLEM` (that directory holds another sidecar's or another chain's export).
    Each file appears whole or not at all (written aside, then linked into place)."""
    report = out if out is not None else sys.stdout
    errors = err if err is not None else sys.stderr

    async def run(store: SidecarStore) -> int:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            errors.write(f"quorumgate: cannot create {out_dir}: {error}\n")
            return EXIT_UNUSABLE
        index: list[dict[str, Any]] = []
        written = 0
        async for height, target, data, _ in _artifact_pages(store):
            name = artifact_file_name(height, target)
            path = out_dir / name
            digest = hashlib.sha256(data).hexdigest()
            if path.exists():
                if path.read_bytes() != data:
                    errors.write(
                        f"quorumgate: {path} exists with different bytes; refusing to "
                        f"overwrite it with artifact (height {height}, "
                        f"{printable(target)!r}) (sha256 {digest[:16]}…)\n"
                    )
                    return EXIT_PROBLEM
            else:
                _write_new(path, data)
                written += 1
            index.append(
                {
                    "file": name,
                    "height": height,
                    "canonical_target": target,
                    "sha256": digest,
                    "size": len(data),
                }
            )
        status = _write_index(out_dir, chain_id, index, errors)
        if status != EXIT_OK:
            return status
        report.write(
            f"exported {len(index)} artifact{'' if len(index) == 1 else 's'} to {out_dir} "
            f"({written} written, {len(index) - written} already there); "
            f"index: {out_dir / INDEX_FILE}\n"
        )
        return EXIT_OK

    return _with_store(db_path, chain_id, run, errors)


def _write_new(path: Path, data: bytes) -> None:
    """Create `path` holding `data`, whole or not at all, never replacing a file."""
    aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with aside.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.link(aside, path)  # fails if `path` appeared meanwhile: nothing is overwritten
    finally:
        aside.unlink(missing_ok=True)


def _write_index(out_dir: Path, chain_id: str, index: list[dict[str, Any]], err: TextIO) -> int:
    """Replace index.json, but only by one that still lists everything it listed."""
    path = out_dir / INDEX_FILE
    if path.exists():
        try:
            if path.stat().st_size > INDEX_BYTES_MAX:
                raise ValueError(f"larger than {INDEX_BYTES_MAX} bytes")
            old = json.loads(path.read_text("utf-8"))
            old_chain = old["chain_id"]
            old_items = {json.dumps(item, sort_keys=True) for item in old["artifacts"]}
        except (OSError, ValueError, KeyError, TypeError) as error:
            err.write(f"quorumgate: {path} is not an artifact index ({error}); not replacing it\n")
            return EXIT_PROBLEM
        new_items = {json.dumps(item, sort_keys=True) for item in index}
        if old_chain != chain_id or not old_items <= new_items:
            err.write(
                f"quorumgate: {path} lists artifacts this store does not hold (another "
                "chain's or sidecar's export?); not replacing it\n"
            )
            return EXIT_PROBLEM
    document = {"chain_id": chain_id, "count": len(index), "artifacts": index}
    aside = path.with_name(f".{INDEX_FILE}.{os.getpid()}.tmp")
    try:
        with aside.open("w", encoding="utf-8") as f:
            json.dump(document, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(aside, path)
    finally:
        aside.unlink(missing_ok=True)
    return EXIT_OK


async def _artifact_pages(
    store: SidecarStore,
) -> AsyncIterator[tuple[int, str, bytes, list[dict[str, Any]]]]:
    """Every artifact row, read `ARTIFACTS_PAGE_MAX` at a time."""
    offset = 0
    while True:
        rows = await store.artifact_rows(ARTIFACTS_PAGE_MAX, offset)
        for row in rows:
            yield row
        if len(rows) < ARTIFACTS_PAGE_MAX:
            return
        offset += len(rows)


def _who_and_why(denials: list[dict[str, Any]]) -> str:
    parts = [
        f"{printable(str(d.get('principal', '?')))} {printable(str(d.get('reason', '?')))}"
        for d in denials[:LISTED_DENIALS_MAX]
    ]
    if len(denials) > LISTED_DENIALS_MAX:
        parts.append(f"+{len(denials) - LISTED_DENIALS_MAX} more")
    return ", ".join(parts)


# ==================================================================== the ledger


def ledger_verify(
    db_path: Path,
    chain_id: str,
    out: TextIO,
    *,
    err: TextIO | None = None,
    receipt_keys: Sequence[bytes] = (),
) -> int:
    """Walk the store's whole ledger, recomputing every hash from the stored columns.

    `EXIT_OK` with one summary line (entries, executed height, head) when it holds;
    `EXIT_PROBLEM` naming the first bad entry (its position, height and index, and what
    is wrong) when it does not. A pruned store's checkpoint must carry a signature that
    verifies under its signer's receipt key in `receipt_keys` (docs/pruning.md)."""

    async def run(store: SidecarStore) -> int:
        problem = await store.verify_ledger()
        if problem is not None:
            out.write(f"ledger verification FAILED: {printable(str(problem))}\n")
            return EXIT_PROBLEM
        pruned = _pruned_checkpoint(store, chain_id, receipt_keys)
        if pruned is not None and not pruned[1]:
            out.write(f"ledger verification FAILED: {pruned[0]}\n")
            return EXIT_PROBLEM
        out.write(
            f"ledger ok: {store.ledger_entries} entries through executed height "
            f"{store.executed_height}, head {store.ledger_head.hex()} (chain {chain_id})\n"
        )
        base = store.checkpoint
        if pruned is not None:
            out.write(pruned[0] + "\n")
        elif base is not None:  # installed from a snapshot (docs/snapshots.md)
            out.write(
                f"local history starts after the checkpoint at height {base.height} "
                f"(ledger head {base.ledger_head.hex()}, {base.ledger_entries} entries "
                "before it, not in this store)\n"
            )
        return EXIT_OK

    return _with_store(db_path, chain_id, run, err)


def _pruned_checkpoint(
    store: SidecarStore, chain_id: str, receipt_keys: Sequence[bytes]
) -> tuple[str, bool] | None:
    """For a pruned store: the line saying where its history starts, and whether the
    checkpoint's signature verifies under its signer's receipt key (None: not pruned)."""
    base, signed = store.checkpoint, store.checkpoint_signature
    if base is None or signed is None:
        return None
    return checkpoint_verdict(chain_id, base, signed, receipt_keys)


def checkpoint_verdict(
    chain_id: str, base: Checkpoint, signed: CheckpointSignature, receipt_keys: Sequence[bytes]
) -> tuple[str, bool]:
    """The line saying where a pruned history starts, and whether the checkpoint's
    signature verifies under its signer's receipt key in `receipt_keys`."""
    good = 0 <= signed.signer < len(receipt_keys) and checkpoint_signed_by(
        chain_id, base, signed.signature, receipt_keys[signed.signer]
    )
    verdict = "signature good" if good else "signature does NOT verify under its receipt key"
    line = (
        f"history starts at height {base.height + 1} (pruned below, checkpoint at height "
        f"{base.height}: ledger head {base.ledger_head.hex()}, {base.ledger_entries} entries "
        f"before it, state root {base.state_root.hex()[:16]}…, signed by member "
        f"{signed.signer}: {verdict})"
    )
    return line, good


def checkpoint_line(base: Checkpoint, signed: CheckpointSignature | None) -> str:
    """The first line of the export of a store whose history starts after `base`: the
    checkpoint, and the signature its sidecar made over it when it pruned (none for a
    store installed from a snapshot), as `{"checkpoint": {...}}`."""
    doc: dict[str, object] = {
        "height": base.height,
        "state_root": base.state_root.hex(),
        "ledger_head": base.ledger_head.hex(),
        "ledger_entries": base.ledger_entries,
        "block_hash": base.block_hash.hex(),
        "block_time_ms": base.block_time_ms,
        "signer": None if signed is None else signed.signer,
        "signature": None if signed is None else signed.signature.hex(),
    }
    return json.dumps({"checkpoint": doc}, sort_keys=True)


def read_checkpoint_line(line: str) -> tuple[Checkpoint, CheckpointSignature | None]:
    """`checkpoint_line` read back; ValueError for anything else, or a field of another
    type or size."""
    doc = json.loads(line)
    if not isinstance(doc, dict) or set(doc) != {"checkpoint"}:
        raise ValueError("not a checkpoint line")
    fields = doc["checkpoint"]
    if not isinstance(fields, dict):
        raise ValueError("not a checkpoint line")

    def whole(name: str) -> int:
        value = fields.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"checkpoint {name} is not a whole number")
        return value

    def digest(name: str, size: int = 32) -> bytes:
        value = fields.get(name)
        raw = bytes.fromhex(value) if isinstance(value, str) else b""
        if len(raw) != size:
            raise ValueError(f"checkpoint {name} is not {size} bytes of hex")
        return raw

    base = Checkpoint(
        whole("height"), digest("state_root"), digest("ledger_head"),
        whole("ledger_entries"), digest("block_hash"), whole("block_time_ms"),
    )  # fmt: skip
    if fields.get("signer") is None and fields.get("signature") is None:
        return base, None
    return base, CheckpointSignature(whole("signer"), digest("signature", 64))


def ledger_export(db_path: Path, chain_id: str, out: TextIO, *, err: TextIO | None = None) -> int:
    """Write the ledger to `out` as JSON lines, one verdict a line in ledger order
    (`LedgerEntry.to_json`: bytes as hex, ASCII only). The file verifies offline with
    `verify_ledger_file`; compare its head with another sidecar's to detect a cut.
    A summary goes to `err`, so `out` holds nothing but entries. A store whose history
    starts after a checkpoint (pruned, or installed from a snapshot) is exported with
    that checkpoint first (`checkpoint_line`, docs/pruning.md)."""
    errors = err if err is not None else sys.stderr

    async def run(store: SidecarStore) -> int:
        count = 0
        height, index = 0, 0
        if store.checkpoint is not None:
            out.write(checkpoint_line(store.checkpoint, store.checkpoint_signature) + "\n")
        while True:
            try:
                page = await store.ledger(height, LEDGER_PAGE_ROWS_MAX, index)
            except SidecarStoreError as error:
                errors.write(
                    f"quorumgate: {error}; stopped after {count} entries "
                    "(`quorumgate ledger verify` names the first bad one)\n"
                )
                return EXIT_PROBLEM
            for entry in page:
                out.write(entry.to_json() + "\n")
            count += len(page)
            if len(page) < LEDGER_PAGE_ROWS_MAX:
                break
            height, index = page[-1].height, page[-1].index + 1
        errors.write(
            f"exported {count} ledger entries through executed height "
            f"{store.executed_height}, head {store.ledger_head.hex()}\n"
        )
        return EXIT_OK

    return _with_store(db_path, chain_id, run, errors)


def verify_ledger_file(
    path: Path,
    chain_id: str,
    out: TextIO,
    *,
    expected_head: bytes | None = None,
    err: TextIO | None = None,
    receipt_keys: Sequence[bytes] = (),
) -> int:
    """Verify an exported JSONL ledger offline (no store, no network).

    Reads one line at a time (at most `JSON_LINE_CHARS_MAX` characters each) through the
    same `ChainVerifier` as the store. `EXIT_PROBLEM` names the first bad line and
    entry: unreadable, hash mismatch, broken link or out of order; with `expected_head`
    (a head from `ledger verify` of any honest sidecar), a file cut short fails too. The
    export of a pruned store starts with its checkpoint (`checkpoint_line`): the walk
    starts at its ledger head only if its signature verifies under its signer's receipt
    key in `receipt_keys` (the cluster file's), since anyone could write that line."""
    errors = err if err is not None else sys.stderr
    verifier = ChainVerifier(chain_id)
    history = ""  # where the file's history starts, when after a checkpoint
    lines_before = 0  # entries the checkpoint stands for, less the line it takes
    try:
        with path.open("r", encoding="utf-8", newline="\n") as f:
            line_number = 0
            while True:
                raw = f.readline(JSON_LINE_CHARS_MAX + 2)
                if not raw:
                    break
                line_number += 1
                line = raw.removesuffix("\n")
                if len(line) > JSON_LINE_CHARS_MAX:
                    verifier.unreadable(-1, -1, f"line longer than {JSON_LINE_CHARS_MAX}")
                    break
                if line_number == 1 and line.startswith('{"checkpoint"'):
                    try:
                        history = _start_at_checkpoint(verifier, line, receipt_keys)
                    except ValueError as error:
                        out.write(f"ledger file FAILED: {path} line 1: {printable(str(error))}\n")
                        return EXIT_PROBLEM
                    lines_before = verifier.count - 1
                    continue
                try:
                    entry = LedgerEntry.from_json(line)
                except ValueError as error:
                    verifier.unreadable(-1, -1, f"not a ledger entry: {error}")
                    break
                if verifier.feed(entry) is not None:
                    break
    except (OSError, UnicodeDecodeError) as error:
        errors.write(f"quorumgate: cannot read {path}: {error}\n")
        return EXIT_UNUSABLE
    problem = verifier.finish(expected_head=expected_head)
    if problem is not None:
        line_of = problem.position - lines_before + 1
        out.write(f"ledger file FAILED: {path} line {line_of}: {printable(str(problem))}\n")
        return EXIT_PROBLEM
    matched = " (matches the expected head)" if expected_head is not None else ""
    out.write(
        f"ledger file ok: {verifier.count} entries, head {verifier.head.hex()}{matched} "
        f"(chain {chain_id})\n"
    )
    if history:
        out.write(history + "\n")
    return EXIT_OK


def _start_at_checkpoint(
    verifier: ChainVerifier, line: str, receipt_keys: Sequence[bytes]
) -> str:
    """Start `verifier` at the checkpoint `line` names, once its signature verifies under
    its signer's receipt key; the line saying where the history starts. ValueError, with
    what is wrong, for a line that is not a checkpoint, one without a signature (a store
    installed from a snapshot signs none) or one whose signature does not verify."""
    try:
        base, signed = read_checkpoint_line(line)
    except ValueError as error:
        raise ValueError(f"unreadable checkpoint: {error}") from None
    if signed is None:
        raise ValueError(
            f"the checkpoint at height {base.height} is not signed (a store installed from "
            "a snapshot): its ledger head cannot be checked offline"
        )
    said, good = checkpoint_verdict(verifier.chain_id, base, signed, receipt_keys)
    if not good:
        raise ValueError(said)
    verifier.head, verifier.count = base.ledger_head, base.ledger_entries
    verifier.last = (base.height, LEDGER_INDEX_AFTER_ALL)
    return said


# ==================================================================== the store


def _with_store(
    db_path: Path,
    chain_id: str,
    run: Callable[[SidecarStore], Awaitable[int]],
    err: TextIO | None,
) -> int:
    errors = err if err is not None else sys.stderr

    async def main() -> int:
        try:
            store = await SidecarStore.open(db_path, chain_id, create=False, read_only=True)
        except SidecarStoreError as error:
            errors.write(f"quorumgate: {error}\n")
            return EXIT_UNUSABLE
        try:
            return await run(store)
        except SidecarStoreError as error:
            errors.write(f"quorumgate: {error}\n")
            return EXIT_PROBLEM
        finally:
            await store.close()

    if not db_path.is_file():
        errors.write(f"quorumgate: {db_path}: no sidecar store there\n")
        return EXIT_UNUSABLE
    return asyncio.run(main())
