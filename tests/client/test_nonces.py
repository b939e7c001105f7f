"""The client's nonce bookkeeping (quorumgate.sdk.nonces), checked against the engine's own
replay window (quorumgate.proto.nonces.NonceWindow)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from quorumgate.proto.nonces import NonceWindow
from quorumgate.sdk.nonces import NonceLedger

WINDOW = 8


def test_a_refused_tail_is_given_back() -> None:
    ledger = NonceLedger(WINDOW)
    ledger.sync(1)
    taken = [ledger.take() for _ in range(8)]
    assert taken == list(range(1, 9))
    for n in taken[:3]:
        ledger.delivered(n)
    for n in taken[3:]:
        ledger.refused(n)
    assert ledger.next == 4 and ledger.take() == 4


def test_a_refused_nonce_in_the_middle_is_used_again_first() -> None:
    """A gap would stop the engine's low-water mark, and the window with it."""
    ledger = NonceLedger(WINDOW)
    ledger.sync(1)
    taken = [ledger.take() for _ in range(5)]
    for n in taken:
        (ledger.refused if n == 3 else ledger.delivered)(n)
    assert ledger.take() == 3
    assert ledger.take() == 6


def test_held_elsewhere_spends_a_nonce_inside_the_window_only() -> None:
    ledger = NonceLedger(WINDOW)
    ledger.sync(1)
    inside = ledger.take()
    ledger.held_elsewhere(inside)  # another client of the key holds nonce 1
    assert ledger.take() == 2
    ledger.in_flight.clear()
    ledger.spent_max = WINDOW + 3  # as if the counter had run past the window
    ledger.in_flight.add(WINDOW + 4)
    ledger.held_elsewhere(WINDOW + 4)  # too far ahead: refused, not spent
    assert WINDOW + 4 not in ledger.in_flight and ledger.spent_max == WINDOW + 3


def test_room_is_what_the_engine_would_accept_now() -> None:
    ledger = NonceLedger(WINDOW)
    ledger.sync(1)
    assert ledger.room() == WINDOW
    for _ in range(WINDOW):
        ledger.delivered(ledger.take())
    assert ledger.room() == 0
    ledger.sync(4)  # three executed
    assert ledger.room() == 3 and ledger.window_max == WINDOW + 3
    ledger.sync(2)  # a stale answer does not move the floor back
    assert ledger.floor == 4


def test_sync_forgets_gaps_the_cluster_has_executed() -> None:
    ledger = NonceLedger(WINDOW)
    ledger.sync(1)
    first, second = ledger.take(), ledger.take()
    ledger.refused(first)
    ledger.delivered(second)
    assert ledger.gaps == {1}
    ledger.sync(3)  # another client of the key filled nonce 1
    assert ledger.gaps == set() and ledger.take() == 3


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.sampled_from("drx")), max_size=60))
def test_against_the_engine_window_the_client_never_gets_stuck(
    steps: list[tuple[int, str]],
) -> None:
    """A model cluster: it refuses what its window refuses (and, at random, some fresh
    nonces: `x`), admits the rest and executes admitted nonces in order. However the
    refusals fall, every nonce the client takes next is one the engine would accept once
    what was admitted executes, and nothing admitted is ever signed again."""
    ledger = NonceLedger(WINDOW)
    engine = NonceWindow()
    admitted: set[int] = set()
    for count, kind in steps:
        ledger.sync(engine.low_water + 1)
        room = ledger.room()
        for _ in range(count):
            nonce = ledger.take()
            assert nonce not in admitted, "a spent nonce was signed again"
            fresh = engine.is_fresh(nonce, WINDOW) and nonce not in admitted
            if not fresh or kind == "x":
                ledger.refused(nonce)
            else:
                admitted.add(nonce)
                ledger.delivered(nonce)
        if kind == "r":  # the cluster executes what it admitted
            for nonce in sorted(admitted):
                if engine.is_fresh(nonce, WINDOW):
                    engine.record(nonce, WINDOW)
        assert room <= WINDOW
    # once everything executes, the next nonce the client signs is accepted
    for nonce in sorted(admitted):
        if engine.is_fresh(nonce, WINDOW):
            engine.record(nonce, WINDOW)
    ledger.sync(engine.low_water + 1)
    nonce = ledger.take()
    assert engine.is_fresh(nonce, WINDOW), (nonce, engine.low_water, sorted(engine.executed))
