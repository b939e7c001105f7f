"""The bottom layer: the formats every QuorumGate process shares.

It imports nothing from `quorumgate.replica`, `quorumgate.sidecar` or the SDK, so both the
replica and the sidecar can build on it.

- the protobuf schemas (`*.proto`) and their generated code (`*_pb2.py`, `*_pb2_grpc.py`,
  committed; `scripts/gen_proto.py` regenerates them and a test checks nothing changes)
- `canonical`   the one builder of hashed and signed bytes (`Encoder`, `sha256`)
- `domains`     every domain tag that opens a signed or hashed statement, declared once
- `membership`  members, their consensus keys, f and the quorum
- `clusterfile` the cluster file and the per-node key files
- the signed-transaction format, leaf first: `limits` (every structural limit),
  `names` (canonical names and handles), `model` (the domain types a transaction carries,
  reason codes), `codec` (the only protobuf <-> model conversion), `tx` (sign, verify,
  transaction id, parse), `nonces` (a signer's replay window)
- `reports`     the state-root statement a sidecar signs for its replica
"""
