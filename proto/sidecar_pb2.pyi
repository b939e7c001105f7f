from quorumgate.proto import consensus_pb2 as _consensus_pb2
from quorumgate.proto import tx_pb2 as _tx_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReceiptLeaf(_message.Message):
    __slots__ = ("height", "index", "tx_id", "proposal_id", "kind", "outcome", "reason", "target_digest", "card_digest", "mandate_version", "body_digest")
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TX_ID_FIELD_NUMBER: _ClassVar[int]
    PROPOSAL_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TARGET_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CARD_DIGEST_FIELD_NUMBER: _ClassVar[int]
    MANDATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    BODY_DIGEST_FIELD_NUMBER: _ClassVar[int]
    height: int
    index: int
    tx_id: bytes
    proposal_id: bytes
    kind: str
    outcome: str
    reason: str
    target_digest: bytes
    card_digest: bytes
    mandate_version: int
    body_digest: bytes
    def __init__(self, height: _Optional[int] = ..., index: _Optional[int] = ..., tx_id: _Optional[bytes] = ..., proposal_id: _Optional[bytes] = ..., kind: _Optional[str] = ..., outcome: _Optional[str] = ..., reason: _Optional[str] = ..., target_digest: _Optional[bytes] = ..., card_digest: _Optional[bytes] = ..., mandate_version: _Optional[int] = ..., body_digest: _Optional[bytes] = ...) -> None: ...

class Validity(_message.Message):
    __slots__ = ("block_time_ms", "valid_until_ms")
    BLOCK_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    VALID_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    block_time_ms: int
    valid_until_ms: int
    def __init__(self, block_time_ms: _Optional[int] = ..., valid_until_ms: _Optional[int] = ...) -> None: ...

class Receipt(_message.Message):
    __slots__ = ("leaf", "path", "leaf_count", "verdict_root", "state_root", "signer", "signature", "validity", "epoch")
    LEAF_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    LEAF_COUNT_FIELD_NUMBER: _ClassVar[int]
    VERDICT_ROOT_FIELD_NUMBER: _ClassVar[int]
    STATE_ROOT_FIELD_NUMBER: _ClassVar[int]
    SIGNER_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    VALIDITY_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    leaf: ReceiptLeaf
    path: _containers.RepeatedScalarFieldContainer[bytes]
    leaf_count: int
    verdict_root: bytes
    state_root: bytes
    signer: int
    signature: bytes
    validity: Validity
    epoch: int
    def __init__(self, leaf: _Optional[_Union[ReceiptLeaf, _Mapping]] = ..., path: _Optional[_Iterable[bytes]] = ..., leaf_count: _Optional[int] = ..., verdict_root: _Optional[bytes] = ..., state_root: _Optional[bytes] = ..., signer: _Optional[int] = ..., signature: _Optional[bytes] = ..., validity: _Optional[_Union[Validity, _Mapping]] = ..., epoch: _Optional[int] = ...) -> None: ...

class Certificate(_message.Message):
    __slots__ = ("leaf", "path", "leaf_count", "verdict_root", "state_root", "signatures", "chain_id", "validity", "epoch")
    LEAF_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    LEAF_COUNT_FIELD_NUMBER: _ClassVar[int]
    VERDICT_ROOT_FIELD_NUMBER: _ClassVar[int]
    STATE_ROOT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURES_FIELD_NUMBER: _ClassVar[int]
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    VALIDITY_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    leaf: ReceiptLeaf
    path: _containers.RepeatedScalarFieldContainer[bytes]
    leaf_count: int
    verdict_root: bytes
    state_root: bytes
    signatures: _containers.RepeatedCompositeFieldContainer[_consensus_pb2.Signature]
    chain_id: str
    validity: Validity
    epoch: int
    def __init__(self, leaf: _Optional[_Union[ReceiptLeaf, _Mapping]] = ..., path: _Optional[_Iterable[bytes]] = ..., leaf_count: _Optional[int] = ..., verdict_root: _Optional[bytes] = ..., state_root: _Optional[bytes] = ..., signatures: _Optional[_Iterable[_Union[_consensus_pb2.Signature, _Mapping]]] = ..., chain_id: _Optional[str] = ..., validity: _Optional[_Union[Validity, _Mapping]] = ..., epoch: _Optional[int] = ...) -> None: ...

class ReceiptRequest(_message.Message):
    __slots__ = ("proposal_id", "nonce", "own", "wait_ms", "newer_than")
    PROPOSAL_ID_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    OWN_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    NEWER_THAN_FIELD_NUMBER: _ClassVar[int]
    proposal_id: bytes
    nonce: int
    own: _containers.RepeatedCompositeFieldContainer[OwnTx]
    wait_ms: int
    newer_than: int
    def __init__(self, proposal_id: _Optional[bytes] = ..., nonce: _Optional[int] = ..., own: _Optional[_Iterable[_Union[OwnTx, _Mapping]]] = ..., wait_ms: _Optional[int] = ..., newer_than: _Optional[int] = ...) -> None: ...

class ReceiptReply(_message.Message):
    __slots__ = ("found", "receipt", "executed_height", "card")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    EXECUTED_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    CARD_FIELD_NUMBER: _ClassVar[int]
    found: bool
    receipt: Receipt
    executed_height: int
    card: bytes
    def __init__(self, found: _Optional[bool] = ..., receipt: _Optional[_Union[Receipt, _Mapping]] = ..., executed_height: _Optional[int] = ..., card: _Optional[bytes] = ...) -> None: ...

class ReceiptsRequest(_message.Message):
    __slots__ = ("from_height", "own")
    FROM_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    OWN_FIELD_NUMBER: _ClassVar[int]
    from_height: int
    own: _containers.RepeatedCompositeFieldContainer[OwnTx]
    def __init__(self, from_height: _Optional[int] = ..., own: _Optional[_Iterable[_Union[OwnTx, _Mapping]]] = ...) -> None: ...

class OwnTx(_message.Message):
    __slots__ = ("tx_id", "nonce")
    TX_ID_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    tx_id: bytes
    nonce: int
    def __init__(self, tx_id: _Optional[bytes] = ..., nonce: _Optional[int] = ...) -> None: ...

class ReceiptBatch(_message.Message):
    __slots__ = ("height", "receipts")
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    height: int
    receipts: _containers.RepeatedCompositeFieldContainer[Receipt]
    def __init__(self, height: _Optional[int] = ..., receipts: _Optional[_Iterable[_Union[Receipt, _Mapping]]] = ...) -> None: ...

class AdmitRequest(_message.Message):
    __slots__ = ("tx",)
    TX_FIELD_NUMBER: _ClassVar[int]
    tx: bytes
    def __init__(self, tx: _Optional[bytes] = ...) -> None: ...

class AdmitBatchRequest(_message.Message):
    __slots__ = ("txs", "signatures_verified")
    TXS_FIELD_NUMBER: _ClassVar[int]
    SIGNATURES_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    txs: _containers.RepeatedScalarFieldContainer[bytes]
    signatures_verified: bool
    def __init__(self, txs: _Optional[_Iterable[bytes]] = ..., signatures_verified: _Optional[bool] = ...) -> None: ...

class AdmitBatchReply(_message.Message):
    __slots__ = ("replies",)
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[AdmitReply]
    def __init__(self, replies: _Optional[_Iterable[_Union[AdmitReply, _Mapping]]] = ...) -> None: ...

class AdmitReply(_message.Message):
    __slots__ = ("accepted", "reason", "tx_id")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TX_ID_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    tx_id: bytes
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., tx_id: _Optional[bytes] = ...) -> None: ...

class AccountRequest(_message.Message):
    __slots__ = ("signer",)
    SIGNER_FIELD_NUMBER: _ClassVar[int]
    signer: bytes
    def __init__(self, signer: _Optional[bytes] = ...) -> None: ...

class AccountReply(_message.Message):
    __slots__ = ("known", "next_nonce", "executed_height")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    NEXT_NONCE_FIELD_NUMBER: _ClassVar[int]
    EXECUTED_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    known: bool
    next_nonce: int
    executed_height: int
    def __init__(self, known: _Optional[bool] = ..., next_nonce: _Optional[int] = ..., executed_height: _Optional[int] = ...) -> None: ...

class SidecarStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SidecarStatusReply(_message.Message):
    __slots__ = ("chain_id", "node", "executed_height", "state_root", "ledger_head", "ledger_entries", "artifacts", "diverged", "divergence", "replica_committed_height")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    EXECUTED_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    STATE_ROOT_FIELD_NUMBER: _ClassVar[int]
    LEDGER_HEAD_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    DIVERGED_FIELD_NUMBER: _ClassVar[int]
    DIVERGENCE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_COMMITTED_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    chain_id: str
    node: int
    executed_height: int
    state_root: bytes
    ledger_head: bytes
    ledger_entries: int
    artifacts: int
    diverged: bool
    divergence: str
    replica_committed_height: int
    def __init__(self, chain_id: _Optional[str] = ..., node: _Optional[int] = ..., executed_height: _Optional[int] = ..., state_root: _Optional[bytes] = ..., ledger_head: _Optional[bytes] = ..., ledger_entries: _Optional[int] = ..., artifacts: _Optional[int] = ..., diverged: _Optional[bool] = ..., divergence: _Optional[str] = ..., replica_committed_height: _Optional[int] = ...) -> None: ...

class StateRootReport(_message.Message):
    __slots__ = ("height", "state_root", "signature", "owner_key")
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    STATE_ROOT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    OWNER_KEY_FIELD_NUMBER: _ClassVar[int]
    height: int
    state_root: bytes
    signature: bytes
    owner_key: bytes
    def __init__(self, height: _Optional[int] = ..., state_root: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., owner_key: _Optional[bytes] = ...) -> None: ...

class RegistryRequest(_message.Message):
    __slots__ = ("height",)
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    height: int
    def __init__(self, height: _Optional[int] = ...) -> None: ...

class RegistryAgent(_message.Message):
    __slots__ = ("agent_id", "public_key", "mandate_version", "suspended", "mandate", "principal")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    MANDATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_FIELD_NUMBER: _ClassVar[int]
    MANDATE_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    public_key: bytes
    mandate_version: int
    suspended: bool
    mandate: _tx_pb2.SetMandate
    principal: str
    def __init__(self, agent_id: _Optional[str] = ..., public_key: _Optional[bytes] = ..., mandate_version: _Optional[int] = ..., suspended: _Optional[bool] = ..., mandate: _Optional[_Union[_tx_pb2.SetMandate, _Mapping]] = ..., principal: _Optional[str] = ...) -> None: ...

class RegistryContent(_message.Message):
    __slots__ = ("agents", "tools", "sinks", "principals", "sets", "settings")
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    SINKS_FIELD_NUMBER: _ClassVar[int]
    PRINCIPALS_FIELD_NUMBER: _ClassVar[int]
    SETS_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    agents: _containers.RepeatedCompositeFieldContainer[RegistryAgent]
    tools: _containers.RepeatedCompositeFieldContainer[_tx_pb2.RegisterTool]
    sinks: _containers.RepeatedCompositeFieldContainer[_tx_pb2.RegisterSink]
    principals: _containers.RepeatedCompositeFieldContainer[_tx_pb2.RegisterPrincipal]
    sets: _containers.RepeatedCompositeFieldContainer[_tx_pb2.SetEntries]
    settings: _containers.RepeatedCompositeFieldContainer[_tx_pb2.Setting]
    def __init__(self, agents: _Optional[_Iterable[_Union[RegistryAgent, _Mapping]]] = ..., tools: _Optional[_Iterable[_Union[_tx_pb2.RegisterTool, _Mapping]]] = ..., sinks: _Optional[_Iterable[_Union[_tx_pb2.RegisterSink, _Mapping]]] = ..., principals: _Optional[_Iterable[_Union[_tx_pb2.RegisterPrincipal, _Mapping]]] = ..., sets: _Optional[_Iterable[_Union[_tx_pb2.SetEntries, _Mapping]]] = ..., settings: _Optional[_Iterable[_Union[_tx_pb2.Setting, _Mapping]]] = ...) -> None: ...

class RegistryReply(_message.Message):
    __slots__ = ("height", "state_root", "registry_since", "content", "scope")
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    STATE_ROOT_FIELD_NUMBER: _ClassVar[int]
    REGISTRY_SINCE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    height: int
    state_root: bytes
    registry_since: int
    content: RegistryContent
    scope: str
    def __init__(self, height: _Optional[int] = ..., state_root: _Optional[bytes] = ..., registry_since: _Optional[int] = ..., content: _Optional[_Union[RegistryContent, _Mapping]] = ..., scope: _Optional[str] = ...) -> None: ...

class PendingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PendingCard(_message.Message):
    __slots__ = ("card", "transaction")
    CARD_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    card: bytes
    transaction: bytes
    def __init__(self, card: _Optional[bytes] = ..., transaction: _Optional[bytes] = ...) -> None: ...

class PendingReply(_message.Message):
    __slots__ = ("executed_height", "cards")
    EXECUTED_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    CARDS_FIELD_NUMBER: _ClassVar[int]
    executed_height: int
    cards: _containers.RepeatedCompositeFieldContainer[PendingCard]
    def __init__(self, executed_height: _Optional[int] = ..., cards: _Optional[_Iterable[_Union[PendingCard, _Mapping]]] = ...) -> None: ...

class LedgerRequest(_message.Message):
    __slots__ = ("from_height", "from_index", "limit")
    FROM_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    FROM_INDEX_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    from_height: int
    from_index: int
    limit: int
    def __init__(self, from_height: _Optional[int] = ..., from_index: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class LedgerReply(_message.Message):
    __slots__ = ("entries", "executed_height")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    EXECUTED_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedScalarFieldContainer[str]
    executed_height: int
    def __init__(self, entries: _Optional[_Iterable[str]] = ..., executed_height: _Optional[int] = ...) -> None: ...

class SnapshotManifest(_message.Message):
    __slots__ = ("format_version", "height", "state_root", "ledger_head", "ledger_entries", "block_hash", "block_time_ms", "total_bytes", "chunk_bytes", "chunk_digests")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    STATE_ROOT_FIELD_NUMBER: _ClassVar[int]
    LEDGER_HEAD_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    height: int
    state_root: bytes
    ledger_head: bytes
    ledger_entries: int
    block_hash: bytes
    block_time_ms: int
    total_bytes: int
    chunk_bytes: int
    chunk_digests: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, format_version: _Optional[int] = ..., height: _Optional[int] = ..., state_root: _Optional[bytes] = ..., ledger_head: _Optional[bytes] = ..., ledger_entries: _Optional[int] = ..., block_hash: _Optional[bytes] = ..., block_time_ms: _Optional[int] = ..., total_bytes: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., chunk_digests: _Optional[_Iterable[bytes]] = ...) -> None: ...

class SnapshotAttestation(_message.Message):
    __slots__ = ("height", "verdict_root", "state_root", "leaf_count", "signer", "signature", "validity", "ledger_head", "ledger_entries", "block_hash", "block_time_ms", "epoch")
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    VERDICT_ROOT_FIELD_NUMBER: _ClassVar[int]
    STATE_ROOT_FIELD_NUMBER: _ClassVar[int]
    LEAF_COUNT_FIELD_NUMBER: _ClassVar[int]
    SIGNER_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    VALIDITY_FIELD_NUMBER: _ClassVar[int]
    LEDGER_HEAD_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    height: int
    verdict_root: bytes
    state_root: bytes
    leaf_count: int
    signer: int
    signature: bytes
    validity: Validity
    ledger_head: bytes
    ledger_entries: int
    block_hash: bytes
    block_time_ms: int
    epoch: int
    def __init__(self, height: _Optional[int] = ..., verdict_root: _Optional[bytes] = ..., state_root: _Optional[bytes] = ..., leaf_count: _Optional[int] = ..., signer: _Optional[int] = ..., signature: _Optional[bytes] = ..., validity: _Optional[_Union[Validity, _Mapping]] = ..., ledger_head: _Optional[bytes] = ..., ledger_entries: _Optional[int] = ..., block_hash: _Optional[bytes] = ..., block_time_ms: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class SnapshotListRequest(_message.Message):
    __slots__ = ("attest_heights",)
    ATTEST_HEIGHTS_FIELD_NUMBER: _ClassVar[int]
    attest_heights: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, attest_heights: _Optional[_Iterable[int]] = ...) -> None: ...

class SnapshotListReply(_message.Message):
    __slots__ = ("snapshots", "attestations", "executed_height")
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    ATTESTATIONS_FIELD_NUMBER: _ClassVar[int]
    EXECUTED_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    snapshots: _containers.RepeatedCompositeFieldContainer[SnapshotManifest]
    attestations: _containers.RepeatedCompositeFieldContainer[SnapshotAttestation]
    executed_height: int
    def __init__(self, snapshots: _Optional[_Iterable[_Union[SnapshotManifest, _Mapping]]] = ..., attestations: _Optional[_Iterable[_Union[SnapshotAttestation, _Mapping]]] = ..., executed_height: _Optional[int] = ...) -> None: ...

class SnapshotChunkRequest(_message.Message):
    __slots__ = ("height", "index")
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    height: int
    index: int
    def __init__(self, height: _Optional[int] = ..., index: _Optional[int] = ...) -> None: ...

class SnapshotChunkReply(_message.Message):
    __slots__ = ("height", "index", "data")
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    height: int
    index: int
    data: bytes
    def __init__(self, height: _Optional[int] = ..., index: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...
