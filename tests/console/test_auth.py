"""The console's gate without a socket (`console/auth.py`): sessions, nonces and the
passphrase window, each bound reached and checked, on a clock the test moves."""

from __future__ import annotations

import itertools

from quorumgate.console.auth import (
    NONCE_S_MAX,
    NONCES_PER_SESSION_MAX,
    PASSPHRASE_FAILURES_MAX,
    PASSPHRASE_WINDOW_S,
    SESSION_S_MAX,
    SESSIONS_MAX,
    UNLOCK_NONCES_MAX,
    Gate,
)
from tests.console.conftest import Clock


def _gate() -> tuple[Gate, Clock]:
    clock = Clock()
    numbers = itertools.count()
    return Gate(clock, lambda: f"token-{next(numbers)}"), clock


def test_a_session_needs_both_secrets_and_ends_after_its_bound() -> None:
    gate, clock = _gate()
    session = gate.open_session()
    assert gate.session(session.cookie, session.header) is session
    assert gate.session(session.cookie, "") is None
    assert gate.session("", session.header) is None
    assert gate.session(session.header, session.cookie) is None
    other = gate.open_session()
    assert gate.session(session.cookie, other.header) is None
    clock.advance(SESSION_S_MAX - 0.5)
    assert gate.session(session.cookie, session.header) is session
    clock.advance(0.5)
    assert gate.session(session.cookie, session.header) is None
    assert not gate.expire()  # both are over: the console drops the key


def test_at_most_sessions_max_are_open_and_a_new_one_ends_the_oldest() -> None:
    gate, _ = _gate()
    sessions = [gate.open_session() for _ in range(SESSIONS_MAX + 1)]
    assert gate.session(sessions[0].cookie, sessions[0].header) is None
    assert all(gate.session(s.cookie, s.header) is s for s in sessions[1:])


def test_a_nonce_answers_once_for_its_own_session_within_its_time() -> None:
    gate, clock = _gate()
    first, second = gate.open_session(), gate.open_session()
    nonce = gate.issue_nonce(first)
    assert not gate.take_nonce(second, nonce)  # another session's: refused
    assert not gate.take_nonce(None, nonce)  # a session's nonce does not unlock
    unlock = gate.issue_nonce(None)
    assert not gate.take_nonce(first, unlock)  # nor an unlock nonce answer a card
    nonce = gate.issue_nonce(first)
    assert gate.take_nonce(first, nonce) and not gate.take_nonce(first, nonce)
    late = gate.issue_nonce(first)
    clock.advance(NONCE_S_MAX)
    assert not gate.take_nonce(first, late)
    assert not gate.take_nonce(first, "")


def test_unused_nonces_are_bounded_per_session_and_for_the_unlock_form() -> None:
    gate, _ = _gate()
    session = gate.open_session()
    issued = [gate.issue_nonce(session) for _ in range(NONCES_PER_SESSION_MAX + 1)]
    assert len(session.nonces) == NONCES_PER_SESSION_MAX
    assert not gate.take_nonce(session, issued[0]) and gate.take_nonce(session, issued[-1])
    unlocks = [gate.issue_nonce(None) for _ in range(UNLOCK_NONCES_MAX + 1)]
    assert not gate.take_nonce(None, unlocks[0]) and gate.take_nonce(None, unlocks[1])


def test_failed_passphrases_close_the_window_until_the_oldest_leaves_it() -> None:
    gate, clock = _gate()
    for _ in range(PASSPHRASE_FAILURES_MAX):
        assert gate.attempt_allowed()
        gate.failed()
        clock.advance(10)
    assert not gate.attempt_allowed()
    # the oldest failure was PASSPHRASE_FAILURES_MAX * 10 s ago
    assert gate.retry_after_s() == PASSPHRASE_WINDOW_S - PASSPHRASE_FAILURES_MAX * 10
    clock.advance(gate.retry_after_s())
    assert gate.attempt_allowed()
    gate.failed()  # one more at once: the window is full again, from the second-oldest
    assert not gate.attempt_allowed()
    assert gate.retry_after_s() == 10
