from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QuorumCert(_message.Message):
    __slots__ = ("view", "block_hash", "height", "signatures")
    VIEW_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURES_FIELD_NUMBER: _ClassVar[int]
    view: int
    block_hash: bytes
    height: int
    signatures: _containers.RepeatedCompositeFieldContainer[Signature]
    def __init__(self, view: _Optional[int] = ..., block_hash: _Optional[bytes] = ..., height: _Optional[int] = ..., signatures: _Optional[_Iterable[_Union[Signature, _Mapping]]] = ...) -> None: ...

class Signature(_message.Message):
    __slots__ = ("signer", "signature")
    SIGNER_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    signer: int
    signature: bytes
    def __init__(self, signer: _Optional[int] = ..., signature: _Optional[bytes] = ...) -> None: ...

class Block(_message.Message):
    __slots__ = ("parent_hash", "view", "height", "justify", "timestamp_ms", "proposer", "payload", "state_root_height", "state_root")
    PARENT_HASH_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    JUSTIFY_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    PROPOSER_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    STATE_ROOT_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    STATE_ROOT_FIELD_NUMBER: _ClassVar[int]
    parent_hash: bytes
    view: int
    height: int
    justify: QuorumCert
    timestamp_ms: int
    proposer: int
    payload: _containers.RepeatedScalarFieldContainer[bytes]
    state_root_height: int
    state_root: bytes
    def __init__(self, parent_hash: _Optional[bytes] = ..., view: _Optional[int] = ..., height: _Optional[int] = ..., justify: _Optional[_Union[QuorumCert, _Mapping]] = ..., timestamp_ms: _Optional[int] = ..., proposer: _Optional[int] = ..., payload: _Optional[_Iterable[bytes]] = ..., state_root_height: _Optional[int] = ..., state_root: _Optional[bytes] = ...) -> None: ...

class Proposal(_message.Message):
    __slots__ = ("block", "signature", "high_tc")
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    HIGH_TC_FIELD_NUMBER: _ClassVar[int]
    block: Block
    signature: bytes
    high_tc: TimeoutCert
    def __init__(self, block: _Optional[_Union[Block, _Mapping]] = ..., signature: _Optional[bytes] = ..., high_tc: _Optional[_Union[TimeoutCert, _Mapping]] = ...) -> None: ...

class Vote(_message.Message):
    __slots__ = ("view", "block_hash", "height", "voter", "signature")
    VIEW_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    VOTER_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    view: int
    block_hash: bytes
    height: int
    voter: int
    signature: bytes
    def __init__(self, view: _Optional[int] = ..., block_hash: _Optional[bytes] = ..., height: _Optional[int] = ..., voter: _Optional[int] = ..., signature: _Optional[bytes] = ...) -> None: ...

class Timeout(_message.Message):
    __slots__ = ("view", "high_qc", "voter", "signature", "high_tc")
    VIEW_FIELD_NUMBER: _ClassVar[int]
    HIGH_QC_FIELD_NUMBER: _ClassVar[int]
    VOTER_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    HIGH_TC_FIELD_NUMBER: _ClassVar[int]
    view: int
    high_qc: QuorumCert
    voter: int
    signature: bytes
    high_tc: TimeoutCert
    def __init__(self, view: _Optional[int] = ..., high_qc: _Optional[_Union[QuorumCert, _Mapping]] = ..., voter: _Optional[int] = ..., signature: _Optional[bytes] = ..., high_tc: _Optional[_Union[TimeoutCert, _Mapping]] = ...) -> None: ...

class TimeoutSignature(_message.Message):
    __slots__ = ("signer", "high_qc_view", "signature")
    SIGNER_FIELD_NUMBER: _ClassVar[int]
    HIGH_QC_VIEW_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    signer: int
    high_qc_view: int
    signature: bytes
    def __init__(self, signer: _Optional[int] = ..., high_qc_view: _Optional[int] = ..., signature: _Optional[bytes] = ...) -> None: ...

class TimeoutCert(_message.Message):
    __slots__ = ("view", "high_qc", "signatures")
    VIEW_FIELD_NUMBER: _ClassVar[int]
    HIGH_QC_FIELD_NUMBER: _ClassVar[int]
    SIGNATURES_FIELD_NUMBER: _ClassVar[int]
    view: int
    high_qc: QuorumCert
    signatures: _containers.RepeatedCompositeFieldContainer[TimeoutSignature]
    def __init__(self, view: _Optional[int] = ..., high_qc: _Optional[_Union[QuorumCert, _Mapping]] = ..., signatures: _Optional[_Iterable[_Union[TimeoutSignature, _Mapping]]] = ...) -> None: ...

class SyncRequest(_message.Message):
    __slots__ = ("from_height", "max_blocks", "target_hash")
    FROM_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TARGET_HASH_FIELD_NUMBER: _ClassVar[int]
    from_height: int
    max_blocks: int
    target_hash: bytes
    def __init__(self, from_height: _Optional[int] = ..., max_blocks: _Optional[int] = ..., target_hash: _Optional[bytes] = ...) -> None: ...

class SyncResponse(_message.Message):
    __slots__ = ("committed", "proof", "proof_qc", "pending", "committed_height", "history_from", "epoch_ends")
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    PROOF_QC_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FROM_FIELD_NUMBER: _ClassVar[int]
    EPOCH_ENDS_FIELD_NUMBER: _ClassVar[int]
    committed: _containers.RepeatedCompositeFieldContainer[Block]
    proof: _containers.RepeatedCompositeFieldContainer[Block]
    proof_qc: QuorumCert
    pending: _containers.RepeatedCompositeFieldContainer[Block]
    committed_height: int
    history_from: int
    epoch_ends: _containers.RepeatedCompositeFieldContainer[EpochLink]
    def __init__(self, committed: _Optional[_Iterable[_Union[Block, _Mapping]]] = ..., proof: _Optional[_Iterable[_Union[Block, _Mapping]]] = ..., proof_qc: _Optional[_Union[QuorumCert, _Mapping]] = ..., pending: _Optional[_Iterable[_Union[Block, _Mapping]]] = ..., committed_height: _Optional[int] = ..., history_from: _Optional[int] = ..., epoch_ends: _Optional[_Iterable[_Union[EpochLink, _Mapping]]] = ...) -> None: ...

class EpochLink(_message.Message):
    __slots__ = ("epoch", "keys", "ended")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    keys: bytes
    ended: bytes
    def __init__(self, epoch: _Optional[int] = ..., keys: _Optional[bytes] = ..., ended: _Optional[bytes] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("nonce", "signature")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    signature: bytes
    def __init__(self, nonce: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class HelloReply(_message.Message):
    __slots__ = ("last_signed_view", "view", "high_qc", "high_tc", "asker", "nonce", "signature")
    LAST_SIGNED_VIEW_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    HIGH_QC_FIELD_NUMBER: _ClassVar[int]
    HIGH_TC_FIELD_NUMBER: _ClassVar[int]
    ASKER_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    last_signed_view: int
    view: int
    high_qc: QuorumCert
    high_tc: TimeoutCert
    asker: int
    nonce: bytes
    signature: bytes
    def __init__(self, last_signed_view: _Optional[int] = ..., view: _Optional[int] = ..., high_qc: _Optional[_Union[QuorumCert, _Mapping]] = ..., high_tc: _Optional[_Union[TimeoutCert, _Mapping]] = ..., asker: _Optional[int] = ..., nonce: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class TxBatch(_message.Message):
    __slots__ = ("txs",)
    TXS_FIELD_NUMBER: _ClassVar[int]
    txs: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, txs: _Optional[_Iterable[bytes]] = ...) -> None: ...

class MessageBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ConsensusMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ConsensusMessage, _Mapping]]] = ...) -> None: ...

class ConsensusMessage(_message.Message):
    __slots__ = ("chain_id", "sender", "proposal", "vote", "timeout", "timeout_cert", "sync_request", "sync_response", "tx_batch", "hello", "hello_reply", "batch", "epoch")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    PROPOSAL_FIELD_NUMBER: _ClassVar[int]
    VOTE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_CERT_FIELD_NUMBER: _ClassVar[int]
    SYNC_REQUEST_FIELD_NUMBER: _ClassVar[int]
    SYNC_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    TX_BATCH_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    HELLO_REPLY_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    chain_id: str
    sender: int
    proposal: Proposal
    vote: Vote
    timeout: Timeout
    timeout_cert: TimeoutCert
    sync_request: SyncRequest
    sync_response: SyncResponse
    tx_batch: TxBatch
    hello: Hello
    hello_reply: HelloReply
    batch: MessageBatch
    epoch: int
    def __init__(self, chain_id: _Optional[str] = ..., sender: _Optional[int] = ..., proposal: _Optional[_Union[Proposal, _Mapping]] = ..., vote: _Optional[_Union[Vote, _Mapping]] = ..., timeout: _Optional[_Union[Timeout, _Mapping]] = ..., timeout_cert: _Optional[_Union[TimeoutCert, _Mapping]] = ..., sync_request: _Optional[_Union[SyncRequest, _Mapping]] = ..., sync_response: _Optional[_Union[SyncResponse, _Mapping]] = ..., tx_batch: _Optional[_Union[TxBatch, _Mapping]] = ..., hello: _Optional[_Union[Hello, _Mapping]] = ..., hello_reply: _Optional[_Union[HelloReply, _Mapping]] = ..., batch: _Optional[_Union[MessageBatch, _Mapping]] = ..., epoch: _Optional[int] = ...) -> None: ...

class StreamAck(_message.Message):
    __slots__ = ("received",)
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    received: int
    def __init__(self, received: _Optional[int] = ...) -> None: ...

class SafetyRecord(_message.Message):
    __slots__ = ("epoch", "last_voted_view", "locked_qc", "high_qc", "last_proposed_view", "last_vote", "last_timeout", "high_tc")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_VOTED_VIEW_FIELD_NUMBER: _ClassVar[int]
    LOCKED_QC_FIELD_NUMBER: _ClassVar[int]
    HIGH_QC_FIELD_NUMBER: _ClassVar[int]
    LAST_PROPOSED_VIEW_FIELD_NUMBER: _ClassVar[int]
    LAST_VOTE_FIELD_NUMBER: _ClassVar[int]
    LAST_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    HIGH_TC_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    last_voted_view: int
    locked_qc: QuorumCert
    high_qc: QuorumCert
    last_proposed_view: int
    last_vote: Vote
    last_timeout: Timeout
    high_tc: TimeoutCert
    def __init__(self, epoch: _Optional[int] = ..., last_voted_view: _Optional[int] = ..., locked_qc: _Optional[_Union[QuorumCert, _Mapping]] = ..., high_qc: _Optional[_Union[QuorumCert, _Mapping]] = ..., last_proposed_view: _Optional[int] = ..., last_vote: _Optional[_Union[Vote, _Mapping]] = ..., last_timeout: _Optional[_Union[Timeout, _Mapping]] = ..., high_tc: _Optional[_Union[TimeoutCert, _Mapping]] = ...) -> None: ...

class StoredProof(_message.Message):
    __slots__ = ("b1", "b2", "qc")
    B1_FIELD_NUMBER: _ClassVar[int]
    B2_FIELD_NUMBER: _ClassVar[int]
    QC_FIELD_NUMBER: _ClassVar[int]
    b1: Block
    b2: Block
    qc: QuorumCert
    def __init__(self, b1: _Optional[_Union[Block, _Mapping]] = ..., b2: _Optional[_Union[Block, _Mapping]] = ..., qc: _Optional[_Union[QuorumCert, _Mapping]] = ...) -> None: ...
