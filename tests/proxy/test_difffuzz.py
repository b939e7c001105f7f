"""A seeded slice of the proxy's differential fuzzer (`difffuzz.py`; at scale:
`scripts/fuzz_proxy.py`): no generated answer makes an official SDK hand the agent a call
the proxy did not decide, or one it did not release."""

from __future__ import annotations

import logging
import warnings

import pytest

from tests.proxy.difffuzz import check, generate

SLICE_CASES = 90  # a few seconds; the scale run is scripts/fuzz_proxy.py


@pytest.mark.parametrize("start", range(0, SLICE_CASES, 30))
def test_no_generated_answer_gives_the_agent_an_unjudged_call(start: int) -> None:
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the SDKs warn about the shapes made here
            findings = {seed: check(generate(seed)) for seed in range(start, start + 30)}
    finally:
        logging.disable(logging.NOTSET)
    assert {seed: found for seed, found in findings.items() if found} == {}


def test_the_fuzzer_finds_a_proxy_that_passes_what_it_cannot_read() -> None:
    """The fuzzer must catch a known-bad door: one that forwards a stream it cannot read."""
    from tests.proxy import difffuzz

    original = difffuzz._judge_stream

    async def lenient(case: difffuzz.Case, verdict: difffuzz.Verdict) -> difffuzz.Wire:
        wire = await original(case, verdict)
        if verdict.refused:  # instead of refusing: the upstream's bytes, unjudged
            verdict.refused = False
            return difffuzz.Wire(200, {"content-type": "text/event-stream"}, list(case.chunks))
        return wire

    difffuzz._judge_stream = lenient  # type: ignore[assignment]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logging.disable(logging.WARNING)
            caught = [seed for seed in range(150) if check(generate(seed))]
    finally:
        difffuzz._judge_stream = original  # type: ignore[assignment]
        logging.disable(logging.NOTSET)
    assert caught, "the fuzzer found nothing wrong with a proxy that forwards unread streams"
