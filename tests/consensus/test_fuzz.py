"""Structure-aware fuzzing of `Core.on_message` (replica/fuzz.py): a fixed
5,000 generated messages of each kind, malformed, truncated, oversized, stale, far-future,
with forged or duplicated signatures and spoofed senders, and nothing but the core's own
refusals comes out. `scripts/fuzz_core.py` runs the large numbers."""

from __future__ import annotations

import pytest

import quorumgate.replica.core as core_module
from quorumgate.replica.fuzz import KINDS, FuzzFailure, fuzz_kind

PER_KIND = 5_000
SEED = 20261201


@pytest.mark.parametrize("kind", KINDS)
def test_no_generated_message_escapes_the_core(kind: str) -> None:
    report = fuzz_kind(kind, SEED, PER_KIND)
    assert report.messages + report.refused_on_arrival >= PER_KIND * 0.99
    assert report.messages >= PER_KIND // 5, "too few messages reached the core"
    assert sum(report.dropped.values()) > 0
    if kind not in ("sync_request",):  # served by the shell: the core only drops them
        assert report.acted_on > 0, f"no {kind} got past the checks: the fuzzer is shallow"


def test_the_fuzzer_finds_the_sync_response_that_crashed_the_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the whole-message check of sync responses taken out (as the code once was),
    the fuzzer finds a response that raises out of `Core.on_message` and names its seed."""
    monkeypatch.setattr(core_module, "check_envelope", lambda envelope, membership, limits: None)
    with pytest.raises(FuzzFailure) as found:
        fuzz_kind("sync_response", SEED, PER_KIND)
    assert "escaped Core.on_message" in str(found.value)
    assert f"seed={SEED}" in str(found.value)
