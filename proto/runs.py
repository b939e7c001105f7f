"""Run ids come from committed data: a run is named after the nonce of its owner's
transaction that opened it, `n<nonce>`.

On chains of authority version 2 the engine accepts, for a proposal on the agent's own
mandate and for a delegation that starts a chain, only a run id `n<k>` with `k` at most the
transaction's own nonce: the run its first transaction opened (the agent's nonces are its
own committed sequence), never a name the agent makes up. Proposals and delegations under
a grant act in the grant's run. So an agent can neither pick a run's name nor reuse
another's; it can open a new run with any new transaction, which is why the latch also
counts refusals across runs (sidecar/engine/core.py).

Clients keep readable *labels* ("invoice-1042") and map each to the run its first
transaction opened (`RunLabels`), so code that names runs by label works unchanged.
"""

from __future__ import annotations

import re
from collections import OrderedDict

__all__ = ["RunLabels", "names_opened_run", "opened_run", "run_for_nonce"]

_OPENED_RUN_RE = re.compile(r"n([1-9][0-9]{0,19})")
RUN_LABELS_MAX = 65_536  # labels one client remembers; the least recently used go first


def run_for_nonce(nonce: int) -> str:
    """The id of the run opened by the transaction with `nonce`."""
    if not 0 < nonce < 2**64:
        raise ValueError("nonce must be in 1..2**64-1")
    return f"n{nonce}"


def opened_run(run_id: str) -> int | None:
    """The nonce a run id names (`n<k>` -> k), or None for any other text."""
    match = _OPENED_RUN_RE.fullmatch(run_id)
    return None if match is None else int(match.group(1))


def names_opened_run(run_id: str, nonce: int) -> bool:
    """Whether a transaction with `nonce` may act in run `run_id` as its owner: a run
    opened by this transaction or an earlier one of the same signer."""
    k = opened_run(run_id)
    return k is not None and k <= nonce


class RunLabels:
    """One signer's labels -> run ids. `bind(label, nonce)` is the run id a transaction
    with `nonce` uses for `label`: a label seen before keeps its run; a new label opens a
    run named after this nonce. A run id (`n<k>`, k <= nonce) passes as it is."""

    def __init__(self, limit: int = RUN_LABELS_MAX) -> None:
        self._runs: OrderedDict[str, str] = OrderedDict()
        self._limit = limit

    def bind(self, label: str, nonce: int) -> str:
        if names_opened_run(label, nonce):
            return label
        run = self._runs.get(label)
        if run is None or not names_opened_run(run, nonce):
            # a new label; or (rarely) a nonce given back and reused below the opener's
            run = run_for_nonce(nonce)
            self._runs[label] = run
        self._runs.move_to_end(label)
        while len(self._runs) > self._limit:
            self._runs.popitem(last=False)
        return run

    def get(self, label: str) -> str | None:
        return self._runs.get(label)

    def __len__(self) -> int:
        return len(self._runs)
