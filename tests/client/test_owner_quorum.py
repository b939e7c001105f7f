"""The owner's session waits until f+1 sidecars executed its transactions, not one: the
drill that registered agents and then read them back, asking f+1 sidecars to agree, found
them "not registered" when the one sidecar ahead had ended the wait and the f+1 answering
first were all behind it (quorumgate.sdk.owner)."""

from __future__ import annotations

from quorumgate.sdk.owner import executed_by_f_plus_one

F = 1
LAST_NONCE = 7  # the owner's last transaction was signed at 7: executed means next > 7


def test_one_sidecar_ahead_is_not_enough() -> None:
    answers = [(True, 8), (True, 7), (True, 7), (True, 7)]
    assert not executed_by_f_plus_one(answers, F, LAST_NONCE)


def test_f_plus_one_sidecars_ahead_are() -> None:
    answers = [(True, 8), (True, 9), (True, 7), (False, 1)]
    assert executed_by_f_plus_one(answers, F, LAST_NONCE)


def test_f_plus_one_answers_all_behind_are_not() -> None:
    assert not executed_by_f_plus_one([(True, 7), (True, 6)], F, LAST_NONCE)
