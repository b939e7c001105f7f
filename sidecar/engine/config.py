"""The engine's configuration: what every honest sidecar of one chain shares.

`EngineConfig` holds cluster.json's chain, owner, versions and capacities and every other
limit at its default; `fingerprint` commits to all of it, and `effective_fingerprint` to
that and the settings the log made (docs/engine.md, "Settings in the log"), so the state
root names the configuration it was produced under.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from quorumgate.proto import domains, limits
from quorumgate.proto.canonical import Encoder
from quorumgate.proto.chainversions import (
    AUTHORITY_VERSION_NEW,
    AUTHORITY_VERSIONS,
    CANONICAL_VERSION_NEW,
    CANONICAL_VERSIONS,
    RECEIPT_VERSION_NEW,
    RECEIPT_VERSIONS,
    STATE_VERSION_NEW,
    STATE_VERSIONS,
    receipts_expire,
    split_authority,
    state_hash_tree,
    strict_forms,
)
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.sidecar.engine.unicode_assigned import UNICODE_VERSION

TAG_CONFIG = domains.ENGINE_CONFIG
TAG_SETTINGS = domains.ENGINE_SETTINGS
AUTHORITY_VERSION_LATEST = AUTHORITY_VERSION_NEW
CERTIFICATE_TTL_SETTING = "certificate_ttl_ms"


@dataclass(frozen=True)
class EngineConfig:
    """Deployment constants every honest sidecar of one chain shares.

    Part of the state root (through `fingerprint`), so two sidecars configured differently
    disagree at once instead of drifting apart later. The four versions are the chain's
    semantics, fixed at `init` and kept in cluster.json, so a replay decides old calls as
    they were decided; what each turns on is proto/chainversions.py's table.
    """

    chain_id: str
    owner_public_key: bytes
    nonce_window: int = limits.NONCE_WINDOW
    latch_halt_threshold: int = limits.LATCH_HALT_THRESHOLD_DEFAULT
    latch_runs_max: int = limits.LATCH_RUNS_MAX_DEFAULT
    latch_buckets_per_run_max: int = limits.LATCH_BUCKETS_PER_RUN_MAX_DEFAULT
    quota_window_ms: int = limits.QUOTA_WINDOW_MS_DEFAULT
    quota_proposals_max: int = limits.QUOTA_PROPOSALS_MAX_DEFAULT
    confirmation_ttl_ms: int = limits.CONFIRMATION_TTL_MS_DEFAULT
    pending_max: int = limits.PENDING_MAX_DEFAULT
    pending_per_principal_max: int = limits.PENDING_PER_PRINCIPAL_MAX_DEFAULT
    grant_ttl_ms_max: int = limits.GRANT_TTL_MS_MAX_DEFAULT
    grants_max: int = limits.GRANTS_MAX_DEFAULT
    grants_per_agent_max: int = limits.GRANTS_PER_AGENT_MAX_DEFAULT
    delegation_depth_max: int = limits.DELEGATION_DEPTH_MAX_DEFAULT
    handles_max: int = limits.HANDLES_MAX_DEFAULT
    handles_per_principal_max: int = limits.HANDLES_PER_PRINCIPAL_MAX_DEFAULT
    tools_max: int = limits.TOOLS_MAX_DEFAULT
    agents_max: int = limits.AGENTS_MAX_DEFAULT
    sinks_max: int = limits.SINKS_MAX_DEFAULT
    expired_retention_ms: int = limits.EXPIRED_RETENTION_MS_DEFAULT
    # How targets are spelled (sidecar/engine/targets.py).
    canonical_version: int = CANONICAL_VERSION_NEW
    # Who answers confirmation cards: the proposer's side, or only the principal the run
    # acts for (`user_confirm`) or the owner (`owner_confirm`), never an agent key.
    authority_version: int = AUTHORITY_VERSION_LATEST
    # With split authority: an (agent, tool) pair refused in this many runs is refused in
    # every run (a new run id does not reset the latch).
    latch_cross_run_threshold: int = limits.LATCH_CROSS_RUN_THRESHOLD_DEFAULT
    # How the state root is computed: SHA-256 of the whole state bytes, or the hash tree
    # over per-entry hashes.
    state_version: int = STATE_VERSION_NEW
    # What the sidecars' receipts sign; on a chain whose receipts expire, how long after
    # its block's time a certificate may be used (an owner setting in the log changes it).
    receipt_version: int = RECEIPT_VERSION_NEW
    certificate_ttl_ms: int = limits.CERTIFICATE_TTL_MS_DEFAULT

    def __post_init__(self) -> None:
        if self.canonical_version not in CANONICAL_VERSIONS:
            raise ValueError(f"canonical_version must be one of {CANONICAL_VERSIONS}")
        if self.authority_version not in AUTHORITY_VERSIONS:
            raise ValueError(f"authority_version must be one of {AUTHORITY_VERSIONS}")
        if self.state_version not in STATE_VERSIONS:
            raise ValueError(f"state_version must be one of {STATE_VERSIONS}")
        if self.receipt_version not in RECEIPT_VERSIONS:
            raise ValueError(f"receipt_version must be one of {RECEIPT_VERSIONS}")
        low, high = limits.CERTIFICATE_TTL_MS_MIN, limits.CERTIFICATE_TTL_MS_MAX
        if not low <= self.certificate_ttl_ms <= high:
            raise ValueError(f"certificate_ttl_ms must be in {low}..{high}")
        if not 1 <= self.latch_cross_run_threshold < 2**32:
            raise ValueError("latch_cross_run_threshold must be in 1..2**32-1")
        if not 0 < len(self.chain_id) <= limits.ID_CHARS_MAX:
            raise ValueError("chain_id must be 1..64 characters")
        if len(self.owner_public_key) != 32:
            raise ValueError("owner_public_key must be a 32-byte Ed25519 public key")
        for name, value in self._limits():
            floor = 0 if name == "delegation_depth_max" else 1
            if not floor <= value < 2**32 and name not in _MS_FIELDS:
                raise ValueError(f"{name} must be in {floor}..2**32-1")
            if name in _MS_FIELDS and not 0 < value < 2**62:
                raise ValueError(f"{name} must be a positive number of milliseconds")

    def _limits(self) -> list[tuple[str, int]]:
        return [(name, getattr(self, name)) for name in _LIMIT_FIELDS]

    @property
    def fingerprint(self) -> bytes:
        """Each version is named only on the chains it changes something for, so a chain
        made before a version field existed keeps the fingerprint it had."""
        enc = Encoder(TAG_CONFIG).text(self.chain_id).raw(self.owner_public_key)
        for name, value in self._limits():
            enc.text(name).u64(value)
        if strict_forms(self.canonical_version):  # the forms depend on the Unicode version
            enc.text("canonical_version").u64(self.canonical_version)
            enc.text("unicode").text(UNICODE_VERSION)
        if self.split_authority:  # the cross-run threshold means something from here
            enc.text("authority_version").u64(self.authority_version)
            enc.text("latch_cross_run_threshold").u64(self.latch_cross_run_threshold)
        if state_hash_tree(self.state_version):
            enc.text("state_version").u64(self.state_version)
        if self.receipts_expire:  # the certificate TTL means something from here
            enc.text("receipt_version").u64(self.receipt_version)
            enc.text("certificate_ttl_ms").u64(self.certificate_ttl_ms)
        return enc.digest()

    @property
    def split_authority(self) -> bool:
        """The chain has principals (proto/chainversions.py `split_authority`)."""
        return split_authority(self.authority_version)

    @property
    def receipts_expire(self) -> bool:
        """Certificates carry a signed validity window (proto/chainversions.py)."""
        return receipts_expire(self.receipt_version)


def config_for_cluster(spec: ClusterSpec) -> EngineConfig:
    """The engine configuration of a cluster's sidecars: cluster.json's chain, owner,
    versions and capacities; every other limit at its default (settings in the log change
    some while it runs)."""
    return EngineConfig(
        chain_id=spec.chain_id,
        owner_public_key=spec.owner_public_key,
        canonical_version=spec.canonical_version,
        authority_version=spec.authority_version,
        state_version=spec.state_version,
        receipt_version=spec.receipt_version,
        **dict(spec.capacities),
    )


def effective_fingerprint(config: EngineConfig, settings: Mapping[str, int]) -> bytes:
    """The fingerprint of the configuration in effect: cluster.json's (`config.fingerprint`)
    while the log sets nothing, else that and every setting the log made. The state
    carries it, so its root commits to both."""
    if not settings:
        return config.fingerprint
    enc = Encoder(TAG_SETTINGS).raw(config.fingerprint)
    for name in sorted(settings):
        enc.text(name).u64(settings[name])
    return enc.digest()


def setting(config: EngineConfig, settings: Mapping[str, int], name: str) -> int:
    """A setting's value: the log's, else cluster.json's."""
    value = settings.get(name)
    return int(getattr(config, name)) if value is None else value


_LIMIT_FIELDS = (
    "nonce_window", "latch_halt_threshold", "latch_runs_max", "latch_buckets_per_run_max",
    "quota_window_ms", "quota_proposals_max", "confirmation_ttl_ms", "pending_max",
    "pending_per_principal_max", "grant_ttl_ms_max", "grants_max", "grants_per_agent_max",
    "delegation_depth_max", "handles_max", "handles_per_principal_max", "tools_max",
    "agents_max", "sinks_max", "expired_retention_ms",
)  # fmt: skip
_MS_FIELDS = frozenset(
    {"quota_window_ms", "confirmation_ttl_ms", "grant_ttl_ms_max", "expired_retention_ms"}
)
