"""`CommittedLog`: the committed log of one replica, replayed by a local engine.

What the agents/tools listings and an executor's envelope lookup stand on when they need the
whole state rather than one certified answer (blocking gRPC; see the class).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable

import grpc
from nacl.signing import SigningKey

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.runtime.channels import Reader, sync_channel
from quorumgate.sdk.delivery import RPC_TIMEOUT_S
from quorumgate.sdk.errors import ClusterUnavailable

__all__ = ["CommittedLog"]

ROOTS_KEPT_MAX = 4096  # state roots by height a `CommittedLog` remembers
BLOCKS_STREAM_TIMEOUT_S = 60.0

log = logging.getLogger("quorumgate.client")


class CommittedLog:
    """A local, read-only engine fed with the committed log of one replica (blocking gRPC).

    What the agents/tools listings and an executor's envelope lookup stand on until a
    read-only sidecar RPC exists. One replica is trusted for the blocks; `state_root_at`
    lets a caller compare the local state with a certified one (a certificate signs the
    state root after its height), which is what makes a lookup trustworthy: equal roots
    mean the local state is the state f+1 sidecars signed.
    """

    def __init__(self, spec: ClusterSpec, reader: SigningKey) -> None:
        """`reader`: a key allowed to read committed blocks — the owner's or an auditor's
        (runtime/readauth.py); the blocks hold every argument value."""
        from quorumgate.sidecar.engine.core import Engine, config_for_cluster

        self.reader = Reader.of(reader)
        self.spec = spec
        # the sidecars' configuration: versions and capacities are in the state's root
        self.engine = Engine(config_for_cluster(spec))
        self.height = 0
        self._roots: OrderedDict[int, bytes] = OrderedDict()

    def state_root_at(self, height: int) -> bytes | None:
        return self._roots.get(height)

    def committed_height(self) -> int:
        """The highest committed height any replica reports."""
        best = -1
        for member in self.spec.members:
            with sync_channel(self.spec, member.index) as channel:
                try:
                    reply = cpb_grpc.ReplicaStub(channel).Status(
                        cpb.StatusRequest(), timeout=RPC_TIMEOUT_S
                    )
                except grpc.RpcError:
                    continue
            best = max(best, reply.committed_height)
        if best < 0:
            raise ClusterUnavailable("replicas_unreachable")
        return best

    def advance(
        self,
        to_height: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> int:
        """Execute committed blocks up to `to_height` (default: the committed height now);
        try each replica in turn. Returns the height reached."""
        from quorumgate.replica.wire import decode_block

        target = self.committed_height() if to_height is None else to_height
        for member in self.spec.members:
            if self.height >= target:
                break
            with sync_channel(self.spec, member.index, reader=self.reader) as ch:
                stream = cpb_grpc.ReplicaStub(ch).CommittedBlocks(
                    cpb.BlocksRequest(from_height=self.height + 1),
                    timeout=BLOCKS_STREAM_TIMEOUT_S,
                )
                try:
                    for committed in stream:
                        if committed.height != self.height + 1:
                            break
                        block = decode_block(
                            self.spec.chain_id, committed.block.SerializeToString()
                        )
                        result = self.engine.execute_block(
                            block.height, block.timestamp_ms, list(block.payload), False
                        )
                        self.height = block.height
                        self._roots[block.height] = result.state_root
                        while len(self._roots) > ROOTS_KEPT_MAX:
                            self._roots.popitem(last=False)
                        if progress is not None:
                            progress(self.height, target)
                        if self.height >= target:
                            break
                except grpc.RpcError as err:
                    log.info("event=blocks_stream_closed code=%s", err.code().name)
                finally:
                    stream.cancel()
        if self.height < target:
            raise ClusterUnavailable("replicas_unreachable")
        return self.height
