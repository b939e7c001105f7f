"""`quorumgate ship --otlp`: the certified verdict ledger as OpenTelemetry log records over
OTLP/gRPC (docs/audit.md, "OpenTelemetry"). The rounds are the PostgreSQL shipper's
(`read_round`: f+1 identical pages, hash links, certificates); what differs is the copy.

OTLP has no transaction to hold a cursor, so the shipper keeps its own in a local file,
replaced atomically only after the receiver acknowledged the batch: a restart resumes
after the last acknowledged entry and never skips one (the next page must link to the
head the file holds), but a crash between the acknowledgement and the file's replacement
sends that batch again. Every record carries `log.record.uid`, its chain position, which
the semantic conventions define as the key a receiver may drop duplicates by.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from nacl.signing import SigningKey
from prometheus_client import CollectorRegistry, Counter, Gauge

from quorumgate.audit.acked import AckedFiles, acked_height
from quorumgate.audit.follow import LearnEpochs, Reader, read_round
from quorumgate.audit.records import Batch, Cursor, ShippedVerdict
from quorumgate.proto.canonical import HASH_BYTES
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.sidecar.ledger import GENESIS_PREV_HASH
from quorumgate.sidecar.wire import encode_certificate

log = logging.getLogger("quorumgate.ship.otlp")

OTLP_DEFAULT_PORT = 4317  # the OTLP/gRPC port of the specification and of the collector
OTLP_EXPORT_S = 10.0  # one batch's export, the exporter's own retries of it included
OTLP_IDLE_S = 0.5  # between rounds when there was nothing new to send
OTLP_RETRY_S_MAX = 10.0  # the longest pause before a round after a failed export
OTLP_SEND_ATTEMPTS_MAX = 5  # exports of one batch before the round gives up
OTLP_CURSOR_FILE = "ship-otlp-cursor.json"  # in the cluster directory unless named
ACKED_COPY = "otlp"  # this copy's name among those bounding the acknowledged height
EVENT_NAME = "quorumgate.verdict"
SCOPE_NAME = "quorumgate.audit"
SERVICE_NAME = "quorumgate-ship"
UNCHECKED_TARGET = "!"  # sidecar/engine/targets.py: a target with no canonical form
# Outcomes an auditor looks at (proto/model.py `Outcome`): a denial, an observe-mode
# finding, a rejected transaction. They are WARN; the rest (allow, pending, applied) INFO.
WARN_OUTCOMES = frozenset({"deny", "flag", "rejected"})


class OtlpError(Exception):
    """Input the OTLP shipper refuses (an endpoint, a cursor file); the message names
    what is wrong and never repeats the endpoint (it may hold a password)."""


class ExportFailed(Exception):
    """The receiver did not acknowledge a batch after every attempt."""


def parse_endpoint(url: str) -> tuple[str, bool]:
    """`http://HOST[:PORT]` (plain gRPC) or `https://HOST[:PORT]` (TLS) as the exporter's
    endpoint and whether it is insecure. OTLP/gRPC has no path; credentials travel in
    headers (OTEL_EXPORTER_OTLP_LOGS_HEADERS), never in the URL."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise OtlpError(f"--otlp is not a URL: {type(error).__name__}") from None
    if parts.scheme not in ("http", "https"):
        raise OtlpError("--otlp must start with http:// (plain) or https:// (TLS)")
    if not parts.hostname:
        raise OtlpError("--otlp names no host")
    if parts.username is not None or parts.password is not None:
        raise OtlpError("--otlp must not hold credentials: use OTEL_EXPORTER_OTLP_LOGS_HEADERS")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise OtlpError("--otlp takes no path, query or fragment (OTLP/gRPC has none)")
    if port == 0:
        raise OtlpError("--otlp port must be between 1 and 65535")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port or OTLP_DEFAULT_PORT}", parts.scheme == "http"


# ---------------------------------------------------------------------------- the cursor


@dataclass(frozen=True, slots=True)
class CursorFile:
    """The OTLP copy's cursor: the last acknowledged entry's place and hash, for one chain
    and one endpoint (another receiver holds none of these records)."""

    path: Path
    chain_id: str
    endpoint: str

    def read(self) -> Cursor:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return Cursor(0, 0, GENESIS_PREV_HASH, 0)
        try:
            data = json.loads(text)
            cursor = Cursor(
                int(data["height"]), int(data["index"]), bytes.fromhex(data["head"]),
                int(data["entries"]),
            )  # fmt: skip
            chain_id, endpoint = str(data["chain_id"]), str(data["endpoint"])
        except (ValueError, KeyError, TypeError) as error:
            raise OtlpError(f"{self.path} is not a cursor file: {type(error).__name__}") from None
        if len(cursor.head) != HASH_BYTES or min(cursor.height, cursor.index, cursor.entries) < 0:
            raise OtlpError(f"{self.path} is not a cursor file: a bad head or place")
        if chain_id != self.chain_id:
            raise OtlpError(f"{self.path} is the cursor of another chain")
        if endpoint != self.endpoint:
            raise OtlpError(
                f"{self.path} is the cursor of another endpoint: name a cursor file of its "
                "own with --otlp-cursor (this receiver has none of the records it counts)"
            )
        return cursor

    def write(self, cursor: Cursor) -> None:
        """Replace the file whole: a crash leaves the old cursor or the new one, never a
        part (the new file is synced, renamed over the old, then the directory synced)."""
        data = {
            "chain_id": self.chain_id, "endpoint": self.endpoint, "height": cursor.height,
            "index": cursor.index, "head": cursor.head.hex(), "entries": cursor.entries,
        }  # fmt: skip
        temporary = self.path.with_name(self.path.name + ".tmp")
        with open(temporary, "w", encoding="utf-8") as out:
            json.dump(data, out, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


# ---------------------------------------------------------------------------- records


def tool_of(kind: str, canonical_target: str) -> str | None:
    """The tool a proposal or a confirmation names: the engine writes a canonical call as
    `"<tool> <target>"` (sidecar/engine/targets.py, `canonical_call`); none for another
    kind, or a target that had no canonical form."""
    if kind not in ("proposal", "confirm") or canonical_target == UNCHECKED_TARGET:
        return None
    tool, space, _ = canonical_target.split("\n", 1)[0].partition(" ")
    return tool if space and tool else None


def record_id(chain_id: str, height: int, index: int) -> str:
    return f"{chain_id}:{height}.{index}"


def verdict_attributes(chain_id: str, verdict: ShippedVerdict) -> dict[str, Any]:
    """A verdict's attributes (docs/audit.md, the attribute table): what the ledger entry
    holds, names and digests only, and its certificate."""
    e, cert = verdict.entry, verdict.certificate
    attributes: dict[str, Any] = {
        "log.record.uid": record_id(chain_id, e.height, e.index),
        "quorumgate.chain.id": chain_id,
        "quorumgate.ledger.height": e.height,
        "quorumgate.ledger.index": e.index,
        "quorumgate.ledger.hash": e.hash.hex(),
        "quorumgate.ledger.prev_hash": e.prev_hash.hex(),
        "quorumgate.tx.id": e.tx_id.hex(),
        "quorumgate.proposal.id": (e.proposal_id or e.tx_id).hex(),
        "quorumgate.verdict.kind": e.kind,
        "quorumgate.verdict.outcome": e.outcome,
        "quorumgate.verdict.reason": e.reason,
        "quorumgate.verdict.principal": e.principal,
        "quorumgate.mandate.version": e.mandate_version,
        "quorumgate.target.canonical": e.canonical_target,
        "quorumgate.target.digest": e.target_digest.hex(),
        "quorumgate.arguments.names": list(e.argument_names),
        "quorumgate.certificate.signers": list(cert.signers),
        "quorumgate.certificate": encode_certificate(cert),
    }
    tool = tool_of(e.kind, e.canonical_target)
    if tool is not None:
        attributes["quorumgate.tool.name"] = tool
    if e.card_digest:
        attributes["quorumgate.card.digest"] = e.card_digest.hex()
    return attributes


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("quorumgate")
    except PackageNotFoundError:  # run from a checkout that was not installed
        return "0"


class VerdictRecords:
    """Log records made by the OpenTelemetry SDK (its resource, scope and limits) and
    handed back to the caller, who exports them as one batch and sees the receiver's
    answer: the SDK's own processors export in the background and report nothing."""

    def __init__(self, chain_id: str) -> None:
        from opentelemetry._logs import SeverityNumber
        from opentelemetry.sdk._logs import LoggerProvider, LogRecordProcessor
        from opentelemetry.sdk._logs import ReadableLogRecord as Readable
        from opentelemetry.sdk.resources import Resource

        class Collect(LogRecordProcessor):
            def __init__(self) -> None:
                self.records: list[Readable] = []

            def on_emit(self, log_record: Any) -> None:
                self.records.append(
                    Readable(
                        log_record=log_record.log_record,
                        resource=log_record.resource,
                        instrumentation_scope=log_record.instrumentation_scope,
                        limits=log_record.limits,
                    )
                )

            def shutdown(self) -> None:
                self.records = []

            def force_flush(self, timeout_millis: int = 0) -> bool:
                return True

        version = _version()
        self.chain_id = chain_id
        self.severity = SeverityNumber
        self.collect = Collect()
        resource = Resource.create(
            {"service.name": SERVICE_NAME, "service.version": version,
             "quorumgate.chain.id": chain_id}
        )  # fmt: skip
        self.provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
        self.provider.add_log_record_processor(self.collect)
        self.logger = self.provider.get_logger(SCOPE_NAME, version)

    def make(self, verdicts: Sequence[ShippedVerdict]) -> list[Any]:
        """One record per verdict, in ledger order: an event (no body, as the semantic
        conventions for events ask), WARN for `WARN_OUTCOMES`, INFO otherwise."""
        self.collect.records = []
        for verdict in verdicts:
            warn = verdict.entry.outcome in WARN_OUTCOMES
            self.logger.emit(
                event_name=EVENT_NAME,
                severity_number=self.severity.WARN if warn else self.severity.INFO,
                severity_text="WARN" if warn else "INFO",
                attributes=verdict_attributes(self.chain_id, verdict),
            )
        made, self.collect.records = self.collect.records, []
        if len(made) != len(verdicts):
            # OTEL_SDK_DISABLED=true makes the SDK drop every record: moving the cursor
            # past verdicts no receiver got would skip them.
            raise ExportFailed("the OpenTelemetry SDK made no record (OTEL_SDK_DISABLED?)")
        return made

    def close(self) -> None:
        self.provider.shutdown()


# ---------------------------------------------------------------------------- shipping


class OtlpMetrics:
    """The PostgreSQL shipper's metrics (docs/audit.md, "Metrics") for the OTLP copy."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.lag = Gauge(
            "qg_ship_otlp_lag_heights",
            "Heights f+1 sidecars executed that the receiver was not sent yet",
            registry=r,
        )
        self.shipped_height = Gauge(
            "qg_ship_otlp_shipped_height", "Height of the last verdict acknowledged", registry=r
        )
        self.batches = Counter(
            "qg_ship_otlp_batches", "Batches exported, by result", ["result"], registry=r
        )
        self.verdicts = Counter(
            "qg_ship_otlp_verdicts", "Verdicts the receiver acknowledged", registry=r
        )
        self.retries = Counter(
            "qg_ship_otlp_retries", "Batch exports tried again after a failure", registry=r
        )
        self.refusals = Counter(
            "qg_ship_otlp_refusals",
            "Answers not taken, by what was wrong (a sidecar's, or no f+1 agreement)",
            ["reason"],
            registry=r,
        )


@dataclass(frozen=True, slots=True)
class OtlpOptions:
    endpoint: str  # as `parse_endpoint` gives it
    insecure: bool
    cursor_path: Path
    idle_s: float = OTLP_IDLE_S
    export_s: float = OTLP_EXPORT_S


def make_exporter(options: OtlpOptions) -> Any:
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter

    return OTLPLogExporter(
        endpoint=options.endpoint, insecure=options.insecure, timeout=options.export_s
    )


class OtlpShipper:
    """Rounds of certified verdicts into an OTLP receiver, one batch per export."""

    def __init__(
        self,
        spec: ClusterSpec,
        key: SigningKey,
        stubs: Sequence[Any],
        options: OtlpOptions,
        acked: AckedFiles | None = None,
        learn: LearnEpochs | None = None,
    ) -> None:
        self.spec = spec
        self.reader = Reader(spec, key, stubs, learn)  # learn: as `Shipper`'s
        self.options = options
        self.acked = acked  # where the copy's acknowledged height goes (docs/pruning.md)
        self.cursor_file = CursorFile(options.cursor_path, spec.chain_id, options.endpoint)
        self.metrics = OtlpMetrics()
        self.records = VerdictRecords(spec.chain_id)
        self.exporter = make_exporter(options)

    def close(self) -> None:
        self.exporter.shutdown()
        self.records.close()

    async def send(self, batch: Batch) -> None:
        """Export `batch` until the receiver acknowledges it, or raise ExportFailed."""
        from opentelemetry.sdk._logs.export import LogRecordExportResult

        made = self.records.make(batch.verdicts)
        for attempt in range(OTLP_SEND_ATTEMPTS_MAX):
            result = await asyncio.to_thread(self.exporter.export, made)
            if result is LogRecordExportResult.SUCCESS:
                self.metrics.batches.labels(result="exported").inc()
                self.metrics.verdicts.inc(len(made))
                return
            self.metrics.batches.labels(result="failed").inc()
            if attempt + 1 < OTLP_SEND_ATTEMPTS_MAX:
                self.metrics.retries.inc()
                log.warning("batch %s not acknowledged; sending it again", batch.key)
        raise ExportFailed(f"batch {batch.key} not acknowledged")

    async def ship_once(self) -> int:
        """One round: read, check, export, then move the cursor. Returns how many
        verdicts the receiver acknowledged."""
        cursor = self.cursor_file.read()
        found = await read_round(self.spec, self.reader, cursor)
        for refusal in found.refusals:
            self.metrics.refusals.labels(reason=refusal.reason).inc()
        shipped_height = cursor.height
        # The cursor file holds no leaf count: read back alone, its height counts as
        # unfinished; after a batch, the last verdict's certificate tells (docs/pruning.md).
        end, count = cursor, None
        if found.verdicts:
            batch = Batch(self.spec.chain_id, tuple(found.verdicts))
            await self.send(batch)
            end, count = batch.after(cursor), batch.verdicts[-1].certificate.leaf_count
            self.cursor_file.write(end)
            shipped_height = batch.verdicts[-1].entry.height
            self.metrics.shipped_height.set(shipped_height)
        if self.acked is not None:
            self.acked.report(ACKED_COPY, acked_height(end, count))
        behind = 0 if found.caught_up else found.executed - shipped_height
        self.metrics.lag.set(max(0, behind))
        return len(found.verdicts)

    async def run(self, stop: asyncio.Event) -> None:
        pause = self.options.idle_s
        while not stop.is_set():
            try:
                shipped = await self.ship_once()
                pause = self.options.idle_s
            except ExportFailed as error:
                log.warning("OTLP receiver unavailable (%s)", error)
                shipped, pause = 0, min(pause * 2, OTLP_RETRY_S_MAX)
            if not shipped:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), pause)
