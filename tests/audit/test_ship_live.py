"""`quorumgate ship` and `quorumgate audit verify` against a live 4-node cluster and a real
PostgreSQL server (docs/audit.md): certified verdicts, allows and denials, copied in
idempotent batches; a resent batch is the same batch; a lying sidecar is outvoted; the copy
checked on its own finds an edited, a deleted and a moved row."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from nacl.signing import SigningKey

from quorumgate.audit import shipper as shipper_module
from quorumgate.audit.records import SHIP_BATCH_VERDICTS_MAX
from quorumgate.audit.shipper import ShipOptions, Shipper
from quorumgate.audit.store import CursorMoved, Written, read_cursor, write_batch
from quorumgate.audit.verify import TrustedHead, check_copy
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto.clusterfile import (
    OWNER_KEY_FILE,
    AuditorSpec,
    ClusterSpec,
    add_auditor,
    read_seed,
    write_seed,
)
from quorumgate.runtime.readauth import METHOD_LEDGER
from quorumgate.sdk.builders import mandate
from quorumgate.sdk.delivery import Channels
from quorumgate.sdk.sync import SyncClient
from quorumgate.sidecar.ledger import LedgerEntry
from quorumgate.sidecar.receipts import ReceiptEpoch, ReceiptEpochs
from tests.support.cluster import new_agent

RUN = "audit-run"
HALT_RUN = "halt-run"
URL = "https://example.com/a"
ALLOWS = 6
SHIP_WAIT_S = 30.0
SHIP_POLL_S = 0.05


def fresh_db(dsn: str, name: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    return dsn.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(scope="module")
def decided(cluster: ClusterSpec, owner: SyncClient) -> str:
    """Allows, a denial, then a new mandate and an allow under it; the agent's id."""
    agent_id, key = new_agent(owner, ["web.get"])
    with SyncClient(cluster, key) as qg:
        for i in range(ALLOWS):
            assert qg.propose("web.get", URL, {"q": str(i)}, run_id=RUN).allowed
        assert not qg.propose("web.post", URL, run_id=RUN).allowed
        owner.set_mandate(agent_id, mandate(["web.get", "web.post"]))
        assert qg.propose("web.post", URL, run_id=RUN).allowed
    return agent_id


@pytest.fixture(scope="module")
def halted(cluster: ClusterSpec, owner: SyncClient) -> str:
    """An agent refused a tool three times in a run, which halts it, then calling another
    tool of that run (docs/audit.md, "Repeat counts and halts"); the agent's id."""
    agent_id, key = new_agent(owner, ["web.get"])
    with SyncClient(cluster, key) as qg:
        for _ in range(3):
            assert not qg.propose("web.post", URL, run_id=HALT_RUN).allowed
        assert not qg.propose("web.get", URL, run_id=HALT_RUN).allowed
    return agent_id


def owner_key(spec: ClusterSpec) -> SigningKey:
    return SigningKey(read_seed(spec.directory / OWNER_KEY_FILE))


async def honest_status(stubs: list[Any]) -> spb.SidecarStatusReply:
    return await stubs[0].Status(spb.SidecarStatusRequest(), timeout=5)


async def ship_all(shipper: Shipper, stubs: list[Any]) -> spb.SidecarStatusReply:
    """Ship until the copy holds as many entries as sidecar 0's ledger, bounded."""
    deadline = time.monotonic() + SHIP_WAIT_S
    while True:
        status = await honest_status(stubs)
        cursor = read_cursor(shipper._db(), shipper.spec.chain_id)
        if cursor.entries == status.ledger_entries and cursor.head == status.ledger_head:
            return status
        found = await shipper.next_round(cursor)
        if found.verdicts:
            await shipper.ship_once()
        assert time.monotonic() < deadline, f"copy at {cursor.entries}: {found.refusals}"
        await asyncio.sleep(SHIP_POLL_S)


@pytest.fixture
async def channels(cluster: ClusterSpec) -> AsyncIterator[Channels]:
    made = Channels(cluster)
    try:
        yield made
    finally:
        await made.close()


def count(dsn: str, sql: str) -> int:
    with psycopg.connect(dsn) as conn:
        return int(conn.execute(sql).fetchone()[0])  # type: ignore[index]


def metric(shipper: Shipper, name: str, **labels: str) -> float:
    value = shipper.metrics.registry.get_sample_value(name, labels or None)
    return value or 0.0


# ---------------------------------------------------------------------------- shipping


async def test_ships_every_certified_verdict_allows_too_and_verifies(
    cluster: ClusterSpec, decided: str, channels: Channels, postgres_dsn: str
) -> None:
    dsn = fresh_db(postgres_dsn, "ship_all")
    shipper = Shipper(cluster, owner_key(cluster), channels.sidecars, ShipOptions(dsn))
    try:
        status = await ship_all(shipper, channels.sidecars)
    finally:
        shipper.close()
    assert count(dsn, "SELECT count(*) FROM qg_verdicts") == status.ledger_entries
    assert count(dsn, "SELECT max(verdicts) FROM qg_batches") <= SHIP_BATCH_VERDICTS_MAX
    allows = f"SELECT count(*) FROM qg_verdicts WHERE principal = '{decided}' AND outcome = "
    assert count(dsn, allows + "'allow'") == ALLOWS + 1
    assert count(dsn, allows + "'deny'") == 1
    assert metric(shipper, "qg_ship_batches_total", result="written") >= 1
    assert metric(shipper, "qg_ship_verdicts_total") == status.ledger_entries
    assert metric(shipper, "qg_ship_lag_heights") == 0
    with psycopg.connect(dsn) as conn:
        report = check_copy(conn, cluster, TrustedHead())
    assert report.problems == []
    assert report.rows == status.ledger_entries and report.head == status.ledger_head
    assert report.mandates[decided] == {1, 2}  # drift: a finding, not a problem


async def test_a_batch_resent_after_a_lost_acknowledgement_is_the_same_batch(
    cluster: ClusterSpec,
    decided: str,
    channels: Channels,
    postgres_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first write commits, then its connection dies before the answer arrives (the
    shipper killed between write and ack): the shipper sends the batch again, and the copy
    holds it once."""
    dsn = fresh_db(postgres_dsn, "ship_resend")
    real_write = shipper_module.write_batch
    lost: list[Written] = []

    def commit_then_lose_the_answer(conn: psycopg.Connection[Any], batch: Any, cursor: Any):
        result = real_write(conn, batch, cursor)
        if not lost:
            lost.append(result)
            conn.close()
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return result

    monkeypatch.setattr(shipper_module, "write_batch", commit_then_lose_the_answer)
    shipper = Shipper(cluster, owner_key(cluster), channels.sidecars, ShipOptions(dsn))
    try:
        cursor = read_cursor(shipper._db(), cluster.chain_id)
        found = await shipper.next_round(cursor)
        batch = shipper_module.Batch(cluster.chain_id, tuple(found.verdicts))
        assert shipper.write(batch, cursor) is Written.ALREADY  # the resend
        # and a shipper started afresh that sends it once more (it crashed before its ack)
        again = Shipper(cluster, owner_key(cluster), channels.sidecars, ShipOptions(dsn))
        assert again.write(batch, cursor) is Written.ALREADY
        # another batch from the same, now stale, cursor: refused whole, nothing written
        shorter = shipper_module.Batch(cluster.chain_id, batch.verdicts[:1])
        with pytest.raises(CursorMoved):
            write_batch(again._db(), shorter, cursor)
        again.close()
    finally:
        shipper.close()
    assert lost == [Written.WRITTEN]
    assert metric(shipper, "qg_ship_retries_total") == 1
    assert count(dsn, "SELECT count(*) FROM qg_verdicts") == len(batch.verdicts)
    assert count(dsn, "SELECT count(*) FROM qg_batches") == 1
    with psycopg.connect(dsn) as conn:
        assert read_cursor(conn, cluster.chain_id) == batch.after(cursor)


class LyingSidecar:
    """Sidecar 3 as a Byzantine member would answer: a ledger whose denials read as allows,
    re-hashed so that its own chain links, and receipts with the same lie (their leaves no
    longer sit under the root it signed, and no other sidecar signs them). Everything else
    is passed to the real sidecar."""

    def __init__(self, stub: Any, chain_id: str) -> None:
        self._stub = stub
        self._chain_id = chain_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)

    async def Ledger(self, request: spb.LedgerRequest, **kwargs: Any) -> spb.LedgerReply:
        reply = await self._stub.Ledger(request, **kwargs)
        entries = [LedgerEntry.from_json(line) for line in reply.entries]
        forged, prev = [], entries[0].prev_hash if entries else b""
        for e in entries:
            fields = {n: getattr(e, n) for n in LedgerEntry.__slots__}  # type: ignore[attr-defined]
            fields.update(outcome="allow", reason="ok", prev_hash=prev)
            draft = LedgerEntry(**fields)
            fields["hash"] = draft.computed_hash(self._chain_id)
            forged.append(LedgerEntry(**fields))
            prev = fields["hash"]
        out = spb.LedgerReply(executed_height=reply.executed_height)
        out.entries.extend(e.to_json() for e in forged)
        return out

    def Receipts(self, request: spb.ReceiptsRequest, **kwargs: Any) -> Any:
        call = self._stub.Receipts(request, **kwargs)

        class Lies:
            def cancel(self) -> None:
                call.cancel()

            async def __aiter__(self) -> AsyncIterator[spb.ReceiptBatch]:
                async for batch in call:
                    for receipt in batch.receipts:
                        receipt.leaf.outcome = "allow"
                    yield batch

        return Lies()


async def test_a_lying_sidecar_is_outvoted_not_copied(
    cluster: ClusterSpec, decided: str, channels: Channels, postgres_dsn: str
) -> None:
    dsn = fresh_db(postgres_dsn, "ship_liar")
    stubs = [*channels.sidecars[:3], LyingSidecar(channels.sidecars[3], cluster.chain_id)]
    shipper = Shipper(cluster, owner_key(cluster), stubs, ShipOptions(dsn))
    try:
        status = await ship_all(shipper, stubs)
    finally:
        shipper.close()
    assert metric(shipper, "qg_ship_refusals_total", reason="ledger differs") >= 1
    deny = f"SELECT count(*) FROM qg_verdicts WHERE principal = '{decided}' AND outcome = 'deny'"
    assert count(dsn, deny) == 1
    with psycopg.connect(dsn) as conn:
        assert read_cursor(conn, cluster.chain_id).head == status.ledger_head


# ---------------------------------------------------------------------------- audit verify


def _problems(dsn: str, spec: ClusterSpec, sql: str) -> list[str]:
    """What `audit verify` finds with `sql` applied, rolled back afterwards."""
    with psycopg.connect(dsn) as conn, conn.transaction(force_rollback=True):
        conn.execute(sql)
        return check_copy(conn, spec, TrustedHead()).problems


@pytest.fixture(scope="module")
def copy_dsn(cluster: ClusterSpec, decided: str, halted: str, postgres_dsn: str) -> str:
    """A whole copy of the ledger, shipped once for the tamper tests."""
    dsn = fresh_db(postgres_dsn, "audit_copy")

    async def ship() -> None:
        made = Channels(cluster)
        shipper = Shipper(cluster, owner_key(cluster), made.sidecars, ShipOptions(dsn))
        try:
            await ship_all(shipper, made.sidecars)
        finally:
            shipper.close()
            await made.close()

    asyncio.run(ship())
    assert count(dsn, "SELECT count(*) FROM qg_verdicts") > ALLOWS
    return dsn


NTH = "(SELECT height, idx FROM qg_verdicts ORDER BY height, idx OFFSET {} LIMIT 1)"
SWAP = (
    f"CREATE TEMP TABLE a AS {NTH.format(4)[1:-1]};"
    f"CREATE TEMP TABLE b AS {NTH.format(5)[1:-1]};"
    "UPDATE qg_verdicts SET idx = -1 WHERE (height, idx) = (SELECT * FROM a);"
    "UPDATE qg_verdicts SET (height, idx) = (SELECT * FROM a)"
    " WHERE (height, idx) = (SELECT * FROM b);"
    "UPDATE qg_verdicts SET (height, idx) = (SELECT * FROM b) WHERE idx = -1;"
)  # fmt: skip
TAMPERING = {
    "edited": (
        "UPDATE qg_verdicts SET outcome = 'allow' WHERE outcome = 'deny'",
        ["edited", "certifies another verdict"],
    ),
    "deleted": (f"DELETE FROM qg_verdicts WHERE (height, idx) = {NTH.format(3)}", ["missing"]),
    "moved": (
        f"UPDATE qg_verdicts SET height = height + 1000000 WHERE (height, idx) = {NTH.format(3)}",
        ["edited", "missing"],
    ),
    "reordered": (SWAP, ["edited"]),
    # a version-2 row's commitments and sealed salts dropped: it reads as version 1
    "commitments dropped": (
        f"UPDATE qg_verdicts SET extension = '' WHERE (height, idx) = {NTH.format(3)}",
        ["edited"],
    ),
    # the tripping verdict's repeat count made smaller: part of the entry's hash
    "repeat count edited": (
        "UPDATE qg_verdicts SET extension = replace(extension, '\"repeat\":2', "
        "'\"repeat\":0') WHERE reason = 'run_halted' AND extension LIKE '%\"repeat\":2%'",
        ["edited"],
    ),
    "cut off the end": (
        "DELETE FROM qg_verdicts WHERE (height, idx) = "
        "(SELECT height, idx FROM qg_verdicts ORDER BY height DESC, idx DESC LIMIT 1)",
        ["cursor"],
    ),
}


def test_the_untouched_copy_verifies(cluster: ClusterSpec, copy_dsn: str) -> None:
    assert _problems(copy_dsn, cluster, "SELECT 1") == []


def test_the_copy_is_checked_against_the_epochs_given(
    cluster: ClusterSpec, copy_dsn: str
) -> None:
    """`audit verify --epochs`: with the chain's one epoch the copy verifies; with a file
    whose epoch 0 ended at height 1, every certificate above it, naming epoch 0, is a
    problem (`wrong_epoch`): what a rotated-out receipt key's statement past its epoch
    would be (docs/consensus/epochs.md, "Receipt keys")."""
    keys = cluster.receipt_keys
    one = ReceiptEpochs((ReceiptEpoch(0, 1, None, keys),))
    with psycopg.connect(copy_dsn) as conn:
        assert check_copy(conn, cluster, TrustedHead(), one).problems == []
        ended = ReceiptEpochs((ReceiptEpoch(0, 1, 1, keys), ReceiptEpoch(1, 2, None, keys)))
        problems = check_copy(conn, cluster, TrustedHead(), ended).problems
    assert problems and all("wrong_epoch" in p for p in problems), problems


def test_the_copy_says_refused_three_times_then_the_run_stopped(
    cluster: ClusterSpec, halted: str, copy_dsn: str
) -> None:
    with psycopg.connect(copy_dsn) as conn:
        rows = conn.execute(
            "SELECT reason, extension FROM qg_verdicts WHERE principal = %s"
            " AND kind = 'proposal' ORDER BY height, idx",
            (halted,),
        ).fetchall()
        report = check_copy(conn, cluster, TrustedHead())
    facts = [(r[0], json.loads(r[1])["repeat"], json.loads(r[1])["halted"]) for r in rows]
    assert facts == [
        ("out_of_scope", 0, False),
        ("repeat_denied", 1, False),
        ("run_halted", 2, True),
        ("run_halted", 0, True),
    ]
    assert report.problems == []
    assert report.halted >= 2 and report.repeat_max >= 2


@pytest.mark.parametrize("tampering", list(TAMPERING))
def test_the_copy_checked_on_its_own_finds_a_tampered_row(
    cluster: ClusterSpec, copy_dsn: str, tampering: str
) -> None:
    sql, named = TAMPERING[tampering]
    problems = _problems(copy_dsn, cluster, sql)
    for word in named:
        assert any(word in p for p in problems), (word, problems)


def test_a_deleted_row_is_named_with_the_range_it_leaves(
    cluster: ClusterSpec, copy_dsn: str
) -> None:
    with psycopg.connect(copy_dsn) as conn:
        before = conn.execute(NTH.format(2)).fetchone()
    problems = _problems(copy_dsn, cluster, TAMPERING["deleted"][0])
    assert before is not None
    assert any(f"between height {before[0]} index {before[1]}" in p for p in problems), problems


def test_the_commands_ship_and_verify_from_a_trusted_head(
    cluster: ClusterSpec, decided: str, halted: str, postgres_dsn: str
) -> None:
    dsn = fresh_db(postgres_dsn, "ship_cli")
    cli = [sys.executable, "-m", "quorumgate.cli"]
    shipped = subprocess.run(
        [*cli, "ship", "--dir", str(cluster.directory), "--dsn", dsn, "--once"],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shipped.returncode == 0, shipped.stderr
    assert "shipped" in shipped.stdout
    full = subprocess.run(
        [*cli, "audit", "verify", "--dir", str(cluster.directory), "--dsn", dsn],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert full.returncode == 0, full.stdout + full.stderr
    assert "outcome deny:" in full.stdout and "audit verify ok" in full.stdout
    assert "verdicts in a halted run:" in full.stdout
    assert f"finding: mandate drift: {decided}" in full.stdout
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT height, hash FROM qg_verdicts ORDER BY height, idx OFFSET 2 LIMIT 1"
        ).fetchone()
        later = conn.execute(
            "SELECT count(*) FROM qg_verdicts WHERE height > %s",
            (row[0],),  # type: ignore[index]
        ).fetchone()
    # the head of a whole height: the last entry of the height
    with psycopg.connect(dsn) as conn:
        last = conn.execute(
            "SELECT height, hash FROM qg_verdicts WHERE height = %s ORDER BY idx DESC LIMIT 1",
            (row[0],),  # type: ignore[index]
        ).fetchone()
    head = f"{last[0]}:{bytes(last[1]).hex()}"  # type: ignore[index]
    partial = subprocess.run(
        [*cli, "audit", "verify", "--dir", str(cluster.directory), "--dsn", dsn, "--head", head],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert partial.returncode == 0, partial.stdout
    assert f"rows checked: {later[0]};" in partial.stdout  # type: ignore[index]


# ---------------------------------------------------------------------------- who reads


async def test_the_ledger_answers_an_auditor_and_refuses_an_agent(
    cluster: ClusterSpec, owner: SyncClient, channels: Channels
) -> None:
    """The shipper reads as an auditor (or the owner): every verdict's ledger row is not for
    an agent, nor for a caller without a signed read statement."""
    import grpc

    from quorumgate.audit.follow import Reader

    _, agent_key = new_agent(owner, ["web.get"])
    stub = channels.sidecars[0]
    request = spb.LedgerRequest(from_height=1, limit=5)
    with pytest.raises(grpc.RpcError) as unsigned:
        await stub.Ledger(request, timeout=5)
    assert unsigned.value.code() == grpc.StatusCode.UNAUTHENTICATED
    agent = Reader(cluster, agent_key, channels.sidecars)
    with pytest.raises(grpc.RpcError) as refused:
        await stub.Ledger(request, timeout=5, metadata=agent.auth(METHOD_LEDGER))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    auditor_key = SigningKey.generate()
    add_auditor(cluster.directory, "audit-shipper", bytes(auditor_key.verify_key))
    auditor = Reader(cluster, auditor_key, channels.sidecars)

    async def read() -> spb.LedgerReply | None:
        try:
            return await stub.Ledger(request, timeout=5, metadata=auditor.auth(METHOD_LEDGER))
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED  # not reloaded yet
            return None

    deadline = time.monotonic() + SHIP_WAIT_S
    while (reply := await read()) is None:
        assert time.monotonic() < deadline, "the sidecar never took the new auditor"
        await asyncio.sleep(SHIP_POLL_S)
    assert 0 < len(reply.entries) <= 5
    assert LedgerEntry.from_json(reply.entries[0]).height >= 1


def test_the_running_shipper_serves_its_metrics_and_stops_on_sigterm(
    cluster: ClusterSpec, decided: str, postgres_dsn: str
) -> None:
    import signal
    import socket
    import urllib.request

    from tests.support.cluster import wait_until

    dsn = fresh_db(postgres_dsn, "ship_running")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "quorumgate.cli", "ship", "--dir", str(cluster.directory),
         "--dsn", dsn, "--metrics-port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:

        def caught_up() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                return None
            shipped = "qg_ship_verdicts_total 0.0" not in text
            return text if shipped and "qg_ship_lag_heights 0.0" in text else None

        text = wait_until("the shipper caught up, by its metrics", caught_up)
        assert 'qg_ship_batches_total{result="written"}' in text
        assert "qg_ship_retries_total 0.0" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert count(dsn, "SELECT count(*) FROM qg_verdicts") > ALLOWS


# ---------------------------------------------------------------------------- audit open

OPEN_RUN = "open-run"
CLAIMED = "mozart-1756"  # an argument value short enough for a dictionary


def _open(spec: ClusterSpec, dsn: str, key: Path, where: tuple[int, int], value: str) -> Any:
    cli = [sys.executable, "-m", "quorumgate.cli", "audit", "open"]
    return subprocess.run(
        [*cli, "--dir", str(spec.directory), "--dsn", dsn, "--key", str(key),
         "--height", str(where[0]), "--index", str(where[1]), "--argument", "q",
         "--value", value],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_an_auditor_opens_the_certified_value_and_a_thief_learns_nothing(
    cluster: ClusterSpec, owner: SyncClient, postgres_dsn: str, tmp_path: Path
) -> None:
    """Two calls with one short value, the salt sealed to an auditor the SDK's cluster
    file lists: `audit open` with the auditor's key confirms the value and refuses another;
    another key cannot tell; the copy holds no byte of the value, and the two commitments
    differ (docs/audit.md, "Argument commitments")."""
    auditor = SigningKey.generate()
    listed = AuditorSpec("opener", bytes(auditor.verify_key))
    spec = dataclasses.replace(cluster, auditors=(*cluster.auditors, listed))
    agent_id, key = new_agent(owner, ["web.get"])
    with SyncClient(spec, key) as qg:
        for _ in range(2):
            assert qg.propose("web.get", URL, {"q": CLAIMED}, run_id=OPEN_RUN).allowed
    dsn = fresh_db(postgres_dsn, "audit_open")
    cli = [sys.executable, "-m", "quorumgate.cli"]
    shipped = subprocess.run(
        [*cli, "ship", "--dir", str(cluster.directory), "--dsn", dsn, "--once"],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shipped.returncode == 0, shipped.stderr
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT height, idx, extension, qg_verdicts::text FROM qg_verdicts"
            " WHERE principal = %s ORDER BY height, idx",
            (agent_id,),
        ).fetchall()
    calls = [r for r in rows if r[2]]
    assert len(calls) == 2
    key_file, other_file = tmp_path / "auditor.key", tmp_path / "other.key"
    write_seed(key_file, bytes(auditor))
    write_seed(other_file, bytes(SigningKey.generate()))
    where = (int(calls[0][0]), int(calls[0][1]))
    right = _open(cluster, dsn, key_file, where, CLAIMED)
    assert right.returncode == 0 and "confirmed" in right.stdout, right.stdout + right.stderr
    assert CLAIMED not in right.stdout + right.stderr
    wrong = _open(cluster, dsn, key_file, where, CLAIMED + "0")
    assert wrong.returncode == 1 and "NOT" in wrong.stdout, wrong.stdout + wrong.stderr
    stranger = _open(cluster, dsn, other_file, where, CLAIMED)
    assert stranger.returncode == 2 and "no salt sealed to this key" in stranger.stderr
    # the thief's view: every column of every row, as text
    with psycopg.connect(dsn) as conn:
        dump = " ".join(r[0] for r in conn.execute("SELECT qg_verdicts::text FROM qg_verdicts"))
    for form in (CLAIMED, CLAIMED.encode().hex(), CLAIMED.encode().hex().upper()):
        assert form not in dump
    first, second = (json.loads(r[2])["commitments"] for r in calls)
    assert first[0][0] == second[0][0] == "q" and first[0][1] != second[0][1]
    verified = subprocess.run(
        [*cli, "audit", "verify", "--dir", str(cluster.directory), "--dsn", dsn],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "verdicts committing their arguments:" in verified.stdout
