"""Every domain tag in QuorumGate, declared once.

A signed or hashed statement starts with its tag (`proto/canonical.py`), so a signature or
a hash made for one purpose can never be taken for another, nor one made under an earlier
form of a statement for a later one. That holds only while no two purposes share a tag and
no tag starts another (`tests/proto/test_domains.py` checks both, and that no `b"qg/..."`
literal outside this table names a tag). A tag's bytes are part of what was signed: a
changed statement gets a new tag (`/v2`), and the old one stays here, retired, so that it
is never given to anything else.

Each line says what the tag opens and whether those bytes are signed or only hashed; the
docs page or module that defines the statement is named in its group's heading.
"""

from __future__ import annotations

# Consensus (docs/consensus/messages.md): built in replica/types.py.
BLOCK = b"qg/block/v1"  # hashed: a block (chain, parent, view, height, justify, payload, root)
VOTE = b"qg/vote/v2"  # signed: a vote (chain, view, height, block hash)
# Retired: a vote that did not sign its block's height. Kept so a store whose certificates
# hold such votes is recognised and refused (replica/storage.py); never signed again.
VOTE_V1 = b"qg/vote/v1"
TIMEOUT = b"qg/timeout/v1"  # signed: a timeout (chain, view, the signer's highest QC view)
PROPOSAL = b"qg/proposal/v1"  # signed: a leader's proposal (chain, view, block hash)
QC = b"qg/qc/v1"  # hashed: a quorum certificate's digest (view, height, block, signatures)
HELLO = b"qg/hello/v1"  # signed: a starting replica's hello (chain, sender, nonce)
HELLO_REPLY = b"qg/hello-reply/v1"  # signed: the answer to a hello (who, whom, nonce, views)

# Inside one replica process, never sent (replica/core.py, replica/certs.py, replica/sim.py).
HELLO_NONCE_DEFAULT = b"qg/hello-nonce/default"  # hashed: a core's hello nonce when none given
SIM_HELLO = b"qg/sim/hello"  # hashed: the simulator's fresh hello nonce per start
TC_CACHE = b"qg/tc-cache/v1"  # hashed: the cache key of a timeout certificate found valid
SIG_CACHE = b"qg/sig-cache/v1"  # hashed: the cache key of one signature found valid

# Transactions (proto/tx.py).
TX = b"qg/tx/v1"  # signed: a transaction's serialized TxBody, exactly as carried
TXID = b"qg/txid/v1"  # hashed: a transaction id (signer, nonce)
TXID_RAW = b"qg/txid/raw/v1"  # hashed: the stand-in id of bytes with no signer or nonce
KEY_ROTATION = b"qg/key-rotation/v1"  # signed by a new key: chain, holder, subject, both keys

# Links between processes (runtime/channels.py, runtime/readauth.py;
# docs/security/reads-and-certificates.md).
PEER_STREAM = b"qg/peer-stream/v1"  # signed: a peer stream's opening (chain, from, to, time)
READ = b"qg/read/v1"  # signed: a read statement (chain, method, time, the reader's key)

# Sidecar to replica (proto/reports.py).
STATE_ROOT_REPORT = b"qg/state-root/v1"  # signed: a sidecar's state root at a height
# signed: that root and the owner key the sidecar's state holds after an owner rotation
STATE_ROOT_REPORT_WITH_OWNER = b"qg/state-root/v2"

# Receipts and the ledger (sidecar/receipts.py, sidecar/ledger.py;
# docs/security/reads-and-certificates.md).
RECEIPT_LEAF = b"qg/receipt-leaf/v1"  # hashed: one verdict's leaf in a block's Merkle tree
RECEIPT = b"qg/receipt/v1"  # signed: a block's receipt statement (chain, height, roots, count)
RECEIPT_WITH_VALIDITY = b"qg/receipt/v2"  # signed: that statement and its validity window
# signed: the statement of a block of an epoch after 0, naming its epoch, with its validity
# window where the chain's receipts expire (docs/consensus/epochs.md, "Receipt keys")
RECEIPT_IN_EPOCH = b"qg/receipt-epoch/v1"
LEDGER = b"qg/ledger/v1"  # hashed: a ledger entry, its predecessor's hash included
# hashed: a ledger entry with its argument commitments and sealed salts (chains whose
# receipt version commits arguments; docs/audit.md, "Argument commitments")
LEDGER_WITH_COMMITMENTS = b"qg/ledger-committed/v2"
# signed: a sidecar's pruning checkpoint, where its local ledger starts after it dropped the
# rows below (chain, height, state root, ledger head and entry count, block hash and time;
# sidecar/pruning.py, docs/pruning.md)
LEDGER_CHECKPOINT = b"qg/ledger-checkpoint/v1"

# Reconfiguration (proto/membership.py; docs/consensus/epochs.md, "The record"): opens the
# record the consensus core recognises in a committed transaction (a NUL follows it there).
RECONFIG_RECORD = b"qg/reconfig/v1"
# signed: the owner's word for one record and the epoch it changes (chains whose consensus
# version runs epochs: docs/consensus/epochs.md, "Who may change the member set")
RECONFIG_OWNER = b"qg/reconfig-owner/v1"
# signed by a new owner key: its proof of possession in an `owner` record, binding chain,
# epoch, the key it replaces and itself (proto/membership.py `owner_key_statement`)
RECONFIG_OWNER_KEY = b"qg/reconfig-owner-key/v1"
# signed by a member's new receipt key: its proof of possession in a `receipt` record,
# binding chain, epoch, member index, the key it replaces and itself (proto/membership.py
# `receipt_key_statement`)
RECONFIG_RECEIPT_KEY = b"qg/reconfig-receipt-key/v1"

# Argument commitments (proto/commitments.py; docs/audit.md, "Argument commitments").
ARGUMENT_COMMITMENT = b"qg/argument-commitment/v1"  # HMAC'd under the salt: name, kind, value
COMMIT_SALT = b"qg/commit-salt/v1"  # HMAC'd under the proposer's seed: a call's salt
SALT_SEAL = b"qg/salt-seal/v1"  # hashed: the ephemeral X25519 key sealing a salt to an auditor

# The governance engine (sidecar/engine/; docs/engine.md).
ENGINE_CONFIG = b"qg/engine-config/v1"  # hashed: the configuration fingerprint
ENGINE_SETTINGS = b"qg/engine-settings/v1"  # hashed: that fingerprint and the log's settings
CARD = b"qg/card/v1"  # hashed: a confirmation card (a confirmation names its digest)
VERDICT = b"qg/verdict/v1"  # opens a verdict's canonical bytes at a height
ARTIFACT = b"qg/artifact/v1"  # opens an artifact's canonical bytes (replay compares them)
HANDLE = b"qg/handle/v1"  # hashed: a sealed value's handle, from its transaction id
ENGINE_STATE = b"qg/engine-state/v1"  # hashed: the whole state (its hash: the version-1 root)
ENGINE_STATE_HEADER = b"qg/engine-state-header/v2"  # opens the state outside its sections
ENGINE_STATE_ROOT = b"qg/engine-state-root/v2"  # hashed: the state root (header, sections)
STATE_LEAF = b"qg/state-leaf/v2"  # hashed: one state entry (section, key, bytes)
STATE_BUCKET = b"qg/state-bucket/v2"  # hashed: a bucket of entry hashes
STATE_SECTION = b"qg/state-section/v2"  # hashed: a section of bucket hashes

# Pinned MCP tool definitions (cluster/mcpgw/pins.py; docs/mcp-gateway.md, "The pin").
MCP_TOOL = b"qg/mcp-tool/v2"  # hashed: a whole tool object in RFC 8785 JSON
# Retired as a pin: name, description and input schema only. Hashed still, only to
# recognise an old pin and ask for a new one.
MCP_TOOL_V1 = b"qg/mcp-tool/v1"
