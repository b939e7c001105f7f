"""The benchmark harness (docs/benchmarks.md): its /proc readers, its per-block
certificate check, its load bookkeeping, and `quorumgate bench` end to end on a tiny load.

Benchmarks print figures; nothing here asserts a time or a rate. The end-to-end tests check
that the report has every key with a sane type and that the counts add up.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from quorumgate.bench.certifier import BlockCertifier
from quorumgate.bench.load import LoadLoop, LoadShape
from quorumgate.bench.procstats import (
    CLOCK_TICKS_PER_S,
    cpu_seconds,
    parse_stat_cpu_ticks,
    parse_status_hwm_kib,
    rss_peak_mb,
)
from quorumgate.bench.report import percentile
from quorumgate.cli import main as cli_main
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.sidecar.receipts import Receipt, ReceiptLeaf, all_paths, sign_block
from quorumgate.sidecar.wire import receipt_to_pb

CHAIN = "qg-bench-test"

# ---------------------------------------------------------------------------- /proc


def test_stat_parser_reads_utime_and_stime_after_a_command_name_with_spaces_and_parens() -> None:
    # fields: pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt
    # cmajflt utime stime ...
    text = "4242 (py (bench) x) S 1 4242 4242 0 -1 4194304 100 0 0 0 1234 56 7 8 20 0 3 0\n"
    assert parse_stat_cpu_ticks(text) == 1234 + 56


def test_status_parser_reads_vmhwm_in_kib() -> None:
    text = "Name:\tpython\nVmPeak:\t  900000 kB\nVmHWM:\t   51234 kB\nVmRSS:\t   40000 kB\n"
    assert parse_status_hwm_kib(text) == 51234
    assert parse_status_hwm_kib("Name:\tkthread\n") is None


def test_cpu_reader_matches_os_times_for_this_process() -> None:
    deadline = os.times()
    total = 0
    while os.times().user - deadline.user < 0.2:  # burn a little CPU so both move
        total += sum(range(1000))
    mine = cpu_seconds(os.getpid())
    times = os.times()
    assert mine is not None
    # Same kernel counters, read a moment apart; one tick of resolution each way.
    assert abs(mine - (times.user + times.system)) <= 3 / CLOCK_TICKS_PER_S + 0.05
    assert cpu_seconds(2**22 + 12345) is None  # above pid_max: no such process


def test_rss_reader_sees_the_peak_grow_and_keeps_it_after_a_free() -> None:
    before = rss_peak_mb(os.getpid())
    assert before is not None and before > 1
    # Resident now + this block exceeds the old peak by 64 MiB however far below the peak
    # the process is now (earlier tests in this process may have set a high one).
    block = bytearray((64 + int(before)) * 1024 * 1024)
    for i in range(0, len(block), 4096):  # touch every page so it is resident
        block[i] = 1
    peak = rss_peak_mb(os.getpid())
    del block
    after = rss_peak_mb(os.getpid())
    assert peak is not None and after is not None
    assert peak >= before + 48
    # The block went back to the allocator (a 64 MiB block is its own mapping), but a
    # high-water mark keeps it (the kernel's counters may lag by a few pages).
    assert after >= before + 48


def test_percentile_is_nearest_rank() -> None:
    assert percentile([5.0, 1.0, 3.0], 0.5) == 3.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0
    assert math.isnan(percentile([], 0.5))


# ---------------------------------------------------------------------------- certificates


def _block(
    height: int, count: int, keys: list[SigningKey], tamper_leaf_of: int | None = None
) -> dict[int, list[spb.Receipt]]:
    """Every sidecar's receipts for one block of `count` leaves (optionally one sidecar
    reporting a different leaf 0 under the honest signed root)."""
    leaves = [
        ReceiptLeaf(
            height=height,
            index=i,
            tx_id=bytes([i]) * 32,
            proposal_id=bytes([i]) * 32,
            kind="proposal",
            outcome="allow",
            reason="ok",
            target_digest=b"\x01" * 32,
            card_digest=b"",
            mandate_version=1,
        )
        for i in range(count)
    ]
    hashes = [leaf.hash(CHAIN) for leaf in leaves]
    from quorumgate.sidecar.receipts import merkle_root

    root, paths = merkle_root(hashes), all_paths(hashes)
    out: dict[int, list[spb.Receipt]] = {}
    for s, key in enumerate(keys):
        signed = sign_block(key, s, CHAIN, height, root, b"\x02" * 32, count)
        mine = list(leaves)
        if s == tamper_leaf_of:
            mine[0] = ReceiptLeaf(**{**_fields(leaves[0]), "outcome": "deny"})
        out[s] = [
            receipt_to_pb(Receipt(leaf, tuple(path), signed))
            for leaf, path in zip(mine, paths, strict=True)
        ]
    return out


def _fields(leaf: ReceiptLeaf) -> dict[str, Any]:
    return {name: getattr(leaf, name) for name in ReceiptLeaf.__slots__}


def _keys(n: int) -> list[SigningKey]:
    return [SigningKey(bytes([s + 1]) * 32) for s in range(n)]


def test_a_block_is_certified_once_f_plus_1_sidecars_sent_all_its_receipts() -> None:
    keys = _keys(4)
    certifier = BlockCertifier(CHAIN, [bytes(k.verify_key) for k in keys], receipts_expire=False)
    receipts = _block(7, 5, keys)
    results = [certifier.add(0, r) for r in receipts[0]]
    assert results == [None] * 5  # one sidecar is not a certificate
    results = [certifier.add(2, r) for r in receipts[2]]
    assert results[:4] == [None] * 4
    certified = results[4]
    assert certified is not None
    assert [tid for tid, _ in certified] == [bytes([i]) * 32 for i in range(5)]
    assert {outcome for _, outcome in certified} == {"allow/ok"}
    assert certifier.counts.certified_blocks == 1 and certifier.counts.failures == 0
    # The third sidecar's receipts of a certified block are ignored.
    assert all(certifier.add(1, r) is None for r in receipts[1])


def test_a_forged_statement_signature_is_not_counted() -> None:
    keys = _keys(4)
    forger = SigningKey(b"\x63" * 32)  # not sidecar 1's key
    certifier = BlockCertifier(CHAIN, [bytes(k.verify_key) for k in keys], receipts_expire=False)
    honest = _block(3, 2, keys)
    forged = _block(3, 2, [keys[0], forger, keys[2], keys[3]])
    assert all(certifier.add(0, r) is None for r in honest[0])
    assert all(certifier.add(1, r) is None for r in forged[1])
    assert certifier.counts.failures == 1
    assert certifier.counts.certified_blocks == 0
    results = [certifier.add(3, r) for r in honest[3]]
    assert results[-1] is not None  # two honest sidecars make it


def test_a_leaf_not_under_the_signed_root_fails_the_block_for_that_sidecar() -> None:
    keys = _keys(4)
    certifier = BlockCertifier(CHAIN, [bytes(k.verify_key) for k in keys], receipts_expire=False)
    tampered = _block(5, 3, keys, tamper_leaf_of=0)
    assert all(certifier.add(0, r) is None for r in tampered[0])
    assert all(certifier.add(1, r) is None for r in tampered[1])
    assert certifier.counts.failures == 1  # sidecar 0's leaves do not hash to the root
    assert certifier.counts.certified_blocks == 0
    results = [certifier.add(2, r) for r in tampered[2]]
    assert results[-1] is not None and results[-1][0][1] == "allow/ok"


def test_seven_sidecars_need_three() -> None:
    keys = _keys(7)
    certifier = BlockCertifier(CHAIN, [bytes(k.verify_key) for k in keys], receipts_expire=False)
    receipts = _block(9, 1, keys)
    assert certifier.add(4, receipts[4][0]) is None
    assert certifier.add(5, receipts[5][0]) is None
    assert certifier.add(6, receipts[6][0]) is not None


# ---------------------------------------------------------------------------- load loop


def test_open_loop_latency_starts_at_the_due_time_not_when_the_client_got_round_to_it() -> None:
    loop = LoadLoop(LoadShape(inflight=0, rate_per_s=100.0, warmup_s=0.0, seconds=1.0), 10.0)
    # The client was stalled for 0.5 s: everything due meanwhile goes out now, with the
    # times it was due (no coordinated omission).
    starts = loop.due(10.5)
    assert len(starts) == 51
    assert starts[0] == 10.0 and starts[-1] == pytest.approx(10.5)
    for k, start in enumerate(starts):
        loop.sent(k, start)
    assert loop.done(0, 10.55, 10.6)
    assert loop.result.done_ms == [pytest.approx(600.0)]
    assert loop.result.commit_ms == [pytest.approx(550.0)]
    assert not loop.done(0, 10.7, 10.7)  # twice, or not ours: not counted
    assert loop.due(11.5) == []  # the window is over


def test_closed_loop_keeps_the_window_full_and_counts_only_the_measured_window() -> None:
    loop = LoadLoop(LoadShape(inflight=4, rate_per_s=0.0, warmup_s=1.0, seconds=2.0), 0.0)
    assert len(loop.due(0.0)) == 4
    for k in range(4):
        loop.sent(k, 0.0)
    assert loop.due(0.1) == []
    loop.done(0, 0.5, 0.5)  # in the warm-up: not counted
    loop.failed(1, "mempool_full")
    assert len(loop.due(0.6)) == 2
    loop.done(2, 1.5, 1.6)
    assert loop.result.completed == 1 and loop.result.committed == 1
    assert loop.result.failed == {"mempool_full": 1}
    assert not loop.finished(2.0)
    loop.done(3, 2.9, 3.1)  # committed in the window, certified after it
    assert loop.result.committed == 2 and loop.result.completed == 1
    assert loop.finished(3.2)


def test_a_load_is_closed_or_open() -> None:
    with pytest.raises(ValueError):
        LoadShape(inflight=4, rate_per_s=10.0, warmup_s=0.0, seconds=1.0)
    with pytest.raises(ValueError):
        LoadShape(inflight=0, rate_per_s=0.0, warmup_s=0.0, seconds=1.0)


# ---------------------------------------------------------------------------- end to end

TINY = ["--start", "--nodes", "4", "--seconds", "2", "--warmup", "0.5", "--agents", "16"]


def _bench_json(args: list[str]) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli_main(["bench", *TINY, "--json", *args])
    assert code == 0, out.getvalue()
    report: dict[str, Any] = json.loads(out.getvalue())
    return report


NUMBER = (int, float)


def _check_common(report: dict[str, Any]) -> None:
    assert report["nodes"] == 4 and report["started_cluster"] is True
    assert report["load"] == "closed" and report["inflight"] == 16
    assert isinstance(report["committed"], int) and report["committed"] > 0
    assert isinstance(report["throughput_per_s"], NUMBER) and report["throughput_per_s"] > 0
    for key in ("p50_ms", "p99_ms", "mean_ms"):
        assert isinstance(report[key], NUMBER) and report[key] >= 0, key
    assert report["p50_ms"] <= report["p99_ms"]
    assert isinstance(report["cpu_s_per_proposal"], NUMBER) and report["cpu_s_per_proposal"] > 0
    assert isinstance(report["load_cpu_s_per_proposal"], NUMBER)
    rss = report["rss_peak_mb"]
    assert set(rss) == {"per_process", "max"}
    assert rss["max"] == max(rss["per_process"].values())
    assert all(isinstance(v, NUMBER) and v > 1 for v in rss["per_process"].values())
    assert report["submitted"] >= report["committed"]
    assert isinstance(report["refused"], dict) and report["certificate_failures"] in (0, None)
    assert report["machine"]["cores"] == os.cpu_count()
    assert report["runs"] == 1 and len(report["per_run"]) == 1


def test_bench_full_mode_end_to_end_reports_certified_figures() -> None:
    report = _bench_json(["--inflight", "16"])
    _check_common(report)
    assert report["mode"] == "full"
    assert isinstance(report["certified"], int) and report["certified"] > 0
    assert report["certified_per_s"] == round(report["certified"] / 2, 1)
    assert report["cert_p50_ms"] <= report["cert_p99_ms"]
    # A certificate follows its commit: per proposal and so for the percentiles.
    assert report["cert_p50_ms"] >= report["p50_ms"]
    names = set(report["rss_peak_mb"]["per_process"])
    assert names == {f"{k}-{i}" for k in ("replica", "sidecar") for i in range(4)}
    assert set(report["cpu_s_per_proposal_by_kind"]) == {"replica", "sidecar"}
    assert report["outcomes"].get("allow/ok", 0) > 0
    assert report["certificate_failures"] == 0


def test_bench_ordering_only_runs_replicas_alone_and_counts_commits() -> None:
    report = _bench_json(["--inflight", "16", "--ordering-only"])
    _check_common(report)
    assert report["mode"] == "ordering-only"
    assert report["certified"] is None and report["certified_per_s"] is None
    assert report["cert_p50_ms"] is None and report["cert_p99_ms"] is None
    assert set(report["rss_peak_mb"]["per_process"]) == {f"replica-{i}" for i in range(4)}
    assert set(report["cpu_s_per_proposal_by_kind"]) == {"replica"}


def test_baselines_run_on_the_same_load_with_ratios_run_by_run() -> None:
    """PySyncObj (batching on and off) always; etcd when its binary is on PATH, else a
    note says it was skipped. Each has figures of its own and a ratio against ours."""
    report = _bench_json(["--inflight", "16", "--ordering-only", "--baselines"])
    _check_common(report)
    baselines, ratios = report["baselines"], report["ratios"]
    expected = {"pysyncobj_batch_on", "pysyncobj_batch_off"}
    if shutil.which("etcd"):
        expected.add("etcd")
    else:
        assert any("etcd skipped" in note for note in report["baseline_notes"])
    assert set(baselines) == expected and set(ratios) == expected
    for key, figures in baselines.items():
        assert figures["nodes"] == 4 and figures["inflight"] == 16, key
        assert figures["value_bytes"] == 256, key
        assert isinstance(figures["completed"], int) and figures["completed"] > 0, key
        assert figures["throughput_per_s"] > 0 and figures["p50_ms"] <= figures["p99_ms"], key
        assert figures["cpu_s_per_request"] > 0 and figures["rss_peak_mb"] > 0, key
        ratio = ratios[key]
        assert ratio["throughput"] == pytest.approx(
            report["throughput_per_s"] / figures["throughput_per_s"], rel=0.02
        ), key


def test_plot_of_a_sweep_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from quorumgate.bench.command import plot_report

    point = {
        "certified_per_s": 100.0,
        "cert_p50_ms": 20.0,
        "cert_p99_ms": 80.0,
        "throughput_per_s": 101.0,
        "p50_ms": 15.0,
        "p99_ms": 60.0,
        "baselines": {
            "etcd": {"label": "etcd", "throughput_per_s": 900.0, "p50_ms": 5.0, "p99_ms": 9.0}
        },
    }
    report = {
        "nodes": 4,
        "mode": "full",
        "load": "closed",
        "runs": 3,
        "sweep": [1, 8],
        "points": [point, {**point, "certified_per_s": 300.0}],
    }
    path = tmp_path / "sweep.png"
    plot_report(report, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_idle_reports_the_idle_cost_and_the_wake_up_call() -> None:
    """`--idle`: the CPU of every process over the idle window, then the calls after it,
    the first of which wakes the quiescent cluster (a client held open all along)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli_main(["bench", "--start", "--idle", "3", "--calls", "2", "--json"])
    assert code == 0, out.getvalue()
    report = json.loads(out.getvalue())
    assert report["nodes"] == 4 and report["calls_before"] == 2 and report["runs"] == 1
    assert report["seconds"] >= 3
    names = set(report["per_process"])
    assert names == {f"{k}-{i}" for k in ("replica", "sidecar") for i in range(4)}
    assert all(isinstance(v, NUMBER) and v >= 0 for v in report["per_process"].values())
    assert report["cores"] == pytest.approx(sum(report["per_process"].values()), abs=1e-3)
    wake = report["wake_ms"]
    assert len(wake) == 3 and all(isinstance(ms, NUMBER) and ms > 0 for ms in wake)
