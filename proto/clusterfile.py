"""The cluster file and the per-node key files (docs/operating.md).

One JSON file, `DIR/cluster.json`, names the chain, the owner's public key and every
member: where its replica listens for peers and clients, where its metrics are served, and
its public keys. Private keys live beside it, one file per key, mode 0600, never in git:

    DIR/cluster.json
    DIR/owner.key                      owner (operator) Ed25519 seed, hex
    DIR/node-I/consensus.key           replica I's Ed25519 seed, hex
    DIR/node-I/receipt.key             sidecar I's Ed25519 receipt seed, hex
    DIR/node-I/tls.key                 member I's TLS private key (PEM); its certificate,
                                       public, is in cluster.json (proto/tls.py)
    DIR/node-I/tls-<hex>.key, .pem     a TLS key rotated in place and its certificate
                                       (`admin rotate-key --tls I --prepare`)
    DIR/node-I/                        replica and sidecar I's databases, logs, pid files

`init` writes no principal's key: a principal is a person, whose key is made where the
person works (`quorumgate keygen --principal`) and kept sealed with a passphrase
(proto/sealedkey.py), never in the clear; the owner registers only its public key.

Replicas on several hosts: give each member the `host` its peers and clients reach it at
(an address on that host's network) and copy `cluster.json` plus that member's own
`node-I/` directory to its host; run `quorumgate node --dir DIR --node I` there. `init`
writes loopback addresses for a one-machine cluster.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import socket
import stat
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

from quorumgate.proto.chainversions import (
    AUTHORITY_VERSION_NEW,
    AUTHORITY_VERSIONS,
    CANONICAL_VERSION_NEW,
    CANONICAL_VERSIONS,
    CONSENSUS_VERSION_NEW,
    CONSENSUS_VERSIONS,
    RECEIPT_VERSION_NEW,
    RECEIPT_VERSIONS,
    STATE_VERSION_NEW,
    STATE_VERSIONS,
    VERSION_ABSENT,
    receipts_expire,
    runs_epochs,
)
from quorumgate.proto.membership import (
    MEMBERS_MIN,
    RECONFIG_SIZES,
    Member,
    MemberEntry,
    MemberEntryError,
    Membership,
    OwnerRecords,
)
from quorumgate.proto.tls import certificate_problem, check_certificate, make_node_certificate

FORMAT = "quorumgate-cluster/1"
CLUSTER_FILE = "cluster.json"
OWNER_KEY_FILE = "owner.key"
CONSENSUS_KEY_FILE = "consensus.key"
RECEIPT_KEY_FILE = "receipt.key"
TLS_KEY_FILE = "tls.key"
# A new machine's directory (`quorumgate init --join`): the member entry it is to take,
# public parts only, beside the cluster file it trusts (docs/operating.md, "Replacing a
# member").
JOIN_FILE = "join.json"
TRANSPORT_TLS = "tls"
AUDITORS_MAX = 64
AUDITOR_ID_CHARS_MAX = 64
TRANSPORT_INSECURE = "insecure"  # plaintext gRPC: only on a trusted network, and it says so
KEY_FILE_MODE = 0o600
NODE_DIR_MODE = 0o700
PORTS_PER_MEMBER = 4  # replica (peers + clients), replica metrics, sidecar, sidecar metrics
PORT_BASE_DEFAULT = 7400  # `init --hosts`: member ports 7400..7403 on each host
# The sync page's bounds (docs/operating.md, "The sync page"): below 4 blocks a page can
# hold no 2-chain to prove itself by with a block to spare; above 4096 one answer of full
# blocks outgrows any sensible message, and `replica/epochs.py` caps a proof there anyway.
SYNC_BLOCKS_DEFAULT = 256
SYNC_BLOCKS_MIN = 4
SYNC_BLOCKS_MAX = 4096
PORT_MIN = 1024  # no privileged ports: replicas do not run as root
PORT_MAX = 65535
PORT_FIELDS = ("replica_port", "metrics_port", "sidecar_port", "sidecar_metrics_port")


class ClusterFileError(Exception):
    """The cluster file or a key file is missing, unreadable or inconsistent."""


# A member as cluster.json lists it is the public description a `replace` or `add` record
# carries (proto/membership.py): one type, so the two cannot drift apart.
MemberSpec = MemberEntry


@dataclass(frozen=True, slots=True)
class AuditorSpec:
    """A key the owner lets read the committed log and every verdict (not an agent)."""

    auditor_id: str
    public_key: bytes


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    directory: Path
    chain_id: str
    owner_public_key: bytes
    members: tuple[MemberSpec, ...]
    tick_ms: int = 10
    insecure: bool = False  # plaintext gRPC (`quorumgate init --insecure`)
    auditors: tuple[AuditorSpec, ...] = ()
    # The chain's semantics, fixed at `init` so that a replay of its log under a newer
    # build decides every old call as it was decided; what each version turns on is the
    # table in proto/chainversions.py. A file without a field is that field's first
    # version (VERSION_ABSENT): the rules of chains made before the field existed.
    # How the engine spells canonical targets (sidecar/engine/targets.py).
    canonical_version: int = VERSION_ABSENT
    # Who answers confirmation cards: the proposer's side, or only principals and the
    # owner (split authority, docs/engine.md).
    authority_version: int = VERSION_ABSENT
    # The engine's capacities where they differ from the defaults (proto/limits.py), as
    # (name, value) pairs sorted by name: `CAPACITY_NAMES`, fixed at `init --capacity`.
    # They size the sidecars' memory and are part of the chain's configuration.
    capacities: tuple[tuple[str, int], ...] = ()
    # How the state root is computed (docs/sidecar.md, "The state root").
    state_version: int = VERSION_ABSENT
    # What receipts sign, and whether certificates expire.
    receipt_version: int = VERSION_ABSENT
    # Whether the member set may change at epochs (docs/consensus/epochs.md).
    consensus_version: int = VERSION_ABSENT
    # The sync page: committed blocks one catch-up answer carries at most, and what a
    # replica accepts in one (docs/operating.md, "The sync page"). Every member reads the
    # same file, so askers and servers agree on it.
    sync_blocks_max: int = SYNC_BLOCKS_DEFAULT
    # In a new machine's directory (`init --join`, DIR/join.json): the entry of the member
    # it is to become. `member(index)` answers with it, so the node listens, serves TLS
    # and reaches its sidecar as the new machine; `membership()` keeps the cluster file's
    # keys, which check epoch 0 (docs/consensus/epochs.md, "The live replica").
    joined: MemberSpec | None = None

    @property
    def receipts_expire(self) -> bool:
        return receipts_expire(self.receipt_version)

    @property
    def runs_epochs(self) -> bool:
        return runs_epochs(self.consensus_version)

    @property
    def transport(self) -> str:
        return TRANSPORT_INSECURE if self.insecure else TRANSPORT_TLS

    @property
    def n(self) -> int:
        return len(self.members)

    @property
    def f(self) -> int:
        return (self.n - 1) // 3

    @property
    def receipt_keys(self) -> tuple[bytes, ...]:
        return tuple(m.receipt_public_key for m in self.members)

    def membership(self) -> Membership:
        return Membership(
            self.chain_id,
            tuple(Member(m.index, m.public_key, m.replica_address) for m in self.members),
        )

    def with_entries(self, entries: Sequence[MemberEntry], size: int | None = None) -> ClusterSpec:
        """This description with each member an entry names swapped for the entry, an
        entry naming the next index appended, and then cut to `size` members if given:
        the cluster as it stands after a `replace`, an `add` or a `remove` of the highest
        indexes (docs/consensus/epochs.md, "The live replica", "Growing and shrinking").
        The chain id, owner key and every setting stay the cluster file's."""
        members = list(self.members)
        for entry in entries:
            if entry.index == len(members):
                members.append(entry)
                continue
            if not 0 <= entry.index < len(members):
                raise ClusterFileError(f"a member entry names member {entry.index}, not one")
            members[entry.index] = entry
        if size is not None:
            members = members[:size]
        return replace(self, members=tuple(members))

    def record_reader(self) -> OwnerRecords:
        """How epoch 0's reconfiguration records are read (docs/consensus/epochs.md, "Who
        may change the member set"): signed with this file's owner key, a `receipt` record
        checked against this file's receipt keys. Every replica, sidecar, replay and
        follower starts from this one reader, so they all read a record alike."""
        return OwnerRecords(self.chain_id, self.owner_public_key, self.receipt_keys)

    def node_dir(self, index: int) -> Path:
        return self.directory / f"node-{index}"

    def member(self, index: int) -> MemberSpec:
        # (A new machine's own entry, whatever the epoch: an `add` names an index the
        # cluster file does not have.)
        if self.joined is not None and self.joined.index == index:
            return self.joined
        if not 0 <= index < self.n:
            raise ClusterFileError(f"node {index} is not a member (0..{self.n - 1})")
        return self.members[index]


# The kernel hands out ports in this range for outgoing connections and for binds to port 0
# (ip(7), ip_local_port_range). A port `init` picks there can be taken by any client socket
# before `up` binds it, so `init` picks below it. When the file is absent (not Linux), the
# IANA dynamic range starts at 49152 (RFC 6335, section 6); Linux's default starts at 32768.
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
EPHEMERAL_LOW_DEFAULT = 32768
LOCAL_PORTS_LOW = 20000  # below it lie the ports people and other services set by hand
LOCAL_BLOCK_TRIES = 64


def ephemeral_low(path: Path = EPHEMERAL_RANGE_FILE) -> int:
    """The first port of the kernel's ephemeral range (EPHEMERAL_LOW_DEFAULT if unknown)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_LOW_DEFAULT


def _port_is_free(port: int, stack: ExitStack) -> bool:
    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def free_loopback_ports(count: int, *, high: int | None = None) -> list[int]:
    """`count` consecutive ports free on loopback now, in [LOCAL_PORTS_LOW, ephemeral_low()):
    outside the range the kernel gives to client sockets, so no outgoing connection takes
    one between `init` and `up`. The block starts at a random port, so two clusters set up
    at once rarely try the same one. Where that range is too small (a kernel configured
    so), ports the kernel hands out now, as a last resort."""
    high = ephemeral_low() if high is None else high
    span = high - LOCAL_PORTS_LOW - count
    if span > 0:
        for _ in range(LOCAL_BLOCK_TRIES):
            first = LOCAL_PORTS_LOW + secrets.randbelow(span)
            with ExitStack() as stack:  # all held together while checked
                if all(_port_is_free(port, stack) for port in range(first, first + count)):
                    return list(range(first, first + count))
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


def write_seed(path: Path, seed: bytes) -> None:
    """Create a key file readable by its owner only; never overwrite one."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, KEY_FILE_MODE)
    with os.fdopen(fd, "w") as handle:
        handle.write(seed.hex() + "\n")


def read_seed(path: Path) -> bytes:
    """A 32-byte key seed from a file only its owner may read."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        text = path.read_text().strip()
    except OSError as err:
        raise ClusterFileError(f"cannot read key file {path}: {err.strerror}") from err
    if mode & 0o077:
        raise ClusterFileError(f"key file {path} is readable by others (mode {mode:o}); chmod 600")
    if text.startswith("{"):  # proto/sealedkey.py: a principal's key, sealed
        raise ClusterFileError(
            f"key file {path} is sealed with a passphrase (a principal's key): open it with "
            f"its passphrase (`load_principal_key`, or a command's passphrase prompt)"
        )
    try:
        seed = bytes.fromhex(text)
    except ValueError as err:
        raise ClusterFileError(f"key file {path} is not hex") from err
    if len(seed) != 32:
        raise ClusterFileError(f"key file {path} must hold a 32-byte seed")
    return seed


def public_key_of(seed: bytes) -> bytes:
    return bytes(SigningKey(seed).verify_key)


# A member's consensus key after a rotation (docs/consensus/epochs.md, "The live replica"):
# beside `consensus.key`, named by the start of its public key. `consensus.key` stays the
# key the cluster file names, which authenticates the member's link to its sidecar; its
# peer streams open with the key of the epoch its peers run.
ROTATED_KEY_PREFIX = "consensus-"
ROTATED_KEY_NAME_HEX_CHARS = 16
ROTATED_KEYS_READ_MAX = 8  # rotated key files a node reads to sign its stream statements


def rotated_key_file(public_key: bytes) -> str:
    return f"{ROTATED_KEY_PREFIX}{public_key.hex()[:ROTATED_KEY_NAME_HEX_CHARS]}.key"


def held_consensus_seeds(node_dir: Path) -> list[bytes]:
    """The consensus keys `node_dir` holds: the cluster file's, then the rotated ones by
    name (at most `ROTATED_KEYS_READ_MAX`); a file that is not a key is skipped."""
    return _held_seeds(node_dir, CONSENSUS_KEY_FILE, ROTATED_KEY_PREFIX)


def consensus_seed_for(node_dir: Path, public_key: bytes) -> bytes | None:
    """The seed of the consensus key `public_key` from `node_dir` (the cluster file's key
    or a rotated one), or None if the directory holds no such key."""
    return _seed_for(node_dir, (CONSENSUS_KEY_FILE, rotated_key_file(public_key)), public_key)


def _held_seeds(node_dir: Path, key_file: str, rotated_prefix: str) -> list[bytes]:
    paths = [node_dir / key_file]
    paths += sorted(node_dir.glob(f"{rotated_prefix}*.key"))[:ROTATED_KEYS_READ_MAX]
    seeds = []
    for path in paths:
        try:
            seeds.append(read_seed(path))
        except (OSError, ClusterFileError):
            continue
    return seeds


def _seed_for(node_dir: Path, names: tuple[str, ...], public_key: bytes) -> bytes | None:
    for name in names:
        path = node_dir / name
        if path.exists():
            seed = read_seed(path)
            if public_key_of(seed) == public_key:
                return seed
    return None


# A sidecar's receipt key after a `receipt` record (docs/consensus/epochs.md, "Receipt
# keys"): beside `receipt.key`, named by the start of its public key. `receipt.key` stays
# the key the cluster file names, which signs the epochs before the rotation.
ROTATED_RECEIPT_KEY_PREFIX = "receipt-"


def rotated_receipt_key_file(public_key: bytes) -> str:
    return f"{ROTATED_RECEIPT_KEY_PREFIX}{public_key.hex()[:ROTATED_KEY_NAME_HEX_CHARS]}.key"


def held_receipt_seeds(node_dir: Path) -> list[bytes]:
    """The receipt keys `node_dir` holds: the cluster file's, then the rotated ones by name
    (at most `ROTATED_KEYS_READ_MAX`); a file that is not a key is skipped."""
    return _held_seeds(node_dir, RECEIPT_KEY_FILE, ROTATED_RECEIPT_KEY_PREFIX)


def receipt_seed_for(node_dir: Path, public_key: bytes) -> bytes | None:
    """The seed of the receipt key `public_key` from `node_dir` (the cluster file's key
    or a rotated one), or None if the directory holds no such key."""
    names = (RECEIPT_KEY_FILE, rotated_receipt_key_file(public_key))
    return _seed_for(node_dir, names, public_key)


# A member's TLS key after a rotation in place (docs/consensus/epochs.md, "TLS keys"):
# `tls-<first 16 hex of the certificate's SHA-256>.key` beside `tls.key`, and its
# certificate, public, beside it as `.pem`. Named by the SHA-256 of the certificate's PEM
# bytes, the exact bytes a member entry carries, so that a process finds the key of the
# certificate its epoch names without parsing X.509. `tls.key` stays the key of the
# certificate cluster.json (or join.json) names.
ROTATED_TLS_PREFIX = "tls-"
ROTATED_TLS_CERT_SUFFIX = ".pem"


def certificate_name(cert: bytes) -> str:
    """What a rotated TLS key's files are named by: the start of its certificate's hash."""
    return hashlib.sha256(cert).hexdigest()[:ROTATED_KEY_NAME_HEX_CHARS]


def rotated_tls_key_file(cert: bytes) -> str:
    return f"{ROTATED_TLS_PREFIX}{certificate_name(cert)}.key"


def rotated_tls_cert_file(cert: bytes) -> str:
    return f"{ROTATED_TLS_PREFIX}{certificate_name(cert)}{ROTATED_TLS_CERT_SUFFIX}"


def write_rotated_tls(node_dir: Path, key_pem: bytes, cert: bytes) -> tuple[Path, Path]:
    """Write a new TLS key (mode 0600, never over an existing file) and its certificate
    beside the member's other keys; (key file, certificate file)."""
    key_path = node_dir / rotated_tls_key_file(cert)
    cert_path = node_dir / rotated_tls_cert_file(cert)
    _write_private(key_path, key_pem)
    try:
        cert_path.write_bytes(cert)
    except OSError:
        key_path.unlink(missing_ok=True)
        raise
    return key_path, cert_path


def tls_key_for(node_dir: Path, cert: bytes, own_cert: bytes) -> bytes | None:
    """The private key of `cert` from `node_dir`: `tls.key` for `own_cert` (the
    certificate cluster.json or join.json gives this machine), else a rotated key file
    named by `cert`; None if the directory holds none."""
    path = node_dir / (TLS_KEY_FILE if cert == own_cert else rotated_tls_key_file(cert))
    if not path.exists():
        return None
    return read_private(path)


def held_tls_certificates(node_dir: Path, own_cert: bytes) -> bytes:
    """The certificates whose keys `node_dir` holds, concatenated (a trust bundle):
    `own_cert`, then each rotated one whose key file is there (at most
    `ROTATED_KEYS_READ_MAX`). What a member's replica and sidecar pin on their links to
    each other, which cross the boundary of a TLS rotation at different times."""
    certs = [own_cert]
    paths = sorted(node_dir.glob(f"{ROTATED_TLS_PREFIX}*{ROTATED_TLS_CERT_SUFFIX}"))
    for path in paths[:ROTATED_KEYS_READ_MAX]:
        try:
            cert = path.read_bytes()
        except OSError:
            continue
        if (node_dir / rotated_tls_key_file(cert)).exists() and cert not in certs:
            certs.append(cert)
    return b"".join(certs)


def member_ports(hosts: Sequence[str], port_base: int) -> list[list[int]]:
    """Fixed ports for members on the given hosts: PORTS_PER_MEMBER from `port_base` on
    each host, the next block for a second member on the same host."""
    seen: dict[str, int] = {}
    out = []
    for host in hosts:
        k = seen.get(host, 0)
        seen[host] = k + 1
        first = port_base + k * PORTS_PER_MEMBER
        out.append(list(range(first, first + PORTS_PER_MEMBER)))
    if out and max(max(ports) for ports in out) > PORT_MAX:
        raise ClusterFileError(f"--port-base {port_base} leaves ports above {PORT_MAX}")
    return out


def init_cluster(
    directory: Path,
    nodes: int,
    *,
    host: str = "127.0.0.1",
    hosts: Sequence[str] | None = None,
    port_base: int | None = None,
    insecure: bool = False,
    capacities: Mapping[str, int] | None = None,
) -> ClusterSpec:
    """Write a new cluster file and fresh keys for `nodes` members under `directory`; with
    TLS (the default) a TLS key per member and its pinned certificate in the file.

    Every member listens on `host` at a block of ports free on this machine now, below the
    kernel's range for client sockets (`free_loopback_ports`); or, for members on
    several hosts, member I on `hosts[I]` at fixed ports from `port_base`
    (PORT_BASE_DEFAULT), the same on every host (`member_ports`)."""
    hosts = _checked_hosts(nodes, hosts)
    if port_base is not None and not PORT_MIN <= port_base <= PORT_MAX:
        raise ClusterFileError(f"--port-base must be in {PORT_MIN}..{PORT_MAX}")
    checked_capacities = check_capacities(dict(capacities or {}), "--capacity")
    _check_member_count(nodes)
    _refuse_existing_keys(directory, nodes)
    if hosts is None and port_base is None:
        free = free_loopback_ports(nodes * PORTS_PER_MEMBER)
        ports = [free[i * PORTS_PER_MEMBER : (i + 1) * PORTS_PER_MEMBER] for i in range(nodes)]
    else:
        ports = member_ports(hosts or [host] * nodes, port_base or PORT_BASE_DEFAULT)
    addresses = list(hosts) if hosts is not None else [host] * nodes
    created: list[Path] = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        owner_seed = secrets.token_bytes(32)
        members = [
            _write_member(directory, i, addresses[i], ports[i], insecure, created)
            for i in range(nodes)
        ]
        write_seed(directory / OWNER_KEY_FILE, owner_seed)
        created.append(directory / OWNER_KEY_FILE)
        spec = ClusterSpec(
            directory=directory,
            chain_id=f"qg-{secrets.token_hex(6)}",
            owner_public_key=public_key_of(owner_seed),
            members=tuple(members),
            insecure=insecure,
            canonical_version=CANONICAL_VERSION_NEW,
            authority_version=AUTHORITY_VERSION_NEW,
            capacities=checked_capacities,
            state_version=STATE_VERSION_NEW,
            receipt_version=RECEIPT_VERSION_NEW,
            consensus_version=CONSENSUS_VERSION_NEW,
        )
        write_cluster_file(spec)
    except OSError as err:
        for path in reversed(created):  # files first, then the node folders we made
            with contextlib.suppress(OSError):
                path.rmdir() if path.is_dir() else path.unlink()
        raise ClusterFileError(
            f"cannot write the cluster under {directory}: {err.strerror}"
        ) from err
    return spec


def _checked_hosts(nodes: int, hosts: Sequence[str] | None) -> list[str] | None:
    """`--hosts`, one address or host name per member, stripped; None when not given."""
    if hosts is None:
        return None
    hosts = [h.strip() for h in hosts]
    if len(hosts) != nodes:
        raise ClusterFileError(f"--hosts names {len(hosts)} addresses for {nodes} nodes")
    if any(not h or any(c.isspace() or c in "/,[]" for c in h) for h in hosts):
        raise ClusterFileError("--hosts takes addresses or host names, comma-separated")
    return hosts


def _check_member_count(nodes: int) -> None:
    if nodes < MEMBERS_MIN:
        raise ClusterFileError(f"a cluster needs at least {MEMBERS_MIN} nodes (n = 3f+1)")
    if (nodes - 1) % 3:
        raise ClusterFileError(
            f"{nodes} nodes is not 3f+1: it tolerates no more faults than "
            f"{nodes - (nodes - 1) % 3} nodes; use 4, 7, 10, ..."
        )


def _refuse_existing_keys(directory: Path, nodes: int) -> None:
    """Nothing is written until nothing can be in the way: init never overwrites a key,
    and a half-built directory (some node keys, no cluster file) is worse than a refusal."""
    planned = [directory / CLUSTER_FILE, directory / OWNER_KEY_FILE]
    for i in range(nodes):
        planned += [
            directory / f"node-{i}" / CONSENSUS_KEY_FILE,
            directory / f"node-{i}" / RECEIPT_KEY_FILE,
            directory / f"node-{i}" / TLS_KEY_FILE,
        ]
    for path in planned:
        if path.exists():
            raise ClusterFileError(f"{path} exists; init writes only into a new or empty --dir")


def _write_member(
    directory: Path,
    index: int,
    host: str,
    ports: Sequence[int],
    insecure: bool,
    created: list[Path],
) -> MemberSpec:
    """Member `index`'s folder and fresh keys (each path appended to `created`, so a
    failure can take them away again), and its entry in the cluster file."""
    node_dir = directory / f"node-{index}"
    if not node_dir.exists():
        node_dir.mkdir(mode=NODE_DIR_MODE)
        created.append(node_dir)
    seed = secrets.token_bytes(32)
    receipt_seed = secrets.token_bytes(32)
    for name, value in ((CONSENSUS_KEY_FILE, seed), (RECEIPT_KEY_FILE, receipt_seed)):
        write_seed(node_dir / name, value)
        created.append(node_dir / name)
    tls_cert = b""
    if not insecure:
        tls_key, tls_cert = make_node_certificate(index, host)
        _write_private(node_dir / TLS_KEY_FILE, tls_key)
        created.append(node_dir / TLS_KEY_FILE)
    replica_port, metrics_port, sidecar_port, sidecar_metrics_port = ports
    return MemberSpec(
        index=index,
        host=host,
        replica_port=replica_port,
        metrics_port=metrics_port,
        sidecar_port=sidecar_port,
        sidecar_metrics_port=sidecar_metrics_port,
        public_key=public_key_of(seed),
        receipt_public_key=public_key_of(receipt_seed),
        tls_cert=tls_cert,
    )


def add_auditor(directory: Path, auditor_id: str, public_key: bytes) -> ClusterSpec:
    """List a key as an auditor in the cluster file (running nodes see it within a second);
    refuses an id or a key already listed, or a key the cluster uses for something else."""
    spec = load_cluster(directory)
    used = {spec.owner_public_key, *(m.public_key for m in spec.members)}
    used |= {m.receipt_public_key for m in spec.members}
    if any(a.auditor_id == auditor_id for a in spec.auditors):
        raise ClusterFileError(f"auditor {auditor_id!r} is already listed")
    if public_key in used or any(a.public_key == public_key for a in spec.auditors):
        raise ClusterFileError("that key is already the owner's, a member's or an auditor's")
    if not auditor_id or len(auditor_id) > AUDITOR_ID_CHARS_MAX:
        raise ClusterFileError(f"an auditor id is 1..{AUDITOR_ID_CHARS_MAX} characters")
    if len(spec.auditors) >= AUDITORS_MAX:
        raise ClusterFileError(f"at most {AUDITORS_MAX} auditors")
    updated = replace(spec, auditors=(*spec.auditors, AuditorSpec(auditor_id, public_key)))
    write_cluster_file(updated)
    return updated


def write_cluster_file(spec: ClusterSpec) -> None:
    doc = {
        "format": FORMAT,
        "chain_id": spec.chain_id,
        "f": spec.f,
        "tick_ms": spec.tick_ms,
        "transport": spec.transport,
        "owner_public_key": spec.owner_public_key.hex(),
        "members": [
            {
                "index": m.index,
                "host": m.host,
                "replica_port": m.replica_port,
                "metrics_port": m.metrics_port,
                "sidecar_port": m.sidecar_port,
                "sidecar_metrics_port": m.sidecar_metrics_port,
                "public_key": m.public_key.hex(),
                "receipt_public_key": m.receipt_public_key.hex(),
                **({"tls_cert": m.tls_cert.decode()} if m.tls_cert else {}),
            }
            for m in spec.members
        ],
        "auditors": [
            {"auditor_id": a.auditor_id, "public_key": a.public_key.hex()} for a in spec.auditors
        ],
        **_written("canonical_version", spec.canonical_version),
        **_written("authority_version", spec.authority_version),
        **({"capacities": dict(spec.capacities)} if spec.capacities else {}),
        **_written("state_version", spec.state_version),
        **_written("receipt_version", spec.receipt_version),
        **_written("consensus_version", spec.consensus_version),
        **(
            {"sync_blocks_max": spec.sync_blocks_max}
            if spec.sync_blocks_max != SYNC_BLOCKS_DEFAULT
            else {}
        ),
    }
    path = spec.directory / CLUSTER_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)


# The engine capacities a cluster file may raise or lower (EngineConfig fields of the same
# names; defaults in proto/limits.py), and the bound on each: memory grows with them.
CAPACITY_NAMES = (
    "agents_max",
    "grants_max",
    "grants_per_agent_max",
    "handles_max",
    "handles_per_principal_max",
    "pending_max",
    "pending_per_principal_max",
    "sinks_max",
    "tools_max",
)
CAPACITY_VALUE_MAX = 1_000_000


def check_capacities(raw: Mapping[str, object], where: str) -> tuple[tuple[str, int], ...]:
    """Validated (name, value) pairs, sorted by name; a clear error for anything else."""
    out = []
    for name, value in raw.items():
        if name not in CAPACITY_NAMES:
            raise ClusterFileError(
                f"{where}: unknown capacity {name!r} (one of {', '.join(CAPACITY_NAMES)})"
            )
        if not isinstance(value, int) or isinstance(value, bool):
            raise ClusterFileError(f"{where}: {name} must be an integer")
        if not 1 <= value <= CAPACITY_VALUE_MAX:
            raise ClusterFileError(f"{where}: {name} must be in 1..{CAPACITY_VALUE_MAX}")
        out.append((name, value))
    return tuple(sorted(out))


def _field(doc: dict[str, object], name: str, kind: type, where: str) -> object:
    if name not in doc:
        raise ClusterFileError(f"{where}: missing field {name!r}")
    value = doc[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ClusterFileError(f"{where}: field {name!r} must be {kind.__name__}")
    return value


def _hex_key(text: object, where: str) -> bytes:
    try:
        key = bytes.fromhex(str(text))
    except ValueError as err:
        raise ClusterFileError(f"{where}: not hex") from err
    if len(key) != 32:
        raise ClusterFileError(f"{where}: a public key is 32 bytes")
    return key


def _tls_cert(raw: dict[str, object], index: int, where: str) -> bytes:
    pem = str(_field(raw, "tls_cert", str, where)).encode()
    try:
        check_certificate(pem, index)
    except ValueError as err:
        raise ClusterFileError(f"{where}: tls_cert: {err}") from err
    return pem


def _write_private(path: Path, data: bytes) -> None:
    """A new private file (mode 0600), never over an existing one."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, KEY_FILE_MODE)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def read_private(path: Path) -> bytes:
    """A private file only its owner may read (a TLS key)."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        data = path.read_bytes()
    except OSError as err:
        raise ClusterFileError(f"cannot read key file {path}: {err.strerror}") from err
    if mode & 0o077:
        raise ClusterFileError(f"key file {path} is readable by others (mode {mode:o}); chmod 600")
    return data


def _written(name: str, version: int) -> dict[str, int]:
    """A chain version as cluster.json holds it: left out when it is the version a file
    without the field is read as, so files from before the field read back unchanged."""
    return {} if version == VERSION_ABSENT else {name: version}


def _version(doc: dict[str, object], name: str, allowed: tuple[int, ...], where: str) -> int:
    """A chain version from the file: absent, 1 (files from before it existed); else one
    of `allowed`, as a JSON integer (not `true`, `"2"` or `2.0`)."""
    value = doc.get(name, VERSION_ABSENT)
    if type(value) is not int or value not in allowed:
        raise ClusterFileError(f"{where}: {name} must be one of {allowed} (this build)")
    return value


def _read_document(directory: Path) -> dict[str, Any]:
    path = directory / CLUSTER_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise ClusterFileError(
            f"no cluster file at {path}; create one with `quorumgate init --dir {directory}`"
        ) from err
    except (OSError, ValueError) as err:
        raise ClusterFileError(f"cluster file {path} is unreadable or not JSON: {err}") from err
    if not isinstance(doc, dict):
        raise ClusterFileError(f"{path}: expected a JSON object")
    return doc


def load_cluster(directory: Path) -> ClusterSpec:
    doc = _read_document(directory)
    where = str(directory / CLUSTER_FILE)
    if doc.get("format") != FORMAT:
        raise ClusterFileError(f"{where}: format must be {FORMAT!r}")
    chain_id = _field(doc, "chain_id", str, where)
    owner = _hex_key(_field(doc, "owner_public_key", str, where), f"{where}: owner_public_key")
    tick_ms = doc.get("tick_ms", 10)
    if not isinstance(tick_ms, int) or not 1 <= tick_ms <= 1000:
        raise ClusterFileError(f"{where}: tick_ms must be an integer in 1..1000")
    transport = doc.get("transport", TRANSPORT_INSECURE)  # files from before TLS: plaintext
    if transport not in (TRANSPORT_TLS, TRANSPORT_INSECURE):
        raise ClusterFileError(
            f"{where}: transport must be {TRANSPORT_TLS!r} or {TRANSPORT_INSECURE!r}"
        )
    insecure = transport == TRANSPORT_INSECURE
    raw_members = _field(doc, "members", list, where)
    assert isinstance(raw_members, list)
    members = [_load_member(raw, i, where, insecure) for i, raw in enumerate(raw_members)]
    auditors = _load_auditors(doc, where)
    canonical_version = _version(doc, "canonical_version", CANONICAL_VERSIONS, where)
    authority_version = _version(doc, "authority_version", AUTHORITY_VERSIONS, where)
    state_version = _version(doc, "state_version", STATE_VERSIONS, where)
    receipt_version = _version(doc, "receipt_version", RECEIPT_VERSIONS, where)
    consensus_version = _version(doc, "consensus_version", CONSENSUS_VERSIONS, where)
    sync_blocks_max = doc.get("sync_blocks_max", SYNC_BLOCKS_DEFAULT)
    if type(sync_blocks_max) is not int or not (
        SYNC_BLOCKS_MIN <= sync_blocks_max <= SYNC_BLOCKS_MAX
    ):
        raise ClusterFileError(
            f"{where}: sync_blocks_max must be an integer in {SYNC_BLOCKS_MIN}..{SYNC_BLOCKS_MAX}"
            ' (blocks in one catch-up answer; docs/operating.md, "The sync page")'
        )
    raw_capacities = doc.get("capacities", {})
    if not isinstance(raw_capacities, dict):
        raise ClusterFileError(f"{where}: capacities must be an object of name: number")
    spec = ClusterSpec(
        directory,
        str(chain_id),
        owner,
        tuple(members),
        tick_ms,
        insecure,
        tuple(auditors),
        canonical_version,
        authority_version,
        check_capacities(raw_capacities, f"{where}: capacities"),
        state_version,
        receipt_version,
        consensus_version,
        sync_blocks_max,
    )
    declared_f = doc.get("f")
    if declared_f is not None and declared_f != spec.f:
        raise ClusterFileError(f"{where}: f is {declared_f} but {spec.n} members give f={spec.f}")
    try:
        spec.membership()
    except ValueError as err:
        raise ClusterFileError(f"{where}: {err}") from err
    joined = _load_joined(directory, spec)
    if joined is not None:
        spec = replace(spec, joined=joined)
    endpoints = [
        (m.host, p)
        for m in members
        for p in (m.replica_port, m.metrics_port, m.sidecar_port, m.sidecar_metrics_port)
    ]
    if len(set(endpoints)) != len(endpoints):
        raise ClusterFileError(f"{where}: two endpoints share a host and port")
    return spec


def parse_member_entry(doc: object, spec: ClusterSpec, where: str) -> MemberSpec:
    """A member entry (`init --join`'s output, a `replace` record's description) for
    `spec`'s cluster: it parses (`MemberEntry.from_document`), names a member, has a
    TLS certificate exactly when the cluster uses TLS, and its consensus and receipt keys
    are none the cluster file names. `ClusterFileError` says what is wrong."""
    try:
        entry = MemberEntry.from_document(doc)
    except MemberEntryError as err:
        raise ClusterFileError(f"{where}: {err}") from err
    try:
        _check_joinable(entry.index)
    except ClusterFileError as err:
        raise ClusterFileError(f"{where}: {err}") from err
    if spec.insecure and entry.tls_cert:
        raise ClusterFileError(f"{where}: a TLS certificate for a plaintext cluster")
    problem = certificate_problem(entry.tls_cert, entry.index) if entry.tls_cert else None
    if problem is not None:
        raise ClusterFileError(f"{where}: tls_cert: {problem}")
    if not spec.insecure and not entry.tls_cert:
        raise ClusterFileError(f"{where}: no tls_cert, and the cluster uses TLS")
    used = {spec.owner_public_key}
    used |= {k for m in spec.members for k in (m.public_key, m.receipt_public_key)}
    if entry.public_key in used or entry.receipt_public_key in used:
        raise ClusterFileError(f"{where}: a key the cluster file already names")
    if entry.public_key == entry.receipt_public_key:
        raise ClusterFileError(f"{where}: one key as consensus and receipt key")
    return entry


def _check_joinable(index: int) -> None:
    """A new machine's index: a member's (a `replace`) or one an `add` brings, below the
    largest cluster a reconfiguration leads to (whether the record applies is the
    chain's to say: `OwnerRecords.step`)."""
    top = max(RECONFIG_SIZES)
    if not 0 <= index < top:
        raise ClusterFileError(f"index {index} is no member of any cluster size (0..{top - 1})")


def _load_joined(directory: Path, spec: ClusterSpec) -> MemberSpec | None:
    path = directory / JOIN_FILE
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ClusterFileError(f"{path} is unreadable or not JSON: {err}") from err
    return parse_member_entry(doc, spec, str(path))


def init_join(
    cluster_file: Path,
    index: int,
    directory: Path,
    *,
    host: str = "127.0.0.1",
    port_base: int | None = None,
) -> MemberSpec:
    """A new machine's directory for member `index` of the cluster `cluster_file`
    describes (`quorumgate init --join`): the cluster file it trusts, copied as it is;
    fresh consensus, receipt and TLS keys in `node-I/` (mode 0600, never printed);
    ports free on this machine now, or the four from `port_base` (a new host among
    several, on the fixed ports the others use: `member_ports`); and `join.json`, the
    member entry the owner's
    `admin replace-member` or `admin add-member` signs into the record. `index` may be
    beyond the cluster file's members: a machine an `add` brings. Returns that entry."""
    trusted = load_cluster(cluster_file.parent) if cluster_file.name == CLUSTER_FILE else None
    if trusted is None:
        raise ClusterFileError(f"--cluster names {cluster_file}: expected a {CLUSTER_FILE}")
    _check_joinable(index)
    if not trusted.runs_epochs:
        raise ClusterFileError(
            f"this chain's consensus_version is {trusted.consensus_version}: its member set "
            "is fixed for good (docs/consensus/epochs.md)"
        )
    _checked_hosts(1, [host])
    if port_base is not None and not PORT_MIN <= port_base <= PORT_MAX:
        raise ClusterFileError(f"--port-base must be in {PORT_MIN}..{PORT_MAX}")
    fixed = None if port_base is None else member_ports([host], port_base)[0]
    for path in (directory / CLUSTER_FILE, directory / JOIN_FILE, directory / f"node-{index}"):
        if path.exists():
            raise ClusterFileError(f"{path} exists; init --join writes only into a new --dir")
    created: list[Path] = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        ports = free_loopback_ports(PORTS_PER_MEMBER) if fixed is None else fixed
        member = _write_member(directory, index, host.strip(), ports, trusted.insecure, created)
        text = cluster_file.read_text()
        (directory / CLUSTER_FILE).write_text(text)
        created.append(directory / CLUSTER_FILE)
        entry = json.dumps(member.document(), indent=2) + "\n"
        (directory / JOIN_FILE).write_text(entry)
        created.append(directory / JOIN_FILE)
        load_cluster(directory)  # what the node will read
    except BaseException:
        for path in reversed(created):
            with contextlib.suppress(OSError):
                path.rmdir() if path.is_dir() else path.unlink()
        raise
    return member


def _load_member(raw: object, i: int, where: str, insecure: bool) -> MemberSpec:
    mwhere = f"{where}: members[{i}]"
    if not isinstance(raw, dict):
        raise ClusterFileError(f"{mwhere}: expected an object")
    index = _field(raw, "index", int, mwhere)
    if index != i:
        raise ClusterFileError(f"{mwhere}: index must be {i}")
    ports = []
    for name in PORT_FIELDS:
        port = _field(raw, name, int, mwhere)
        assert isinstance(port, int)
        if not 1 <= port <= 65535:
            raise ClusterFileError(f"{mwhere}: {name} out of range")
        ports.append(port)
    return MemberSpec(
        index=i,
        host=str(_field(raw, "host", str, mwhere)),
        replica_port=ports[0],
        metrics_port=ports[1],
        sidecar_port=ports[2],
        sidecar_metrics_port=ports[3],
        public_key=_hex_key(_field(raw, "public_key", str, mwhere), mwhere),
        receipt_public_key=_hex_key(
            _field(raw, "receipt_public_key", str, mwhere), f"{mwhere}: receipt_public_key"
        ),
        tls_cert=b"" if insecure else _tls_cert(raw, i, mwhere),
    )


def _load_auditors(doc: dict[str, Any], where: str) -> list[AuditorSpec]:
    auditors = []
    for i, raw in enumerate(doc.get("auditors", [])):
        awhere = f"{where}: auditors[{i}]"
        if not isinstance(raw, dict):
            raise ClusterFileError(f"{awhere}: expected an object")
        auditor_id = str(_field(raw, "auditor_id", str, awhere))
        if not auditor_id or len(auditor_id) > AUDITOR_ID_CHARS_MAX:
            raise ClusterFileError(f"{awhere}: auditor_id must be 1..{AUDITOR_ID_CHARS_MAX} chars")
        key = _hex_key(_field(raw, "public_key", str, awhere), f"{awhere}: public_key")
        auditors.append(AuditorSpec(auditor_id, key))
    if len(auditors) > AUDITORS_MAX:
        raise ClusterFileError(f"{where}: at most {AUDITORS_MAX} auditors")
    return auditors
