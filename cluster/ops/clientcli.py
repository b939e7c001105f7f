"""Client commands of the `quorumgate` CLI (docs/sdk.md, "The command line").

`add_client_commands(sub)` registers, on the CLI's subparsers:

    keygen     --out FILE [--sink | --principal]
                                                an Ed25519 agent key, 0600 (an X25519 sink
                                                key; a principal's, sealed with a passphrase)
    passphrase --key FILE                       seal a principal's key file, or change it
    submit     --dir D --key F --run R --tool T [--target X] [--also ROLE=X]... [--arg N=V]...
               [--handle N=H]...
    pending    --dir D [--key F]                the open cards this key alone may answer
    confirm    --dir D [--key F] PROPOSAL_ID [--yes] [--expect-tool T [--expect-target X]
               [--expect-also ROLE=X]...]     refuses a card that is not that call
    reject     --dir D [--key F] PROPOSAL_ID [--yes]
    admin      --dir D [--key F] register-tool | register-agent | register-principal |
               register-sink | set-mandate | suspend | resume | set-settings |
               set-run-targets | rotate-key (--agent ID | --principal ID) --key F |
               rotate-key --owner | rotate-key (--member I | --receipt I | --tls I) |
               replace-member --member I --entry F |
               add-member --entry F --entry F --entry F | remove-member |
               rotate-key (--agent ID | --principal ID) --by-owner --out F ...
    agents     --dir D                          registered agents and their mandates
    settings   --dir D                          settings in effect (the log's or cluster.json's)
    tools      --dir D                          registered tools
    verdicts   --dir D [--from-height H] [--follow]

Every command takes `--json` (one JSON document; `verdicts` prints JSON lines) and prints
tidy tables otherwise; anything that waits shows a progress line on a terminal (stderr,
never with `--json`). Keys are hex seed files with mode 0600, like `DIR/owner.key`;
`admin`, `pending`, `confirm` and `reject` default to the owner's. A principal's key is
sealed with a passphrase (`keygen --principal`, `quorumgate passphrase`): a command given
one asks for the passphrase on the terminal, or reads it from `--passphrase-fd N`
(ops/passphrases.py says why not an environment variable). `pending`, `confirm`, `reject`
and a principal's `admin register-principal` and `admin set-run-targets` refuse any other
key kept in the clear than the owner's: an approval needs the person
(docs/security/approvals.md).

Exit codes: 0 done (allow, flag, applied); 1 denied or rejected; 2 bad input, refused, or
cluster unreachable; 3 pending confirmation (`submit`).

Reason codes are operator information. `admin`, `confirm`, `agents`, `tools` and
`verdicts` are operator commands and show them; `submit` (what an agent's wrapper might
run) shows only the outcome and the fixed denial sentence unless `--show-reason`.

`agents` and `tools` read the registry from the sidecars' `Registry` RPC: the content f+1
of them return for one height with one state root (`Client.registry`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

from nacl.public import PrivateKey
from nacl.signing import SigningKey

from quorumgate.ops.output import table
from quorumgate.ops.passphrases import (
    add_kdf_cost_argument,
    add_passphrase_command,
    ask_passphrase,
    kdf_cost,
    new_passphrase,
)
from quorumgate.proto.chainversions import only_principals_answer_cards
from quorumgate.proto.clusterfile import (
    OWNER_KEY_FILE,
    ClusterFileError,
    ClusterSpec,
    add_auditor,
    load_cluster,
    read_seed,
    write_seed,
)
from quorumgate.proto.model import (
    DENIAL_TEXT,
    SETTING_NAMES,
    ArgCheck,
    EnvelopeArg,
    KeyHolder,
    Mandate,
    Outcome,
    RuleKind,
    SetSettings,
    ToolRules,
)
from quorumgate.proto.sealedkey import is_sealed_file, read_sealed, seal, write_sealed
from quorumgate.sdk.builders import mandate, tool_spec
from quorumgate.sdk.cards import card_matches
from quorumgate.sdk.client import (
    CertificateTimeout,
    Client,
    ClusterUnavailable,
    Decision,
    Handle,
    OpenCard,
    QuorumGateError,
    ReadNotAuthorized,
    TransactionRejected,
)
from quorumgate.sdk.keys import (
    abandon_rotation,
    commit_rotation,
    generate_key,
    generate_sink_key,
    load_principal_key,
    rotating_path,
    stage_rotation,
)
from quorumgate.sdk.registry import Registry
from quorumgate.sidecar.engine.core import config_for_cluster
from quorumgate.sidecar.engine.statements import ConfirmationCard

T = TypeVar("T")

EXIT_OK = 0
EXIT_DENIED = 1
EXIT_ERROR = 2
EXIT_PENDING = 3
PROGRESS_BAR_CHARS = 30
PROGRESS_REFRESH_S = 0.1  # at most this often, so a fast replay is not slowed by drawing
VERDICTS_IDLE_S = 1.0  # without --follow: stop once sidecars were silent this long


# ---------------------------------------------------------------------------- output


class Progress:
    """One self-rewriting line on stderr when it is a terminal (and not --json): a bar
    when the total is known, elapsed seconds otherwise."""

    def __init__(self, label: str, *, enabled: bool, stream: IO[str] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and self.stream.isatty()
        self.label = label
        self.started = time.monotonic()
        self._drawn = 0.0

    def update(self, done: int | None = None, total: int | None = None) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._drawn < PROGRESS_REFRESH_S and (done is None or done != total):
            return
        self._drawn = now
        elapsed = now - self.started
        if done is not None and total:
            filled = int(PROGRESS_BAR_CHARS * min(done, total) / total)
            bar = "#" * filled + "-" * (PROGRESS_BAR_CHARS - filled)
            text = f"{self.label} [{bar}] {done}/{total}"
        else:
            text = f"{self.label} ... {elapsed:.1f} s"
        self.stream.write("\r" + text + "\x1b[K")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def _fail(message: str, code: int = EXIT_ERROR) -> int:
    print(f"quorumgate: {message}", file=sys.stderr)
    return code


def _emit(args: argparse.Namespace, doc: object, human: str) -> None:
    print(json.dumps(doc, sort_keys=True) if args.json else human)


def _signers(decision: Decision) -> str:
    return ",".join(str(s) for s in decision.signers)


def decision_json(decision: Decision, *, with_reason: bool) -> dict[str, object]:
    doc: dict[str, object] = {
        "proposal_id": decision.proposal_id.hex(),
        "tx_id": decision.tx_id.hex(),
        "kind": decision.kind,
        "outcome": decision.outcome.value,
        "height": decision.height,
        "certified_by": list(decision.signers),
        "mandate_version": decision.mandate_version,
        "certificate": decision.certificate_bytes().hex(),
    }
    if with_reason:
        doc["reason"] = decision.reason
    if decision.card is not None:
        doc["card"] = {
            "digest": decision.card.digest.hex(),
            "text": decision.card.render(),
            "expires_at_ms": decision.card.expires_at_ms,
        }
    return doc


# ---------------------------------------------------------------------------- plumbing


def _spec(args: argparse.Namespace) -> ClusterSpec:
    return load_cluster(Path(args.dir))


def _key(
    args: argparse.Namespace, spec: ClusterSpec, *, owner_default: bool, principal: bool = False
) -> SigningKey:
    """The key to sign with: `--key FILE` (a sealed file opened with its passphrase), or
    the owner's. `principal`: the command answers or reads cards, which only a person
    may, so a key kept in the clear is refused unless it is the cluster owner's."""
    if args.key is None:
        if not owner_default:
            raise ClusterFileError("--key FILE is required (an agent key; see `keygen`)")
        return SigningKey(read_seed(spec.directory / OWNER_KEY_FILE))
    path = Path(args.key)
    if is_sealed_file(path):
        return load_principal_key(path, ask_passphrase(path, args.passphrase_fd))
    key = SigningKey(read_seed(path))
    # the owner's: cluster.json's key, or DIR/owner.key itself (after `rotate-key --owner`)
    owners = path.resolve() == (spec.directory / OWNER_KEY_FILE).resolve()
    if principal and bytes(key.verify_key) != spec.owner_public_key and not owners:
        raise ClusterFileError(
            f"{path} holds a key in the clear: a principal's key is sealed with a "
            f"passphrase, so that only the person can answer cards (seal it with "
            f"`quorumgate passphrase --key {path}`)"
        )
    return key


def _run_with_client(
    args: argparse.Namespace,
    *,
    owner_default: bool,
    work: Callable[[Client], Coroutine[Any, Any, int]],
    principal: bool = False,
) -> int:
    try:
        spec = _spec(args)
        key = _key(args, spec, owner_default=owner_default, principal=principal)
    except ClusterFileError as err:
        return _fail(str(err))

    async def main() -> int:
        async with Client(spec, key) as client:
            return await work(client)

    try:
        return asyncio.run(main())
    except ClusterUnavailable:
        return _fail("the cluster could not be reached (no quorum of replicas or sidecars)")


async def _waiting(label: str, args: argparse.Namespace, coro: Coroutine[Any, Any, T]) -> T:
    """Await `coro` with a progress line (elapsed time) while it runs."""
    progress = Progress(label, enabled=not args.json)
    task = asyncio.ensure_future(coro)
    try:
        while not task.done():
            progress.update()
            await asyncio.wait({task}, timeout=PROGRESS_REFRESH_S)
        return task.result()
    finally:
        task.cancel()
        progress.close()


def _hex_bytes(text: str, what: str, size: int = 32) -> bytes:
    try:
        value = bytes.fromhex(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be hex") from None
    if len(value) != size:
        raise argparse.ArgumentTypeError(f"{what} must be {size} bytes ({2 * size} hex digits)")
    return value


def _pairs(items: Sequence[str], what: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"{what} takes NAME=VALUE")
        out.append((name, value))
    return out


# ---------------------------------------------------------------------------- keygen


def _cmd_keygen(args: argparse.Namespace) -> int:
    path = Path(args.out)
    if args.sink and args.principal:
        return _fail("--sink or --principal, not both")
    if path.exists():  # before asking for a passphrase that would not be used
        return _fail(f"{path} exists; keys are never overwritten")
    sealed = ""
    try:
        if args.sink:
            public, kind = bytes(generate_sink_key(path).public_key), "x25519"
        elif args.principal:
            passphrase = new_passphrase(path, args.passphrase_fd, "--passphrase-fd")
            made = seal(bytes(SigningKey.generate()), passphrase, kdf_cost(args.kdf_cost))
            write_sealed(path, made)
            public, kind = made.public_key, "ed25519"
            sealed = f", sealed with a passphrase (argon2id, {args.kdf_cost})"
        else:
            public, kind = bytes(generate_key(path).verify_key), "ed25519"
    except FileExistsError:
        return _fail(f"{path} exists; keys are never overwritten")
    except ClusterFileError as err:
        return _fail(str(err))
    except OSError as err:
        return _fail(f"cannot write {path}: {err.strerror}")
    _emit(
        args,
        {"file": str(path), "kind": kind, "public_key": public.hex(), "sealed": bool(sealed)},
        f"wrote {path} (mode 0600, {kind}{sealed}); public key {public.hex()}",
    )
    return EXIT_OK


# ---------------------------------------------------------------------------- submit


def _cmd_submit(args: argparse.Namespace) -> int:
    try:
        texts = _pairs(args.arg, "--arg")
        handles = _pairs(args.handle, "--handle")
        further = _pairs(args.also, "--also")
        grant = _hex_bytes(args.grant, "--grant") if args.grant else None
    except argparse.ArgumentTypeError as err:
        return _fail(str(err))
    arguments: dict[str, str | Handle] = {name: value for name, value in texts}
    arguments.update({name: Handle(value) for name, value in handles})

    async def work(client: Client) -> int:
        try:
            decision = await _waiting(
                "waiting for f+1 receipts",
                args,
                client.propose(
                    args.tool,
                    args.target,
                    arguments,
                    run_id=args.run,
                    grant=grant,
                    deadline_s=args.deadline,
                    targets=further,
                ),
            )
        except QuorumGateError as err:
            if isinstance(err, ClusterUnavailable):
                raise
            detail = f" ({err.reason})" if args.show_reason else ""
            return _fail(f"{err}{detail}")
        run = args.run if grant is not None else client.run_of(args.run)
        return _print_decision(args, decision, run=run)

    try:
        return _run_with_client(args, owner_default=False, work=work)
    except ValueError as err:  # a malformed proposal (run id, sizes): never echoes values
        return _fail(f"invalid proposal: {err}")


def _print_decision(args: argparse.Namespace, decision: Decision, run: str | None = None) -> int:
    """`run`: the run a `submit` acted in (on authority version 2 a new label opens run
    `n<nonce>`: pass that id as `--run` to act in the same run again)."""
    show = bool(getattr(args, "show_reason", True))
    outcome = decision.outcome
    row = [decision.proposal_id.hex()[:16], outcome.value, decision.height, _signers(decision)]
    headers = ["proposal", "outcome", "height", "certified by"]
    if show:
        headers.append("reason")
        row.append(decision.reason)
    lines = [table(headers, [row])]
    if outcome in (Outcome.DENY, Outcome.REJECTED):
        lines.append(DENIAL_TEXT)
    if run is not None and run != getattr(args, "run", run):
        lines.append(f"run {run} (opened for {args.run!r}: pass --run {run} to act in it again)")
    if decision.card is not None and outcome is Outcome.PENDING:
        lines += ["", decision.card.render(), ""]
        lines.append(
            f"confirm with: quorumgate confirm --dir {args.dir} --key PRINCIPAL_KEY "
            f"{decision.proposal_id.hex()}"
        )
    doc = decision_json(decision, with_reason=show)
    if run is not None:
        doc["run_id"] = run
    _emit(args, doc, "\n".join(lines))
    if decision.allowed or outcome is Outcome.APPLIED:
        return EXIT_OK
    return EXIT_PENDING if outcome is Outcome.PENDING else EXIT_DENIED


# ---------------------------------------------------------------------------- confirm


def _card_json(open_card: OpenCard) -> dict[str, object]:
    card = open_card.card
    return {
        "proposal_id": card.proposal_id.hex(),
        "card_digest": card.digest.hex(),
        "tool": card.tool,
        "target": card.canonical_target,
        "links": list(card.links),
        "requested_by": card.principal,
        "tier": card.tier.value,
        "delegate_of": card.delegate_of,
        "confirmer": card.confirmer,
        "values": dict(open_card.values),
        "expires_at_ms": card.expires_at_ms,
        "created_height": card.created_height,
        # the run had read untrusted content (docs/provenance.md): by which call
        "exposed_by": None
        if card.exposed_by is None
        else {"height": card.exposed_by[0], "tool": card.exposed_by[1]},
        "certified_by": list(open_card.sidecars),
        "text": open_card.render(),
    }


def _cmd_pending(args: argparse.Namespace) -> int:
    """The open cards this key alone may answer, rendered as the person should read them."""

    async def work(client: Client) -> int:
        cards = await _waiting("reading open cards", args, client.pending(args.deadline))
        if args.json:
            _emit(args, {"cards": [_card_json(c) for c in cards]}, "")
            return EXIT_OK
        if not cards:
            print("no open cards for this key")
            return EXIT_OK
        for open_card in cards:
            print(open_card.render())
            print()
        print(f"{len(cards)} open card(s); answer with `quorumgate confirm` or `reject`")
        return EXIT_OK

    return _run_with_client(args, owner_default=True, work=work, principal=True)


def _cmd_confirm(args: argparse.Namespace) -> int:
    return _answer(args, reject=False)


def _cmd_reject(args: argparse.Namespace) -> int:
    return _answer(args, reject=True)


def card_differs(
    args: argparse.Namespace, card: ConfirmationCard | OpenCard, canonical_version: int
) -> str | None:
    """`confirm --expect-tool T --expect-target X [--expect-also ROLE=X]...`: what differs
    between the card and the call the person meant (`card_matches`), or None; None too
    when nothing is expected."""
    if args.expect_tool is None:
        return None
    try:
        further = _pairs(args.expect_also, "--expect-also")
    except argparse.ArgumentTypeError as err:
        return str(err)
    differences = card_matches(
        card,
        tool=args.expect_tool,
        target=args.expect_target,
        further_targets=further,
        version=canonical_version,
    )
    return "; ".join(differences) or None


def _answer(args: argparse.Namespace, *, reject: bool) -> int:
    """Show the card with every value, ask (unless --yes), sign the answer."""
    verb = "reject" if reject else "confirm"
    try:
        proposal_id = _hex_bytes(args.proposal_id, "PROPOSAL_ID")
    except argparse.ArgumentTypeError as err:
        return _fail(str(err))

    async def card_of_v1(client: Client) -> ConfirmationCard | int:
        """Authority version 1 chains: the card from the proposal's certificate."""
        try:
            pending = await _waiting(
                "fetching the certified card",
                args,
                client.await_certificate(proposal_id, args.deadline),
            )
        except CertificateTimeout:
            return _fail(
                f"proposal {proposal_id.hex()[:16]}... has no certified verdict (unknown, or "
                f"not executed within {args.deadline:g} s): check the id with "
                f"`quorumgate verdicts --dir {args.dir}`"
            )
        if pending.card is None or pending.outcome is not Outcome.PENDING:
            return _fail(f"proposal is not pending (outcome {pending.outcome.value})", 1)
        return pending.card

    async def work(client: Client) -> int:
        if only_principals_answer_cards(client.spec.authority_version):
            cards = await _waiting("reading open cards", args, client.pending(args.deadline))
            mine = [c for c in cards if c.proposal_id == proposal_id]
            if not mine:
                return _fail(
                    f"no open card {proposal_id.hex()[:16]}... for this key: it was answered, "
                    f"expired, or is another's to answer (list yours with `quorumgate "
                    f"pending --dir {args.dir} --key KEY`)",
                    1,
                )
            card, text, shown = mine[0].card, mine[0].render(), mine[0]
        else:
            found = await card_of_v1(client)
            if isinstance(found, int):
                return found
            card, text, shown = found, found.render(), found
        if not args.json:
            print(text)
        if not reject:
            version = config_for_cluster(client.spec).canonical_version
            differs = card_differs(args, shown, version)
            if differs is not None:
                return _fail(f"not confirmed: the card is not the call expected: {differs}", 1)
        if not args.yes:
            if not sys.stdin.isatty():
                return _fail(f"not a terminal: pass --yes to {verb} the card shown")
            question = "Reject this call?" if reject else "Confirm exactly this call?"
            answer = input(f"{question} [y/N] ").strip().lower()
            if answer not in ("y", "yes"):
                return _fail(f"not {verb}ed", 1)
        try:
            decision = await _waiting(
                f"{verb}ing",
                args,
                client.confirm(proposal_id, card.digest, args.deadline, reject=reject),
            )
        except TransactionRejected as err:
            _emit(
                args,
                decision_json(err.decision, with_reason=True),
                f"{verb} refused: {err.reason}",
            )
            return EXIT_DENIED
        if reject:
            _emit(
                args,
                decision_json(decision, with_reason=True),
                f"rejected: proposal {proposal_id.hex()[:16]}... is denied "
                f"({decision.reason}), certified by sidecars {_signers(decision)}",
            )
            return EXIT_OK
        return _print_decision(args, decision)

    return _run_with_client(args, owner_default=True, work=work, principal=True)


# ---------------------------------------------------------------------------- admin


def _public_key_arg(args: argparse.Namespace, *, sink: bool, principal: bool = False) -> bytes:
    """`--public-key HEX`, or the public key of `--key-file FILE`: a sealed file names it
    in the clear (no passphrase needed); a principal's file must be sealed."""
    if args.public_key:
        return _hex_bytes(args.public_key, "--public-key")
    if args.key_file:
        path = Path(args.key_file)
        if is_sealed_file(path) and not sink:
            return read_sealed(path).public_key
        if principal:
            raise ClusterFileError(
                f"{path} holds a key in the clear: a principal's key is sealed with a "
                f"passphrase (`quorumgate keygen --principal`, or `quorumgate passphrase "
                f"--key {path}` to seal this one)"
            )
        seed = read_seed(path)
        if sink:
            return bytes(PrivateKey(seed).public_key)
        return bytes(SigningKey(seed).verify_key)
    raise argparse.ArgumentTypeError("give --public-key HEX or --key-file FILE")


def _envelope(text: str) -> EnvelopeArg:
    parts = text.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "verified"):
        raise argparse.ArgumentTypeError("--envelope takes NAME:KIND or NAME:KIND:verified")
    return EnvelopeArg(parts[0], parts[1], require_verified=len(parts) == 3)


def _role(text: str) -> tuple[str, tuple[list[str], int]]:
    """`--role ROLE=SCHEME[,SCHEME...][:MAX]`: further targets a tool takes in a role."""
    role, sep, rest = text.partition("=")
    schemes, colon, most = rest.partition(":")
    if not sep or not role or not schemes or (colon and not most.isdigit()):
        raise argparse.ArgumentTypeError("--role takes ROLE=SCHEME[,SCHEME...][:MAX]")
    return role, ([s for s in schemes.split(",") if s], int(most) if colon else 1)


def _admin_op(args: argparse.Namespace) -> tuple[str, str, Callable[[Client], Any]]:
    """(operation, subject, call) for the admin subcommand in `args`."""
    op = args.admin_command
    if op == "register-tool":
        spec = tool_spec(
            args.name,
            args.mode,
            sink=args.sink,
            schemes=args.scheme,
            envelopes=[_envelope(e) for e in args.envelope],
            min_tier=args.min_tier,
            binds_caller=args.binds_caller,
            arguments=dict(_pairs(args.arg, "--arg")),
            direct_override=args.direct_override,
            roles=dict(_role(r) for r in args.role),
            target_optional=args.target_optional,
            untrusted_results=args.untrusted_results,
        )
        return op, args.name, lambda c: c.register_tool(spec, args.deadline)
    if op == "set-run-targets":
        return (
            op,
            args.agent,
            lambda c: c.set_run_targets(args.agent, args.run, args.targets, args.deadline),
        )
    if op in ("register-agent", "register-sink", "register-principal"):
        key = _public_key_arg(
            args, sink=op == "register-sink", principal=op == "register-principal"
        )
        if op == "register-agent":
            principal = args.principal or ""
            return (
                op,
                args.agent_id,
                lambda c: c.register_agent(args.agent_id, key, args.deadline, principal=principal),
            )
        if op == "register-principal":
            deputies = [d for d in (args.deputies or "").split(",") if d]
            return (
                op,
                args.principal_id,
                lambda c: c.register_principal(
                    args.principal_id, key, args.deadline, deputies=deputies
                ),
            )
        return op, args.sink_id, lambda c: c.register_sink(args.sink_id, key, args.deadline)
    if op == "set-mandate":
        chosen = [args.tools is not None, args.unrestricted, args.no_tools]
        if sum(chosen) != 1:
            raise argparse.ArgumentTypeError(
                "give one of --tools A,B / --unrestricted / --no-tools"
            )
        tools: list[str] | None
        if args.unrestricted:
            tools = None
        elif args.no_tools:
            tools = []
        else:
            tools = [t for t in args.tools.split(",") if t]
        value = mandate(
            tools,
            enforcement="observe" if args.observe else "enforce",
            suspended=args.suspended,
            delegation_policy=args.delegation,
            max_delegation_depth=args.max_depth,
        )
        return op, args.agent_id, lambda c: c.set_mandate(args.agent_id, value, args.deadline)
    if op == "suspend":
        return op, args.agent_id, lambda c: c.suspend(args.agent_id, args.deadline)
    if op == "set-settings":
        values = {}
        for name, text in _pairs(args.setting, "NAME=VALUE"):
            if not text.isdigit():
                raise argparse.ArgumentTypeError(f"{name}: a whole number, not {text!r}")
            values[name] = int(text)
        if not values and not args.clear:
            raise argparse.ArgumentTypeError("give NAME=VALUE settings or --clear NAME")
        clear = sorted(set(args.clear))
        try:
            SetSettings(values=tuple(sorted(values.items())), clear=tuple(clear))
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return (
            op,
            "settings",
            lambda c: c.set_settings(values, clear=clear, deadline_s=args.deadline),
        )
    assert op == "resume", op
    return op, args.agent_id, lambda c: c.resume(args.agent_id, args.deadline)


def _cmd_add_auditor(args: argparse.Namespace) -> int:
    """Auditors are listed in the cluster file, which the owner keeps: running replicas and
    sidecars see the change within a second. Copy the file to every host of a multi-host
    cluster."""
    try:
        public_key = _public_key_arg(args, sink=False)
        spec = add_auditor(Path(args.dir), args.auditor_id, public_key)
    except (argparse.ArgumentTypeError, ClusterFileError) as err:
        return _fail(str(err))
    _emit(
        args,
        {
            "auditor_id": args.auditor_id,
            "public_key": public_key.hex(),
            "auditors": len(spec.auditors),
        },
        f"auditor {args.auditor_id} may now read the committed log and every verdict "
        f"({len(spec.auditors)} auditors in {spec.directory / 'cluster.json'})",
    )
    return EXIT_OK


# The admin operations a principal may sign too (the engine checks which principal).
_PRINCIPAL_OPS = ("register-principal", "set-run-targets")


def _cmd_admin(args: argparse.Namespace) -> int:
    try:
        op, subject, call = _admin_op(args)
    except (argparse.ArgumentTypeError, ValueError, ClusterFileError) as err:
        return _fail(str(err))

    async def work(client: Client) -> int:
        # a principal may sign register-principal for itself (to name its deputies) and
        # the own targets of its agents' runs (docs/provenance.md)
        # DIR/owner.key is the owner's by definition (after `rotate-key --owner` too)
        if args.key is not None and not client.is_owner and op not in _PRINCIPAL_OPS:
            return _fail("admin operations are signed with the owner key (DIR/owner.key)")
        try:
            decision = await _waiting(f"{op} {subject}", args, call(client))
        except TransactionRejected as err:
            _emit(
                args,
                {
                    "operation": op,
                    "subject": subject,
                    **decision_json(err.decision, with_reason=True),
                },
                f"rejected: {op} {subject} ({err.reason})",
            )
            return EXIT_DENIED
        except QuorumGateError as err:
            if isinstance(err, ClusterUnavailable):
                raise
            return _fail(f"{err} ({err.reason})")
        _emit(
            args,
            {"operation": op, "subject": subject, **decision_json(decision, with_reason=True)},
            f"applied: {op} {subject} at height {decision.height}, "
            f"certified by sidecars {_signers(decision)}",
        )
        return EXIT_OK

    # a principal signing is a person acting: its key sealed
    principal = args.key is not None and op in _PRINCIPAL_OPS
    return _run_with_client(args, owner_default=True, work=work, principal=principal)


def _rotation_target(args: argparse.Namespace, spec: ClusterSpec) -> tuple[KeyHolder, str, Path]:
    """(whose key, its id, the key file rotated in place) for `admin rotate-key`."""
    if args.owner:
        if args.key is not None:
            raise ClusterFileError("--owner rotates DIR/owner.key: give no --key")
        return KeyHolder.OWNER, "", spec.directory / OWNER_KEY_FILE
    if args.key is None:
        raise ClusterFileError("--key FILE is required: the key file to rotate (its holder signs)")
    if args.agent:
        return KeyHolder.AGENT, args.agent, Path(args.key)
    return KeyHolder.PRINCIPAL, args.principal, Path(args.key)


def _cmd_add_member(args: argparse.Namespace) -> int:
    from quorumgate.ops.rotate import cmd_add_member

    return cmd_add_member(args)


def _cmd_remove_member(args: argparse.Namespace) -> int:
    from quorumgate.ops.rotate import cmd_remove_member

    return cmd_remove_member(args)


def _cmd_replace_member(args: argparse.Namespace) -> int:
    from quorumgate.ops.rotate import cmd_replace_member

    return cmd_replace_member(args)


def _cmd_rotate_key(args: argparse.Namespace) -> int:
    """`admin rotate-key`: the holder's key file gets a new key in place, the old one
    waits as `<name>.old`, signs the rotation, and goes once the rotation is certified (or
    comes back if it is refused). Neither key is ever printed. `--by-owner`: see
    `_rotate_by_owner`."""
    if (args.prepare or args.cert is not None) and args.tls is None:
        return _fail("--prepare and --cert are for --tls")
    if args.member is not None or args.receipt is not None or args.tls is not None:
        if args.by_owner or args.out is not None:
            return _fail("--by-owner and --out are for an agent's or a principal's key")
        from quorumgate.ops.rotate import cmd_rotate_key

        return cmd_rotate_key(args)  # a member's keys change at an epoch boundary
    if args.by_owner:
        return _rotate_by_owner(args)
    if args.out is not None:
        return _fail("--out is for --by-owner: the holder's own key file is rotated in place")
    if args.owner:
        try:
            spec = _spec(args)
        except ClusterFileError as err:
            return _fail(str(err))
        path = spec.directory / OWNER_KEY_FILE
        if spec.runs_epochs and rotating_path(path).exists():
            return _finish_owner_records(args, spec, path)
    try:
        spec = _spec(args)
        holder, subject, path = _rotation_target(args, spec)
        sealed = is_sealed_file(path)
        if holder is KeyHolder.PRINCIPAL and not sealed:
            raise ClusterFileError(
                f"{path} holds a key in the clear: a principal's key is sealed with a "
                f"passphrase (`quorumgate passphrase --key {path}`)"
            )
        passphrase = ask_passphrase(path, args.passphrase_fd) if sealed else None
        old, new = stage_rotation(path, passphrase)
    except FileExistsError as err:
        return _fail(f"{err}; put the right key back at {path} first")
    except ClusterFileError as err:
        return _fail(str(err))
    except OSError as err:
        return _fail(f"cannot rotate {path}: {err.strerror}")
    name = subject or "owner"

    async def main() -> Decision:
        async with Client(spec, old) as client:
            call = client.rotate_key(holder, subject, new, deadline_s=args.deadline)
            return await _waiting(f"rotate-key {name}", args, call)

    try:
        decision = asyncio.run(main())
    except TransactionRejected as err:
        abandon_rotation(path)
        _emit(
            args,
            {
                "operation": "rotate-key",
                "subject": name,
                **decision_json(err.decision, with_reason=True),
            },
            f"rejected: rotate-key {name} ({err.reason}); {path} holds the old key again",
        )
        return EXIT_DENIED
    except QuorumGateError as err:
        return _fail(
            f"the rotation of {name}'s key is not known to be certified ({err.reason}): {path} "
            f"holds the new key, {rotating_path(path)} the old one; `quorumgate agents` shows "
            "the key the cluster holds: keep that file at the first path, remove the other"
        )
    if holder is KeyHolder.OWNER and spec.runs_epochs:
        _emit_progress(
            args,
            f"applied: rotate-key owner at height {decision.height}, certified by sidecars "
            f"{_signers(decision)}; now the records' key",
        )
        return _finish_owner_records(args, spec, path, (old, new, decision))
    commit_rotation(path)
    _emit(
        args,
        {"operation": "rotate-key", "subject": name, **decision_json(decision, with_reason=True)},
        f"applied: rotate-key {name} at height {decision.height}, certified by sidecars "
        f"{_signers(decision)}; {path} holds the new key (mode 0600), the old one is retired",
    )
    return EXIT_OK


def _emit_progress(args: argparse.Namespace, human: str) -> None:
    if not args.json:
        print(human, flush=True)


def _finish_owner_records(
    args: argparse.Namespace,
    spec: ClusterSpec,
    path: Path,
    rotated: tuple[SigningKey, SigningKey, Decision] | None = None,
) -> int:
    """The owner rotation's second half on a chain that runs epochs: the member set's
    records are checked with an owner key of their own per epoch (docs/consensus/
    epochs.md, "The record key"), handed over by an `owner` record that the old key
    signs. The engine's rotation comes first: it is the half that the engine's rules may
    refuse (then nothing changed and the old key is back in place), while the record,
    once the engine took the new key, is refused only for a stale epoch, and is then
    signed again for the next one. The old key stays at `<owner.key>.old` until the
    epoch that checks records with the new key has started, so that an interrupted
    hand-over is finished by running the command again (`rotated` None: the keys are
    read back from the two files)."""
    from quorumgate.ops.rotate import RecordKeyError, hand_over_records

    old_path = rotating_path(path)
    doc: dict[str, object] = {"operation": "rotate-key", "subject": "owner"}
    try:
        if rotated is None:
            old, new = SigningKey(read_seed(old_path)), SigningKey(read_seed(path))
            _emit_progress(args, f"resuming: {old_path} holds the old owner key")
        else:
            old, new, decision = rotated
            doc.update(decision_json(decision, with_reason=True))
        epoch = asyncio.run(
            hand_over_records(spec, old, new, args.deadline, lambda m: _emit_progress(args, m))
        )
    except (ClusterFileError, RecordKeyError) as err:
        return _fail(str(err))
    except ReadNotAuthorized:
        # The record is only ever offered after a read as the new key, which the replicas
        # allow once their sidecars hold it as the owner's: nothing was offered.
        return _fail(
            f"the replicas do not take the key in {path} as the owner's, so no record was "
            f"offered: the engine's rotation may not be certified; `quorumgate agents` shows "
            f"the key the cluster holds (the old key is at {old_path})"
        )
    except QuorumGateError as err:
        epoch, problem = None, f"{err} ({err.reason})"
    else:
        problem = f"not in effect after {args.deadline:g} s"
    if epoch is None:
        return _fail(
            f"the records are still checked with the old owner key ({problem}): it stays at "
            f"{old_path}, the new key at {path}; run `quorumgate admin rotate-key --owner "
            f"--dir {spec.directory}` again to finish",
            EXIT_PENDING,
        )
    commit_rotation(path)
    fingerprint = bytes(new.verify_key).hex()[:16]
    _emit(
        args,
        {**doc, "record_key": fingerprint, "records_epoch": epoch},
        f"in effect: records are checked with owner key {fingerprint} from epoch {epoch} on; "
        f"{path} holds the new key (mode 0600), the old one is retired",
    )
    return EXIT_OK


def _rotate_by_owner(args: argparse.Namespace) -> int:
    """`admin rotate-key --agent ID | --principal ID --by-owner --out FILE`: for a lost or
    stolen key the owner (DIR/owner.key) signs; the key it replaces is the one the
    registry names, and the new key is written to a new FILE (a principal's sealed under a
    new passphrase), removed again if the rotation is refused."""
    if args.owner or args.key is not None or args.out is None:
        return _fail("--by-owner takes --agent ID or --principal ID, --out FILE and no --key")
    holder = KeyHolder.AGENT if args.agent else KeyHolder.PRINCIPAL
    subject, path = args.agent or args.principal, Path(args.out)
    try:
        spec = _spec(args)
        owner_key = SigningKey(read_seed(spec.directory / OWNER_KEY_FILE))
        if path.exists():
            raise ClusterFileError(f"{path} exists; keys are never overwritten")
        new = SigningKey.generate()
        if holder is KeyHolder.PRINCIPAL:
            passphrase = new_passphrase(path, args.passphrase_fd, "--passphrase-fd")
            write_sealed(path, seal(bytes(new), passphrase, kdf_cost("moderate")))
        else:
            write_seed(path, bytes(new))
    except ClusterFileError as err:
        return _fail(str(err))
    except OSError as err:
        return _fail(f"cannot write {path}: {err.strerror}")

    async def main() -> Decision:
        async with Client(spec, owner_key) as client:
            registry = await client.registry(args.deadline)
            if holder is KeyHolder.AGENT:
                entry = registry.agent(subject)
                old = None if entry is None else entry.public_key
            else:
                found = [p for p in registry.principals if p.principal_id == subject]
                old = found[0].public_key if found else None
            call = client.rotate_key(
                holder, subject, new, old_public_key=old or bytes(32), deadline_s=args.deadline
            )
            return await _waiting(f"rotate-key {subject}", args, call)

    try:
        decision = asyncio.run(main())
    except TransactionRejected as err:
        path.unlink()
        _emit(
            args,
            {
                "operation": "rotate-key",
                "subject": subject,
                **decision_json(err.decision, with_reason=True),
            },
            f"rejected: rotate-key {subject} ({err.reason}); {path} removed",
        )
        return EXIT_DENIED
    except QuorumGateError as err:
        return _fail(
            f"the rotation of {subject}'s key is not known to be certified ({err.reason}): "
            f"{path} holds the new key; `quorumgate agents` shows the key the cluster holds"
        )
    _emit(
        args,
        {
            "operation": "rotate-key",
            "subject": subject,
            **decision_json(decision, with_reason=True),
        },
        f"applied: rotate-key {subject} by the owner at height {decision.height}, certified by "
        f"sidecars {_signers(decision)}; {path} holds the new key (mode 0600)",
    )
    return EXIT_OK


# ---------------------------------------------------------------------------- registry


def _registry(args: argparse.Namespace) -> Registry | int:
    """The registry f+1 sidecars agree on (`Client.registry`, the sidecars' Registry RPC):
    as cheap at height ten million as at height ten, unlike replaying the log."""
    try:
        spec = _spec(args)
    except ClusterFileError as err:
        return _fail(str(err))

    try:
        key = _key(args, spec, owner_default=True)  # reads are signed: the owner's by default
    except ClusterFileError as err:
        return _fail(str(err))

    async def read() -> Registry:
        async with Client(spec, key) as client:
            return await client.registry(args.deadline)

    try:
        return asyncio.run(read())
    except ClusterUnavailable:
        return _fail("the cluster could not be reached (no f+1 sidecars agreed on a registry)")
    except ReadNotAuthorized as err:
        return _fail(f"{err} The registry answers the owner, members and auditors, and an "
                     "agent or a principal its own part.")  # fmt: skip


def _mandate_json(m: Mandate | None) -> dict[str, object] | None:
    if m is None:
        return None
    return {
        "allowed_tools": None if m.allowed_tools is None else list(m.allowed_tools),
        "enforcement": m.enforcement.value,
        "suspended": m.suspended,
        "delegation_policy": m.delegation_policy.value,
        "max_delegation_depth": m.max_delegation_depth,
        "rules": {entry.tool: _tool_rules_json(entry) for entry in m.rules},
    }


def _tool_rules_json(entry: ToolRules) -> dict[str, object]:
    """The policy file's spelling of one tool's rules."""
    targets: list[object] = []
    for rule in entry.targets:
        if rule.kind is RuleKind.ANY and rule.mode is None:
            targets.append(RuleKind.ANY.value)
            continue
        item: dict[str, object] = {
            rule.kind.value: True if rule.kind is RuleKind.ANY else rule.value
        }
        if rule.mode is not None:
            item["mode"] = rule.mode.value
        targets.append(item)
    args: dict[str, object] = {}
    for arg in entry.arguments:
        if arg.check is ArgCheck.MAX:
            args[arg.name] = {"max": arg.number}
        elif arg.check is ArgCheck.ONE_OF:
            args[arg.name] = {"one_of": list(arg.values)}
        else:
            args[arg.name] = {"max_chars": arg.count}
    return {"targets": targets, "args": args}


def _tools_cell(m: Mandate | None) -> str:
    if m is None:
        return "(no mandate)"
    ruled = {entry.tool for entry in m.rules}
    if m.allowed_tools is None:
        return "(unrestricted)" + (f" rules: {','.join(sorted(ruled))}" if ruled else "")
    return ",".join(t + ("*" if t in ruled else "") for t in m.allowed_tools) or "(none)"


def _cmd_agents(args: argparse.Namespace) -> int:
    registry = _registry(args)
    if isinstance(registry, int):
        return registry
    doc = {
        "height": registry.height,
        "state_root": registry.state_root.hex(),
        "agreed_by": list(registry.agreed_by),
        "scope": registry.scope,  # "all", or the part this key may read
        "agents": [
            {
                "agent_id": a.agent_id,
                "public_key": a.public_key.hex(),
                "mandate_version": a.mandate_version,
                "suspended": a.suspended,
                "mandate": _mandate_json(a.mandate),
            }
            for a in registry.agents
        ],
    }
    rows = [
        [
            a.agent_id,
            a.public_key.hex()[:16],
            a.mandate_version,
            "yes" if a.suspended else "no",
            a.mandate.enforcement.value if a.mandate else None,
            a.mandate.delegation_policy.value if a.mandate else None,
            _tools_cell(a.mandate),
        ]
        for a in registry.agents
    ]
    human = table(
        ["agent", "key", "version", "suspended", "enforcement", "delegation", "tools"], rows
    )
    _emit(args, doc, f"{human}\n{len(rows)} agents at height {registry.height}")
    return EXIT_OK


def _cmd_settings(args: argparse.Namespace) -> int:
    registry = _registry(args)
    if isinstance(registry, int):
        return registry
    if registry.scope != "all":  # the log's settings are not in a scoped registry
        return _fail(
            f"this key reads the registry as {registry.scope}: the settings made in the log "
            "answer the owner, members and auditors (docs/security/reads-and-certificates.md)"
        )
    config = config_for_cluster(_spec(args))
    logged = dict(registry.settings)
    rows = []
    values: dict[str, dict[str, object]] = {}
    for name in SETTING_NAMES:
        static = getattr(config, name, None)
        value = logged.get(name, static)
        source = "log" if name in logged else "cluster.json"
        shown = "none" if value is None else "no limit" if value == 0 else value
        if name == "quota_agent_per_minute" and name not in logged:
            shown = f"{config.quota_proposals_max} per {config.quota_window_ms // 1000} s (sliding)"
        if name == "certificate_ttl_ms" and not config.receipts_expire:
            value, shown = None, "none (this chain's certificates carry no window)"
        values[name] = {"value": value, "source": source}
        rows.append([name, shown, source])
    doc = {"height": registry.height, "settings": values}
    human = table(["setting", "value", "from"], rows)
    _emit(args, doc, f"{human}\nat height {registry.height}")
    return EXIT_OK


def _cmd_tools(args: argparse.Namespace) -> int:
    registry = _registry(args)
    if isinstance(registry, int):
        return registry
    doc = {
        "height": registry.height,
        "state_root": registry.state_root.hex(),
        "agreed_by": list(registry.agreed_by),
        "tools": [
            {
                "name": t.name,
                "mode": t.mode.value,
                "sink": t.sink,
                "target_schemes": list(t.target_schemes),
                "envelope_args": [
                    {"name": e.name, "kind": e.kind, "require_verified": e.require_verified}
                    for e in t.envelope_args
                ],
                "min_tier": t.min_tier.value if t.min_tier_declared else None,
                "binds_caller": t.binds_caller,
                "arguments": {a.name: a.role.value for a in t.arguments},
                "direct_override": t.direct_override,
                "target_optional": t.target_optional,
                "target_roles": {
                    r.role: {"schemes": list(r.schemes), "max": r.max} for r in t.target_roles
                },
            }
            for t in registry.tools
        ],
        "sinks": [{"sink_id": s, "public_key": k.hex()} for s, k in registry.sinks],
    }
    rows = [
        [
            t.name,
            t.mode.value,
            t.sink,
            (",".join(t.target_schemes) + (" (optional)" if t.target_optional else "")) or None,
            " ".join(f"{r.role}={','.join(r.schemes)}:{r.max}" for r in t.target_roles) or None,
            ",".join(
                f"{e.name}:{e.kind}{':verified' if e.require_verified else ''}"
                for e in t.envelope_args
            )
            or None,
            t.min_tier.value if t.min_tier_declared else f"({t.min_tier.value})",
            "yes" if t.binds_caller else "no",
            ",".join(f"{a.name}:{a.role.value}" for a in t.arguments) or None,
            "yes" if t.direct_override else None,
        ]
        for t in registry.tools
    ]
    human = table(
        [
            "tool", "mode", "sink", "schemes", "roles", "envelopes", "min tier", "binds caller",
            "arguments", "override",
        ],
        rows,
    )  # fmt: skip
    _emit(args, doc, f"{human}\n{len(rows)} tools at height {registry.height}")
    return EXIT_OK


# ---------------------------------------------------------------------------- verdicts


VERDICT_HEADERS = ("height", "idx", "kind", "outcome", "reason", "proposal", "certified by")
# --follow prints rows as they are certified, so the columns have fixed widths
VERDICT_WIDTHS = (8, 4, 13, 8, 26, 16, 12)


def _verdict_row(decision: Decision) -> list[object]:
    leaf = decision.certificate.leaf
    return [
        leaf.height,
        leaf.index,
        leaf.kind,
        leaf.outcome,
        leaf.reason,
        decision.proposal_id.hex()[:16],
        _signers(decision),
    ]


def _fixed(values: Sequence[object]) -> str:
    cells = []
    for value, width in zip(values, VERDICT_WIDTHS, strict=True):
        text = str(value)
        cells.append(text.rjust(width) if isinstance(value, int) else text.ljust(width))
    return "  ".join(cells).rstrip()


def _cmd_verdicts(args: argparse.Namespace) -> int:
    async def work(client: Client) -> int:
        statuses = await client.sidecar_status()
        if len(statuses) < client.spec.f + 1:
            raise ClusterUnavailable("sidecars_unreachable")
        top = max(s.executed_height for s in statuses.values())
        start = args.from_height if args.from_height is not None else max(1, top - 100)
        progress = Progress("certifying verdicts", enabled=not args.json and not args.follow)
        rows: list[list[object]] = []
        if args.follow and not args.json:
            print(_fixed(VERDICT_HEADERS))
        idle = None if args.follow else VERDICTS_IDLE_S
        count = 0
        try:
            async for decision in client.certified_verdicts(start, idle_s=idle):
                count += 1
                height = decision.height
                progress.update(min(height, top) - start + 1, max(1, top - start + 1))
                if args.json:
                    print(json.dumps(decision_json(decision, with_reason=True), sort_keys=True))
                elif args.follow:
                    print(_fixed(_verdict_row(decision)))
                else:
                    rows.append(_verdict_row(decision))
                sys.stdout.flush()
                if args.limit and count >= args.limit:
                    break
        finally:
            progress.close()
        if not args.json and not args.follow:
            rows.sort(key=lambda r: (int(str(r[0])), int(str(r[1]))))
            print(table(VERDICT_HEADERS, rows))
            print(f"{len(rows)} certified verdicts from height {start}")
        return EXIT_OK

    try:
        return _run_with_client(args, owner_default=True, work=work)
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:  # `verdicts --follow | head`: the reader is gone, we are done
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


# ---------------------------------------------------------------------------- parser


def _common(parser: argparse.ArgumentParser, *, key_help: str | None) -> None:
    parser.add_argument("--dir", required=True, help="cluster directory (cluster.json)")
    if key_help is not None:
        parser.add_argument("--key", metavar="FILE", help=key_help)
        parser.add_argument(
            "--passphrase-fd",
            type=int,
            metavar="N",
            help="read a sealed key's passphrase from descriptor N (scripts; else asked)",
        )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _deadline(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--deadline", type=float, default=10.0, metavar="S", help="certificate wait (s)"
    )


# Long on purpose: argparse declarations for every client command, kept in one place.
def add_client_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the client commands on the `quorumgate` subparsers."""
    keygen = sub.add_parser("keygen", help="write a new key file (agent, sink, principal), 0600")
    keygen.add_argument("--out", required=True, metavar="FILE")
    keygen.add_argument("--sink", action="store_true", help="an X25519 sink key")
    keygen.add_argument(
        "--principal", action="store_true", help="a person's key, sealed with a passphrase"
    )
    keygen.add_argument(
        "--passphrase-fd", type=int, metavar="N", help="--principal: read it from descriptor N"
    )
    add_kdf_cost_argument(keygen)
    keygen.add_argument("--json", action="store_true")
    keygen.set_defaults(func=_cmd_keygen)
    add_passphrase_command(sub)

    submit = sub.add_parser("submit", help="propose one tool call; print its certified verdict")
    _common(submit, key_help="the agent's key file (required)")
    submit.add_argument("--run", required=True, help="run id")
    submit.add_argument("--tool", required=True)
    submit.add_argument("--target", default="", help="the call's target (none by default)")
    submit.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="ROLE=TARGET",
        help="a further target in a role the tool declares (repeat for each)",
    )
    submit.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE")
    submit.add_argument("--handle", action="append", default=[], metavar="NAME=HANDLE")
    submit.add_argument("--grant", metavar="HEX", help="the delegation grant id to act under")
    submit.add_argument("--show-reason", action="store_true", help="operator: print reasons")
    _deadline(submit)
    submit.set_defaults(func=_cmd_submit)

    pending = sub.add_parser("pending", help="the open cards this key alone may answer")
    _common(pending, key_help="a principal's key (default: the owner's)")
    _deadline(pending)
    pending.set_defaults(func=_cmd_pending)
    for name, func, what in (
        ("confirm", _cmd_confirm, "confirm"),
        ("reject", _cmd_reject, "decline"),
    ):
        answer = sub.add_parser(
            name, help=f"show a pending call's card with its values and {what} it"
        )
        _common(answer, key_help="the principal's key the card names (default: the owner's)")
        answer.add_argument("proposal_id", metavar="PROPOSAL_ID", help="hex")
        answer.add_argument("--yes", action="store_true", help=f"{what} without asking")
        _deadline(answer)
        answer.set_defaults(func=func, expect_tool=None, expect_target="", expect_also=[])
        if name == "confirm":
            answer.add_argument(
                "--expect-tool", help="refuse to confirm unless the card is this call"
            )
            answer.add_argument("--expect-target", default="", help="with --expect-tool")
            answer.add_argument("--expect-also", action="append", default=[], metavar="ROLE=TARGET")

    admin = sub.add_parser("admin", help="owner operations (signed with DIR/owner.key)")
    admin_sub = admin.add_subparsers(dest="admin_command", required=True)
    tool = admin_sub.add_parser("register-tool", help="register (or replace) a tool")
    tool.add_argument("name")
    tool.add_argument(
        "--mode", required=True, choices=["read", "direct", "user_confirm", "owner_confirm"]
    )
    tool.add_argument("--sink", help="the sink that opens this tool's envelopes")
    tool.add_argument("--scheme", action="append", default=[], help="accepted target scheme")
    tool.add_argument("--envelope", action="append", default=[], metavar="NAME:KIND[:verified]")
    tool.add_argument(
        "--min-tier",
        choices=["delegate", "master"],
        help="who may run it; a confirm-gated tool must state it",
    )
    tool.add_argument("--binds-caller", action="store_true", help="a status tool")
    tool.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="NAME=ROLE",
        help="a plain argument it takes: identity|recipient|amount|credential|text",
    )
    tool.add_argument(
        "--direct-override",
        action="store_true",
        help="direct although it takes a recipient, amount or credential (recorded)",
    )
    tool.add_argument(
        "--role",
        action="append",
        default=[],
        metavar="ROLE=SCHEME[,SCHEME][:MAX]",
        help="further targets it takes in ROLE (recipient, grantee...), at most MAX (1)",
    )
    tool.add_argument(
        "--target-optional", action="store_true", help="a call may leave the main target out"
    )
    tool.add_argument(
        "--untrusted-results",
        action="store_true",
        help="its results carry untrusted content: a run calling it is exposed",
    )
    intent = admin_sub.add_parser(
        "set-run-targets",
        help="name a run's own targets (its principal's key, or the owner's; docs/provenance.md)",
    )
    intent.add_argument("--agent", required=True, help="the run's owner")
    intent.add_argument("--run", required=True, help="the run id (n<nonce>)")
    intent.add_argument("targets", nargs="*", metavar="TARGET", help="none: clear them")
    agent = admin_sub.add_parser("register-agent", help="register an agent's public key")
    agent.add_argument("agent_id")
    agent.add_argument(
        "--principal", metavar="ID", help="the principal it acts for (default: the owner)"
    )
    person = admin_sub.add_parser(
        "register-principal", help="register a principal: the person who answers its cards"
    )
    person.add_argument("principal_id")
    person.add_argument(
        "--deputies",
        metavar="ID,ID",
        help="principals who may answer its cards too (replaces the list)",
    )
    sink = admin_sub.add_parser("register-sink", help="register a sink's X25519 public key")
    sink.add_argument("sink_id")
    for parser in (agent, person, sink):
        parser.add_argument("--public-key", metavar="HEX")
        parser.add_argument("--key-file", metavar="FILE", help="derive it from a key file")
    mand = admin_sub.add_parser("set-mandate", help="set an agent's mandate (new version)")
    mand.add_argument("agent_id")
    mand.add_argument("--tools", metavar="A,B", help="allowed tools")
    mand.add_argument("--unrestricted", action="store_true", help="allowed_tools = null")
    mand.add_argument("--no-tools", action="store_true", help="allowed_tools = [] (nothing)")
    mand.add_argument("--observe", action="store_true", help="flag out-of-scope calls")
    mand.add_argument("--suspended", action="store_true")
    mand.add_argument("--delegation", default="none", choices=["none", "attenuated"])
    mand.add_argument("--max-depth", type=int, help="max delegation depth")
    suspend = admin_sub.add_parser("suspend", help="suspend an agent (temporary)")
    suspend.add_argument("agent_id")
    resume = admin_sub.add_parser("resume", help="lift a suspension")
    resume.add_argument("agent_id")
    sets = admin_sub.add_parser(
        "set-settings",
        help="latch thresholds, quotas, confirmation and certificate TTLs, grant limits",
    )
    sets.add_argument("setting", nargs="*", metavar="NAME=VALUE", help=", ".join(SETTING_NAMES))
    sets.add_argument(
        "--clear", action="append", default=[], metavar="NAME", help="back to cluster.json's"
    )
    for parser in (tool, intent, agent, person, sink, mand, suspend, resume, sets):
        _common(parser, key_help="the owner key (default DIR/owner.key)")
        _deadline(parser)
        parser.set_defaults(func=_cmd_admin)
    rotate = admin_sub.add_parser(
        "rotate-key",
        help="replace a key while the chain runs: its holder signs, the new key proves itself",
    )
    whose = rotate.add_mutually_exclusive_group(required=True)
    whose.add_argument("--agent", metavar="ID", help="an agent's key (--key: its key file)")
    whose.add_argument(
        "--principal", metavar="ID", help="a principal's sealed key (--key: its key file)"
    )
    whose.add_argument("--owner", action="store_true", help="the owner's key (DIR/owner.key)")
    whose.add_argument(
        "--member", type=int, metavar="I",
        help="member I's consensus key, from the next epoch on (--key: the owner key)",
    )  # fmt: skip
    whose.add_argument(
        "--receipt", type=int, metavar="I",
        help="sidecar I's receipt key, from the next epoch on (--key: the owner key)",
    )  # fmt: skip
    whose.add_argument(
        "--tls", type=int, metavar="I",
        help="member I's TLS key and certificate, from the next epoch on (--key: the owner key)",
    )  # fmt: skip
    rotate.add_argument(
        "--prepare", action="store_true",
        help="with --tls, on member I's machine: make the new TLS key and certificate only",
    )  # fmt: skip
    rotate.add_argument(
        "--cert", metavar="FILE", help="with --tls: the certificate --prepare made (commit it)"
    )
    rotate.add_argument(
        "--by-owner",
        action="store_true",
        help="a lost or stolen key: DIR/owner.key signs, the new key goes to --out FILE",
    )
    rotate.add_argument("--out", metavar="FILE", help="with --by-owner: the new key file")
    _common(rotate, key_help="the key file rotated in place (the old one kept as FILE.old)")
    _deadline(rotate)
    # a member's new key waits for the epoch boundary: 2f+1 nodes in the next epoch
    rotate.set_defaults(func=_cmd_rotate_key, deadline=30.0)
    replace_member = admin_sub.add_parser(
        "replace-member",
        help="give member I a new machine (init --join's entry) from the next epoch on",
    )
    replace_member.add_argument("--member", type=int, required=True, metavar="I")
    replace_member.add_argument(
        "--entry", required=True, metavar="FILE", help="the new member's entry (join.json)"
    )
    _common(replace_member, key_help="the owner key in force (default DIR/owner.key)")
    _deadline(replace_member)
    replace_member.set_defaults(func=_cmd_replace_member, deadline=30.0)
    add_member = admin_sub.add_parser(
        "add-member",
        help="grow 4 -> 7: three new machines (init --join --index 4..6 entries) join",
    )
    add_member.add_argument(
        "--entry", required=True, action="append", metavar="FILE",
        help="a new member's entry (join.json); given three times",
    )  # fmt: skip
    _common(add_member, key_help="the owner key in force (default DIR/owner.key)")
    _deadline(add_member)
    add_member.set_defaults(func=_cmd_add_member, deadline=30.0)
    remove_member = admin_sub.add_parser(
        "remove-member", help="shrink 7 -> 4: members 4, 5 and 6 leave at the next epoch"
    )
    _common(remove_member, key_help="the owner key in force (default DIR/owner.key)")
    _deadline(remove_member)
    remove_member.set_defaults(func=_cmd_remove_member, deadline=30.0)
    auditor = admin_sub.add_parser(
        "add-auditor",
        help="let a key read the committed log and every verdict (edits cluster.json)",
    )
    auditor.add_argument("auditor_id")
    auditor.add_argument("--public-key", metavar="HEX")
    auditor.add_argument("--key-file", metavar="FILE", help="derive it from a key file")
    auditor.add_argument("--dir", required=True, help="cluster directory (cluster.json)")
    auditor.add_argument("--json", action="store_true", help="machine-readable output")
    auditor.set_defaults(func=_cmd_add_auditor)

    agents = sub.add_parser("agents", help="registered agents and their mandates")
    _common(agents, key_help="a key allowed to read the registry (default: the owner's)")
    _deadline(agents)
    agents.set_defaults(func=_cmd_agents)

    settings = sub.add_parser("settings", help="settings in effect: the log's or cluster.json's")
    _common(settings, key_help="a key allowed to read the registry (default: the owner's)")
    _deadline(settings)
    settings.set_defaults(func=_cmd_settings)

    tools = sub.add_parser("tools", help="registered tools and sinks")
    _common(tools, key_help="a key allowed to read the registry (default: the owner's)")
    _deadline(tools)
    tools.set_defaults(func=_cmd_tools)

    verdicts = sub.add_parser("verdicts", help="verdicts certified by f+1 sidecars")
    _common(verdicts, key_help="any client key (default: the owner's)")
    verdicts.add_argument("--from-height", type=int, help="default: 100 below the top")
    verdicts.add_argument("--follow", action="store_true", help="keep printing new verdicts")
    verdicts.add_argument("--limit", type=int, default=0, help="stop after N verdicts")
    verdicts.set_defaults(func=_cmd_verdicts)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m quorumgate.ops.clientcli ...`: the client commands on their own."""
    parser = argparse.ArgumentParser(prog="quorumgate", description="QuorumGate client commands")
    add_client_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
