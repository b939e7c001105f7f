"""Replacing, growing and shrinking across hosts (docs/operating.md, "Several hosts"),
under load, TLS on, every machine its own network namespace with its own address on one
bridge (`tests/support/netns.py`).

Member 3's host is gone for good (its cable deleted, its processes killed). A new machine
with a new address prepares its own directory with `quorumgate init --join --host ADDR
--port-base 7400` (run on that machine, in its namespace, on the ports the others use),
starts from genesis as a non-member, and `admin replace-member`, run from the operator's
namespace, makes it member 3: it catches up from the others over the bridge and votes in
epoch 1. Three more machines join the same way and `admin add-member` grows the cluster
4 -> 7 (epoch 2), where a call is certified by f+1 of the seven; `admin remove-member`
shrinks it back (epoch 3) and the removed replicas exit (but for one that had not
committed the change block when the others left, which is never told: a limit,
docs/consensus/epochs.md, "Growing and shrinking"). At the end every live member holds
one chain, each acknowledged proposal in it once, every certificate checks with the
member set of its epoch (from the chain of epochs a client checks from cluster.json), the
sidecars' stores hold one state root, one ledger head and ledgers that verify, and no
replica's vote table splits a view. The checks
are the drills' own functions (cluster/ops/drills/checker.py, replace.py, audit.py).

Needs root and `ip` (CI runs as root); skipped, saying so, without them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from nacl.signing import SigningKey

from quorumgate.ops.drills.audit import certify, read_replica, read_sidecar
from quorumgate.ops.drills.bounds import EXPECTED_ALLOWED
from quorumgate.ops.drills.checker import majority, placements, vote_splits
from quorumgate.ops.drills.machines import certificate_problems, new_machine_vote_problems
from quorumgate.ops.nodes import log_tail
from quorumgate.proto.clusterfile import (
    OWNER_KEY_FILE,
    ClusterSpec,
    init_cluster,
    load_cluster,
    read_seed,
)
from quorumgate.proto.membership import is_record
from quorumgate.sdk.builders import tool_spec
from quorumgate.sdk.certificates import verify
from quorumgate.sdk.client import Client
from quorumgate.sdk.epochs import Epochs
from quorumgate.sdk.polling import poll_for
from quorumgate.sdk.sync import SyncClient
from tests.support.cluster import new_agent
from tests.support.live import (
    POLL_S,
    WAIT_S,
    LiveCluster,
    Load,
    assert_each_committed_once,
    wait_sidecars_settled,
    wait_until,
)
from tests.support.netns import IP, NEEDS_ROOT, Hosts, NamespacedCluster

pytestmark = NEEDS_ROOT

N = 4
GONE = 3  # the member whose host is gone for good
STAYING = [0, 1, 2]  # on their first hosts throughout; the load goes to them
NEW = (4, 5, 6)  # the members the add brings and the remove takes away
CLI_TIMEOUT_S = 120.0
HEIGHTS = 3  # heights committed to show progress
# 8 agents x 2/s for up to 500 s, longer than the test even on a loaded machine (where it
# took 450 s): every change is made under load.
LOAD_AGENTS, LOAD_PER_AGENT, LOAD_RATE_PER_S = 8, 1000, 2.0
URL = "https://example.com/in-the-epoch-of-seven"
REMOVED_EXIT_S = 15.0  # a removed replica that committed the change block exits in this
CERTIFIED_SAMPLE = 5  # proposals of the epoch of seven certified at the end
PORT_BASE = 7400  # each host's ports, the new ones' as the first four's (`init --hosts`)


def quorumgate(*args: str, on: str | None = None) -> subprocess.CompletedProcess[str]:
    """The command line, run as an operator runs it: on machine `on` (a namespace), or
    from the test's own namespace (the operator's workstation, which reaches every host
    and holds the owner key)."""
    where = [] if on is None else [str(IP), "netns", "exec", on]
    return subprocess.run(
        [*where, sys.executable, "-m", "quorumgate", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def new_machine(hosts: Hosts, spec: ClusterSpec, index: int, home: Path) -> tuple[int, Path]:
    """A new host on the bridge, and on it `init --join --host <its address> --port-base
    7400` for member `index`: its machine number and the entry file the owner signs."""
    h = hosts.add()
    made = quorumgate(
        "init", "--join", "--cluster", str(spec.directory / "cluster.json"),
        "--index", str(index), "--dir", str(home), "--host", hosts.addresses[h],
        "--port-base", str(PORT_BASE), "--json", on=hosts.ns[h],
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    entry = json.loads(made.stdout)
    assert entry["index"] == index and entry["host"] == hosts.addresses[h], entry
    assert entry["replica_port"] == PORT_BASE, entry
    assert entry["tls_cert"], "a cluster with TLS: the new machine brings its certificate"
    path = home.parent / f"entry-{index}.json"
    path.write_text(made.stdout)
    return h, path


def checked_epochs(spec: ClusterSpec) -> Epochs:
    """The chain of epochs as the owner's client checks it from cluster.json."""

    async def main() -> Epochs:
        owner = SigningKey(read_seed(spec.directory / OWNER_KEY_FILE))
        async with Client(spec, owner) as client:
            return await client.epochs()

    return asyncio.run(main())


def test_replace_grow_and_shrink_across_hosts_with_tls(hosts: Hosts, tmp_path: Path) -> None:
    spec = init_cluster(tmp_path / "cluster", N, hosts=hosts.addresses)
    assert spec.transport == "tls"
    cluster = NamespacedCluster(spec, hosts)
    machines: dict[int, NamespacedCluster] = {}  # member -> the new machine it runs on
    readers: list[LiveCluster] = []  # read the cluster as it stands; start nothing
    load: Load | None = None
    try:
        cluster.start()
        cluster.start_sidecars()
        with SyncClient.as_owner(spec.directory) as owner:
            owner.register_tool(tool_spec("web.get", "read", schemes=["https"]))
            _, agent_key = new_agent(owner, ["web.get"])
        load = Load(
            cluster,
            "netns-members",
            agents=LOAD_AGENTS,
            per_agent=LOAD_PER_AGENT,
            batch=5,
            rate_per_s=LOAD_RATE_PER_S,
            targets=STAYING,
        )
        cluster.register(load.agents)
        load.start()
        load.wait_acked(10)

        # Member 3's host is gone for good: its cable, then its processes.
        hosts.remove(GONE)
        cluster.kill(GONE, kind="sidecar")
        cluster.kill(GONE)
        cluster.wait_progress(HEIGHTS, STAYING)

        # The new machine for member 3, at a new address; it follows epoch 0 from genesis.
        h, entry = new_machine(hosts, spec, GONE, tmp_path / "machine-3")
        machines[GONE] = NamespacedCluster(load_cluster(tmp_path / "machine-3"), hosts, {GONE: h})
        machines[GONE].start([GONE])
        machines[GONE].start_sidecars([GONE])
        # The cluster as the chain of epochs will describe it, read as the owner.
        view = LiveCluster(replace(spec, joined=machines[GONE].spec.member(GONE)))
        readers.append(view)
        assert view.status(GONE).epoch == 0
        done = quorumgate(
            "admin", "replace-member", "--dir", str(spec.directory), "--member", str(GONE),
            "--entry", str(entry), "--json", "--deadline", str(WAIT_S),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        assert doc["in_effect"] and doc["address"] == view.spec.member(GONE).replica_address
        wait_until("the new member 3 in epoch 1", lambda: view.status(GONE).epoch == 1)
        goal = max(cluster.heights(STAYING).values()) + HEIGHTS
        cluster.wait_height(goal, STAYING)
        view.wait_height(goal, [GONE])

        # Grow 4 -> 7: three more machines, each at its own address.
        entries = []
        for index in NEW:
            h, entry = new_machine(hosts, spec, index, tmp_path / f"machine-{index}")
            machines[index] = NamespacedCluster(
                load_cluster(tmp_path / f"machine-{index}"), hosts, {index: h}
            )
            machines[index].start([index])
            machines[index].start_sidecars([index])
            entries += ["--entry", str(entry)]
        added = quorumgate(
            "admin", "add-member", "--dir", str(spec.directory), *entries,
            "--json", "--deadline", str(WAIT_S),
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
        doc = json.loads(added.stdout)
        assert doc["in_effect"] and doc["members_after"] == 7 and doc["epoch"] == 1
        seven = LiveCluster(checked_epochs(spec).cluster(spec))
        readers.append(seven)
        wait_until(
            "all seven in epoch 2",
            lambda: {int(s.epoch) for s in seven.statuses(range(7)).values()} == {2},
        )
        # A call certified in the epoch of seven: f+1 = 3 receipts, checked with epoch 2's
        # receipt keys. The agent may not read the chain of epochs: it reaches the sidecars
        # cluster.json names, of which three run, and needs every one of them, each
        # executing on a loaded machine; hence the suite's wait rather than the SDK's.
        epochs = checked_epochs(spec)
        assert [e.members for e in epochs.epochs] == [4, 4, 7]
        with SyncClient(spec, agent_key) as agent:
            decision = agent.propose("web.get", URL, run_id="seven", deadline_s=WAIT_S)
        certificate = decision.certificate
        assert decision.allowed and certificate.epoch == 2
        verify(spec, certificate, epochs=epochs.receipt_epochs)
        assert len({signer for signer, _ in certificate.signatures}) >= 3

        # Shrink 7 -> 4: members 4, 5 and 6 leave, and their replicas exit at the boundary.
        removed = quorumgate(
            "admin", "remove-member", "--dir", str(spec.directory),
            "--json", "--deadline", str(WAIT_S),
        )  # fmt: skip
        assert removed.returncode == 0, removed.stderr
        doc = json.loads(removed.stdout)
        assert doc["in_effect"] and doc["members_after"] == 4 and doc["epoch"] == 2
        live = [*STAYING, GONE]
        wait_until(
            "the four in epoch 3",
            lambda: {int(s.epoch) for s in seven.statuses(live).values()} == {3},
        )
        # A removed replica that committed the change block exits at the boundary. One
        # that had not yet when the others left epoch 2 is never told: they close their
        # links to it and refuse its streams (docs/consensus/epochs.md, "Growing and
        # shrinking", limits). It stays in epoch 2, signing nothing anyone counts, until
        # the operator stops it, as here.
        poll_for(
            lambda: all(machines[i].procs[i].poll() is not None for i in NEW) or None,
            REMOVED_EXIT_S,
            POLL_S,
        )
        left = [i for i in NEW if machines[i].procs[i].poll() is None]
        for index in left:
            assert seven.status(index).epoch == 2, index
            machines[index].stop_all()
        print(f"removed replicas that did not learn of the remove: {left}")

        # Settled: nothing acknowledged lost, one chain. The load stops first, then one
        # more call, certified in epoch 3, takes the chain into it: a cluster with nothing
        # to order commits nothing more (docs/consensus/protocol.md).
        load.stop()
        load.assert_clean()
        with SyncClient(spec, agent_key) as agent:
            decision = agent.propose("web.get", URL, run_id="four", deadline_s=WAIT_S)
        assert decision.allowed and decision.certificate.epoch == 3
        committed_at = cluster.wait_committed(load.acked, 0)
        height = max(*committed_at.values(), decision.height)
        seven.wait_height(height, live)
        chain = seven.assert_same_chain(live, height)
        assert_each_committed_once(load.acked, chain)
        records = [b.height for b in chain for tx in b.payload if is_record(tx)]
        assert len(records) == 3, records

        # Every certificate with the member set of its epoch, as a client holding only
        # cluster.json and the chain of epochs checks it.
        epochs = checked_epochs(spec)
        assert epochs.current.epoch == 3 and epochs.current.members == 4
        problems, per_epoch = certificate_problems(chain, epochs.chain.epochs, spec.chain_id)
        assert not problems, problems[:5]
        assert sorted(per_epoch) == [0, 1, 2, 3], per_epoch
        # Proposals of the load committed after the replace, the last ones first (in the
        # epoch of seven when the load lasted), certified through the owner's client,
        # which follows the chain to the new hosts (the drills' `certify`).
        placed = placements(b for b in chain if b.height > records[0])
        sample = [p for p in reversed(list(load.acked)) if p in placed][:CERTIFIED_SAMPLE]
        assert sample, "no acknowledged proposal committed after the replace"
        certified = asyncio.run(certify(spec, sample))
        assert all(certified[p] == (placed[p][0], *EXPECTED_ALLOWED) for p in sample), certified

        # Every live sidecar at one height, then the stores read once all is stopped.
        homes = {i: spec for i in STAYING} | {GONE: machines[GONE].spec}
        settled_at = wait_sidecars_settled(lambda: seven.heights(live), homes)
        settled = next(iter(settled_at.values())).executed_height
        seven.assert_no_equivocation_seen(live)
        cluster.stop_all()
        machines[GONE].stop_all()
        sidecars = {i: asyncio.run(read_sidecar(homes[i], i, settled)) for i in live}
        assert majority({i: v.state_root for i, v in sidecars.items()})[1] == []
        assert majority({i: v.ledger_head for i, v in sidecars.items()})[1] == []
        assert all(v.ledger_entries > 0 and not v.ledger_problem for v in sidecars.values())
        stores = {i: machines[i].spec if i in machines else spec for i in (*live, *NEW)}
        votes = {i: asyncio.run(read_replica(stores[i], i)).votes for i in stores}
        assert vote_splits(votes) == {}
        # Each new machine voted from its first epoch on, and in no epoch before it.
        assert new_machine_vote_problems(votes[GONE], 1, 3) == []
        for index in NEW:
            assert new_machine_vote_problems(votes[index], 2, 2) == []
    except BaseException:
        print(cluster.log_tails(), file=sys.stderr)
        for index, machine in machines.items():
            tails = [log_tail(machine.spec, index, kind=kind) for kind in ("replica", "sidecar")]
            print(f"--- new machine {index} ---\n" + "\n".join(tails), file=sys.stderr)
        if load is not None:
            print(f"load: {load.failures[:5]} refused {load.refused[:5]}", file=sys.stderr)
        raise
    finally:
        if load is not None:
            load.stop()
        cluster.close()
        for machine in machines.values():
            machine.close()
        for reader in readers:
            for i in range(reader.n):
                reader.forget_channel(i)
