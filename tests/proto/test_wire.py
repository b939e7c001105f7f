"""The replica's wire codec: domain values survive a round trip; garbage is refused."""

from __future__ import annotations

import pytest

from quorumgate.replica.sim import SimOptions, Simulation
from quorumgate.replica.types import Envelope, RemoteError, SyncRequest
from quorumgate.replica.wire import decode_envelope, encode_envelope
from quorumgate.runtime.links import ENVELOPE_BYTES_MAX


def _messages_from_a_simulation() -> list[Envelope]:
    """Every kind of consensus message, as real cores produced them."""
    sim = Simulation(SimOptions(seed=3, ticks=400, partition_ticks=40, loss_permille=100))
    seen: list[Envelope] = []
    original = sim._deliver_from

    def record(src, to, msg, src_instance=0):  # type: ignore[no-untyped-def]
        seen.append(Envelope(sim.membership.chain_id, src, msg))
        return original(src, to, msg, src_instance)

    sim._deliver_from = record  # type: ignore[method-assign]
    sim.run()
    return seen


def test_every_message_kind_round_trips_unchanged() -> None:
    envelopes = _messages_from_a_simulation()
    kinds = {type(e.message).__name__ for e in envelopes}
    assert {
        "Proposal",
        "Vote",
        "Timeout",
        "SyncRequest",
        "SyncResponse",
        "Hello",
        "HelloReply",
    } <= kinds, kinds
    for envelope in envelopes:
        decoded = decode_envelope(encode_envelope(envelope))
        assert decoded == envelope
        if hasattr(envelope.message, "block"):
            assert decoded.message.block.hash == envelope.message.block.hash  # type: ignore[union-attr]


def test_garbage_bytes_are_refused_as_malformed() -> None:
    for data in (b"\xff\xff\xff", b"\x0a\x05abc", bytes(range(64))):
        with pytest.raises(RemoteError) as err:
            decode_envelope(data)
        assert err.value.reason == "malformed"


def test_an_empty_envelope_is_refused() -> None:
    with pytest.raises(RemoteError) as err:
        decode_envelope(b"")
    assert err.value.reason == "malformed"


def test_oversized_data_is_refused_before_parsing() -> None:
    with pytest.raises(RemoteError) as err:
        decode_envelope(bytes(ENVELOPE_BYTES_MAX + 1))
    assert err.value.reason == "oversized"


def test_a_vote_with_a_short_block_hash_is_malformed() -> None:
    from quorumgate.proto import consensus_pb2 as pb

    msg = pb.ConsensusMessage(chain_id="c", sender=1)
    msg.vote.block_hash = b"short"
    with pytest.raises(RemoteError) as err:
        decode_envelope(msg.SerializeToString())
    assert err.value.reason == "malformed"


def test_sync_request_fields_survive() -> None:
    env = Envelope("chain", 2, SyncRequest(7, 64, bytes(32)))
    assert decode_envelope(encode_envelope(env)) == env
