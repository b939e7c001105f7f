from quorumgate.proto import consensus_pb2 as _consensus_pb2
from quorumgate.proto import sidecar_pb2 as _sidecar_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitRequest(_message.Message):
    __slots__ = ("tx", "request_id")
    TX_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    tx: bytes
    request_id: int
    def __init__(self, tx: _Optional[bytes] = ..., request_id: _Optional[int] = ...) -> None: ...

class SubmitReply(_message.Message):
    __slots__ = ("request_id", "accepted", "proposal_id", "reason", "detail", "code")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    PROPOSAL_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    accepted: bool
    proposal_id: bytes
    reason: str
    detail: str
    code: int
    def __init__(self, request_id: _Optional[int] = ..., accepted: _Optional[bool] = ..., proposal_id: _Optional[bytes] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ..., code: _Optional[int] = ...) -> None: ...

class SubmitBatch(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[SubmitRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[SubmitRequest, _Mapping]]] = ...) -> None: ...

class SubmitBatchReply(_message.Message):
    __slots__ = ("replies",)
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[SubmitReply]
    def __init__(self, replies: _Optional[_Iterable[_Union[SubmitReply, _Mapping]]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("chain_id", "node", "committed_height", "committed_hash", "view", "leader", "peers_connected", "mempool_txs", "mempool_bytes", "members", "f", "sync_target_height", "epoch")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_HASH_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    PEERS_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    MEMPOOL_TXS_FIELD_NUMBER: _ClassVar[int]
    MEMPOOL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    F_FIELD_NUMBER: _ClassVar[int]
    SYNC_TARGET_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    chain_id: str
    node: int
    committed_height: int
    committed_hash: bytes
    view: int
    leader: int
    peers_connected: _containers.RepeatedScalarFieldContainer[int]
    mempool_txs: int
    mempool_bytes: int
    members: int
    f: int
    sync_target_height: int
    epoch: int
    def __init__(self, chain_id: _Optional[str] = ..., node: _Optional[int] = ..., committed_height: _Optional[int] = ..., committed_hash: _Optional[bytes] = ..., view: _Optional[int] = ..., leader: _Optional[int] = ..., peers_connected: _Optional[_Iterable[int]] = ..., mempool_txs: _Optional[int] = ..., mempool_bytes: _Optional[int] = ..., members: _Optional[int] = ..., f: _Optional[int] = ..., sync_target_height: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class BlocksRequest(_message.Message):
    __slots__ = ("from_height",)
    FROM_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    from_height: int
    def __init__(self, from_height: _Optional[int] = ...) -> None: ...

class CommittedBlock(_message.Message):
    __slots__ = ("height", "hash", "block")
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    height: int
    hash: bytes
    block: _consensus_pb2.Block
    def __init__(self, height: _Optional[int] = ..., hash: _Optional[bytes] = ..., block: _Optional[_Union[_consensus_pb2.Block, _Mapping]] = ...) -> None: ...

class StoredEpochEnd(_message.Message):
    __slots__ = ("epoch", "keys", "ended")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    keys: bytes
    ended: bytes
    def __init__(self, epoch: _Optional[int] = ..., keys: _Optional[bytes] = ..., ended: _Optional[bytes] = ...) -> None: ...

class EpochEndsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EpochEndsReply(_message.Message):
    __slots__ = ("ends",)
    ENDS_FIELD_NUMBER: _ClassVar[int]
    ends: _containers.RepeatedCompositeFieldContainer[StoredEpochEnd]
    def __init__(self, ends: _Optional[_Iterable[_Union[StoredEpochEnd, _Mapping]]] = ...) -> None: ...
