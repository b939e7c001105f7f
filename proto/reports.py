"""The statement a sidecar signs to report its state root to its replica (docs/sidecar.md).

Both sides need its bytes: the sidecar signs them with its receipt key, and the replica
checks the signature before it votes for a block carrying that root. So it lives in the
bottom layer, below both.
"""

from __future__ import annotations

from quorumgate.proto import domains
from quorumgate.proto.canonical import Encoder

TAG_ROOT_REPORT = domains.STATE_ROOT_REPORT
TAG_ROOT_REPORT_WITH_OWNER = domains.STATE_ROOT_REPORT_WITH_OWNER


def root_report_statement(
    chain_id: str, height: int, state_root: bytes, owner_key: bytes = b""
) -> bytes:
    """`owner_key`: the owner key the sidecar's state holds after an owner rotation
    (docs/engine.md, "Rotating keys"), signed under its own tag; without one, the
    statement of every chain so far."""
    if not owner_key:
        return bytes(Encoder(TAG_ROOT_REPORT).text(chain_id).u64(height).blob(state_root))
    enc = Encoder(TAG_ROOT_REPORT_WITH_OWNER).text(chain_id).u64(height).blob(state_root)
    return bytes(enc.blob(owner_key))
