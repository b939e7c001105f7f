"""The operator commands behind `quorumgate artifacts` and `quorumgate ledger verify|export`
(sidecar/operator.py), on a store recorded from real engine output."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from quorumgate.sidecar import operator
from quorumgate.sidecar.ledger import LedgerEntry
from quorumgate.sidecar.operator import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_UNUSABLE,
    artifact_file_name,
    export_artifacts,
    ledger_export,
    ledger_verify,
    list_artifacts,
    printable,
    verify_ledger_file,
)
from quorumgate.sidecar.store import ExecutedHeight, SidecarStore
from tests.engine.harness import CHAIN
from tests.sidecar.executed_log import (
    ARGUMENT_SECRET,
    SEALED_SECRET,
    busy_world,
    execute,
    read_around_the_store,
    write_around_the_store,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def heights() -> list[ExecutedHeight]:
    return execute(busy_world().world)


@pytest.fixture
def db(heights: list[ExecutedHeight], tmp_path: Path) -> Path:
    path = tmp_path / "sidecar.db"

    async def record() -> None:
        store = await SidecarStore.open(path, CHAIN)
        try:
            for h in heights:
                await store.record(h)
        finally:
            await store.close()

    asyncio.run(record())
    return path


def artifacts_of(heights: list[ExecutedHeight]) -> list[tuple[int, str, bytes]]:
    return sorted(
        (a.height, a.canonical_target, a.to_bytes()) for h in heights for a in h.result.artifacts
    )


def entries_of(heights: list[ExecutedHeight]) -> int:
    return sum(len(h.result.verdicts) for h in heights)


def run(function: object, *args: object, **kwargs: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = function(*args, out=out, err=err, **kwargs)  # type: ignore[operator]
    assert isinstance(status, int)
    return status, out.getvalue(), err.getvalue()


# ============================================================================ artifacts


def test_list_artifacts_for_people(db: Path, heights: list[ExecutedHeight]) -> None:
    status, out, err = run(list_artifacts, db, CHAIN, False)
    assert (status, err) == (EXIT_OK, "")
    lines = out.splitlines()
    expected = artifacts_of(heights)
    assert lines[0].split() == ["height", "denials", "sha256", "target"]
    assert lines[-1] == f"{len(expected)} artifacts (chain {CHAIN})"
    assert len(lines) == len(expected) + 2
    for line, (height, target, data) in zip(lines[1:], expected, strict=False):
        fields = line.split()
        assert int(fields[0]) == height
        assert fields[2] == hashlib.sha256(data).hexdigest()[:16]
        assert target in line
    assert "mallory out_of_scope" in out and "mallory run_halted" in out
    assert "bob ambient_identity_argument" in out


def test_list_artifacts_as_json(db: Path, heights: list[ExecutedHeight]) -> None:
    status, out, _ = run(list_artifacts, db, CHAIN, True)
    assert status == EXIT_OK
    document = json.loads(out)
    expected = artifacts_of(heights)
    assert document["chain_id"] == CHAIN and document["count"] == len(expected)
    items = document["artifacts"]
    assert [(i["height"], i["canonical_target"], bytes.fromhex(i["data_hex"])) for i in items] == (
        expected
    )
    for item in items:
        assert item["sha256"] == hashlib.sha256(bytes.fromhex(item["data_hex"])).hexdigest()
        assert item["denials"] and {"principal", "reason", "argument_names"} <= set(
            item["denials"][0]
        )
    two = next(i for i in items if len(i["denials"]) == 2)
    assert [d["principal"] for d in two["denials"]] == ["mallory", "bob"]  # block order


def test_listing_pages_through_every_artifact(
    db: Path, heights: list[ExecutedHeight], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(operator, "ARTIFACTS_PAGE_MAX", 2)
    status, out, _ = run(list_artifacts, db, CHAIN, True)
    assert status == EXIT_OK
    assert json.loads(out)["count"] == len(artifacts_of(heights)) > 4


def test_export_artifacts_writes_one_file_per_key_and_an_index(
    db: Path, heights: list[ExecutedHeight], tmp_path: Path
) -> None:
    out_dir = tmp_path / "export" / "node0"
    status, out, err = run(export_artifacts, db, CHAIN, out_dir)
    expected = artifacts_of(heights)
    assert (status, err) == (EXIT_OK, "")
    assert f"exported {len(expected)} artifacts" in out and f"({len(expected)} written" in out
    files = sorted(p.name for p in out_dir.iterdir())
    assert files == sorted([*(artifact_file_name(h, t) for h, t, _ in expected), "index.json"])
    index = json.loads((out_dir / "index.json").read_text())
    assert index["chain_id"] == CHAIN and index["count"] == len(expected)
    for item, (height, target, data) in zip(index["artifacts"], expected, strict=True):
        assert (item["height"], item["canonical_target"]) == (height, target)
        name = f"{height}-{hashlib.sha256(target.encode()).hexdigest()[:16]}.artifact"
        assert item["file"] == name
        assert (out_dir / name).read_bytes() == data
        assert item["sha256"] == hashlib.sha256(data).hexdigest()
    # again: nothing to write, the same index
    before = (out_dir / "index.json").read_bytes()
    status, out, _ = run(export_artifacts, db, CHAIN, out_dir)
    assert status == EXIT_OK and "(0 written" in out
    assert (out_dir / "index.json").read_bytes() == before


def test_export_refuses_to_overwrite_a_different_file(
    db: Path, heights: list[ExecutedHeight], tmp_path: Path
) -> None:
    out_dir = tmp_path / "export"
    height, target, _ = artifacts_of(heights)[-1]
    out_dir.mkdir()
    squatter = out_dir / artifact_file_name(height, target)
    squatter.write_bytes(b"another sidecar's artifact")
    status, _, err = run(export_artifacts, db, CHAIN, out_dir)
    assert status == EXIT_PROBLEM
    assert f"{squatter} exists with different bytes" in err
    assert f"artifact (height {height}, {target!r})" in err
    assert squatter.read_bytes() == b"another sidecar's artifact"
    assert not (out_dir / "index.json").exists()
    assert not [p for p in out_dir.iterdir() if p.name.endswith(".tmp")]


def test_export_refuses_to_replace_an_index_of_other_artifacts(db: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "export"
    out_dir.mkdir()
    foreign = {"chain_id": CHAIN, "count": 1, "artifacts": [{"file": "9-x.artifact"}]}
    (out_dir / "index.json").write_text(json.dumps(foreign))
    status, _, err = run(export_artifacts, db, CHAIN, out_dir)
    assert status == EXIT_PROBLEM and "not replacing it" in err
    assert json.loads((out_dir / "index.json").read_text()) == foreign


def test_printable_escapes_what_could_rewrite_a_terminal() -> None:
    assert printable("kb.search https://a.example/ü") == "kb.search https://a.example/ü"
    assert printable("a\u202eb\x1b[2Jc\nd\\") == "a\\u202eb\\u001b[2Jc\\u000ad\\\\"


# ============================================================================ ledger


def test_ledger_verify_passes_with_a_summary(db: Path, heights: list[ExecutedHeight]) -> None:
    status, out, err = run(ledger_verify, db, CHAIN)
    assert (status, err) == (EXIT_OK, "")
    assert out.startswith(
        f"ledger ok: {entries_of(heights)} entries through executed height {heights[-1].height}"
    )
    assert out.count("\n") == 1


def test_ledger_verify_names_the_first_bad_entry(db: Path) -> None:
    rowid, height, index = read_around_the_store(
        db, "SELECT rowid, height, idx FROM ledger ORDER BY rowid LIMIT 1 OFFSET 9"
    )[0]
    write_around_the_store(db, "UPDATE ledger SET reason = 'tampered' WHERE rowid = ?", (rowid,))
    write_around_the_store(
        db, "UPDATE ledger SET outcome = 'tampered' WHERE rowid = ?", (rowid + 3,)
    )
    status, out, _ = run(ledger_verify, db, CHAIN)
    assert status == EXIT_PROBLEM
    assert out.startswith(
        f"ledger verification FAILED: entry #9 (height {height}, index {index}): hash_mismatch"
    )


def test_export_then_verify_the_file_offline(
    db: Path, heights: list[ExecutedHeight], tmp_path: Path
) -> None:
    status, jsonl, err = run(ledger_export, db, CHAIN)
    assert status == EXIT_OK
    lines = jsonl.splitlines()
    assert len(lines) == entries_of(heights)
    entries = [LedgerEntry.from_json(line) for line in lines]
    head = entries[-1].hash
    assert f"exported {len(lines)} ledger entries" in err and head.hex() in err
    path = tmp_path / "ledger.jsonl"
    path.write_text(jsonl)
    status, out, _ = run(verify_ledger_file, path, CHAIN, expected_head=head)
    assert status == EXIT_OK
    assert out.startswith(f"ledger file ok: {len(lines)} entries, head {head.hex()} (matches")
    # the store's own verify prints the same head: what an auditor compares
    assert head.hex() in run(ledger_verify, db, CHAIN)[1]


def test_export_pages_through_the_whole_ledger(
    db: Path, heights: list[ExecutedHeight], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(operator, "LEDGER_PAGE_ROWS_MAX", 3)  # pages end inside heights
    status, jsonl, _ = run(ledger_export, db, CHAIN)
    assert status == EXIT_OK and len(jsonl.splitlines()) == entries_of(heights)
    path = tmp_path / "ledger.jsonl"
    path.write_text(jsonl)
    assert run(verify_ledger_file, path, CHAIN)[0] == EXIT_OK


def test_a_tampered_exported_line_is_named(db: Path, tmp_path: Path) -> None:
    lines = run(ledger_export, db, CHAIN)[1].splitlines()
    path = tmp_path / "ledger.jsonl"

    def verify(edited: list[str], **kwargs: object) -> tuple[int, str]:
        path.write_text("".join(line + "\n" for line in edited))
        status, out, _ = run(verify_ledger_file, path, CHAIN, **kwargs)
        return status, out

    entry = json.loads(lines[12])
    entry["reason"] = "ok" if entry["reason"] != "ok" else "out_of_scope"
    status, out = verify([*lines[:12], json.dumps(entry), *lines[13:]])
    assert status == EXIT_PROBLEM
    assert out.startswith(
        f"ledger file FAILED: {path} line 13: entry #12 (height {entry['height']}, "
        f"index {entry['index']}): hash_mismatch"
    )
    status, out = verify([*lines[:5], "{not json", *lines[6:]])
    assert status == EXIT_PROBLEM and "line 6: entry #5 (position unreadable): unreadable" in out
    status, out = verify([*lines[:7], *lines[8:]])
    assert status == EXIT_PROBLEM and "line 8: entry #7" in out
    # cut short: only a known head tells
    head = bytes.fromhex(json.loads(lines[-1])["hash"])
    assert verify(lines[:-2])[0] == EXIT_OK
    status, out = verify(lines[:-2], expected_head=head)
    assert status == EXIT_PROBLEM and "head_mismatch" in out
    status, out, _ = run(verify_ledger_file, path, "another-chain")
    assert status == EXIT_PROBLEM and "another chain" in out


def test_an_unreadable_file_is_unusable(tmp_path: Path) -> None:
    status, _, err = run(verify_ledger_file, tmp_path / "nope.jsonl", CHAIN)
    assert status == EXIT_UNUSABLE and "cannot read" in err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    status, out, _ = run(verify_ledger_file, empty, CHAIN)
    assert status == EXIT_OK and "0 entries" in out


# ============================================================================ stores


def test_a_missing_store_is_an_error_and_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "node9" / "sidecar.db"
    for function, args in [
        (list_artifacts, (missing, CHAIN, False)),
        (export_artifacts, (missing, CHAIN, tmp_path / "out")),
        (ledger_verify, (missing, CHAIN)),
        (ledger_export, (missing, CHAIN)),
    ]:
        status, out, err = run(function, *args)
        assert status == EXIT_UNUSABLE and out == ""
        assert "no sidecar store there" in err
    assert not missing.exists() and not (tmp_path / "out").exists()


def test_a_store_of_another_chain_is_refused(db: Path) -> None:
    status, out, err = run(ledger_verify, db, "another-chain")
    assert (status, out) == (EXIT_UNUSABLE, "")
    assert "belongs to chain 'qg-test', not 'another-chain'" in err


HOLDER = """
import asyncio, sys
from pathlib import Path
from quorumgate.sidecar.store import SidecarStore

async def main() -> None:
    store = await SidecarStore.open(Path(sys.argv[1]), sys.argv[2])
    print("open", flush=True)
    sys.stdin.read()
    await store.close()

asyncio.run(main())
"""


def test_a_store_held_by_a_running_sidecar_is_read_while_it_runs(db: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(db), CHAIN],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO_ROOT,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"open\n"
        status, out, err = run(ledger_verify, db, CHAIN)
        assert status == EXIT_OK, err
        assert out
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        assert holder.wait(timeout=30) == 0
    assert run(ledger_verify, db, CHAIN)[0] == EXIT_OK  # stopped: readable as well


# ============================================================================ confidentiality


def test_no_planted_secret_appears_in_any_listing_or_export(db: Path, tmp_path: Path) -> None:
    outputs = [
        run(list_artifacts, db, CHAIN, False)[1],
        run(list_artifacts, db, CHAIN, True)[1],
        run(ledger_export, db, CHAIN)[1],
        run(ledger_verify, db, CHAIN)[1],
    ]
    out_dir = tmp_path / "export"
    assert run(export_artifacts, db, CHAIN, out_dir)[0] == EXIT_OK
    blobs = [o.encode() for o in outputs] + [p.read_bytes() for p in out_dir.iterdir()]
    assert b"user_id" in b"".join(blobs)  # argument names are there: this check can fail
    for secret in (SEALED_SECRET, ARGUMENT_SECRET.encode()):
        for form in (secret, secret.hex().encode(), secret.lower()):
            for blob in blobs:
                assert form not in blob
