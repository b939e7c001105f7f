"""Quotas on proposals, in block time (docs/engine.md, "Settings in the log").

Each quota setting the log sets (not 0) counts the proposals of its agent, (agent, tool)
pair or run in the current fixed minute or hour of block time; any at its limit refuses.
Until `quota_agent_per_minute` is set in the log, cluster.json's `quota_proposals_max`
per sliding `quota_window_ms` applies per agent. A refused proposal counts nowhere, and
a quota refusal is never latched.
"""

from __future__ import annotations

from quorumgate.proto import limits
from quorumgate.sidecar.engine.env import Env
from quorumgate.sidecar.engine.state import AgentRecord, QuotaCounter, QuotaKey, RunKey
from quorumgate.sidecar.engine.targets import UNCHECKED_TARGET

# The quota periods of block time: fixed windows, so a counter is one number.
QUOTA_PERIODS = (("minute", 60_000), ("hour", 3_600_000))


def admits(env: Env, record: AgentRecord, tool: str | None, run_key: RunKey) -> bool:
    """Whether the proposal is within every quota; if so, it is counted in each."""
    counted = _counters(env, record.agent_id, tool, run_key)
    if any(counter.count >= limit for counter, limit in counted):
        return False
    if "quota_agent_per_minute" not in env.state.settings and not _sliding(env, record):
        return False
    for counter, _ in counted:
        counter.count += 1
    return True


def _counters(
    env: Env, agent: str, tool: str | None, run_key: RunKey
) -> list[tuple[QuotaCounter, int]]:
    """The counters of every quota set in the log (not 0) that this call falls under,
    each with its limit; a counter of a past window starts again at 0."""
    settings = env.state.settings
    if not settings:
        return []
    subjects: dict[str, tuple[str, ...]] = {
        "agent": (agent,),
        "tool": (agent, tool or UNCHECKED_TARGET),
        "run": run_key,
    }
    out = []
    for scope, subject in subjects.items():
        for period, length in QUOTA_PERIODS:
            limit = settings.get(f"quota_{scope}_per_{period}", 0)
            if limit == 0:
                continue
            window = env.now_ms // length
            key = (scope, period, *subject)
            counter = env.state.quota_counters.get(key)
            if counter is None or counter.window != window:
                counter = _new_counter(env, key, window)
            out.append((counter, limit))
    return out


def _new_counter(env: Env, key: QuotaKey, window: int) -> QuotaCounter:
    """A counter for `key` from 0. The table is bounded (QUOTA_COUNTERS_MAX): when full,
    counters of past windows go first, then the (agent, tool) and run counters with the
    fewest calls (an agent's own counters, at most two per registered agent, are kept:
    they bound everything an agent does)."""
    counters = env.state.quota_counters
    if key not in counters and len(counters) >= limits.QUOTA_COUNTERS_MAX:
        for stale in [k for k, c in counters.items() if c.window != _window_of(env, k)]:
            del counters[stale]
        if len(counters) >= limits.QUOTA_COUNTERS_MAX:
            victims = [k for k in counters if k[0] != "agent"]
            if victims:
                del counters[min(victims, key=lambda k: (counters[k].count, k))]
    counter = QuotaCounter(window=window, count=0)
    counters[key] = counter
    return counter


def _window_of(env: Env, key: QuotaKey) -> int:
    return env.now_ms // dict(QUOTA_PERIODS)[key[1]]


def _sliding(env: Env, record: AgentRecord) -> bool:
    """cluster.json's per-agent quota: `quota_proposals_max` in any sliding
    `quota_window_ms` of block time (until the log sets `quota_agent_per_minute`)."""
    since = env.now_ms - env.config.quota_window_ms
    recent = [t for t in record.recent_proposals_ms if t > since]
    if len(recent) >= env.config.quota_proposals_max:
        record.recent_proposals_ms = recent
        return False
    recent.append(env.now_ms)
    record.recent_proposals_ms = recent
    return True
