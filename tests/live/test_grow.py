"""The cluster grown 4 -> 7 and shrunk 7 -> 4 live (docs/consensus/epochs.md, "Growing and
shrinking"; docs/operating.md, "Growing and shrinking the cluster"). Three new machines,
prepared with `init --join --index 4..6`, follow epoch 0 without signing; `admin
add-member` signs the `add` record with their entries and they vote from epoch 1 on;
`admin remove-member` takes members 4, 5 and 6 out again, whose replicas stop for good at
the boundary, and the four that stay commit in epoch 2."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey, VerifyKey

from quorumgate.proto.clusterfile import OWNER_KEY_FILE, load_cluster, read_seed
from quorumgate.proto.membership import is_record
from quorumgate.replica.types import Block, vote_bytes
from quorumgate.sdk.builders import tool_spec
from quorumgate.sdk.certificates import verify
from quorumgate.sdk.client import Client
from quorumgate.sdk.sync import SyncClient
from quorumgate.sidecar.receipts import ReceiptEpochs
from tests.support.cluster import new_agent
from tests.support.live import (
    WAIT_S,
    LiveCluster,
    Load,
    assert_each_committed_once,
    wait_sidecars_settled,
    wait_until,
)

N = 4
NEW = (4, 5, 6)
CLI_TIMEOUT_S = 120.0
URL = "https://example.com/after-the-add"


def quorumgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quorumgate", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def status_cluster(directory: Path) -> dict[str, Any]:
    """What `quorumgate status --json` says of the cluster as it stands."""
    shown = quorumgate("status", "--dir", str(directory), "--json")
    assert shown.returncode == 0, shown.stderr
    standing: dict[str, Any] = json.loads(shown.stdout)["cluster"]
    return standing


def votes_in_epoch(
    chain: list[Block], first: int, last: int, chain_id: str, epoch: int, keys: dict[int, bytes]
) -> dict[int, int]:
    """Signatures of each member of `keys` in the certificates of blocks first..last, each
    checked with its key over `epoch`'s statement (one that does not check raises)."""
    counted = dict.fromkeys(keys, 0)
    for block in chain:
        if not first <= block.height <= last:
            continue
        qc = block.justify
        for signer, signature in qc.signatures:
            if signer in keys:
                domain = f"{chain_id}#epoch={epoch}"
                statement = vote_bytes(domain, qc.view, qc.height, qc.block_hash)
                VerifyKey(keys[signer]).verify(statement, signature)
                counted[signer] += 1
    return counted


def test_four_grow_to_seven_and_shrink_to_four(
    live_cluster: Callable[..., LiveCluster], tmp_path: Path
) -> None:
    cluster = live_cluster(N)
    cluster.start_sidecars()
    spec = cluster.spec
    with SyncClient.as_owner(spec.directory) as owner:
        owner.register_tool(tool_spec("web.get", "read", schemes=["https"]))
        _, agent_key = new_agent(owner, ["web.get"])
    load = Load(cluster, "grow", agents=2, per_agent=600, batch=5, rate_per_s=10)
    cluster.register(load.agents)
    load.start()
    load.wait_acked(10)

    # The three new machines: directories, keys and entries; each follows epoch 0.
    joined: dict[int, LiveCluster] = {}  # starts and stops each new machine
    views: dict[int, LiveCluster] = {}  # reads it as the owner; starts and stops nothing
    entries: dict[int, dict[str, object]] = {}
    entry_files: list[str] = []
    try:
        for index in NEW:
            made = quorumgate(
                "init", "--join", "--cluster", str(spec.directory / "cluster.json"),
                "--index", str(index), "--dir", str(tmp_path / f"new-{index}"),
            )  # fmt: skip
            assert made.returncode == 0, made.stderr
            entries[index] = json.loads(made.stdout)
            path = tmp_path / f"entry-{index}.json"
            path.write_text(made.stdout)
            entry_files.append(str(path))
            joined[index] = LiveCluster(load_cluster(tmp_path / f"new-{index}"))
            views[index] = LiveCluster(replace(spec, joined=joined[index].spec.member(index)))
            if index != NEW[-1]:
                joined[index].start([index])
                joined[index].start_sidecars([index])

        # An add of a machine that is not running is refused before signing: signed, it
        # would leave an epoch of seven with six voters at most, and with one more down,
        # none that commits.
        early = quorumgate(
            "admin", "add-member", "--dir", str(spec.directory),
            *[a for f in entry_files for a in ("--entry", f)], "--json",
        )  # fmt: skip
        assert early.returncode != 0 and f"member {NEW[-1]}" in early.stderr, early.stderr
        assert "does not answer" in early.stderr, early.stderr
        assert all(cluster.status(i).epoch == 0 for i in range(N))
        joined[NEW[-1]].start([NEW[-1]])
        joined[NEW[-1]].start_sidecars([NEW[-1]])
        for index in NEW:
            assert views[index].status(index).epoch == 0  # a follower, from genesis

        # An add whose entries name a running member's index is refused before signing.
        wrong = quorumgate(
            "admin", "add-member", "--dir", str(spec.directory),
            "--entry", entry_files[0], "--entry", entry_files[1], "--json",
        )  # fmt: skip
        assert wrong.returncode != 0
        added = quorumgate(
            "admin", "add-member", "--dir", str(spec.directory),
            *[a for f in entry_files for a in ("--entry", f)],
            "--json", "--deadline", str(WAIT_S),
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
        doc = json.loads(added.stdout)
        assert doc["in_effect"] and doc["members_after"] == 7 and doc["epoch"] == 0
        assert len(doc["nodes_in_next_epoch"]) >= 5  # 2f+1 of epoch 1's seven
        for index in NEW:
            wait_until(
                f"new member {index} in epoch 1",
                lambda i=index: views[i].status(i).epoch == 1,  # type: ignore[misc]
            )
        cluster.wait_progress(3)
        goal = max(cluster.heights().values())
        for index in NEW:
            views[index].wait_height(goal, [index])

        # A call certified after the add verifies with f+1 = 3 of epoch 1's seven receipt
        # keys (the SDK counts f of the epoch the certificate names).
        owner_key = SigningKey(read_seed(spec.directory / OWNER_KEY_FILE))

        async def chain() -> ReceiptEpochs:
            async with Client(spec, owner_key) as client:
                return (await client.epochs()).receipt_epochs

        epochs = asyncio.run(chain())
        assert [len(e.keys) for e in epochs.epochs] == [4, 7]
        # `quorumgate status` shows the seven as they stand, the three added in epoch 1 at
        # their own addresses (docs/operating.md, "Status after a reconfiguration").
        standing = status_cluster(spec.directory)
        assert standing["followed"] and standing["epoch"] == 1
        members = {m["index"]: m for m in standing["members"]}
        assert sorted(members) == list(range(7))
        for index in NEW:
            at = f"{entries[index]['host']}:{entries[index]['replica_port']}"
            assert members[index]["address"] == at
            assert members[index]["changes"] == [{"epoch": 1, "change": "added"}]
        with SyncClient(spec, agent_key) as agent:
            decision = agent.propose("web.get", URL, run_id="after-the-add")
        cert = decision.certificate
        assert decision.allowed and cert.epoch == 1
        verify(spec, cert, epochs=epochs)
        assert len({signer for signer, _ in cert.signatures}) >= 3

        # Shrink: members 4, 5, 6 leave; their replicas stop for good at the boundary.
        removed = quorumgate(
            "admin", "remove-member", "--dir", str(spec.directory),
            "--json", "--deadline", str(WAIT_S),
        )  # fmt: skip
        assert removed.returncode == 0, removed.stderr
        doc = json.loads(removed.stdout)
        assert doc["in_effect"] and doc["members_after"] == 4 and doc["epoch"] == 1
        for index in NEW:
            wait_until(
                f"removed member {index} to stop",
                lambda i=index: joined[i].procs[i].poll() is not None,  # type: ignore[misc]
            )
        wait_until("the four in epoch 2", lambda: {
            int(s.epoch) for s in cluster.statuses(range(N)).values()
        } == {2})  # fmt: skip
        cluster.wait_progress(3)
        standing = status_cluster(spec.directory)
        assert standing["epoch"] == 2 and len(standing["members"]) == N
        assert standing["removed"] == [{"index": i, "epoch": 2} for i in NEW]

        load.stop()
        load.assert_clean()
        committed_at = cluster.wait_committed(load.acked, 0)
        top = cluster.wait_height(max(committed_at.values()) + 2)
        height = min(top.values())
        chain = cluster.assert_same_chain(list(range(N)), height)
        assert_each_committed_once(load.acked, chain)
        records = [b.height for b in chain for tx in b.payload if is_record(tx)]
        assert len(records) == 2, records
        keys = {i: bytes.fromhex(str(entries[i]["public_key"])) for i in NEW}
        # Each new member's votes in epoch 1's certificates, under its own key.
        votes = votes_in_epoch(chain, records[0] + 2, records[1], spec.chain_id, 1, keys)
        assert all(votes[i] > 0 for i in NEW), votes
        # None of them signs in epoch 2.
        later = [s for b in chain if b.height > records[1] + 2 for s, _ in b.justify.signatures]
        assert later and not set(later) & set(NEW)
        statuses = wait_sidecars_settled(cluster.heights, {i: spec for i in range(N)})
        heads = {x.ledger_head for x in statuses.values()}
        assert len(heads) == 1 and not any(x.diverged for x in statuses.values())
        cluster.assert_no_equivocation_seen()
    finally:
        for index, view in views.items():
            view.forget_channel(index)
        for machine in joined.values():
            machine.close()
