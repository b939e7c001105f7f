"""Prometheus metrics of one replica process, on its own registry (`/metrics`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class ReplicaMetrics:
    # One declaration per metric, each a few lines: long, and clearer as one list.
    def __init__(self, node: int) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        labels = {"node": str(node)}
        self.committed_height = Gauge(
            "qg_replica_committed_height", "Height of the last committed block", registry=r
        )
        self.view = Gauge("qg_replica_view", "Current consensus view", registry=r)
        self.epoch = Gauge(
            "qg_replica_epoch", "Consensus epoch (docs/consensus/epochs.md)", registry=r
        )
        self.leader = Gauge("qg_replica_leader", "Leader of the current view", registry=r)
        self.timeouts = Counter(
            "qg_replica_timeouts", "View timeouts this replica signed", registry=r
        )
        self.views_entered = Counter(
            "qg_replica_views", "Views entered, by what moved the replica", ["via"], registry=r
        )
        self.qc_latency = Histogram(
            "qg_replica_qc_latency_seconds",
            "From storing a block to holding a QC for it",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.commit_latency = Histogram(
            "qg_replica_commit_latency_seconds",
            "From storing a block to committing it",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.blocks_committed = Counter(
            "qg_replica_blocks_committed", "Blocks committed", registry=r
        )
        self.txs_committed = Counter(
            "qg_replica_transactions_committed", "Transactions committed", registry=r
        )
        self.mempool_txs = Gauge("qg_replica_mempool_txs", "Pending transactions", registry=r)
        self.mempool_bytes = Gauge("qg_replica_mempool_bytes", "Pending bytes", registry=r)
        self.submissions = Counter(
            "qg_replica_submissions",
            "Client transactions by result and reason",
            ["result", "reason"],
            registry=r,
        )
        self.dropped = Counter(
            "qg_replica_messages_dropped",
            "Peer messages dropped, by reason",
            ["reason"],
            registry=r,
        )
        self.read_waits = Gauge(
            "qg_replica_read_waits", "CommittedBlocks streams held open", registry=r
        )
        self.read_waits_refused = Counter(
            "qg_replica_read_waits_refused",
            "CommittedBlocks streams refused: the caller's key held all it may "
            "(runtime/readwaits.py)",
            registry=r,
        )
        self.refused_signatures = Counter(
            "qg_replica_safety_refusals",
            "Votes or timeouts the safety rules refused, by rule",
            ["rule"],
            registry=r,
        )
        self.tx_signatures = Counter(
            "qg_replica_tx_signatures",
            "Transaction signatures checked (verified) or known verified already (cached)",
            ["how"],
            registry=r,
        )
        self.peers_connected = Gauge(
            "qg_replica_peers_connected", "Peers with an open inbound stream", registry=r
        )
        self.peer_messages_sent = Counter(
            "qg_replica_peer_messages_sent",
            "Messages queued to peers (one per peer), by kind",
            ["kind"],
            registry=r,
        )
        self.send_queue_drops = Counter(
            "qg_replica_send_queue_drops", "Messages dropped on full peer send queues", registry=r
        )
        self.sync_requests = Counter(
            "qg_replica_sync_requests", "Catch-up requests sent", registry=r
        )
        self.sync_target = Gauge(
            "qg_replica_sync_target_height",
            "Highest committed height a peer reported (catch-up goal)",
            registry=r,
        )
        self.store_apply_latency = Histogram(
            "qg_replica_store_apply_seconds",
            "One durable SQLite transaction (safety, blocks, commits)",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.info = Gauge("qg_replica_info", "Static facts", list(labels), registry=r)
        self.info.labels(**labels).set(1)
