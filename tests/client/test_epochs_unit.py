"""What a client makes of several replicas' epoch ends (quorumgate.sdk.epochs;
docs/consensus/epochs.md, "Followers: the chain of epochs"): each answer is checked from
what the client trusts, the longest that checks is kept, a replica that withholds newer
epochs cannot hold the client back, and one whose answer does not check is named."""

from __future__ import annotations

import dataclasses

import pytest

from quorumgate.sdk.epochs import EpochFollower, key_fingerprint
from quorumgate.sdk.errors import EpochsUnverified
from tests.consensus.helpers import OUTSIDER, membership
from tests.consensus.test_epoch_chain import KEYS_0, KEYS_1, KEYS_2, RECORDS, _build


def _follower() -> EpochFollower:
    return EpochFollower(membership(), RECORDS)


def test_the_longest_chain_that_checks_wins_and_a_liar_is_named() -> None:
    built = _build()
    liar = dataclasses.replace(
        built.end_2, keys=b"".join((KEYS_2[0], OUTSIDER.public_key, KEYS_2[2], KEYS_2[3]))
    )
    answers = {
        0: [built.end_1, built.end_2],  # honest, up to date
        1: [built.end_1],  # behind (or withholding epoch 2)
        2: [],  # still in epoch 0
        3: [built.end_1, liar],  # its epoch 2 names an outsider
    }
    found = _follower().take(answers)
    assert found.current.epoch == 2
    assert found.current.keys == KEYS_2
    assert [e.checked_by for e in found.epochs] == [(0, 1, 2), (0, 1), (0,)]
    assert list(found.refused) == [3]
    assert "epoch 2" in found.refused[3] and "keys_differ" in found.refused[3]
    doc = found.as_dict()
    assert doc["epoch"] == 2
    assert doc["epochs"][2]["keys"] == [key_fingerprint(k) for k in KEYS_2]
    assert doc["epochs"][1]["change_height"] == 4
    assert all(len(k) == 16 for e in doc["epochs"] for k in e["keys"])


def test_withholding_replicas_cannot_take_the_client_back() -> None:
    """Once epoch 2 is checked, answers that stop at epoch 1 or 0 leave it at epoch 2,
    and an answer going on from it is checked from epoch 2 only."""
    built = _build()
    follower = _follower()
    assert follower.take({0: [built.end_1, built.end_2]}).current.epoch == 2
    again = follower.take({1: [built.end_1], 2: []})
    assert again.current.epoch == 2 and again.current.checked_by == ()
    assert [e.keys for e in again.epochs] == [KEYS_0, KEYS_1, KEYS_2]


def test_a_client_offline_for_several_epochs_checks_every_new_link() -> None:
    built = _build()
    follower = _follower()
    assert follower.take({0: []}).current.epoch == 0
    assert follower.take({0: [built.end_1, built.end_2]}).current.epoch == 2


def test_no_answer_that_checks_is_an_error_naming_each_replica() -> None:
    built = _build()
    forged = dataclasses.replace(built.end_1, ended=built.end_2.ended)
    with pytest.raises(EpochsUnverified) as raised:
        _follower().take({1: [forged], 3: [built.end_2]})
    err = raised.value
    assert err.reason == "none_checked"
    assert sorted(err.refused) == [1, 3]
    assert "gap" in err.refused[3]
    assert str(err) == EpochsUnverified.message  # the reasons are on attributes


def test_a_chain_without_epochs_refuses_any_epoch_end() -> None:
    built = _build()
    follower = EpochFollower(membership(), None)
    found = follower.take({0: [], 1: [built.end_1]})
    assert found.current.epoch == 0 and list(found.refused) == [1]
    assert "no_epochs" in found.refused[1]
