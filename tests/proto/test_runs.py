"""Run ids from committed data: `n<k>`, and clients' labels."""

from __future__ import annotations

import pytest

from quorumgate.proto.runs import RunLabels, names_opened_run, opened_run, run_for_nonce


def test_a_run_is_named_after_the_nonce_that_opened_it() -> None:
    assert run_for_nonce(7) == "n7" and opened_run("n7") == 7
    for text in ("n0", "n07", "N7", "7", "n", "n-1", "run-1", "n7 ", "n" + "9" * 21):
        assert opened_run(text) is None, text
    assert names_opened_run("n7", 7) and names_opened_run("n7", 9)
    assert not names_opened_run("n7", 6) and not names_opened_run("run-1", 100)
    with pytest.raises(ValueError):
        run_for_nonce(0)


def test_labels_keep_their_run_and_new_labels_open_one() -> None:
    labels = RunLabels()
    assert labels.bind("invoice-1", 5) == "n5"
    assert labels.bind("invoice-1", 6) == "n5"  # the same run for later transactions
    assert labels.bind("invoice-2", 7) == "n7"
    assert labels.bind("n5", 8) == "n5"  # a run id passes as it is
    assert labels.bind("invoice-1", 4) == "n4"  # a nonce reused below the opener's: reopened
    assert labels.get("invoice-1") == "n4" and labels.get("nope") is None


def test_labels_are_bounded_least_recently_used_first() -> None:
    labels = RunLabels(limit=2)
    labels.bind("a", 1)
    labels.bind("b", 2)
    labels.bind("a", 3)  # a is used again: b is now the oldest
    labels.bind("c", 4)
    assert labels.get("b") is None and labels.get("a") == "n1" and len(labels) == 2
