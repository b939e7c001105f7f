"""`quorumgate ship --otlp` against a live 4-node cluster and an OTLP receiver
(docs/audit.md, "OpenTelemetry"): every certified verdict arrives once, in ledger order,
as an event with its attributes; a shipper started again resumes from its cursor file; a
crash between the receiver's acknowledgement and the cursor's replacement sends a batch
twice under the same `log.record.uid`; a refused export moves no cursor.

The receiver is the collector's LogsService from opentelemetry-proto's generated code,
served by a gRPC server on a free loopback port in the test's own process."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from nacl.signing import SigningKey
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from quorumgate.audit import otel
from quorumgate.audit.acked import AckedFiles
from quorumgate.audit.follow import Reader
from quorumgate.audit.otel import (
    OTLP_SEND_ATTEMPTS_MAX,
    ExportFailed,
    OtlpOptions,
    OtlpShipper,
    parse_endpoint,
)
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto.clusterfile import OWNER_KEY_FILE, ClusterSpec, read_seed
from quorumgate.runtime.readauth import METHOD_LEDGER
from quorumgate.sdk.builders import mandate
from quorumgate.sdk.certificates import certified_leaf
from quorumgate.sdk.delivery import Channels
from quorumgate.sdk.sync import SyncClient
from quorumgate.sidecar.ledger import LedgerEntry
from quorumgate.sidecar.pruning import read_acked
from quorumgate.sidecar.wire import decode_certificate
from tests.audit.test_ship_live import count, fresh_db
from tests.support.cluster import new_agent, wait_until

RECEIVER_WORKERS = 2
RECEIVER_STOP_S = 5.0
SHIP_WAIT_S = 30.0
SHIP_POLL_S = 0.05
LEDGER_PAGE = 1024  # entries per Ledger read (the sidecar's LEDGER_PAGE_ROWS_MAX)
RUN = "otel-run"
URL = "https://example.com/a"
ALLOWS = 3
VALUE = "argument-value-never-exported"


def value_of(value: AnyValue) -> Any:
    """An attribute's value as Python: text, integer, bytes, or a list of them."""
    which = value.WhichOneof("value")
    if which == "array_value":
        return [value_of(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


@dataclass(frozen=True)
class Received:
    resource: dict[str, Any]
    scope: str
    event_name: str
    severity_number: int
    severity_text: str
    has_body: bool
    attributes: dict[str, Any]

    @property
    def uid(self) -> str:
        return str(self.attributes["log.record.uid"])


class Receiver(logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[logs_service_pb2.ExportLogsServiceRequest] = []
        self.refuse_next = 0
        self.refused = 0
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.lock:
            if self.refuse_next > 0:
                self.refuse_next -= 1
                self.refused += 1
                context.abort(grpc.StatusCode.PERMISSION_DENIED, "refused by the test")
            self.requests.append(request)
        return logs_service_pb2.ExportLogsServiceResponse()

    def records(self) -> list[Received]:
        with self.lock:
            requests = list(self.requests)
        out: list[Received] = []
        for request in requests:
            for resource_logs in request.resource_logs:
                resource = {a.key: value_of(a.value) for a in resource_logs.resource.attributes}
                for scope_logs in resource_logs.scope_logs:
                    for r in scope_logs.log_records:
                        out.append(
                            Received(
                                resource, scope_logs.scope.name, r.event_name,
                                r.severity_number, r.severity_text, value_of(r.body) is not None,
                                {a.key: value_of(a.value) for a in r.attributes},
                            )
                        )  # fmt: skip
        return out

    def clear(self) -> None:
        with self.lock:
            self.requests.clear()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=RECEIVER_WORKERS))
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(made, server)
    made.port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield made
    finally:
        server.stop(grace=None).wait(RECEIVER_STOP_S)


# ---------------------------------------------------------------------------- the cluster


@pytest.fixture(scope="module")
def decided(cluster: ClusterSpec, owner: SyncClient) -> str:
    """Allows, a denial, then a new mandate and an allow under it; the agent's id."""
    agent_id, key = new_agent(owner, ["web.get"])
    with SyncClient(cluster, key) as qg:
        for i in range(ALLOWS):
            assert qg.propose("web.get", URL, {"q": f"{VALUE}-{i}"}, run_id=RUN).allowed
        assert not qg.propose("web.post", URL, {"q": VALUE}, run_id=RUN).allowed
        owner.set_mandate(agent_id, mandate(["web.get", "web.post"]))
        assert qg.propose("web.post", URL, run_id=RUN).allowed
    return agent_id


def more_verdicts(cluster: ClusterSpec, owner: SyncClient, count: int) -> None:
    _, key = new_agent(owner, ["web.get"])
    with SyncClient(cluster, key) as qg:
        for i in range(count):
            assert qg.propose("web.get", URL, {"q": f"{VALUE}-{i}"}, run_id=RUN).allowed


@pytest.fixture
async def channels(cluster: ClusterSpec) -> AsyncIterator[Channels]:
    made = Channels(cluster)
    try:
        yield made
    finally:
        await made.close()


def owner_key(spec: ClusterSpec) -> SigningKey:
    return SigningKey(read_seed(spec.directory / OWNER_KEY_FILE))


def new_shipper(
    spec: ClusterSpec, channels: Channels, receiver: Receiver, cursor: Path
) -> OtlpShipper:
    endpoint, insecure = parse_endpoint(receiver.url)
    options = OtlpOptions(endpoint, insecure, cursor)
    return OtlpShipper(spec, owner_key(spec), channels.sidecars, options)


async def ledger(spec: ClusterSpec, channels: Channels) -> list[LedgerEntry]:
    """Sidecar 0's whole ledger, read as the owner."""
    reader = Reader(spec, owner_key(spec), channels.sidecars)
    entries: list[LedgerEntry] = []
    height, index = 1, 0
    while True:
        request = spb.LedgerRequest(from_height=height, from_index=index, limit=LEDGER_PAGE)
        reply = await channels.sidecars[0].Ledger(
            request, timeout=5, metadata=reader.auth(METHOD_LEDGER)
        )
        page = [LedgerEntry.from_json(line) for line in reply.entries]
        entries += page
        if len(page) < LEDGER_PAGE:
            return entries
        height, index = page[-1].height, page[-1].index + 1


async def ship_all(shipper: OtlpShipper, channels: Channels) -> spb.SidecarStatusReply:
    """Ship until the cursor holds as many entries as sidecar 0's ledger, bounded."""
    deadline = time.monotonic() + SHIP_WAIT_S
    while True:
        status = await channels.sidecars[0].Status(spb.SidecarStatusRequest(), timeout=5)
        cursor = shipper.cursor_file.read()
        if cursor.entries == status.ledger_entries and cursor.head == status.ledger_head:
            return status
        if not await shipper.ship_once():
            assert time.monotonic() < deadline, f"cursor at {cursor.entries} entries"
            await asyncio.sleep(SHIP_POLL_S)


def metric(shipper: OtlpShipper, name: str, **labels: str) -> float:
    return shipper.metrics.registry.get_sample_value(name, labels or None) or 0.0


def uids(spec: ClusterSpec, entries: list[LedgerEntry]) -> list[str]:
    return [f"{spec.chain_id}:{e.height}.{e.index}" for e in entries]


# ---------------------------------------------------------------------------- shipping


def check_record(spec: ClusterSpec, got: Received, entry: LedgerEntry) -> None:
    a = got.attributes
    assert got.event_name == "quorumgate.verdict" and not got.has_body
    assert got.scope == "quorumgate.audit"
    assert got.resource["service.name"] == "quorumgate-ship"
    assert got.resource["quorumgate.chain.id"] == spec.chain_id
    warn = entry.outcome in ("deny", "flag", "rejected")
    assert (got.severity_number, got.severity_text) == ((13, "WARN") if warn else (9, "INFO"))
    assert (a["quorumgate.ledger.height"], a["quorumgate.ledger.index"]) == (
        entry.height, entry.index,
    )  # fmt: skip
    assert a["quorumgate.ledger.hash"] == entry.hash.hex()
    assert a["quorumgate.ledger.prev_hash"] == entry.prev_hash.hex()
    assert a["quorumgate.tx.id"] == entry.tx_id.hex()
    assert (a["quorumgate.verdict.kind"], a["quorumgate.verdict.outcome"]) == (
        entry.kind, entry.outcome,
    )  # fmt: skip
    assert a["quorumgate.verdict.reason"] == entry.reason
    assert a["quorumgate.verdict.principal"] == entry.principal
    assert a["quorumgate.mandate.version"] == entry.mandate_version
    assert a["quorumgate.target.canonical"] == entry.canonical_target
    assert a["quorumgate.target.digest"] == entry.target_digest.hex()
    assert a["quorumgate.arguments.names"] == list(entry.argument_names)
    cert = decode_certificate(a["quorumgate.certificate"])
    leaf = certified_leaf(spec, cert)  # a receiver can check it with the cluster file alone
    assert (leaf.height, leaf.index, leaf.outcome) == (entry.height, entry.index, entry.outcome)
    signers = a["quorumgate.certificate.signers"]
    assert signers == list(cert.signers) and len(set(signers)) >= spec.f + 1


async def test_every_certified_verdict_arrives_once_in_order_with_its_attributes(
    cluster: ClusterSpec, decided: str, channels: Channels, receiver: Receiver, tmp_path: Path
) -> None:
    shipper = new_shipper(cluster, channels, receiver, tmp_path / "cursor.json")
    try:
        status = await ship_all(shipper, channels)
    finally:
        shipper.close()
    entries = await ledger(cluster, channels)
    assert len(entries) == status.ledger_entries
    got = receiver.records()
    assert [r.uid for r in got] == uids(cluster, entries)
    for record, entry in zip(got, entries, strict=True):
        check_record(cluster, record, entry)
    mine = [r.attributes for r in got if r.attributes["quorumgate.verdict.principal"] == decided]
    proposals = [a for a in mine if a["quorumgate.verdict.kind"] == "proposal"]
    assert [a["quorumgate.verdict.outcome"] for a in proposals] == ["allow"] * ALLOWS + [
        "deny", "allow",
    ]  # fmt: skip
    assert [a.get("quorumgate.tool.name") for a in proposals] == ["web.get"] * ALLOWS + [
        "web.post", "web.post",
    ]  # fmt: skip
    assert {a["quorumgate.mandate.version"] for a in proposals} == {1, 2}
    assert proposals[0]["quorumgate.target.canonical"] == f"web.get {URL}"
    assert proposals[0]["quorumgate.arguments.names"] == ["q"]
    assert all(VALUE not in repr(r) for r in got)  # names only, never a value
    assert metric(shipper, "qg_ship_otlp_verdicts_total") == len(entries)
    assert metric(shipper, "qg_ship_otlp_batches_total", result="exported") >= 1
    assert metric(shipper, "qg_ship_otlp_lag_heights") == 0
    assert metric(shipper, "qg_ship_otlp_retries_total") == 0


async def test_a_restarted_shipper_resumes_from_its_cursor(
    cluster: ClusterSpec,
    decided: str,
    owner: SyncClient,
    channels: Channels,
    receiver: Receiver,
    tmp_path: Path,
) -> None:
    cursor = tmp_path / "cursor.json"
    first = new_shipper(cluster, channels, receiver, cursor)
    try:
        await ship_all(first, channels)
    finally:
        first.close()  # the process ends; only the cursor file stays
    before = receiver.records()
    more_verdicts(cluster, owner, 3)
    again = new_shipper(cluster, channels, receiver, cursor)
    try:
        status = await ship_all(again, channels)
    finally:
        again.close()
    entries = await ledger(cluster, channels)
    got = receiver.records()
    assert [r.uid for r in got] == uids(cluster, entries)  # none twice, none skipped
    resumed = got[len(before) :]
    assert len(resumed) >= 3
    assert (
        resumed[0].attributes["quorumgate.ledger.prev_hash"]
        == (before[-1].attributes["quorumgate.ledger.hash"])
    )
    assert again.cursor_file.read().entries == status.ledger_entries
    assert metric(again, "qg_ship_otlp_verdicts_total") == len(resumed)


async def test_the_otlp_copy_tells_pruning_the_height_it_acknowledged(
    cluster: ClusterSpec, decided: str, channels: Channels, receiver: Receiver, tmp_path: Path
) -> None:
    """OTLP alone (docs/pruning.md): after the receiver acknowledged the ledger, the file
    holds the height of its last entry, the last of its height; a shipper started again
    reads only its cursor file, which does not say whether that height is whole, and does
    not lower the file."""
    node = tmp_path / "node-0"
    node.mkdir()
    cursor = tmp_path / "cursor.json"
    endpoint, insecure = parse_endpoint(receiver.url)
    options = OtlpOptions(endpoint, insecure, cursor)

    def shipper() -> OtlpShipper:
        acked = AckedFiles([node], [otel.ACKED_COPY])
        return OtlpShipper(cluster, owner_key(cluster), channels.sidecars, options, acked)

    first = shipper()
    try:
        await ship_all(first, channels)
    finally:
        first.close()
    shipped_to = first.cursor_file.read().height
    assert shipped_to >= 1 and read_acked(node) == shipped_to
    again = shipper()
    try:
        await again.ship_once()
    finally:
        again.close()
    assert read_acked(node) >= shipped_to


async def test_a_crash_after_the_acknowledgement_resends_under_the_same_ids(
    cluster: ClusterSpec,
    decided: str,
    channels: Channels,
    receiver: Receiver,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The receiver acknowledged the first batch; the shipper died before replacing its
    cursor file. Started again, it sends that batch again: the receiver holds it twice,
    with the same `log.record.uid`s, and the copy deduplicated by them is the ledger."""
    cursor = tmp_path / "cursor.json"
    crashing = new_shipper(cluster, channels, receiver, cursor)

    def crash(self: Any, cursor: Any) -> None:
        raise OSError("the shipper died here")

    monkeypatch.setattr(otel.CursorFile, "write", crash)
    with pytest.raises(OSError, match="died"):
        await crashing.ship_once()
    crashing.close()
    sent_before_crash = [r.uid for r in receiver.records()]
    assert sent_before_crash and not cursor.exists()
    monkeypatch.undo()
    again = new_shipper(cluster, channels, receiver, cursor)
    try:
        await ship_all(again, channels)
    finally:
        again.close()
    entries = await ledger(cluster, channels)
    got = [r.uid for r in receiver.records()]
    assert got == sent_before_crash + uids(cluster, entries)
    assert list(dict.fromkeys(got)) == uids(cluster, entries)


async def test_a_refused_export_moves_no_cursor(
    cluster: ClusterSpec, decided: str, channels: Channels, receiver: Receiver, tmp_path: Path
) -> None:
    cursor = tmp_path / "cursor.json"
    shipper = new_shipper(cluster, channels, receiver, cursor)
    try:
        receiver.refuse_next = OTLP_SEND_ATTEMPTS_MAX
        with pytest.raises(ExportFailed):
            await shipper.ship_once()
        assert not cursor.exists() and receiver.records() == []
        assert receiver.refused == OTLP_SEND_ATTEMPTS_MAX
        assert metric(shipper, "qg_ship_otlp_batches_total", result="failed") == (
            OTLP_SEND_ATTEMPTS_MAX
        )
        assert metric(shipper, "qg_ship_otlp_retries_total") == OTLP_SEND_ATTEMPTS_MAX - 1
        receiver.refuse_next = 1  # refused once more, then taken: the same batch
        await ship_all(shipper, channels)
    finally:
        shipper.close()
    entries = await ledger(cluster, channels)
    assert [r.uid for r in receiver.records()] == uids(cluster, entries)


def test_the_command_ships_over_otlp_alone(
    cluster: ClusterSpec, decided: str, receiver: Receiver, tmp_path: Path
) -> None:
    cursor = tmp_path / "cursor.json"
    cli = [sys.executable, "-m", "quorumgate.cli", "ship", "--dir", str(cluster.directory)]
    shipped = subprocess.run(
        [*cli, "--otlp", receiver.url, "--otlp-cursor", str(cursor), "--once"],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shipped.returncode == 0, shipped.stderr
    count = len(receiver.records())
    assert f"shipped {count} verdicts over OTLP" in shipped.stdout and count > ALLOWS
    other = subprocess.run(
        [*cli, "--otlp", "http://127.0.0.1:1", "--otlp-cursor", str(cursor), "--once"],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert other.returncode == 2 and "another endpoint" in other.stderr


def test_beside_postgresql_both_copies_catch_up_with_their_metrics_on_one_port(
    cluster: ClusterSpec, decided: str, receiver: Receiver, postgres_dsn: str, tmp_path: Path
) -> None:
    """The running shipper with --dsn and --otlp: each copy's rounds and cursor, both
    registries on one metrics port, and SIGTERM ends it cleanly."""
    dsn = fresh_db(postgres_dsn, "ship_beside_otlp")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "quorumgate.cli", "ship", "--dir", str(cluster.directory),
         "--dsn", dsn, "--otlp", receiver.url, "--otlp-cursor", str(tmp_path / "cursor.json"),
         "--metrics-port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:

        def caught_up() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                return None
            done = all(
                f"{name} 0.0" not in text
                for name in ("qg_ship_verdicts_total", "qg_ship_otlp_verdicts_total")
            )
            lags = ("qg_ship_lag_heights 0.0", "qg_ship_otlp_lag_heights 0.0")
            return text if done and all(lag in text for lag in lags) else None

        text = wait_until("both copies caught up, by the metrics", caught_up)
        assert 'qg_ship_otlp_batches_total{result="exported"}' in text
        assert "qg_ship_otlp_retries_total 0.0" in text
        assert "qg_ship_acked_height" in text  # the lower of the two copies, for pruning
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    rows = count(dsn, "SELECT count(*) FROM qg_verdicts")
    sent = len({r.uid for r in receiver.records()})
    assert rows == sent > ALLOWS
