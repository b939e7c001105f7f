"""Every structural limit of the governance engine, named in one place: every bound has a
name, with its unit last.

Limits that an operator may reasonably tune per deployment (latch size, quota window,
confirmation lifetime, table sizes) are fields of `EngineConfig` with the defaults below;
limits that shape what a transaction may look like are constants, because the mempool and
the sidecar must agree on them without sharing a configuration.
"""

from __future__ import annotations

# --- transactions (checked before anything else; the mempool uses the same numbers) ---
TX_BYTES_MAX = 64 * 1024
NONCE_WINDOW = 1024  # executed nonces remembered above a signer's low-water mark
RUN_ID_CHARS_MAX = 128
TOOL_NAME_CHARS_MAX = 128
ID_CHARS_MAX = 64  # agent ids, sink ids
TARGET_CHARS_MAX = 2048  # before and after canonicalization
ARGUMENTS_MAX = 32
ARGUMENT_NAME_CHARS_MAX = 64
ARGUMENT_TEXT_BYTES_MAX = 16 * 1024
TOOLS_PER_LIST_MAX = 256  # allowed_tools of a mandate, tools of a grant
SCHEMES_PER_TOOL_MAX = 16
ENVELOPE_ARGS_PER_TOOL_MAX = 16
SINKS_PER_HANDLE_MAX = 8
KIND_CHARS_MAX = 32
SEALED_BYTES_MIN = 48  # a SealedBox adds a 32-byte ephemeral key and a 16-byte MAC
SEALED_BYTES_MAX = 8 * 1024
# --- target and argument rules (docs/policies.md) ---
TOOL_RULES_MAX = 256  # tools with rules in one mandate or grant
TARGET_RULES_PER_TOOL_MAX = 64
ARGUMENT_RULES_PER_TOOL_MAX = 16
RULE_VALUES_MAX = 64  # the enumeration of one `one_of` argument rule
RULE_NUMBER_DIGITS_MAX = 36  # a ceiling's decimal digits (integer and fraction)
SET_ENTRIES_MAX = 256  # entries of one named set
SETS_PER_PRINCIPAL_MAX = 16
SET_NAME_CHARS_MAX = 32

# --- the engine's own checks ---
# After every block the engine re-encodes this many entries of a rotation over its whole
# state and compares them with its per-entry cache; a difference stops execution.
# (Re-encoding the whole state instead would cost, in every block, what the state holds.)
STATE_CHECK_ENTRIES_PER_BLOCK = 16

# --- defaults for EngineConfig (docs/engine.md) ---
LATCH_HALT_THRESHOLD_DEFAULT = 3  # attempts at one refused tool, counting the first
LATCH_RUNS_MAX_DEFAULT = 1024
LATCH_BUCKETS_PER_RUN_MAX_DEFAULT = 64  # a run that collects more refused tools is halted
QUOTA_WINDOW_MS_DEFAULT = 60_000
QUOTA_PROPOSALS_MAX_DEFAULT = 120  # per principal per window
CONFIRMATION_TTL_MS_DEFAULT = 300_000
PENDING_MAX_DEFAULT = 4096
PENDING_PER_PRINCIPAL_MAX_DEFAULT = 64
GRANT_TTL_MS_MAX_DEFAULT = 24 * 3600 * 1000
GRANTS_MAX_DEFAULT = 4096
GRANTS_PER_AGENT_MAX_DEFAULT = 64
DELEGATION_DEPTH_MAX_DEFAULT = 8  # hard ceiling whatever the mandates say
HANDLES_MAX_DEFAULT = 65_536
HANDLES_PER_PRINCIPAL_MAX_DEFAULT = 256
TOOLS_MAX_DEFAULT = 1024
AGENTS_MAX_DEFAULT = 4096
SINKS_MAX_DEFAULT = 256
# Expired pending proposals and grants are kept this long past expiry, so that a late
# confirmation or use is answered `confirmation_expired` / `delegation_expired` rather than
# "unknown"; after that they are pruned, which is what keeps both tables bounded in time.
EXPIRED_RETENTION_MS_DEFAULT = 3_600_000
# How long after its block's time a verdict certificate may be used (chains whose receipts
# expire, proto/clusterfile.py `receipts_expire`): the window an executor that lost its
# record of used certificates reopens (docs/security/reads-and-certificates.md). An owner
# setting in the log (`certificate_ttl_ms`) changes it within these bounds: at least long
# enough to carry a certificate from the sidecars to a tool, at most a day.
CERTIFICATE_TTL_MS_DEFAULT = 300_000
CERTIFICATE_TTL_MS_MIN = 10_000
CERTIFICATE_TTL_MS_MAX = 24 * 3600 * 1000

# --- split authority ---
# Answers naming a wrong card digest, from the card's rightful confirmer, that lock the
# proposal: it leaves the state, denied (`card_locked`).
CARD_WRONG_DIGESTS_MAX = 3
PRINCIPALS_MAX = 4096
# Runs in which one (agent, tool) pair is refused before it is refused in every run
# (`latch_across_runs`: a fresh run id does not reset the latch).
LATCH_CROSS_RUN_THRESHOLD_DEFAULT = 3
CROSS_RUN_PAIRS_MAX = 16_384
DECLARED_ARGS_PER_TOOL_MAX = 32  # plain arguments one tool declares
DEPUTIES_MAX = 8  # principals one principal names to answer its cards too
# Retired keys a chain remembers (docs/engine.md, "Rotating keys"): for its whole life,
# never evicted, since a forgotten key could be registered again and replay what it
# signed; past this a rotation is `capacity_exceeded` (about 100 bytes each in the state).
RETIRED_KEYS_MAX = 65536
# Further targets of one call, in the roles its tool declares.
TARGET_ROLES_PER_TOOL_MAX = 8
TARGETS_PER_ROLE_MAX = 16
TARGETS_PER_CALL_MAX = 16  # further targets in one proposal, all roles together
# Links found inside text arguments (docs/engine.md, "Links inside text"): past either
# bound the call is refused (`too_many_links`), never judged on a truncated list.
LINKS_PER_ARGUMENT_MAX = 16
LINKS_PER_CALL_MAX = 32
ROLE_CHARS_MAX = 32
# Quota counters in the state (settings in the log): per agent, per
# (agent, tool) and per run, per minute and per hour of block time.
QUOTA_COUNTERS_MAX = 16_384
