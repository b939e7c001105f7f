"""`quorumgate ship --otlp` without a cluster (docs/audit.md, "OpenTelemetry"): the
endpoints it refuses and why, the cursor file (atomic, for one chain and one endpoint),
the tool named by a canonical call, and an SDK that makes no record does not move it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from quorumgate.audit import otel
from quorumgate.audit.otel import CursorFile, ExportFailed, OtlpError, parse_endpoint, tool_of
from quorumgate.audit.records import Cursor
from quorumgate.cli import build_parser
from quorumgate.sidecar.ledger import GENESIS_PREV_HASH

HEAD = bytes(range(32))


@pytest.mark.parametrize(
    ("url", "endpoint", "insecure"),
    [
        ("http://127.0.0.1:4317", "http://127.0.0.1:4317", True),
        ("http://collector.example", "http://collector.example:4317", True),
        ("https://collector.example:443/", "https://collector.example:443", False),
        ("http://[::1]:4317", "http://[::1]:4317", True),
    ],
)
def test_an_endpoint_is_a_scheme_a_host_and_a_port(url: str, endpoint: str, insecure: bool) -> None:
    assert parse_endpoint(url) == (endpoint, insecure)


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("127.0.0.1:4317", "http:// (plain) or https://"),
        ("grpc://127.0.0.1:4317", "http:// (plain) or https://"),
        ("http://", "no host"),
        ("http://:4317", "no host"),
        ("http://h:99999", "not a URL"),
        ("http://h:port", "not a URL"),
        ("http://h:0", "between 1 and 65535"),
        ("http://h:4317/v1/logs", "no path"),
        ("http://h:4317?x=1", "no path, query"),
        ("http://user:hunter2@h:4317", "credentials"),
    ],
)
def test_a_bad_endpoint_is_refused_by_name_never_repeated(url: str, named: str) -> None:
    with pytest.raises(OtlpError) as refused:
        parse_endpoint(url)
    assert named in str(refused.value)
    assert "hunter2" not in str(refused.value)


def ship(tmp_path: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    parsed = build_parser().parse_args(["ship", "--dir", str(tmp_path), *args])
    code = parsed.func(parsed)
    return code, capsys.readouterr().err


def test_the_command_refuses_no_copy_and_a_bad_endpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ship(tmp_path, capsys=capsys) == (2, "error: ship needs --dsn, --otlp or both\n")
    code, err = ship(tmp_path, "--otlp", "ftp://collector:21", capsys=capsys)
    assert code == 2 and "--otlp must start with http://" in err
    code, err = ship(tmp_path, "--otlp", "https://me:hunter2@collector", capsys=capsys)
    assert code == 2 and "credentials" in err and "hunter2" not in err


def test_the_cursor_file_starts_at_genesis_and_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "cursor.json"
    cursor_file = CursorFile(path, "chain-a", "http://h:4317")
    assert cursor_file.read() == Cursor(0, 0, GENESIS_PREV_HASH, 0)
    cursor_file.write(Cursor(7, 2, HEAD, 31))
    assert cursor_file.read() == Cursor(7, 2, HEAD, 31)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cursor.json"]  # no .tmp left
    cursor_file.write(Cursor(9, 0, HEAD[::-1], 40))
    assert json.loads(path.read_text())["head"] == HEAD[::-1].hex()


@pytest.mark.parametrize(
    ("chain_id", "endpoint", "named"),
    [
        ("chain-b", "http://h:4317", "another chain"),
        ("chain-a", "http://other:4317", "another endpoint"),
    ],
)
def test_a_cursor_of_another_chain_or_endpoint_is_refused(
    tmp_path: Path, chain_id: str, endpoint: str, named: str
) -> None:
    """A cursor counts what one receiver acknowledged: pointed at another receiver it
    would skip every record that one never got."""
    path = tmp_path / "cursor.json"
    CursorFile(path, "chain-a", "http://h:4317").write(Cursor(7, 2, HEAD, 31))
    with pytest.raises(OtlpError, match=named):
        CursorFile(path, chain_id, endpoint).read()


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "{}",
        '{"chain_id": "chain-a", "endpoint": "http://h:4317", "height": 1, "index": 0,'
        ' "head": "00", "entries": 1}',
        '{"chain_id": "chain-a", "endpoint": "http://h:4317", "height": -1, "index": 0,'
        f' "head": "{HEAD.hex()}", "entries": 1}}',
    ],
)
def test_a_damaged_cursor_file_is_refused_not_restarted_from_genesis(
    tmp_path: Path, text: str
) -> None:
    path = tmp_path / "cursor.json"
    path.write_text(text)
    with pytest.raises(OtlpError, match="is not a cursor file"):
        CursorFile(path, "chain-a", "http://h:4317").read()


@pytest.mark.parametrize(
    ("kind", "canonical", "tool"),
    [
        ("proposal", "web.get https://example.com/a", "web.get"),
        ("confirm", "pay iban:DE89370400440532013000\npayee principal:bob", "pay"),
        ("proposal", "!", None),
        ("admin", "register_tool web.get", None),
        ("proposal", "", None),
    ],
)
def test_the_tool_is_the_head_of_a_canonical_call(kind: str, canonical: str, tool: str) -> None:
    assert tool_of(kind, canonical) == tool


def test_an_sdk_that_makes_no_record_stops_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_SDK_DISABLED=true makes the SDK drop what it is given: the batch must fail,
    or the cursor would move past verdicts no receiver got."""
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    monkeypatch.setattr(otel, "verdict_attributes", lambda chain_id, v: {"log.record.uid": "x"})
    records = otel.VerdictRecords("chain-a")
    verdict = SimpleNamespace(entry=SimpleNamespace(outcome="allow"))
    with pytest.raises(ExportFailed, match="OTEL_SDK_DISABLED"):
        records.make([verdict])  # type: ignore[list-item]
    records.close()
