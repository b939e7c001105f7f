"""New machines and the cluster as the chain of epochs describes it, for the drills that
change the member set (`replace-member`, module `replace`; `grow-shrink`, module `grow`;
docs/drills.md).

- Preparing a new machine is what an operator does: `quorumgate init --join --cluster
  DIR/cluster.json --index I --dir DIR/new-machine-...` in a new directory inside the
  drill's cluster directory (fresh consensus, receipt and TLS keys, free ports,
  `join.json`), several at once when an `add` brings three (`join_machines`).
- `MovedSpec` is the cluster file's description with the new machines' entries in it
  (`ClusterSpec.with_entries`) and their node directories the new machines'; the
  `MovedCluster` controller starts a new machine's processes from its own directory, as
  an operator on that machine starts them.
- The checks read the chain of epochs with the client SDK (`chain_of_epochs`: each link
  certified by a quorum of the epoch before, from the cluster file), not what the drill
  did: every committed block's certificate with the member set of its epoch
  (`certificate_problems`), a machine's own vote table against the epochs it was a member
  of (`new_machine_vote_problems`), and whether a key still opens a peer stream
  (`stream_code`).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import grpc
from nacl.signing import SigningKey

from quorumgate.ops.drills.audit import committed_blocks
from quorumgate.ops.drills.context import Drill
from quorumgate.ops.drills.report import Abort, DrillError
from quorumgate.ops.live import RPC_TIMEOUT_S, LiveCluster
from quorumgate.ops.nodes import start_nodes
from quorumgate.proto.clusterfile import (
    CLUSTER_FILE,
    OWNER_KEY_FILE,
    ClusterFileError,
    ClusterSpec,
    MemberSpec,
    load_cluster,
    read_seed,
)
from quorumgate.proto.crypto import Ed25519Signer, Verifier
from quorumgate.replica.certs import CertificateChecker
from quorumgate.replica.epochchain import ChainedEpoch
from quorumgate.replica.epochs import start_qc
from quorumgate.replica.types import Block, RemoteError
from quorumgate.runtime.channels import peer_auth_metadata
from quorumgate.sdk.client import Client
from quorumgate.sdk.delivery import ChannelPool
from quorumgate.sdk.epochs import Epochs
from quorumgate.sdk.errors import QuorumGateError

MACHINES_GLOB = "new-machine-*"  # the new machines' directories, in the drill's directory
CLI_TIMEOUT_S = 120.0  # `init --join`, on a loaded 2-core machine
VERIFY_CACHE = 4096  # signatures the offline certificate check remembers
SENT_METRIC = "qg_replica_peer_messages_sent_total"


@dataclass(frozen=True)
class MovedSpec(ClusterSpec):
    """The cluster as it stands after members were replaced or added: `members` with
    each new machine's entry (`ClusterSpec.with_entries`), and each such member's node
    directory the new machine's (`homes`: index -> the directory `init --join` made)."""

    homes: tuple[tuple[int, Path], ...] = ()

    def node_dir(self, index: int) -> Path:
        for i, home in self.homes:
            if i == index:
                return home / f"node-{index}"
        return super().node_dir(index)

    def home(self, index: int) -> Path | None:
        return dict(self.homes).get(index)


def moved(current: ClusterSpec, homes: Mapping[int, Path]) -> MovedSpec:
    """`current` (a cluster description, its new members' entries in it) with the new
    machines' node directories."""
    values = {f.name: getattr(current, f.name) for f in fields(ClusterSpec)}
    return MovedSpec(**values, homes=tuple(sorted(homes.items())))


class MovedCluster(LiveCluster):
    """The drill's controller once members moved: a new machine's processes start from
    its own directory (its cluster file and join.json), as an operator on that machine
    starts them; every other call reaches it through `spec` (a MovedSpec)."""

    def spawn(
        self,
        kind: str,
        indexes: list[int],
        module: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> dict[int, subprocess.Popen[bytes]]:
        spec = self.spec
        away = dict(spec.homes if isinstance(spec, MovedSpec) else ())
        procs = start_nodes(
            spec, [i for i in indexes if i not in away], kind, module=module, env=env
        )
        for i in indexes:
            if i in away:
                procs.update(start_nodes(load_cluster(away[i]), [i], kind, module=module, env=env))
        return procs


def prepare_moved(d: Drill) -> None:
    """Refuse a directory drilled before by a drill that brought new machines (its chain
    has moved members, whose old directories `up` would start, and its machines'
    directories are taken), and drive the cluster with a MovedCluster."""
    used = sorted(p.name for p in d.spec.directory.glob(MACHINES_GLOB))
    if used:
        raise DrillError(
            f"{d.spec.directory} holds new machines of an earlier drill "
            f"({', '.join(used)}): use a fresh --dir"
        )
    d.cluster = MovedCluster(
        d.spec, ready_timeout_s=d.cluster.ready_timeout_s, stop_grace_s=d.cluster.stop_grace_s
    )


def cli(*args: str, timeout_s: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """One `quorumgate` command, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "quorumgate", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def failed(what: str, done: subprocess.CompletedProcess[str]) -> Abort:
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
    return Abort(f"{what} exited {done.returncode}: {tail[0]}")


def join_machines(cluster_file: ClusterSpec, homes: Mapping[int, Path]) -> dict[int, MemberSpec]:
    """Prepare a new machine for each index in `homes` with `quorumgate init --join`, all
    at once (each is its own process, as on its own host): its directory, keys, ports and
    `join.json`. Returns each machine's own member entry; `Abort` if one cannot be made."""
    source = str(cluster_file.directory / CLUSTER_FILE)
    procs = {}
    for index, home in homes.items():
        procs[index] = subprocess.Popen(
            [
                sys.executable, "-m", "quorumgate", "init", "--join", "--cluster", source,
                "--index", str(index), "--dir", str(home),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
    joined: dict[int, MemberSpec] = {}
    problems: list[Abort] = []
    for index, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=CLI_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if done.returncode != 0:
            problems.append(failed(f"init --join --index {index}", done))
            continue
        try:
            joined[index] = load_cluster(homes[index]).member(index)
        except ClusterFileError as error:
            problems.append(Abort(f"the new machine's directory {homes[index]}: {error}"))
    if problems:
        raise problems[0]
    return joined


def chain_of_epochs(d: Drill, cluster_file: ClusterSpec) -> Epochs:
    """The chain of epochs, checked link by link from the cluster file (`Client.epochs`),
    read over channels to the cluster as the drill last saw it (`d.spec`)."""

    async def main() -> Epochs:
        owner = SigningKey(read_seed(cluster_file.directory / OWNER_KEY_FILE))
        pool = ChannelPool(d.spec)
        try:
            async with Client(cluster_file, owner, pool=pool) as client:
                return await client.epochs()
        finally:
            await pool.close()

    try:
        return asyncio.run(main())
    except QuorumGateError as err:
        raise Abort(f"the chain of epochs: {err}") from err


def change_height(epochs: Epochs, epoch: int) -> int | None:
    """The height of the change block that started `epoch`, from the chain of epochs."""
    for e in epochs.chain.epochs:
        if e.epoch == epoch:
            return e.boundary_height
    return None


def votes_sent(d: Drill, member: int) -> float:
    """Votes replica `member` sent to its peers (a machine that is no member sends none)."""
    try:
        metrics = d.cluster.metrics(member)
    except OSError:
        return 0.0
    return metrics.by_label(SENT_METRIC, "kind").get("vote", 0.0)


# ---------------------------------------------------------------------------- the checks


def certificate_problems(
    blocks: Sequence[Block], chained: Sequence[ChainedEpoch], chain_id: str
) -> tuple[list[str], dict[int, int]]:
    """Each block's justify certificate checked with the member set of the epoch it was
    signed in (replica/certs.py `CertificateChecker`: 2f+1 of that epoch's n): an epoch's
    blocks run from after its change block to the next change block, and its first block
    carries the unsigned certificate naming the change block (replica/epochs.py
    `start_qc`). The problems, naming height and epoch, and the certificates verified by
    epoch."""
    problems: list[str] = []
    per_epoch: dict[int, int] = {}
    checkers = [
        CertificateChecker(e.membership, Verifier(VERIFY_CACHE), start_qc(chain_id, e.boundary))
        for e in chained
    ]
    for block in blocks:
        index = max(k for k, e in enumerate(chained) if e.boundary_height < block.height)
        epoch = chained[index].epoch
        try:
            checkers[index].check_qc(block.justify)
        except RemoteError as err:
            problems.append(f"height {block.height} (epoch {epoch}): {err}")
            continue
        per_epoch[epoch] = per_epoch.get(epoch, 0) + 1
    return problems, per_epoch


def check_certificates_by_epoch(d: Drill, epochs: Epochs, target: int) -> list[Block]:
    """Every committed block's certificate, 1..T, with its epoch's members: what a reader
    holding only the cluster file and the chain of epochs can check. Returns the blocks."""
    reader = next((i for i in range(d.n) if d.cluster.probe(i) is not None), 0)
    blocks = committed_blocks(d.spec, reader, 1, target)
    problems, per_epoch = certificate_problems(blocks, epochs.chain.epochs, d.spec.chain_id)
    sizes = {e.epoch: e.membership.n for e in epochs.chain.epochs}
    d.check(
        "certificates_verify_by_epoch",
        problems + ([] if blocks else [f"no block read from replica {reader}"]),
        f"{sum(per_epoch.values())} certificates verified with their epoch's members, by "
        f"epoch {dict(sorted(per_epoch.items()))}, members by epoch {sizes}",
    )
    return blocks


def stream_code(d: Drill, member: int, listener: int, seed: bytes) -> grpc.StatusCode:
    """What `listener` answers a peer stream opened as `member` with key `seed`."""
    signer = Ed25519Signer(seed)
    auth = peer_auth_metadata(d.spec.chain_id, member, listener, int(time.time() * 1000), signer)
    try:
        d.cluster.peer(listener).Stream(iter(()), timeout=RPC_TIMEOUT_S, metadata=auth)
    except grpc.RpcError as err:
        return err.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def new_machine_vote_problems(
    votes: Mapping[tuple[int, int], bytes], epoch: int, last: int
) -> list[str]:
    """A new machine's own vote table: votes from its first epoch `epoch` on, in epoch
    `last`, none before `epoch` and none after `last` (a removed member's last epoch)."""
    if not votes:
        return ["no vote recorded"]
    epochs = sorted({e for e, _ in votes})
    problems = [f"a vote in epoch {e}, before it was a member" for e in epochs if e < epoch]
    problems += [f"a vote in epoch {e}, after it was removed" for e in epochs if e > last]
    if epoch not in epochs:
        problems.append(f"no vote in epoch {epoch}, its first")
    if last != epoch and last not in epochs:
        problems.append(f"no vote in epoch {last}, the last")
    return problems
