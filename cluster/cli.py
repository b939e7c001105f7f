"""The `quorumgate` command line."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from quorumgate.ops.output import status_table

if TYPE_CHECKING:
    from quorumgate.ops.standing import Standing
    from quorumgate.proto.clusterfile import ClusterSpec

# While `up` cannot follow the chain of epochs (too few replicas serve yet), how often its
# table tries again.
UP_CHAIN_RETRY_S = 5.0


def _cmd_simulate(args: argparse.Namespace) -> int:
    """Run one simulated cluster and print what it committed."""
    from quorumgate.replica.sim import SimOptions, Simulation, SimulationFailure

    options = SimOptions(
        seed=args.seed,
        n=args.nodes,
        ticks=args.ticks,
        fast_crypto=False,
        byzantine=tuple(args.byzantine),
        loss_permille=args.loss_permille,
    )
    sim = Simulation(options)
    try:
        result = sim.run()
    except SimulationFailure as failure:
        print(f"simulation failed: {failure}", file=sys.stderr)
        return 1
    node = sim.nodes[sim.honest[0]][0]
    committed = node.disk.committed
    if args.json:
        print(
            json.dumps(
                {
                    "nodes": args.nodes,
                    "byzantine": {str(k): v for k, v in sim.byzantine.items()},
                    "committed_height": {str(k): v for k, v in result.committed_heights.items()},
                    "views": {str(k): v for k, v in result.views.items()},
                    "transactions_committed": sum(len(b.payload) for b in committed),
                    "messages": result.messages,
                    "dropped": dict(result.dropped),
                }
            )
        )
        return 0
    print(
        f"Simulated {args.nodes} replicas for {result.ticks} ticks "
        f"(Byzantine: {sim.byzantine or 'none'}), real Ed25519 votes."
    )
    print(f"{'height':>7} {'view':>6} {'proposer':>8} {'txs':>4}  block")
    for block in committed[-args.show :]:
        print(
            f"{block.height:>7} {block.view:>6} {block.proposer:>8} {len(block.payload):>4}  "
            f"{block.hash.hex()[:16]}"
        )
    heights = result.committed_heights
    print(
        f"Every honest replica committed the same chain: heights {heights}; "
        f"{sum(len(b.payload) for b in committed)} transactions; "
        f"{result.messages} messages; dropped {dict(result.dropped) or 'none'}."
    )
    return 0


INSECURE_WARNING = (
    "INSECURE: plaintext gRPC; anyone on the network reads every call and can pose as a "
    "client (peers still sign what they send)"
)


def _fail(message: str, code: int = 1) -> int:
    print(f"quorumgate: {message}", file=sys.stderr)
    return code


def _cmd_init_join(args: argparse.Namespace) -> int:
    """`init --join`: a new machine's directory for member I; prints its entry (public
    parts only), which the owner passes to `admin replace-member --entry`."""
    from quorumgate.proto.clusterfile import JOIN_FILE, ClusterFileError, init_join

    if args.cluster is None or args.index is None:
        return _fail(
            "init --join needs --cluster FILE (the cluster.json to trust) and --index I", 2
        )
    try:
        member = init_join(
            Path(args.cluster), args.index, Path(args.dir), host=args.host,
            port_base=args.port_base,
        )  # fmt: skip
    except (ClusterFileError, OSError) as err:
        return _fail(str(err), 2)
    entry = json.dumps(member.document(), indent=2)
    if not args.json:
        print(
            f"Wrote {Path(args.dir) / JOIN_FILE}: a new machine for member {member.index} at "
            f"{member.replica_address}. Give the owner this entry for `quorumgate admin "
            f"replace-member --member {member.index} --entry FILE`, then start it with "
            f"`quorumgate up --dir {args.dir} --node {member.index}`:",
            file=sys.stderr,
        )
    print(entry)
    return 0


def _cmd_init(args: argparse.Namespace) -> int:
    from quorumgate.proto.clusterfile import ClusterFileError, init_cluster

    if args.join:
        return _cmd_init_join(args)
    try:
        hosts = args.hosts.split(",") if args.hosts is not None else None
        capacities: dict[str, int] = {}
        for item in args.capacity:
            name, _, value = item.partition("=")
            if not value.strip().isdigit():
                raise ClusterFileError(f"--capacity {item!r}: expected NAME=NUMBER")
            capacities[name.strip()] = int(value)
        spec = init_cluster(
            Path(args.dir),
            args.nodes,
            host=args.host,
            hosts=hosts,
            port_base=args.port_base,
            insecure=args.insecure,
            capacities=capacities,
        )
    except (ClusterFileError, OSError) as err:
        return _fail(str(err), 2)
    if args.json:
        print(
            json.dumps(
                {
                    "dir": str(spec.directory),
                    "chain_id": spec.chain_id,
                    "n": spec.n,
                    "f": spec.f,
                    "members": [m.replica_address for m in spec.members],
                    "transport": spec.transport,
                }
            )
        )
        return 0
    print(
        f"Wrote {spec.directory / 'cluster.json'}: chain {spec.chain_id}, "
        f"{spec.n} replicas (tolerates f={spec.f} faulty), transport {spec.transport}."
    )
    for m in spec.members:
        metrics = f"http://{m.host}:{m.metrics_port}/metrics"
        print(f"  node {m.index}: replica {m.replica_address}, metrics {metrics}")
    keys = f"{spec.directory}/owner.key, {spec.directory}/node-*/{{consensus,receipt,tls}}.key"
    print(f"Private keys (mode 0600): {keys}")
    if spec.insecure:
        print(INSECURE_WARNING)
    return 0


def _load(args: argparse.Namespace) -> ClusterSpec:
    from quorumgate.proto.clusterfile import load_cluster

    return load_cluster(Path(args.dir))


def _cmd_up(args: argparse.Namespace) -> int:
    from quorumgate.ops.nodes import OpsError, start_cluster, stop_nodes
    from quorumgate.proto.clusterfile import ClusterFileError

    try:
        spec = _load(args)
        indexes = list(range(spec.n)) if args.node is None else [spec.member(args.node).index]
        procs = start_cluster(spec, indexes)
    except (ClusterFileError, OpsError) as err:
        return _fail(str(err), 2)
    if args.detach:
        hint = f"quorumgate status --dir {args.dir}"
        print(f"{len(indexes)} replicas serving (chain {spec.chain_id}); `{hint}`")
        return 0
    try:
        # Announced inside the `try`: a supervisor may send SIGTERM as soon as it reads
        # this line, and the stop below must run however early it comes.
        print(f"{len(indexes)} replicas serving (chain {spec.chain_id}). Ctrl-C stops them.")
        shown = _UpTable(spec)
        while True:
            table = shown.text()
            if sys.stdout.isatty():
                print(
                    "\x1b[2J\x1b[H"
                    + f"QuorumGate {spec.chain_id} — {args.dir}  (Ctrl-C stops)\n"
                    + table,
                    flush=True,
                )
            else:
                print(table, flush=True)
            time.sleep(args.refresh)
    except KeyboardInterrupt:
        print("\nstopping...", flush=True)
    finally:
        stop_nodes(spec, indexes)
        for proc in procs:
            proc.wait()
    return 0


class _UpTable:
    """`up`'s table of the cluster as it stands (`quorumgate.ops.standing`): the chain of
    epochs is read again when the epoch f+1 replicas report is not the one it showed, or,
    while it cannot be followed, at most every UP_CHAIN_RETRY_S; never cluster.json's
    members as though they were the cluster's once it was reconfigured."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.standing: Standing | None = None
        self.read_at = 0.0

    def _read(self) -> Standing:
        from quorumgate.ops.standing import read_standing

        self.standing = read_standing(self.spec)
        self.read_at = time.monotonic()
        return self.standing

    def text(self) -> str:
        from quorumgate.ops.nodes import query_status
        from quorumgate.ops.output import cluster_epoch
        from quorumgate.ops.standing import standing_text

        standing = self.standing or self._read()
        statuses = [query_status(standing.spec, i) for i in range(standing.spec.n)]
        agreed = cluster_epoch(standing.spec.f, statuses)
        stale = standing.followed and agreed is not None and agreed != standing.epoch
        waited = time.monotonic() - self.read_at >= UP_CHAIN_RETRY_S
        if stale or (standing.problem and waited):
            standing = self._read()
            statuses = [query_status(standing.spec, i) for i in range(standing.spec.n)]
        return status_table(statuses) + "\n" + standing_text(standing)


def _cmd_status(args: argparse.Namespace) -> int:
    from quorumgate.ops.nodes import query_status
    from quorumgate.ops.output import cluster_epoch, epoch_line
    from quorumgate.ops.standing import read_standing, standing_text
    from quorumgate.proto.clusterfile import ClusterFileError

    try:
        spec = _load(args)
    except ClusterFileError as err:
        return _fail(str(err), 2)
    # The members as they stand: the chain of epochs checked from cluster.json, which
    # moves, adds and removes members (docs/operating.md, "Status after a
    # reconfiguration"); cluster.json's, saying why, when it cannot be followed.
    standing = read_standing(spec, Path(args.key) if args.key else None)
    now = standing.spec
    statuses = [query_status(now, i) for i in range(now.n)]
    epoch = cluster_epoch(now.f, statuses)
    if args.json:
        doc = {
            "chain_id": spec.chain_id,
            "f": now.f,
            "transport": spec.transport,
            "epoch": epoch,
            "consensus_version": spec.consensus_version,
            "nodes": [st.as_dict() for st in statuses],
            "cluster": standing.as_dict(),
        }
        print(json.dumps(doc))
    else:
        print(status_table(statuses))
        print(f"transport: {spec.transport}" + (f" — {INSECURE_WARNING}" if spec.insecure else ""))
        print(epoch_line(epoch, spec.runs_epochs))
        print(standing_text(standing))
    return 0 if any(st.alive for st in statuses) else 1


def _cmd_epochs(args: argparse.Namespace) -> int:
    """Every epoch's member set, checked link by link from cluster.json (docs/consensus/
    epochs.md, "Followers: the chain of epochs"); exit 1 when no replica's answer checks."""
    import asyncio

    from nacl.signing import SigningKey

    from quorumgate.proto.clusterfile import OWNER_KEY_FILE, ClusterFileError, read_seed
    from quorumgate.sdk.client import Client
    from quorumgate.sdk.epochs import Epochs, key_fingerprint
    from quorumgate.sdk.errors import ClusterUnavailable, EpochsUnverified, ReadNotAuthorized

    try:
        spec = _load(args)
        key_path = Path(args.key) if args.key else spec.directory / OWNER_KEY_FILE
        if not key_path.exists():
            return _fail(
                f"no key to read with: {key_path} is missing; give --key FILE (the owner's, an "
                "auditor's, or a member's node-I/receipt.key)",
                2,
            )
        key = SigningKey(read_seed(key_path))
    except ClusterFileError as err:
        return _fail(str(err), 2)

    async def ask() -> Epochs:
        async with Client(spec, key) as client:
            return await client.epochs()

    try:
        found = asyncio.run(ask())
    except EpochsUnverified as err:
        why = "; ".join(f"replica {i}: {w}" for i, w in sorted(err.refused.items()))
        if err.reason == "fork":
            return _fail(f"two replicas' chains of epochs check and disagree ({why})")
        return _fail(f"no replica's chain of epochs checks ({why or 'no answer'})")
    except ReadNotAuthorized:
        return _fail(
            "the replicas refused this key the read: use the owner's, an auditor's "
            "or a member's key (--key FILE)"
        )
    except ClusterUnavailable:
        return _fail(
            f"fewer than f+1 = {spec.f + 1} replicas answered; check that the cluster runs "
            f"with `quorumgate status --dir {args.dir}`"
        )
    if args.json:
        print(json.dumps({"chain_id": spec.chain_id, **found.as_dict()}))
        return 0
    for epoch in found.epochs:
        where = (
            "genesis (cluster.json)"
            if epoch.epoch == 0
            else f"change block at height {epoch.boundary_height}"
        )
        checked = ",".join(str(i) for i in epoch.checked_by) or "none this time (checked before)"
        print(
            f"epoch {epoch.epoch}: {where}, {epoch.members} members, checked by replicas {checked}"
        )
        moved = dict(epoch.moved)
        for index, public_key in enumerate(epoch.keys):
            at = f" at {moved[index]} (a new machine)" if index in moved else ""
            receipt = epoch.receipt_keys[index] if index < len(epoch.receipt_keys) else b""
            shown = f", receipt key {key_fingerprint(receipt)}" if receipt else ""
            print(f"  member {index}: {key_fingerprint(public_key)}{shown}{at}")
        if epoch.record_key:
            print(f"  records signed by owner key {key_fingerprint(epoch.record_key)}")
    for replica, why in sorted(found.refused.items()):
        print(f"replica {replica}: its answer does not check: {why}")
    if found.unanswered:
        print(f"no answer from replicas {','.join(str(i) for i in found.unanswered)}")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    from quorumgate.ops.nodes import stop_nodes
    from quorumgate.proto.clusterfile import ClusterFileError

    try:
        spec = _load(args)
    except ClusterFileError as err:
        return _fail(str(err), 2)
    stopped = stop_nodes(spec, None if args.node is None else [args.node])
    print(f"stopped nodes {stopped}" if stopped else "nothing was running")
    return 0


def _cmd_backup_or_restore(args: argparse.Namespace) -> int:
    from quorumgate.ops.backups import backup_replica, restore_replica
    from quorumgate.ops.nodes import OpsError
    from quorumgate.proto.clusterfile import ClusterFileError

    try:
        spec = _load(args)
        if args.command == "backup":
            facts = backup_replica(spec, args.node, Path(args.to))
            done = f"replica {args.node}'s store copied to {args.to}"
        else:
            facts = restore_replica(spec, args.node, Path(args.source))
            done = (
                f"replica {args.node} restored from {args.source}, declared: at its next start "
                "it signs nothing until 2f+1 other members answer (docs/consensus/fencing.md)"
            )
    except (ClusterFileError, OpsError) as err:
        return _fail(str(err), 2)
    print(f"{done} (committed height {facts.committed_height}, "
          f"last voted view {facts.last_voted_view})")  # fmt: skip
    return 0


def _cmd_node(args: argparse.Namespace) -> int:
    from quorumgate.replica.node import main as node_main

    return node_main(["--dir", args.dir, "--node", str(args.node), "--log-stderr"])


def _cmd_bench_breakdown(args: argparse.Namespace) -> int:
    from quorumgate.bench.breakdown import format_breakdown, median_of_runs, run_breakdown

    def say(line: str) -> None:
        if not args.json:
            print(line, file=sys.stderr, flush=True)

    if args.ab_poll:
        # interleaved: one run polling for receipts (the client before the long poll),
        # then one long-polling, `--runs` times; medians of each
        runs: dict[str, list[dict[str, object]]] = {"poll": [], "long poll": []}
        for _ in range(args.runs):
            runs["poll"].append(run_breakdown(args.nodes, args.calls, say, poll=True))
            runs["long poll"].append(run_breakdown(args.nodes, args.calls, say))
        both = {name: median_of_runs(r) for name, r in runs.items()}
        if args.json:
            print(json.dumps(both, indent=2))
        else:
            for name, report in both.items():
                print(f"[{name}]\n{format_breakdown(report)}\n")
        return 0
    if args.state == "large":
        # interleaved: a fresh cluster, then one filled with the large state, `--runs`
        # times; medians of each, and the ratio of the whole call's p50
        by_state: dict[str, list[dict[str, object]]] = {"fresh": [], "large state": []}
        for _ in range(args.runs):
            fresh = run_breakdown(args.nodes, args.calls, say, sized_for_state=True)
            by_state["fresh"].append(fresh)
            by_state["large state"].append(run_breakdown(args.nodes, args.calls, say, state=True))
        medians = {name: median_of_runs(r) for name, r in by_state.items()}
        total = "submit -> certificate (total)"
        p50 = {n: next(r["p50_ms"] for r in m["stages"] if r["stage"] == total)
               for n, m in medians.items()}  # fmt: skip
        ratio = round(p50["large state"] / p50["fresh"], 2)
        if args.json:
            print(json.dumps({**medians, "large_over_fresh_p50": ratio}, indent=2))
        else:
            for name, report in medians.items():
                print(f"[{name}]\n{format_breakdown(report)}\n")
            print(f"large state / fresh, whole call p50: {ratio}x")
        return 0
    reports = [run_breakdown(args.nodes, args.calls, say) for _ in range(args.runs)]
    report = median_of_runs(reports)
    print(json.dumps(report, indent=2) if args.json else format_breakdown(report))
    return 0


def _cmd_bench_idle(args: argparse.Namespace) -> int:
    from quorumgate.bench.idle import format_idle, median_idle, run_idle

    def say(line: str) -> None:
        if not args.json:
            print(line, file=sys.stderr, flush=True)

    large = args.state == "large"
    reports = [
        run_idle(args.nodes, args.idle, args.calls, say, state=large) for _ in range(args.runs)
    ]
    report = median_idle(reports)
    print(json.dumps(report, indent=2) if args.json else format_idle(report))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from quorumgate.bench.state import PresetError

    if args.state != "fresh" and args.idle is None and not args.breakdown:
        return _fail("--state large goes with --breakdown or --idle", 2)
    try:
        if args.idle is not None:
            if not args.start or args.idle <= 0:
                return _fail("--idle SECONDS (> 0) starts its own cluster: use it with --start", 2)
            return _cmd_bench_idle(args)
        if args.breakdown:
            if not args.start:
                return _fail("--breakdown starts its own traced cluster: use it with --start", 2)
            return _cmd_bench_breakdown(args)
    except PresetError as err:
        return _fail(f"the large-state preset failed: {err}", 1)
    from quorumgate.bench.command import BenchRequest, bench_command, format_report, plot_report
    from quorumgate.bench.harness import BenchError, BenchInterrupted, RunOptions
    from quorumgate.ops.nodes import OpsError
    from quorumgate.proto.clusterfile import ClusterFileError

    try:
        sweep = tuple(float(v) for v in args.sweep.split(",") if v) if args.sweep else ()
        request = BenchRequest(
            directory=Path(args.dir) if args.dir else None,
            start_nodes=args.nodes if args.start else None,
            base=RunOptions(
                seconds=args.seconds,
                warmup_s=args.warmup,
                inflight=args.inflight,
                rate_per_s=args.rate or 0.0,
                clients=args.clients,
                ordering_only=args.ordering_only,
            ),
            sweep=sweep,
            runs=args.runs,
            agents=args.agents,
            baselines=args.baselines,
        )
        request.base.shape()
    except ValueError as err:
        return _fail(str(err), 2)

    def progress(line: str) -> None:
        print(f"[bench] {line}", file=sys.stderr, flush=True)

    try:
        report = bench_command(request, progress)
        if args.plot:
            plot_report(report, Path(args.plot))
    except (ClusterFileError, OpsError, BenchError) as err:
        return _fail(str(err))
    except BenchInterrupted:
        return _fail("interrupted (what the bench started is stopped)", 130)
    if args.json:
        print(json.dumps(report))
    else:
        print(format_report(report))
    if args.plot:
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from quorumgate.ops.demo import run_demo
    from quorumgate.ops.nodes import OpsError
    from quorumgate.proto.clusterfile import ClusterFileError, init_cluster, load_cluster

    directory = Path(args.dir or f"run/demo-{args.nodes}")
    try:
        if (directory / "cluster.json").exists():
            spec = load_cluster(directory)
            if spec.n != args.nodes:
                return _fail(
                    f"{directory} holds a {spec.n}-node cluster; use another --dir for {args.nodes}"
                )
        else:
            spec = init_cluster(directory, args.nodes)
            print(f"Created a {spec.n}-replica cluster in {directory} (chain {spec.chain_id}).")
        return run_demo(spec, once=args.once, refresh_s=args.refresh, vendored=args.vendored)
    except (ClusterFileError, OpsError) as err:
        return _fail(str(err), 2)


def _sidecar_db(args: argparse.Namespace) -> tuple[Path, str] | int:
    from quorumgate.proto.clusterfile import ClusterFileError

    try:
        spec = _load(args)
        spec.member(args.node)
    except ClusterFileError as err:
        return _fail(str(err), 2)
    return spec.node_dir(args.node) / "sidecar.db", spec.chain_id


def _cmd_artifacts(args: argparse.Namespace) -> int:
    from quorumgate.sidecar.operator import export_artifacts, list_artifacts

    found = _sidecar_db(args)
    if isinstance(found, int):
        return found
    db, chain = found
    if args.export:
        return export_artifacts(db, chain, Path(args.export))
    return list_artifacts(db, chain, args.json, sys.stdout)


def _cmd_ledger(args: argparse.Namespace) -> int:
    from quorumgate.sidecar.operator import ledger_export, ledger_verify, verify_ledger_file

    if args.ledger_command == "verify" and args.file:
        from quorumgate.proto.clusterfile import ClusterFileError

        try:
            spec = _load(args)
        except ClusterFileError as err:
            return _fail(str(err), 2)
        head = bytes.fromhex(args.head) if args.head else None
        return verify_ledger_file(
            Path(args.file),
            spec.chain_id,
            sys.stdout,
            expected_head=head,
            receipt_keys=spec.receipt_keys,  # an export of a pruned store starts signed
        )
    if args.node is None:
        return _fail("--node is required (or --file for an exported ledger)", 2)
    found = _sidecar_db(args)
    if isinstance(found, int):
        return found
    db, chain = found
    if args.ledger_command == "verify":
        keys = _load(args).receipt_keys  # a pruned store's checkpoint is signed
        return ledger_verify(db, chain, sys.stdout, receipt_keys=keys)
    return ledger_export(db, chain, sys.stdout)


class Progress:
    """A one-line progress bar on stderr with rate and ETA (a line per 10% when not a tty)."""

    def __init__(self, label: str, unit: str) -> None:
        self.label, self.unit = label, unit
        self.tty = sys.stderr.isatty()
        self.last_decile = -1
        self.last_draw = 0.0

    def __call__(self, done: int, total: int, elapsed_s: float) -> None:
        now = time.monotonic()
        fraction = done / total if total else 1.0
        decile = int(fraction * 10)
        if self.tty and now - self.last_draw < 0.1 and done < total:
            return
        if not self.tty and decile == self.last_decile and done < total:
            return
        self.last_draw, self.last_decile = now, decile
        rate = done / elapsed_s if elapsed_s > 0 else 0.0
        eta = (total - done) / rate if rate > 0 else 0.0
        bar = "#" * int(fraction * 30)
        line = f"{self.label} [{bar:<30}] {done}/{total} {self.unit} {rate:,.0f}/s ETA {eta:,.0f} s"
        sys.stderr.write(("\r" + line) if self.tty else line + "\n")
        if self.tty and done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _cmd_replay(args: argparse.Namespace) -> int:
    import asyncio

    from quorumgate.ops.nodes import running_pid
    from quorumgate.proto.clusterfile import ClusterFileError
    from quorumgate.sidecar.replay import ReplayError, replay

    try:
        spec = _load(args)
        spec.member(args.node)
    except ClusterFileError as err:
        return _fail(str(err), 2)
    if running_pid(spec, args.node, "sidecar") is not None:
        return _fail(
            f"sidecar {args.node} is running; stop it first "
            f"(quorumgate down --dir {args.dir} --node {args.node} stops its replica too)",
            2,
        )
    progress = None if args.quiet else Progress(f"replay node {args.node}", "heights")
    try:
        report = asyncio.run(
            replay(
                spec,
                args.node,
                from_height=args.from_height,
                resume=not args.no_resume,
                progress=progress,
                workers=0 if args.in_process else 1,
                from_snapshot=args.from_snapshot,
            )
        )
    except ReplayError as err:
        return _fail(str(err))
    doc = report.as_dict()
    if args.json:
        print(json.dumps(doc))
    else:
        print(
            f"replayed {report.heights_replayed} heights ({report.verdicts} verdicts) of node "
            f"{report.node} up to height {report.top_height} in {doc['seconds']} s "
            f"({doc['rate_heights_per_s']} heights/s, {doc['rate_verdicts_per_s']} verdicts/s)"
        )
        print(
            f"compared {report.heights_compared} heights, recorded {report.heights_recorded}; "
            f"artifacts re-confirmed {report.artifacts_reconfirmed}, written "
            f"{report.artifacts_written}; certificates checked {report.certificates_checked}"
            + (f"; resumed after height {report.resumed_from}" if report.resumed_from else "")
        )
        if report.snapshot is not None:
            snap = report.snapshot
            print(
                f"installed the snapshot of height {snap['height']} ({snap['bytes']} bytes, "
                f"{snap['chunks']} chunks) attested by members {snap['attested_by']}, served "
                f"by {snap['served_by']}, in {snap['seconds']} s"
            )
        if report.history_from and report.history_pruned:
            print(
                f"history starts at height {report.history_from + 1} (pruned below, "
                f"checkpoint at height {report.history_from}, ledger head "
                f"{report.history_ledger_head})"
            )
        elif report.history_from:
            print(
                f"local history starts at height {report.history_from} (ledger head "
                f"{report.history_ledger_head}): heights below it are not in this store"
            )
        if report.start_epoch:
            print(
                f"started in epoch {report.start_epoch} (the replica's stored epoch ends, "
                "checked from the genesis member set)"
            )
        for crossed in report.epochs:
            print(
                f"epoch {crossed['epoch']} from height {crossed['from_height']}: change block "
                f"at height {crossed['boundary_height']}, new consensus key for members "
                f"{crossed['rotated']}"
            )
        if report.mismatches:
            print(f"{len(report.mismatches)} MISMATCHES:")
            for m in report.mismatches[:20]:
                print(f"  height {m['height']}: {m['what']}: {m['detail']}")
        else:
            print("no mismatches")
    return 0 if report.ok else 1


def _cmd_policy_test(args: argparse.Namespace) -> int:
    from quorumgate.sidecar.policykit import run_policy_test

    return run_policy_test(args.file, json_output=args.json)


def _cmd_policy_explain(args: argparse.Namespace) -> int:
    from quorumgate.sidecar.policyexplain import run_policy_explain

    return run_policy_explain(
        args.file, agent=args.agent, tool=args.tool, target=args.target, also=args.also,
        arguments=args.arg, via=args.via, run=args.run, json_output=args.json,
        after=args.after,
    )  # fmt: skip


# Long on purpose: argparse declarations, one subcommand after another; split, the CLI's
# shape would no longer read as one list.
def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `command`, a command defined in this file, only the
    commands of this file: the commands of the proxy, the gateway, the console, the
    client and the drills import their packages to declare their options, which costs
    most of a second on every `status`, `up` or `down`."""
    parser = argparse.ArgumentParser(
        prog="quorumgate",
        description="QuorumGate: a Byzantine-fault-tolerant judge for AI-agent tool calls.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser(
        "simulate", help="run a simulated cluster of consensus cores and print its chain"
    )
    sim.add_argument("--nodes", type=int, default=4)
    sim.add_argument("--seed", type=int, default=1)
    sim.add_argument("--ticks", type=int, default=600)
    sim.add_argument("--byzantine", nargs="*", default=[], help="behaviours, at most f")
    sim.add_argument("--loss-permille", type=int, default=0)
    sim.add_argument("--show", type=int, default=10, help="last N committed blocks to print")
    sim.add_argument("--json", action="store_true")
    sim.set_defaults(func=_cmd_simulate)

    demo = sub.add_parser(
        "demo", help="the main job: a local cluster, the multi-agent example, live status"
    )
    demo.add_argument("--dir", help="cluster directory, made if absent (run/demo-N)")
    demo.add_argument("--nodes", type=int, default=4, help="4 or 7 (any 3f+1)")
    demo.add_argument("--once", action="store_true", help="stop the cluster at the end")
    demo.add_argument("--refresh", type=float, default=1.0)
    demo.add_argument(
        "--vendored",
        action="store_true",
        help="the variant: an unmodified anthropic-SDK agent governed by the proxy",
    )
    demo.set_defaults(func=_cmd_demo)

    init = sub.add_parser("init", help="write a cluster file and keys for N replicas")
    init.add_argument("--nodes", type=int, default=4, help="3f+1 replicas: 4 or 7 (default 4)")
    init.add_argument("--dir", required=True)
    init.add_argument("--host", default="127.0.0.1", help="address every member listens on")
    init.add_argument(
        "--hosts",
        help="members on several hosts: member I's address is the I-th of these "
        "(comma-separated), its ports fixed from --port-base",
    )
    init.add_argument(
        "--capacity",
        action="append",
        default=[],
        metavar="NAME=N",
        help="raise or lower one of the engine's capacities (agents_max, grants_max, "
        "pending_max, ...: proto/clusterfile.py CAPACITY_NAMES); repeatable",
    )
    init.add_argument(
        "--port-base",
        type=int,
        help="fixed ports: each member's four from here (default with --hosts: 7400); "
        "with --join, the new machine's four",
    )
    init.add_argument(
        "--insecure",
        action="store_true",
        help="plaintext gRPC, no TLS: only on a network you trust (status says so)",
    )
    init.add_argument(
        "--join",
        action="store_true",
        help="a new machine for an existing member (with --cluster, --index): its keys and "
        "ports; prints the entry for `admin replace-member`",
    )
    init.add_argument("--cluster", metavar="FILE", help="with --join: the cluster.json to trust")
    init.add_argument("--index", type=int, metavar="I", help="with --join: the member replaced")
    init.add_argument("--json", action="store_true")
    init.set_defaults(func=_cmd_init)

    up = sub.add_parser("up", help="start every replica of a cluster as its own process")
    up.add_argument("--dir", required=True)
    up.add_argument("--node", type=int, help="start only this member (multi-host setups)")
    up.add_argument("--detach", action="store_true", help="return once the cluster serves")
    up.add_argument("--refresh", type=float, default=1.0, help="status refresh seconds")
    up.set_defaults(func=_cmd_up)

    status = sub.add_parser("status", help="per node: alive, height, view, leader")
    status.add_argument("--dir", required=True)
    status.add_argument("--json", action="store_true")
    status.add_argument(
        "--key",
        help="key file to read the chain of epochs with (default DIR/owner.key; an auditor's "
        "or a member's)",
    )
    status.set_defaults(func=_cmd_status)

    epochs = sub.add_parser(
        "epochs", help="every epoch's member keys, checked link by link from cluster.json"
    )
    epochs.add_argument("--dir", required=True)
    epochs.add_argument("--json", action="store_true")
    epochs.add_argument(
        "--key", help="key file to read with (default DIR/owner.key; an auditor's or a member's)"
    )
    epochs.set_defaults(func=_cmd_epochs)

    down = sub.add_parser("down", help="stop what `up` started for this directory")
    down.add_argument("--dir", required=True)
    down.add_argument("--node", type=int)
    down.set_defaults(func=_cmd_down)

    backup = sub.add_parser("backup", help="copy a stopped replica's store to a file")
    backup.add_argument("--dir", required=True)
    backup.add_argument("--node", type=int, required=True)
    backup.add_argument("--to", required=True, help="the backup file (must not exist)")
    backup.set_defaults(func=_cmd_backup_or_restore)

    restore = sub.add_parser(
        "restore",
        help="put a backup back as a stopped replica's store, declared (it starts fenced)",
    )
    restore.add_argument("--dir", required=True)
    restore.add_argument("--node", type=int, required=True)
    restore.add_argument("--from", dest="source", required=True, help="the backup file")
    restore.set_defaults(func=_cmd_backup_or_restore)

    node = sub.add_parser("node", help="run one replica in the foreground (multi-host)")
    node.add_argument("--dir", required=True)
    node.add_argument("--node", type=int, required=True)
    node.set_defaults(func=_cmd_node)

    bench = sub.add_parser(
        "bench",
        help="benchmark: certified proposals/s, latency, CPU and RSS; baselines",
        description="Load a cluster with signed 256-byte proposals from client processes "
        "and report committed and certified proposals per second, submit-to-commit and "
        "submit-to-certificate latency p50/p99, cluster CPU seconds per proposal and peak "
        "RSS per process (medians over --runs).",
    )
    where = bench.add_mutually_exclusive_group(required=True)
    where.add_argument("--dir", help="a running cluster's directory")
    where.add_argument(
        "--start",
        action="store_true",
        help="init and start a temporary cluster (stopped at the end)",
    )
    bench.add_argument("--nodes", type=int, default=4, help="with --start: 4 or 7 (any 3f+1)")
    bench.add_argument("--seconds", type=float, default=10.0, help="measured window per run")
    bench.add_argument("--warmup", type=float, default=2.0, help="seconds before the window")
    bench.add_argument("--inflight", type=int, default=256, help="closed loop: in flight, in all")
    bench.add_argument("--rate", type=float, help="open loop: proposals/s offered, in all")
    bench.add_argument("--clients", type=int, default=2, help="client processes")
    bench.add_argument(
        "--ordering-only", action="store_true", help="replicas only; count committed proposals"
    )
    bench.add_argument("--runs", type=int, default=1, help="runs per point (medians reported)")
    bench.add_argument(
        "--sweep", help="comma-separated inflight values (or rates with --rate): 1,8,64,256"
    )
    bench.add_argument(
        "--agents", type=int, default=2048, help="governed bench agents (the quota is per agent)"
    )
    bench.add_argument(
        "--baselines", action="store_true", help="PySyncObj (and etcd if on PATH), same runs"
    )
    bench.add_argument("--plot", metavar="FILE.png", help="throughput against latency (matplotlib)")
    bench.add_argument(
        "--breakdown",
        action="store_true",
        help="with --start: where one call's time goes at W = 1, stage by stage (traced)",
    )
    bench.add_argument(
        "--calls", type=int, default=100, help="--breakdown, --idle: calls per run (W = 1)"
    )
    bench.add_argument(
        "--state",
        choices=("fresh", "large"),
        default="fresh",
        help="--breakdown, --idle: 'large' first fills the cluster with 10,100 agents, "
        "10,000 grants and 5,000 pending cards (--breakdown then runs fresh and large "
        "clusters interleaved and prints the ratio)",
    )
    bench.add_argument(
        "--idle",
        type=float,
        metavar="SECONDS",
        help="with --start: CPU of the cluster's processes left idle for SECONDS after "
        "--calls calls (an idle cluster goes quiet: docs/consensus/protocol.md)",
    )
    bench.add_argument(
        "--ab-poll",
        action="store_true",
        help="--breakdown: interleave runs where the client polls receipts (as before the "
        "long poll) with runs where it long-polls",
    )
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(func=_cmd_bench)

    artifacts = sub.add_parser("artifacts", help="a sidecar's rejection artifacts")
    artifacts.add_argument("--dir", required=True)
    artifacts.add_argument("--node", type=int, required=True)
    artifacts.add_argument("--json", action="store_true")
    artifacts.add_argument("--export", metavar="OUT_DIR", help="write one file per artifact")
    artifacts.set_defaults(func=_cmd_artifacts)

    ledger = sub.add_parser("ledger", help="a sidecar's verdict ledger")
    ledger_sub = ledger.add_subparsers(dest="ledger_command", required=True)
    lverify = ledger_sub.add_parser("verify", help="check the hash chain; name the first bad entry")
    lverify.add_argument("--dir", required=True)
    lverify.add_argument("--node", type=int)
    lverify.add_argument("--file", help="an exported ledger (JSONL) instead of a node's store")
    lverify.add_argument("--head", help="with --file: the head (hex) another sidecar reports")
    lverify.set_defaults(func=_cmd_ledger)
    lexport = ledger_sub.add_parser("export", help="JSONL, one verdict a line")
    lexport.add_argument("--dir", required=True)
    lexport.add_argument("--node", type=int, required=True)
    lexport.set_defaults(func=_cmd_ledger)

    rp = sub.add_parser("replay", help="rebuild and check a sidecar's state from its log")
    rp.add_argument("--dir", required=True)
    rp.add_argument("--node", type=int, required=True)
    rp.add_argument("--from-height", type=int, default=1, help="compare from this height on")
    rp.add_argument("--no-resume", action="store_true", help="ignore a checkpoint, start over")
    rp.add_argument(
        "--from-snapshot",
        action="store_true",
        help="start an empty store from the newest snapshot f+1 peers attest (docs/snapshots.md)",
    )
    rp.add_argument("--quiet", action="store_true", help="no progress bar")
    rp.add_argument(
        "--in-process",
        action="store_true",
        help="execute in this process (by default a second process executes, on another core)",
    )
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(func=_cmd_replay)

    policy = sub.add_parser("policy", help="operator policy tools")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)
    ptest = policy_sub.add_parser("test", help="check a policy file's expected verdicts")
    ptest.add_argument("file")
    ptest.add_argument("--json", action="store_true")
    ptest.set_defaults(func=_cmd_policy_test)
    pexplain = policy_sub.add_parser(
        "explain", help="which rules, from which mandate, decide one call of a policy file"
    )
    pexplain.add_argument("file")
    pexplain.add_argument("--agent", required=True)
    pexplain.add_argument("--tool", required=True)
    pexplain.add_argument("--target", default="", help="the main target (empty: none)")
    pexplain.add_argument(
        "--also", action="append", default=[], metavar="ROLE=TARGET", help="a further target"
    )
    pexplain.add_argument(
        "--arg", action="append", default=[], metavar="NAME=VALUE",
        help="an argument: its value is judged by the argument rules, never printed",
    )  # fmt: skip
    pexplain.add_argument("--via", default=None, help="act under this delegation of the file")
    pexplain.add_argument("--run", default="run-1")
    pexplain.add_argument(
        "--after", action="append", default=[], metavar="TOOL=TARGET",
        help="a call made first in the same run (docs/provenance.md: to explain an exposed run)",
    )  # fmt: skip
    pexplain.add_argument("--json", action="store_true")
    pexplain.set_defaults(func=_cmd_policy_explain)
    if command in sub.choices and command != "policy":  # ("policy plan" is below)
        return parser

    from quorumgate.audit.command import add_parsers as add_audit_parsers

    add_audit_parsers(sub)

    from quorumgate.ops.clientcli import add_client_commands

    add_client_commands(sub)

    from quorumgate.ops.drill import add_drill_command

    add_drill_command(sub)

    from quorumgate.ops.policyplan import add_policy_plan_commands

    add_policy_plan_commands(policy_sub)

    from quorumgate.proxy.command import add_proxy_command

    add_proxy_command(sub)

    from quorumgate.mcpgw.command import add_mcp_commands

    add_mcp_commands(sub)

    from quorumgate.console.command import add_console_command

    add_console_command(sub)

    from quorumgate.notify.command import add_notify_command

    add_notify_command(sub)
    return parser


DEBUG_ENV = "QUORUMGATE_DEBUG"  # set it to see the traceback of an unexpected error


def _raise_interrupt(signum: int, frame: object) -> None:
    # The first SIGTERM starts the stop; a second one (a supervisor that signals the whole
    # process group, `timeout` among them) must not cut the stop short, and could land
    # before the stop itself holds interrupts, leaving the nodes running.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def stop_on_sigterm_as_on_ctrl_c() -> None:
    """A supervisor (systemd, `timeout`, a container runtime) stops a foreground command
    with SIGTERM, not Ctrl-C. Unwind the same way, so a command that started replicas and
    sidecars (`up`, `demo`) stops them before it exits instead of leaving them running."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_interrupt)


def main(argv: Sequence[str] | None = None) -> int:
    """Every error is one line on stderr that says what to do, and exit status 2; a
    Python traceback only with QUORUMGATE_DEBUG=1."""
    words = list(sys.argv[1:] if argv is None else argv)
    command = words[0] if words and not words[0].startswith("-") else None
    args = build_parser(command).parse_args(words)
    stop_on_sigterm_as_on_ctrl_c()
    try:
        result: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        if os.environ.get(DEBUG_ENV):
            raise
        return _fail(describe_error(err), 2)
    return result


def describe_error(err: BaseException) -> str:
    """One line for an error no command handled itself. It names what failed and what to
    do; it never carries an argument value (our errors never hold one) or a traceback."""
    from quorumgate.ops.nodes import OpsError
    from quorumgate.proto.clusterfile import ClusterFileError
    from quorumgate.sdk.client import (
        CertificateTimeout,
        ClusterUnavailable,
        InvalidCertificate,
        QuorumGateError,
        Refused,
    )

    if isinstance(err, ClusterFileError | OpsError):
        return str(err)
    if isinstance(err, ClusterUnavailable):
        return (
            f"the cluster could not be reached ({err.reason}); "
            "check that it runs with `quorumgate status --dir DIR`"
        )
    if isinstance(err, CertificateTimeout):
        return (
            "no certified verdict arrived before the deadline; check the proposal id with "
            "`quorumgate verdicts --dir DIR`, or wait longer with --deadline S"
        )
    if isinstance(err, InvalidCertificate):
        return f"a certificate did not verify ({err.reason}); report it: a sidecar may be faulty"
    if isinstance(err, Refused):
        return f"the cluster refused the transaction ({err.reason})"
    if isinstance(err, QuorumGateError):
        return f"{type(err).__name__} ({err.reason})"
    if isinstance(err, OSError):
        where = f" ({err.filename})" if err.filename else ""
        return f"{err.strerror or type(err).__name__}{where}"
    return (
        f"unexpected error ({type(err).__name__}); "
        f"run again with {DEBUG_ENV}=1 for the traceback and report it"
    )


if __name__ == "__main__":
    sys.exit(main())
