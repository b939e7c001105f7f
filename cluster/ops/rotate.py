"""`quorumgate admin rotate-key --dir D --member I`: give a member a new consensus key at the
next epoch boundary (docs/consensus/epochs.md, "The live replica"; docs/operating.md,
"Rotating a member's consensus key"); `--receipt I`: give its sidecar a new receipt key
the same way (docs/consensus/epochs.md, "Receipt keys"; docs/operating.md, "Rotating a
sidecar's receipt key"); `--tls I`: give the member a new TLS key and certificate on the
same machine (docs/consensus/epochs.md, "TLS keys"; docs/operating.md, "Rotating a
member's TLS key"): `--prepare` on the member's machine makes them there, `--cert FILE`
where the owner key is commits the certificate in a `replace` record that keeps the
member's index, address and keys.

What it does, in order:

1. reads the epoch the replicas are in (the one at least f+1 of them report: at least one
   honest replica is in it);
2. writes a new Ed25519 key into the member's node directory, `node-I/consensus-<hex>.key`
   (`receipt-<hex>.key` for a receipt key; mode 0600, beside the key it replaces; the seed
   is never printed or logged);
3. signs the `rotate` record (`receipt`: with the new key's proof of possession) for that
   epoch with the owner key and offers it to the replicas, which take it only with the
   owner's signature;
4. waits until a quorum (2f+1) of replicas report the next epoch, when the member signs
   with the new key and the old one's votes (or receipts) count no more.

A member on another host needs the new key file copied into its node directory there
before the boundary: its replica looks for it when the epoch starts, and stops with an
error naming the key if it is missing.

The record is signed with the record key in force (docs/consensus/epochs.md, "The record
key"): the cluster file's owner key until an owner rotation hands it over, then the key
`admin rotate-key --owner` wrote to DIR/owner.key. A key file holding another key is
refused with both fingerprints before anything is written.

`hand_over_records` is the owner rotation's second half on a chain that runs epochs: the
`owner` record, signed by the old key with the new key's proof of possession, offered
until the epoch that checks records with the new key has started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from nacl.signing import SigningKey

from quorumgate.proto.clusterfile import (
    OWNER_KEY_FILE,
    ClusterFileError,
    ClusterSpec,
    MemberSpec,
    load_cluster,
    parse_member_entry,
    public_key_of,
    read_seed,
    rotated_key_file,
    rotated_receipt_key_file,
    write_rotated_tls,
    write_seed,
)
from quorumgate.proto.membership import (
    RECONFIG_SIZES,
    RECONFIG_STEP_MEMBERS,
    MemberEntry,
    Reconfiguration,
    owner_record,
    receipt_record,
    sign_record,
)
from quorumgate.proto.tls import (
    PEM_CERT_BYTES_MAX,
    certificate_fingerprint,
    make_node_certificate,
    tls_key_problem,
)
from quorumgate.sdk.client import Client
from quorumgate.sdk.delivery import FreshReplay
from quorumgate.sdk.epochs import Epochs, key_fingerprint
from quorumgate.sdk.errors import ClusterUnavailable, QuorumGateError, ReadNotAuthorized

EXIT_OK = 0
EXIT_ERROR = 2
EXIT_PENDING = 3  # submitted, the boundary not reached within the deadline
POLL_S = 0.2  # how often the replicas' epochs are read while waiting for the boundary
KEY_PREFIX_HEX_CHARS = 16  # of a public key, in what is printed


def _epoch_now(spec: ClusterSpec, epochs: dict[int, int]) -> int | None:
    """The epoch f+1 of the answering replicas report (the newest such), if any."""
    counts = Counter(epochs.values())
    agreed = [epoch for epoch, count in counts.items() if count >= spec.f + 1]
    return max(agreed) if agreed else None


def record_key(spec: ClusterSpec, epochs: Epochs) -> bytes:
    """The owner key the newest checked epoch's records are checked with: the cluster
    file's, or the one the last `owner` record before it handed over to."""
    return epochs.chain.current.owner_key or spec.owner_public_key


def _signer(key: SigningKey) -> Callable[[bytes], bytes]:
    return lambda message: bytes(key.sign(message).signature)


class RecordKeyError(Exception):
    """The key at hand is not the record key in force (the message names both
    fingerprints, never a private key)."""


async def hand_over_records(
    spec: ClusterSpec,
    old: SigningKey,
    new: SigningKey,
    deadline_s: float,
    say: Callable[[str], None],
) -> int | None:
    """Make `new` the record key: offer the `owner` record (signed by `old`, the key in
    force, with `new`'s proof of possession) for the newest checked epoch, and again for
    a later one if another record ends that epoch first, until the chain of epochs (each
    link certified by a quorum: `Client.epochs`) holds an epoch whose records `new`
    checks. Returns that epoch, or None if it has not started within `deadline_s`. Raises
    `RecordKeyError` if the record key in force is neither key. Reads as `new`: after
    the engine's owner rotation the old key reads nothing."""
    old_key, new_key = bytes(old.verify_key), bytes(new.verify_key)
    offered: int | None = None
    started = time.monotonic()
    async with Client(spec, new) as client:
        while True:
            try:
                epochs = await client.epochs()
            except (ReadNotAuthorized, ClusterUnavailable):
                # Each replica learns the new owner key from its own sidecar's reports
                # (replica/sidecar_link.py): for a moment after the engine's rotation
                # some still refuse its reads.
                if time.monotonic() - started >= deadline_s:
                    raise
                await asyncio.sleep(POLL_S)
                continue
            key, epoch = record_key(spec, epochs), epochs.current.epoch
            if key == new_key:
                return epoch
            if key != old_key:
                raise RecordKeyError(
                    f"the records of epoch {epoch} are checked with owner key "
                    f"{key_fingerprint(key)}, neither the old key {key_fingerprint(old_key)} "
                    f"nor the new one {key_fingerprint(new_key)}"
                )
            if offered != epoch:
                record = owner_record(spec.chain_id, epoch, old_key, new_key, _signer(new))
                await client.submit_record(sign_record(record, spec.chain_id, epoch, _signer(old)))
                say(
                    f"submitted: the owner record for epoch {epoch} (signed by the old key, "
                    f"the new key's proof of possession); records are checked with "
                    f"{key_fingerprint(new_key)} from epoch {epoch + 1} on"
                )
                offered = epoch
            if time.monotonic() - started >= deadline_s:
                return None
            await asyncio.sleep(POLL_S)


async def _epochs(client: Client) -> dict[int, int]:
    return {i: int(s.epoch) for i, s in (await client.replica_status()).items()}


def _say(args: argparse.Namespace, human: str) -> None:
    if not args.json:
        print(human, flush=True)


def _fail(message: str) -> int:
    print(f"quorumgate: {message}", file=sys.stderr, flush=True)
    return EXIT_ERROR


async def _record_key_now(spec: ClusterSpec, client: Client, owner: SigningKey) -> bytes:
    """The record key in force, read as `owner`, or, if `owner` may not read the chain of
    epochs (a rotated-out owner key reads nothing), as DIR/owner.key, so that a refusal
    names the key in force too."""
    try:
        return record_key(spec, await client.epochs())
    except ReadNotAuthorized:
        path = spec.directory / OWNER_KEY_FILE
        if not path.exists():
            raise
        held = SigningKey(read_seed(path))
        if held.verify_key == owner.verify_key:
            raise
        async with Client(spec, held) as reader:
            return record_key(spec, await reader.epochs())


async def _epoch_and_key_check(spec: ClusterSpec, client: Client, owner: SigningKey) -> int | str:
    """The epoch f+1 replicas report, if `owner` holds the record key in force; else why
    not (a message naming both fingerprints, never a private key)."""
    # Members replaced by new machines are reached where the checked chain of epochs says
    # they are (`Client.epochs` follows them even when fewer than f+1 replicas answer at
    # cluster.json's addresses); a key that may not read the chain is told below.
    with contextlib.suppress(QuorumGateError):
        await client.epochs()
    epoch = _epoch_now(spec, await _epochs(client))
    if epoch is None:
        return "fewer than f+1 replicas answer with one epoch: start the cluster"
    try:
        in_force = await _record_key_now(spec, client, owner)
    except ReadNotAuthorized:
        return (
            f"the key file given holds owner key {key_fingerprint(bytes(owner.verify_key))}"
            ", which may not read the chain of epochs (nor may DIR/owner.key): neither is "
            "the owner key in force"
        )
    if in_force != bytes(owner.verify_key):
        return (
            f"the records are checked with owner key {key_fingerprint(in_force)}, and the "
            f"key file given holds {key_fingerprint(bytes(owner.verify_key))}: sign with "
            "the owner key in force (after `admin rotate-key --owner`, DIR/owner.key)"
        )
    return epoch


async def _wait_next_epoch(
    spec: ClusterSpec,
    client: Client,
    epoch: int,
    deadline_s: float,
    follow: bool = False,
    need: int | None = None,
) -> list[int]:
    """The replicas in an epoch after `epoch` once 2f+1 of them are, or at the deadline.
    With `follow` (a member replaced by a new machine), once f+1 replicas are past
    `epoch` the client checks the chain of epochs again, which moves its channels to the
    new machine (`Client.epochs`), so that the new member counts too."""
    started = time.monotonic()
    reached: list[int] = []
    need = spec.n - spec.f if need is None else need  # (2f+1 of the next epoch's members)
    while time.monotonic() - started < deadline_s:
        epochs = await _epochs(client)
        reached = sorted(i for i, e in epochs.items() if e > epoch)
        if len(reached) >= need:
            break
        if follow and len(reached) >= spec.f + 1:
            with contextlib.suppress(QuorumGateError):  # (asked again at the next poll)
                follow = (await client.epochs()).current.epoch <= epoch
        await asyncio.sleep(POLL_S)
    return reached


async def _rotate(args: argparse.Namespace, spec: ClusterSpec, owner: SigningKey) -> int:
    receipt = args.receipt is not None
    member = args.receipt if receipt else args.member
    what = "receipt key" if receipt else "consensus key"
    async with Client(spec, owner) as client:
        checked = await _epoch_and_key_check(spec, client, owner)
        if isinstance(checked, str):
            return _fail(checked)
        epoch = checked
        old_receipt_key = b""
        if receipt:
            # the receipt key in force is the newest checked epoch's, which must be the one
            # the replicas run: the record names it, and is void in any other epoch
            current = (await client.epochs()).current
            if current.epoch != epoch:
                return _fail(
                    f"the replicas run epoch {epoch} and the chain of epochs checks to "
                    f"{current.epoch}: try again once they agree"
                )
            old_receipt_key = current.receipt_keys[member]
        seed = secrets.token_bytes(32)
        public_key = public_key_of(seed)
        name = rotated_receipt_key_file if receipt else rotated_key_file
        path = spec.node_dir(member) / name(public_key)
        try:
            write_seed(path, seed)
        except OSError as err:
            return _fail(f"cannot write the new key file {path}: {err.strerror}")
        prefix = public_key.hex()[:KEY_PREFIX_HEX_CHARS]
        if receipt:
            effect = (
                f"from epoch {epoch + 1} on sidecar {member} signs the blocks after the change "
                f"block with the new key; a certificate of a height past it signed with the old "
                f"key {key_fingerprint(old_receipt_key)} is refused"
            )
        else:
            effect = (
                f"from epoch {epoch + 1} on member {member} signs with the new key; votes and "
                "timeouts of its old key are refused"
            )
        _say(
            args,
            f"member {member}: new {what} {prefix}... in {path} (0600)\n"
            f"takes effect at the next epoch boundary: epoch {epoch} ends at the block "
            f"that commits this change, and {effect}",
        )
        sign_owner = _signer(owner)
        if receipt:
            record = receipt_record(
                spec.chain_id, epoch, member, old_receipt_key, public_key,
                _signer(SigningKey(seed)),
            )  # fmt: skip
        else:
            record = Reconfiguration("rotate", (member,), (public_key,))
        await client.submit_record(sign_record(record, spec.chain_id, epoch, sign_owner))
        _say(
            args,
            f"submitted: {record.kind} member {member} (signed by the owner for epoch {epoch})",
        )
        reached = await _wait_next_epoch(spec, client, epoch, args.deadline)
        done = len(reached) >= spec.n - spec.f
        change_height = await _change_height(client, epoch) if done else None
        doc = {
            "member": member,
            "key": "receipt" if receipt else "consensus",
            "public_key": public_key.hex(),
            "key_file": str(path),
            "epoch": epoch,
            "next_epoch": epoch + 1,
            "change_height": change_height,
            "in_effect": done,
            "nodes_in_next_epoch": reached,
        }
        return _report(args, spec, doc, reached, change_height)


async def _change_height(client: Client, epoch: int) -> int | None:
    """The height of the block that ended `epoch`, from the chain of epochs, or None while
    the chain does not show it yet."""
    with contextlib.suppress(QuorumGateError):
        found = await client.epochs()
        if found.current.epoch > epoch:
            return found.epochs[epoch + 1].boundary_height
    return None


def _report(
    args: argparse.Namespace,
    spec: ClusterSpec,
    doc: dict[str, object],
    reached: list[int],
    change_height: int | None = None,
) -> int:
    """How a change that waits for the next epoch ended, for every command that makes
    one: the document with `--json`, else a line; exit 0 in effect, 3 not yet."""
    done = bool(doc["in_effect"])
    if args.json:
        print(json.dumps(doc, indent=2), flush=True)
    elif done:
        after = "" if change_height is None else f" (after the change block at {change_height})"
        print(f"in effect: epoch {doc['next_epoch']}{after} on nodes {reached}", flush=True)
    else:
        print(
            f"not yet in effect after {args.deadline:g} s (epoch {doc['next_epoch']} on nodes "
            f"{reached}): check `quorumgate status --dir {spec.directory}`",
            flush=True,
        )
    return EXIT_OK if done else EXIT_PENDING


def cmd_rotate_key(args: argparse.Namespace) -> int:
    tls = getattr(args, "tls", None) is not None
    try:
        spec = load_cluster(Path(args.dir))
        member = args.tls if tls else args.member if args.receipt is None else args.receipt
        spec.member(member)
        if tls and spec.insecure:
            raise ClusterFileError("this cluster runs plaintext gRPC: it has no TLS keys")
        if tls and args.prepare:
            return _prepare_tls(args, spec)
        owner = SigningKey(read_seed(Path(args.key or spec.directory / OWNER_KEY_FILE)))
        cert = _read_certificate(Path(args.cert)) if tls and args.cert else None
    except ClusterFileError as err:
        return _fail(str(err))
    if not spec.runs_epochs:
        return _fail(
            f"this chain's consensus_version is {spec.consensus_version}: its member set and "
            "keys are fixed for good (docs/consensus/epochs.md)"
        )
    try:
        if tls:
            return asyncio.run(_rotate_tls(args, spec, owner, cert))
        return asyncio.run(_rotate(args, spec, owner))
    except (FreshReplay, QuorumGateError) as err:
        return _fail(f"the record was not taken ({err}); the new key file stays unused")


def _prepared(spec: ClusterSpec, member: int) -> tuple[Path, Path, bytes]:
    """A new TLS key and certificate for `member`, written into its node directory beside
    the ones in use (proto/clusterfile.py `write_rotated_tls`): (key file, certificate
    file, certificate). The certificate names `qg-node-I`, what every client checks, and
    the host cluster.json (or join.json) gives this machine."""
    key_pem, cert = make_node_certificate(member, spec.member(member).host)
    try:
        key_path, cert_path = write_rotated_tls(spec.node_dir(member), key_pem, cert)
    except OSError as err:
        raise ClusterFileError(f"cannot write the new TLS key: {err.strerror}") from err
    return key_path, cert_path, cert


def _prepare_tls(args: argparse.Namespace, spec: ClusterSpec) -> int:
    """`rotate-key --tls I --prepare`, run on member I's machine: the new key and
    certificate there; the key never leaves it, the certificate goes to the owner."""
    key_path, cert_path, cert = _prepared(spec, args.tls)
    doc = {
        "member": args.tls,
        "key_file": str(key_path),
        "certificate_file": str(cert_path),
        "fingerprint": certificate_fingerprint(cert),
    }
    if args.json:
        print(json.dumps(doc, indent=2), flush=True)
    else:
        print(
            f"member {args.tls}: new TLS key in {key_path} (0600) and its certificate in "
            f"{cert_path} (SHA-256 {doc['fingerprint']})\n"
            f"next, where the owner key is: quorumgate admin rotate-key --tls {args.tls} "
            f"--cert {cert_path} --dir DIR",
            flush=True,
        )
    return EXIT_OK


def _read_certificate(path: Path) -> bytes:
    try:
        with path.open("rb") as handle:
            cert = handle.read(PEM_CERT_BYTES_MAX + 1)
    except OSError as err:
        raise ClusterFileError(f"cannot read {path}: {err.strerror}") from err
    if len(cert) > PEM_CERT_BYTES_MAX:
        raise ClusterFileError(f"{path} is larger than a certificate ({PEM_CERT_BYTES_MAX} bytes)")
    return cert


async def _rotate_tls(
    args: argparse.Namespace, spec: ClusterSpec, owner: SigningKey, cert: bytes | None
) -> int:
    """The `replace` record that gives member `args.tls` the certificate `cert` (made
    here first, with `--prepare`'s files, when none is given) and keeps everything else
    of its entry in the current epoch: index, host, ports, consensus and receipt keys."""
    member = args.tls
    async with Client(spec, owner) as client:
        checked = await _epoch_and_key_check(spec, client, owner)
        if isinstance(checked, str):
            return _fail(checked)
        epoch = checked
        epochs = await client.epochs()
        if epochs.current.epoch != epoch:
            return _fail(
                f"the replicas run epoch {epoch} and the chain of epochs checks to "
                f"{epochs.current.epoch}: try again once they agree"
            )
        cluster = epochs.cluster(spec)
        if not 0 <= member < cluster.n:
            return _fail(f"member {member} is no member of epoch {epoch}")
        in_use = tuple(m.tls_cert for m in cluster.members)
        made = None
        if cert is None:
            made = _prepared(spec, member)
            cert = made[2]
        problem = tls_key_problem(cert, member, in_use)
        if problem is not None:
            return _fail(f"{args.cert if made is None else made[1]}: {problem}")
        now = cluster.members[member]
        receipt_keys = epochs.chain.current.receipt_keys or spec.receipt_keys
        entry = MemberEntry(
            member, now.host, now.replica_port, now.metrics_port, now.sidecar_port,
            now.sidecar_metrics_port, epochs.membership.key(member), receipt_keys[member], cert,
        )  # fmt: skip
        old_fingerprint = certificate_fingerprint(now.tls_cert)
        new_fingerprint = certificate_fingerprint(cert)
        _say(
            args,
            f"member {member}: TLS certificate {old_fingerprint[:KEY_PREFIX_HEX_CHARS]}... -> "
            f"{new_fingerprint[:KEY_PREFIX_HEX_CHARS]}... on the same machine\n"
            f"takes effect at the next epoch boundary: epoch {epoch} ends at the block that "
            f"commits this change, and from epoch {epoch + 1} on member {member} serves the "
            "new certificate and its peers and following clients refuse the old one",
        )
        record = Reconfiguration(
            "replace", (member,), (entry.public_key,), entries=(entry.encode(),)
        )
        await client.submit_record(sign_record(record, spec.chain_id, epoch, _signer(owner)))
        _say(args, f"submitted: replace member {member}'s certificate (signed for epoch {epoch})")
        reached = await _wait_next_epoch(spec, client, epoch, args.deadline, follow=True)
        done = len(reached) >= spec.n - spec.f
        change_height = await _change_height(client, epoch) if done else None
        doc = {
            "member": member,
            "key": "tls",
            "fingerprint": new_fingerprint,
            "previous_fingerprint": old_fingerprint,
            "epoch": epoch,
            "next_epoch": epoch + 1,
            "change_height": change_height,
            "in_effect": done,
            "nodes_in_next_epoch": reached,
        }
        if made is not None:
            doc["key_file"], doc["certificate_file"] = str(made[0]), str(made[1])
        return _report(args, spec, doc, reached, change_height)


async def _not_running(
    spec: ClusterSpec, owner: SigningKey, new: Sequence[MemberSpec]
) -> str | None:
    """Why a machine `new` describes cannot be added yet, or None: each must answer a
    status call at the address its entry names (under its certificate, on a TLS cluster)
    as that member of this chain. An `add` signed for machines that are not running counts
    them in the next epoch's quorums all the same: an epoch of seven with four voters is
    one short of the five it needs to commit anything (docs/operating.md, "Growing and
    shrinking the cluster"). A `replace` is not held to it: the member it replaces is
    usually gone already, so a new machine that starts later leaves the quorums as they
    were, and it may start after the cluster pruned (docs/pruning.md)."""
    async with Client(spec.with_entries(new), owner) as probe:
        statuses = await probe.replica_status()
    problems = []
    for member in new:
        status = statuses.get(member.index)
        if status is None:
            problems.append(f"member {member.index} at {member.replica_address} does not answer")
        elif status.chain_id != spec.chain_id or status.node != member.index:
            problems.append(
                f"{member.replica_address} answers as node {status.node} of chain "
                f"{status.chain_id!r}, not as member {member.index} of {spec.chain_id!r}"
            )
    if not problems:
        return None
    return (
        "; ".join(problems) + ": start the new machine (`quorumgate up --dir` its directory) "
        "and run this again; nothing was signed"
    )


async def _replace(
    args: argparse.Namespace, spec: ClusterSpec, owner: SigningKey, new: MemberSpec
) -> int:
    member = new.index
    old = spec.member(member)
    async with Client(spec, owner) as client:
        checked = await _epoch_and_key_check(spec, client, owner)
        if isinstance(checked, str):
            return _fail(checked)
        epoch = checked
        _say(
            args,
            f"member {member}: replaced by a new machine from epoch {epoch + 1} on\n"
            f"  address   {old.replica_address} -> {new.replica_address}\n"
            f"  consensus {old.public_key.hex()[:KEY_PREFIX_HEX_CHARS]}... -> "
            f"{new.public_key.hex()[:KEY_PREFIX_HEX_CHARS]}...\n"
            f"  receipt   {old.receipt_public_key.hex()[:KEY_PREFIX_HEX_CHARS]}... -> "
            f"{new.receipt_public_key.hex()[:KEY_PREFIX_HEX_CHARS]}...\n"
            f"epoch {epoch} ends at the block that commits this change; from epoch "
            f"{epoch + 1} on the members link to the new address and take member {member}'s "
            "votes and streams only under the new key",
        )
        record = Reconfiguration("replace", (member,), (new.public_key,), entries=(new.encode(),))
        data = sign_record(record, spec.chain_id, epoch, _signer(owner))
        await client.submit_record(data)
        _say(args, f"submitted: replace member {member} (signed by the owner for epoch {epoch})")
        reached = await _wait_next_epoch(spec, client, epoch, args.deadline, follow=True)
        done = len(reached) >= spec.n - spec.f
        doc = {
            "member": member,
            "public_key": new.public_key.hex(),
            "address": new.replica_address,
            "epoch": epoch,
            "next_epoch": epoch + 1,
            "in_effect": done,
            "nodes_in_next_epoch": reached,
        }
        return _report(args, spec, doc, reached)


def cmd_replace_member(args: argparse.Namespace) -> int:
    """`admin replace-member --dir DIR --member I --entry ENTRY.json`: sign and offer the
    `replace` record that gives member I the new machine ENTRY.json describes (what
    `init --join` printed), and wait for the next epoch (docs/operating.md, "Replacing a
    member")."""
    try:
        spec = load_cluster(Path(args.dir))
        spec.member(args.member)
        owner = SigningKey(read_seed(Path(args.key or spec.directory / OWNER_KEY_FILE)))
        path = Path(args.entry)
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ClusterFileError(f"{path} is unreadable or not JSON: {err}") from err
        new = parse_member_entry(doc, spec, str(path))
    except ClusterFileError as err:
        return _fail(str(err))
    if not spec.runs_epochs:
        return _fail(
            f"this chain's consensus_version is {spec.consensus_version}: its member set and "
            "keys are fixed for good (docs/consensus/epochs.md)"
        )
    if new.index != args.member:
        return _fail(f"{args.entry} describes member {new.index}, not member {args.member}")
    try:
        return asyncio.run(_replace(args, spec, owner, new))
    except (FreshReplay, QuorumGateError) as err:
        return _fail(f"the record was not taken ({err})")


async def _grow_or_shrink(
    args: argparse.Namespace, spec: ClusterSpec, owner: SigningKey, new: list[MemberSpec]
) -> int:
    """`add` (the members `new` describe) or, with `new` empty, `remove` of the three
    highest indexes: print what changes, sign for the epoch f+1 replicas report, offer,
    and wait for 2f+1 of the NEXT epoch's members (docs/operating.md, "Growing and
    shrinking the cluster")."""
    async with Client(spec, owner) as client:
        checked = await _epoch_and_key_check(spec, client, owner)
        if isinstance(checked, str):
            return _fail(checked)
        epoch = checked
        current = (await client.epochs()).current
        if current.epoch != epoch:
            return _fail(
                f"the replicas run epoch {epoch} and the chain of epochs checks to "
                f"{current.epoch}: try again once they agree"
            )
        n = current.members
        if new:
            if n != min(RECONFIG_SIZES) or [m.index for m in new] != list(range(n, n + 3)):
                return _fail(
                    f"an add brings members {n}, {n + 1} and {n + 2} to a cluster of "
                    f"{min(RECONFIG_SIZES)}; the entries name {[m.index for m in new]} and "
                    f"epoch {epoch} has {n} members"
                )
            absent = await _not_running(spec, owner, new)
            if absent is not None:
                return _fail(absent)
            record = Reconfiguration(
                "add", (), tuple(m.public_key for m in new),
                entries=tuple(m.encode() for m in new),
            )  # fmt: skip
            size = n + RECONFIG_STEP_MEMBERS
            lines = [f"  member {m.index}: {m.replica_address} (new)" for m in new]
            what = f"add members {n}..{n + 2}"
        else:
            if n != max(RECONFIG_SIZES):
                return _fail(f"a remove leaves {min(RECONFIG_SIZES)} of 7; epoch {epoch} has {n}")
            gone = tuple(range(n - RECONFIG_STEP_MEMBERS, n))
            record = Reconfiguration("remove", gone)
            size = n - RECONFIG_STEP_MEMBERS
            lines = [f"  member {i}: removed (its replica stops at the boundary)" for i in gone]
            what = f"remove members {gone[0]}..{gone[-1]}"
        f_next = (size - 1) // 3
        _say(
            args,
            f"{what}: {n} -> {size} members (f {(n - 1) // 3} -> {f_next}) from epoch "
            f"{epoch + 1} on\n" + "\n".join(lines) + f"\nepoch {epoch} ends at the block "
            "that commits this change",
        )
        data = sign_record(record, spec.chain_id, epoch, _signer(owner))
        await client.submit_record(data)
        _say(args, f"submitted: {what} (signed by the owner for epoch {epoch})")
        need = size - f_next
        reached = await _wait_next_epoch(spec, client, epoch, args.deadline, follow=True, need=need)
        reached = [i for i in reached if i < size]
        done = len(reached) >= need
        doc = {
            "change": record.kind,
            "members_before": n,
            "members_after": size,
            "epoch": epoch,
            "next_epoch": epoch + 1,
            "in_effect": done,
            "nodes_in_next_epoch": reached,
        }
        return _report(args, spec, doc, reached)


def _change_prelude(args: argparse.Namespace) -> tuple[ClusterSpec, SigningKey] | str:
    try:
        spec = load_cluster(Path(args.dir))
        owner = SigningKey(read_seed(Path(args.key or spec.directory / OWNER_KEY_FILE)))
    except ClusterFileError as err:
        return str(err)
    if not spec.runs_epochs:
        return (
            f"this chain's consensus_version is {spec.consensus_version}: its member set and "
            "keys are fixed for good (docs/consensus/epochs.md)"
        )
    return spec, owner


def cmd_add_member(args: argparse.Namespace) -> int:
    """`admin add-member --dir DIR --entry E1 --entry E2 --entry E3`: sign and offer the
    `add` record that brings the three new machines the entries describe (what `init
    --join --index 4..6` printed) and wait for 2f+1 of the next epoch's members."""
    prelude = _change_prelude(args)
    if isinstance(prelude, str):
        return _fail(prelude)
    spec, owner = prelude
    new: list[MemberSpec] = []
    try:
        if len(args.entry) != RECONFIG_STEP_MEMBERS:
            raise ClusterFileError(f"an add takes {RECONFIG_STEP_MEMBERS} --entry files")
        for name in args.entry:
            path = Path(name)
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError) as err:
                raise ClusterFileError(f"{path} is unreadable or not JSON: {err}") from err
            new.append(parse_member_entry(doc, spec, str(path)))
    except ClusterFileError as err:
        return _fail(str(err))
    new.sort(key=lambda m: m.index)
    try:
        return asyncio.run(_grow_or_shrink(args, spec, owner, new))
    except (FreshReplay, QuorumGateError) as err:
        return _fail(f"the record was not taken ({err})")


def cmd_remove_member(args: argparse.Namespace) -> int:
    """`admin remove-member --dir DIR`: sign and offer the `remove` record of members 4, 5
    and 6 (live, only the three highest indexes: docs/consensus/epochs.md, "Growing and
    shrinking") and wait for 2f+1 of the next epoch's members."""
    prelude = _change_prelude(args)
    if isinstance(prelude, str):
        return _fail(prelude)
    spec, owner = prelude
    try:
        return asyncio.run(_grow_or_shrink(args, spec, owner, []))
    except (FreshReplay, QuorumGateError) as err:
        return _fail(f"the record was not taken ({err})")
