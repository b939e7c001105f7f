"""`governed_tool`: a tool function that runs only with a verdict certificate.

    @governed_tool(name="files.write", target="path")
    def write_file(path: str, text: str) -> None: ...

    with SyncClient.from_files("run/c4", "agent.key") as qg, agent_context(qg, run_id="run-7"):
        write_file("/docs/a.txt", "hello")      # proposal -> certificate -> body

Each call becomes a signed `Proposal`, is ordered by the replicas, judged by the sidecars,
and the body runs only when f+1 of them certify `allow` or `flag`. Otherwise:

- **deny** (or a refusal at submission): `ActionDenied`, whose `str()` and `repr()` are
  exactly `This action is not permitted.` whatever the reason: every word a refusal tells
  the model is a hint for its next probe (docs/architecture/0007-one-denial-sentence.md).
  The reason is on `.reason`, for operators.
  `RunHalted` (a subclass) tells a supervisor the run is over (`.halted`).
- **pending**: `ConfirmationRequired`, carrying the certified card and the proposal id.
  After the principal confirms (`Client.confirm`, `quorumgate confirm`), call
  the tool again inside `with resume_confirmed(exc):` with the same arguments: it checks
  them against the card's body digest, waits for the confirmed certificate and runs.
- **no certificate before the deadline** (cluster unreachable, no quorum, overloaded):
  the posture decides. `fail_closed` (default) raises `CertificateUnavailable`, an
  `ActionDenied` with the same fixed sentence. `fail_open` runs the body and queues a
  *fail-open record* in memory (`FailOpenQueue`, at most `FAIL_OPEN_QUEUE_MAX` per agent
  key; when full the call fails closed, so nothing runs unrecorded). The record is
  submitted once the cluster answers again (after the next certified call, or
  `flush_fail_open`) as a Proposal of the same tool, target, run and arguments plus one
  marker argument, `qg.fail-open`, whose text says why and which proposal it stands for
  (`cause=...;original=<id hex or ->;ran_at_ms=...`). The marker's *name* lands in the
  verdict ledger and in any rejection artifact, so an operator finds every call that ran
  without a certificate, and the verdict it got shows whether it was in scope.

**Arguments.** The function's bound arguments (defaults applied) become the proposal:

- the *target* is `target="param"` (that parameter's value), `target=callable` (called
  with the bound arguments as a dict), or else a parameter named `target`, or else none
  (`""`, for tools that take no target). The target parameter is not sent again as an
  argument;
- every other parameter is one argument named after it: a `Handle`, or any value of a
  parameter listed in `envelopes=`, is sent as a handle (a raw value for an envelope
  parameter is refused here, before anything leaves the process); `str` as text; `bool`
  as `true`/`false`; `int`, `float`, `Decimal` and enums by their text; lists, tuples and
  dicts of JSON values as their canonical JSON text (RFC 8785: sorted keys, no spaces,
  one spelling per number, so equal values are equal text); `None` is omitted; `*args`
  as `name.0`, `name.1`...; `**kwargs` by key. Anything else raises
  `ArgumentMappingError` naming the parameter (never the value). `exclude=` names
  parameters that are not sent at all; a leading `self`/`cls` is never sent;
- further targets (the recipients of a message, the grantee of a share) are
  `targets={"recipient": "to", "cc": "cc"}`: each role the tool declares, mapped to the
  parameter holding its target text or list of texts (None: none). They are not sent as
  arguments, and the body receives them canonical, in the shape it passed them;
- the tool name is `name=`, or the function's name with `_` as `-` (`read_file` is
  `read-file`: tool names take no underscore).

**Which agent, which run.** `agent_context(client, run_id=...)` (or `async with
agent_context_async(...)`) binds a client (its key is the agent) and a run id in a
`contextvars.ContextVar`: each asyncio task and each thread has its own, so two agents in
one process never share one (a new `threading.Thread` starts with no binding;
`asyncio.to_thread` and `loop.run_in_executor` under `contextvars.copy_context()` carry
the caller's, which is the same agent continuing its work). No binding: `NoAgentContext`,
and the body does not run. Async tools work with a `Client` of the same loop or
a `SyncClient`; sync tools need a `SyncClient` (its loop runs in its own thread).

Inside the body, `current_call()` gives the certified `Decision` and the signed
transaction, to hand to the tool executor (`quorumgate.sdk.executor`).

**By name.** Agent frameworks dispatch tools by name with an argument dict, and their
tools need not have a Python signature that matches. `Gate` is for them:

    gate = Gate()
    gate.tool("files.write", write_file, target="path")
    gate.call("files.write", {"path": "/docs/a.txt", "body": "hi"})   # judged, then run
    await gate.call_many([("files.read", {"path": p}) for p in paths]) # one stream, in order

The argument dict is never spread into a signature of ours, so any argument name works
(`body`, `tool`, `self`...). `call_many` submits every proposal in one `submit_many` and
waits for the certificates together; it returns one result per call, in order: the tool's
return value, or the exception that call raised (`ActionDenied`, `ConfirmationRequired`).

No argument value appears in any exception, repr or log line of this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import inspect
import logging
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any, ParamSpec, TypeVar, cast, overload

import rfc8785

from quorumgate.proto import limits, names
from quorumgate.proto import tx as txlib
from quorumgate.proto.model import DENIAL_TEXT, Argument, Outcome, Proposal, RoleTarget, TxKind
from quorumgate.sdk.certificates import proposal_body_digest
from quorumgate.sdk.client import CERTIFICATE_DEADLINE_S, Client
from quorumgate.sdk.errors import (
    CertificateTimeout,
    ClusterUnavailable,
    Overloaded,
    QuorumGateError,
    Refused,
)
from quorumgate.sdk.sync import SyncClient
from quorumgate.sdk.targets import binds_caller, certified_call
from quorumgate.sdk.values import Decision, Grant, Handle, Submitted, grant_id
from quorumgate.sidecar.engine.statements import ConfirmationCard

__all__ = [
    "ActionDenied",
    "AgentBinding",
    "ArgumentMappingError",
    "CertificateUnavailable",
    "ConfirmationRequired",
    "FailOpenQueue",
    "Gate",
    "GovernedCall",
    "NoAgentContext",
    "Posture",
    "RunHalted",
    "agent_context",
    "agent_context_async",
    "current_call",
    "fail_open_queue",
    "flush_fail_open",
    "governed_tool",
    "resume_confirmed",
]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

FAIL_OPEN_QUEUE_MAX = 256  # fail-open records held per agent key until the cluster answers
FAIL_OPEN_MARKER = "qg.fail-open"  # argument name that marks a fail-open record
FLUSHED_IDS_KEPT_MAX = 256  # proposal ids of submitted fail-open records remembered
FLUSH_DEADLINE_S = 10.0  # one fail-open record: submit and certificate

log = logging.getLogger("quorumgate.governed")


class Posture(StrEnum):
    """What a call does when no certificate can be had before the deadline."""

    FAIL_CLOSED = "fail_closed"
    FAIL_OPEN = "fail_open"


# ---------------------------------------------------------------------------- exceptions


class ActionDenied(Exception):
    """The call may not run. `str()` and `repr()` are the fixed sentence, whatever the
    reason; `reason` (operator-only), `proposal_id` and `decision` are attributes."""

    def __init__(
        self,
        reason: str,
        *,
        proposal_id: bytes | None = None,
        decision: Decision | None = None,
    ) -> None:
        super().__init__(DENIAL_TEXT)
        self.reason = reason
        self.proposal_id = proposal_id
        self.decision = decision

    @property
    def halted(self) -> bool:
        """The run is halted by the denial latch (docs/engine.md, `run_halted`): stop
        scheduling turns for it."""
        return self.reason == "run_halted"

    def __str__(self) -> str:
        return DENIAL_TEXT

    def __repr__(self) -> str:
        return DENIAL_TEXT


class RunHalted(ActionDenied):
    """The denial latch halted this run: every later call in it is denied too."""


class CertificateUnavailable(ActionDenied):
    """`fail_closed`: no certificate before the deadline. `cause` is the client error."""

    def __init__(self, cause: QuorumGateError | TimeoutError, proposal_id: bytes | None) -> None:
        reason = cause.reason if isinstance(cause, QuorumGateError) else "deadline"
        super().__init__(f"no_certificate:{reason}", proposal_id=proposal_id)
        self.cause = cause


class ConfirmationRequired(Exception):
    """The call is pending: the principal (or the owner) must confirm the card first.
    Retry inside `resume_confirmed(exc)` with the same arguments once confirmed."""

    def __init__(
        self, tool: str, decision: Decision, nonce: int, signer: bytes, card: ConfirmationCard
    ) -> None:
        self.tool = tool
        self.decision = decision
        self.proposal_id = decision.proposal_id
        self.nonce = nonce
        self.signer = signer
        self.card = card
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"This action requires confirmation (proposal {self.proposal_id.hex()})."

    def __repr__(self) -> str:
        return f"ConfirmationRequired(tool={self.tool!r}, proposal={self.proposal_id.hex()[:16]})"


class NoAgentContext(RuntimeError):
    """A governed tool was called outside `agent_context`: it does not run."""


class ArgumentMappingError(TypeError):
    """A parameter whose value cannot become a proposal argument (the value is never
    named)."""


# ---------------------------------------------------------------------------- context


@dataclass(frozen=True, repr=False)
class AgentBinding:
    """Which agent (the client's key) and which run a governed call belongs to."""

    client: Client | SyncClient
    run_id: str
    grant: Grant | bytes | None = None
    posture: Posture = Posture.FAIL_CLOSED
    deadline_s: float = CERTIFICATE_DEADLINE_S

    def __post_init__(self) -> None:
        if not names.is_run_id(self.run_id):
            raise ValueError("run_id must match " + names.RUN_ID_RE.pattern)
        if self.deadline_s <= 0:
            raise ValueError("deadline_s must be positive")

    @property
    def public_key(self) -> bytes:
        return self.client.public_key

    @property
    def proposal_run_id(self) -> str:
        """The run id this agent's proposals carry: under a `Grant`, the run it is for
        (`Client.run_under`), else `run_id`."""
        return self.client.run_under(self.grant, self.run_id)

    @property
    def proposal_grant(self) -> bytes | None:
        """The grant id this agent's proposals carry, if it acts under a grant."""
        return None if self.grant is None else grant_id(self.grant)

    def __repr__(self) -> str:
        return (
            f"AgentBinding(signer={self.public_key.hex()[:16]}, run_id={self.run_id!r}, "
            f"posture={self.posture.value})"
        )


_BINDING: ContextVar[AgentBinding | None] = ContextVar("quorumgate_agent", default=None)


@dataclass(frozen=True, repr=False)
class GovernedCall:
    """What the body of a governed tool runs under. `decision` is None only for a
    fail-open run; `tx` is the signed proposal (it holds argument values: never print
    it), for an executor that binds the call to the certificate."""

    tool: str
    proposal_id: bytes | None
    decision: Decision | None
    tx: bytes | None = field(default=None, repr=False)
    fail_open: bool = False
    # The certified canonical target (None in a fail-open run): what the body is handed in
    # place of the raw target it was called with; and its further targets', in call order.
    canonical_target: str | None = None
    canonical_targets: tuple[str, ...] = ()

    def __repr__(self) -> str:
        pid = self.proposal_id.hex()[:16] if self.proposal_id else "-"
        return f"GovernedCall(tool={self.tool!r}, proposal={pid}, fail_open={self.fail_open})"


_CALL: ContextVar[GovernedCall | None] = ContextVar("quorumgate_call", default=None)
_RESUME: ContextVar[ConfirmationRequired | None] = ContextVar("quorumgate_resume", default=None)


@contextlib.contextmanager
def agent_context(
    client: Client | SyncClient,
    *,
    run_id: str,
    grant: Grant | bytes | None = None,
    posture: Posture | str = Posture.FAIL_CLOSED,
    deadline_s: float = CERTIFICATE_DEADLINE_S,
) -> Iterator[AgentBinding]:
    """Bind an agent and a run for the governed calls made inside (this task or thread
    only). `grant`: the delegation this agent acts under (docs/engine.md, the `delegate`
    transaction): a `Grant` from `Client.delegate`, whose run the calls act in, or a plain
    grant id."""
    binding = AgentBinding(client, run_id, grant, Posture(posture), deadline_s)
    token = _BINDING.set(binding)
    try:
        yield binding
    finally:
        _BINDING.reset(token)


@contextlib.asynccontextmanager
async def agent_context_async(
    client: Client | SyncClient,
    *,
    run_id: str,
    grant: Grant | bytes | None = None,
    posture: Posture | str = Posture.FAIL_CLOSED,
    deadline_s: float = CERTIFICATE_DEADLINE_S,
) -> AsyncIterator[AgentBinding]:
    """`async with` form of `agent_context` (the binding is this task's alone)."""
    with agent_context(
        client, run_id=run_id, grant=grant, posture=posture, deadline_s=deadline_s
    ) as binding:
        yield binding


def current_binding() -> AgentBinding | None:
    return _BINDING.get()


def current_call() -> GovernedCall:
    """The certified call the running governed body belongs to."""
    call = _CALL.get()
    if call is None:
        raise LookupError("not inside the body of a governed tool")
    return call


@contextlib.contextmanager
def resume_confirmed(pending: ConfirmationRequired) -> Iterator[None]:
    """Run the confirmed call `pending` stands for: inside, calling the same tool with the
    same arguments waits for its confirmed certificate instead of proposing again."""
    token = _RESUME.set(pending)
    try:
        yield
    finally:
        _RESUME.reset(token)


# ---------------------------------------------------------------------------- fail-open


@dataclass(frozen=True, repr=False)
class FailOpenRecord:
    """A call that ran without a certificate; `arguments` may hold values (never printed)."""

    tool: str
    target: str
    run_id: str
    grant: bytes | None
    arguments: tuple[Argument, ...]
    cause: str
    original: bytes | None
    ran_at_ms: int
    targets: tuple[RoleTarget, ...] = ()

    def marker_proposal(self) -> Proposal:
        original = self.original.hex() if self.original else "-"
        text = f"cause={self.cause};original={original};ran_at_ms={self.ran_at_ms}"
        kept = self.arguments[: limits.ARGUMENTS_MAX - 1]
        return Proposal(
            run_id=self.run_id,
            tool=self.tool,
            target=self.target,
            arguments=(*kept, Argument(FAIL_OPEN_MARKER, text=text)),
            grant=self.grant,
            targets=self.targets,
        )

    def __repr__(self) -> str:
        return f"FailOpenRecord(tool={self.tool!r}, run_id={self.run_id!r}, cause={self.cause})"


class FailOpenQueue:
    """Fail-open records of one agent key, in memory, at most `limit` (named:
    `FAIL_OPEN_QUEUE_MAX`). Used only from the client's event loop."""

    def __init__(self, limit: int = FAIL_OPEN_QUEUE_MAX) -> None:
        self.limit = limit
        self._records: deque[FailOpenRecord] = deque()
        self.flushed: deque[bytes] = deque(maxlen=FLUSHED_IDS_KEPT_MAX)
        self.dropped = 0
        self._flush_task: asyncio.Future[int] | None = None

    def __len__(self) -> int:
        return len(self._records)

    def add(self, record: FailOpenRecord) -> bool:
        if len(self._records) >= self.limit:
            return False
        self._records.append(record)
        return True

    async def flush(self, client: Client, deadline_s: float = FLUSH_DEADLINE_S) -> int:
        """Submit queued records in order until one cannot be certified; returns how many
        were recorded. A record the cluster refuses outright (its tool was removed...) is
        dropped and logged, so one bad record cannot block the others."""
        recorded = 0
        while self._records:
            record = self._records[0]
            try:
                async with asyncio.timeout(deadline_s):
                    submitted = await client.submit(record.marker_proposal())
                    await client.await_certificate(submitted.proposal_id, deadline_s)
            except Overloaded:
                break  # back-pressure: try again later, keep the record
            except Refused as err:
                self._records.popleft()
                self.dropped += 1
                log.error(
                    "event=fail_open_record_refused tool=%s run=%s reason=%s",
                    record.tool,
                    record.run_id,
                    err.reason,
                )
                continue
            except (QuorumGateError, TimeoutError):
                break
            self._records.popleft()
            self.flushed.append(submitted.proposal_id)
            recorded += 1
            log.info(
                "event=fail_open_recorded tool=%s run=%s proposal=%s",
                record.tool,
                record.run_id,
                submitted.proposal_id.hex()[:16],
            )
        return recorded

    def schedule_flush(self, client: Client) -> None:
        """Start a background flush in the running loop unless one is running."""
        if self._records and (self._flush_task is None or self._flush_task.done()):
            self._flush_task = asyncio.ensure_future(self.flush(client))


_QUEUES: weakref.WeakKeyDictionary[Client, FailOpenQueue] = weakref.WeakKeyDictionary()


def fail_open_queue(client: Client | SyncClient) -> FailOpenQueue:
    """The fail-open queue of a client's key (one per client object)."""
    aio = client.aio if isinstance(client, SyncClient) else client
    queue = _QUEUES.get(aio)
    if queue is None:
        queue = _QUEUES[aio] = FailOpenQueue()
    return queue


async def flush_fail_open(client: Client | SyncClient) -> int:
    """Submit the queued fail-open records now (from any loop)."""
    queue = fail_open_queue(client)
    if isinstance(client, SyncClient):
        return await client.bridge(queue.flush(client.aio))
    return await queue.flush(client)


def flush_fail_open_sync(client: SyncClient) -> int:
    queue = fail_open_queue(client)
    return client.run(queue.flush(client.aio))


# ---------------------------------------------------------------------------- arguments


@dataclass(frozen=True)
class _Options:
    name: str
    target: str | Callable[[dict[str, Any]], str] | None
    envelopes: frozenset[str]
    exclude: frozenset[str]
    posture: Posture | None
    deadline_s: float | None
    # further targets: (role, the parameter or argument whose text, or list of texts, they are)
    roles: tuple[tuple[str, str], ...] = ()


def _roles(targets: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    roles = tuple(sorted((targets or {}).items()))
    for role, param in roles:
        if not names.is_role(role) or not isinstance(param, str):
            raise ArgumentMappingError(f"targets: {role!r} is not a role (or not mapped to a name)")
    return roles


def _role_targets(options: _Options, values: dict[str, Any]) -> tuple[RoleTarget, ...]:
    """The further targets of a call: each role's parameter, one text or a list of them
    (None or absent: none). The parameters are not sent again as arguments."""
    out: list[RoleTarget] = []
    for role, param in options.roles:
        value = values.get(param)
        items = [] if value is None else [value] if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not all(isinstance(v, str) for v in items):
            raise ArgumentMappingError(
                f"the {role!r} targets of tool {options.name!r} must be text or a list of text"
            )
        try:
            out.extend(RoleTarget(role, item) for item in items)
        except ValueError:
            raise ArgumentMappingError(
                f"tool {options.name!r}: a {role!r} target is too long"
            ) from None
    if len(out) > limits.TARGETS_PER_CALL_MAX:
        raise ArgumentMappingError(
            f"tool {options.name!r}: more than {limits.TARGETS_PER_CALL_MAX} further targets"
        )
    return tuple(out)


def _canonical_role_values(
    options: _Options, values: Mapping[str, Any], call: GovernedCall
) -> dict[str, Any]:
    """Each role parameter's value with its certified canonical form(s), in its shape."""
    out: dict[str, Any] = {}
    canonical = iter(call.canonical_targets)
    for _, param in options.roles:
        value = values.get(param)
        if value is None:
            continue
        if isinstance(value, str):
            out[param] = next(canonical)
        else:
            out[param] = type(value)(next(canonical) for _ in value)
    return out


def default_tool_name(fn: Callable[..., Any]) -> str:
    return fn.__name__.replace("_", "-").lower()


def _text(param: str, value: object) -> str:
    if isinstance(value, list | tuple | dict):
        try:
            return rfc8785.dumps(value).decode()
        except (rfc8785.CanonicalizationError, TypeError, RecursionError):
            raise ArgumentMappingError(
                f"argument {param!r}: a structured value must hold only JSON values (text "
                "keys; strings, integers within 2**53, finite floats, booleans, null)"
            ) from None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return _text(param, value.value)
    if isinstance(value, str):
        return value
    if isinstance(value, int | Decimal):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    raise ArgumentMappingError(
        f"argument {param!r}: a {type(value).__name__} has no text form; pass text, "
        "a Handle, or list the parameter in exclude="
    )


def _argument(param: str, value: object, envelope: bool) -> Argument:
    if isinstance(value, Handle) or envelope:
        if not isinstance(value, str) or names.HANDLE_RE.fullmatch(value) is None:
            raise ArgumentMappingError(
                f"argument {param!r} must be an envelope handle (h_<kind>_<16 hex>); "
                "seal the value first"
            )
        return Argument(param, handle=str(value))
    try:
        return Argument(param, text=_text(param, value))
    except ValueError:
        raise ArgumentMappingError(f"argument {param!r} is too large or unnamed") from None


def build_proposal(
    options: _Options,
    signature: inspect.Signature,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    binding: AgentBinding,
) -> Proposal:
    """The Proposal one call makes (module docstring, "Arguments")."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        raise ArgumentMappingError(
            f"call does not match the signature of tool {options.name!r}"
        ) from None
    bound.apply_defaults()
    values = dict(bound.arguments)
    params = list(signature.parameters.values())
    skip = set(options.exclude)
    if params and params[0].name in ("self", "cls"):
        skip.add(params[0].name)
    target_param: str | None = None
    if callable(options.target):
        target = options.target(values)
    else:
        target_param = options.target
        if target_param is None and "target" in signature.parameters:
            target_param = "target"
        target = "" if target_param is None else values.get(target_param, "")
    if not isinstance(target, str):
        raise ArgumentMappingError(f"the target of tool {options.name!r} must be text")
    further = _role_targets(options, values)
    skip.update(param for _, param in options.roles)
    arguments: list[Argument] = []
    for param in params:
        if param.name in skip or param.name == target_param or param.name not in values:
            continue
        value = values[param.name]
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            for k, item in enumerate(value):
                if item is not None:
                    name = f"{param.name}.{k}"
                    arguments.append(_argument(name, item, param.name in options.envelopes))
        elif param.kind is inspect.Parameter.VAR_KEYWORD:
            for key in sorted(value):
                if key not in skip and value[key] is not None:
                    arguments.append(_argument(key, value[key], key in options.envelopes))
        elif value is not None:
            arguments.append(_argument(param.name, value, param.name in options.envelopes))
    if len(arguments) > limits.ARGUMENTS_MAX:
        raise ArgumentMappingError(f"tool {options.name!r}: more than {limits.ARGUMENTS_MAX} args")
    try:
        return Proposal(
            run_id=binding.proposal_run_id,
            tool=options.name,
            target=target,
            arguments=tuple(arguments),
            grant=binding.proposal_grant,
            targets=further,
        )
    except ValueError:
        raise ArgumentMappingError(f"tool {options.name!r}: name or target too long") from None


# ---------------------------------------------------------------------------- judging


@dataclass(frozen=True)
class _Verdict:
    decision: Decision | None
    submitted: Submitted | None
    fail_open: bool = False
    original: bytes | None = None  # fail-open: the proposal that got no certificate
    canonical_target: str | None = None  # the certified call's, checked (`_certified_target`)
    canonical_targets: tuple[str, ...] = ()  # its further targets', in call order


class TargetNotCertified(ActionDenied):
    """The certificate names another canonical target than this call's (checked by its
    digest): the body does not run."""


async def _certified_target(
    aio: Client, proposal: Proposal, decision: Decision
) -> tuple[str, tuple[str, ...]]:
    """The canonical target of a certified call, as the body must see it: the body runs on
    the canonical targets, never the raw ones, so an alias cannot act on another resource
    than the one the rules judged (docs/engine.md, "Canonical targets"). Canonicalized here
    the way the chain does (its `canonical_version`), and accepted only if its digest is
    the one the certificate carries (`quorumgate.sdk.targets.certified_target`, the same
    check the executor makes). The agent id is asked of the registry only when the target
    binds to the caller."""
    raw = proposal.target
    further = tuple((t.role, t.target) for t in proposal.targets)
    bound = binds_caller(raw, further)
    principal = (await aio.agent_id() if bound else None) or names.CURRENT_USER
    canonical = certified_call(
        proposal.tool,
        raw,
        decision.certificate.leaf.target_digest,
        version=aio.spec.canonical_version,
        principal=principal,
        targets=further,
    )
    if canonical is None:
        raise TargetNotCertified("target_not_certified", proposal_id=decision.proposal_id)
    return canonical


NO_CERTIFICATE = (ClusterUnavailable, CertificateTimeout, Overloaded, TimeoutError)


async def _govern(
    aio: Client,
    proposal: Proposal,
    binding: AgentBinding,
    options: _Options,
    delivery: Submitted | QuorumGateError | None = None,
) -> _Verdict:
    """Submit (unless `delivery` says how an earlier `submit_many` went), await the
    certificate, apply the posture. Runs in the client's loop."""
    deadline_s = options.deadline_s or binding.deadline_s
    posture = options.posture or binding.posture
    queue = fail_open_queue(aio)
    submitted: Submitted | None = delivery if isinstance(delivery, Submitted) else None
    try:
        async with asyncio.timeout(deadline_s):
            if isinstance(delivery, QuorumGateError):
                raise delivery
            if submitted is None:
                submitted = await aio.submit(proposal)
            decision = await aio.await_certificate(submitted.proposal_id, deadline_s)
    except NO_CERTIFICATE as err:  # before Refused: Overloaded is a refusal with no verdict
        original = submitted.proposal_id if submitted else getattr(err, "proposal_id", None)
        cause = err.reason if isinstance(err, QuorumGateError) else "deadline"
        if posture is Posture.FAIL_OPEN:
            record = FailOpenRecord(
                tool=proposal.tool,
                target=proposal.target,
                run_id=proposal.run_id,
                grant=proposal.grant,
                arguments=proposal.arguments,
                cause=cause,
                original=original,
                ran_at_ms=int(time.time() * 1000),
                targets=proposal.targets,
            )
            if queue.add(record):
                log.warning(
                    "event=fail_open tool=%s run=%s cause=%s queued=%d",
                    proposal.tool,
                    proposal.run_id,
                    cause,
                    len(queue),
                )
                return _Verdict(None, submitted, fail_open=True, original=original)
            log.error("event=fail_open_queue_full tool=%s action=fail_closed", proposal.tool)
        log.warning(
            "event=fail_closed tool=%s run=%s cause=%s", proposal.tool, proposal.run_id, cause
        )
        raise CertificateUnavailable(err, original) from None
    except Refused as err:
        raise ActionDenied(err.reason, proposal_id=err.proposal_id) from None
    queue.schedule_flush(aio)  # the cluster answered: record what ran while it did not
    if not decision.allowed:
        return _Verdict(decision, submitted)
    canonical, further = await _certified_target(aio, proposal, decision)
    return _Verdict(decision, submitted, canonical_target=canonical, canonical_targets=further)


async def _resume(
    aio: Client,
    proposal: Proposal,
    pending: ConfirmationRequired,
    binding: AgentBinding,
    options: _Options,
) -> _Verdict:
    """The confirmed run of a pending call: same signer, same body (card digest), then the
    settled certificate."""
    # the body was signed in the run its label names (docs/engine.md: runs are opened by
    # the cluster, not named by the agent): the same run here
    # and with the salt and auditor keys it was signed with (the salt is the nonce's)
    bound = aio.salted(aio.bind_run(proposal, pending.nonce), pending.nonce)
    assert isinstance(bound, Proposal)
    proposal = bound
    digest = proposal_body_digest(aio.spec.chain_id, pending.nonce, proposal)
    if pending.signer != aio.public_key or digest != pending.card.body_digest:
        raise ActionDenied("confirmation_mismatch", proposal_id=pending.proposal_id)
    deadline_s = options.deadline_s or binding.deadline_s
    try:
        decision = await aio.await_certificate(
            pending.proposal_id, deadline_s, settled=True, nonce=pending.nonce
        )
    except CertificateTimeout:
        raise pending from None  # not confirmed yet
    except (ClusterUnavailable, TimeoutError) as err:
        raise CertificateUnavailable(err, pending.proposal_id) from None
    tx = txlib.build(aio.spec.chain_id, pending.nonce, proposal, aio.key)
    submitted = Submitted(pending.proposal_id, pending.nonce, TxKind.PROPOSAL, aio.public_key, tx)
    if not decision.allowed:
        return _Verdict(decision, submitted)
    canonical, further = await _certified_target(aio, proposal, decision)
    return _Verdict(decision, submitted, canonical_target=canonical, canonical_targets=further)


def _rebound(
    options: _Options,
    signature: inspect.Signature,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    call: GovernedCall,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's arguments with its target parameter replaced by the certified canonical
    target (a target computed by a function from several arguments is left as it is:
    the body reads `current_call().canonical_target`)."""
    param = _target_param(options, signature)
    if call.canonical_target is None or (param is None and not options.roles):
        return args, kwargs
    bound = signature.bind(*args, **kwargs)
    if param is not None:
        bound.arguments[param] = call.canonical_target
    bound.arguments.update(_canonical_role_values(options, bound.arguments, call))
    return tuple(bound.args), dict(bound.kwargs)


def _target_param(options: _Options, signature: inspect.Signature | None) -> str | None:
    if callable(options.target):
        return None
    if options.target is not None:
        return options.target
    if signature is not None and "target" in signature.parameters:
        return "target"
    return None


def _with_canonical_target(
    options: _Options, arguments: Mapping[str, Any], call: GovernedCall
) -> dict[str, Any]:
    """A gate's keyword arguments, the target replaced by the certified canonical one."""
    out = dict(arguments)
    if call.canonical_target is None:
        return out
    if isinstance(options.target, str) and options.target in out and call.canonical_target:
        out[options.target] = call.canonical_target
    out.update(_canonical_role_values(options, out, call))
    return out


def _admit(tool: str, verdict: _Verdict) -> GovernedCall:
    """Turn a verdict into the body's call record, or raise what the agent is told."""
    submitted = verdict.submitted
    if verdict.fail_open:
        return GovernedCall(tool, verdict.original, None, None, fail_open=True)
    decision = verdict.decision
    assert decision is not None and submitted is not None
    if decision.allowed:
        log.info(
            "event=allowed tool=%s proposal=%s outcome=%s",
            tool,
            decision.proposal_id.hex()[:16],
            decision.outcome.value,
        )
        return GovernedCall(
            tool,
            decision.proposal_id,
            decision,
            submitted.tx,
            canonical_target=verdict.canonical_target,
            canonical_targets=verdict.canonical_targets,
        )
    if decision.outcome is Outcome.PENDING and decision.card is not None:
        log.info("event=pending tool=%s proposal=%s", tool, decision.proposal_id.hex()[:16])
        raise ConfirmationRequired(tool, decision, submitted.nonce, submitted.signer, decision.card)
    log.warning(
        "event=denied tool=%s proposal=%s reason=%s",
        tool,
        decision.proposal_id.hex()[:16],
        decision.reason,
    )
    kind = RunHalted if decision.reason == "run_halted" else ActionDenied
    raise kind(decision.reason, proposal_id=decision.proposal_id, decision=decision)


def _binding() -> AgentBinding:
    binding = _BINDING.get()
    if binding is None:
        raise NoAgentContext("a governed tool runs only inside agent_context(client, run_id=...)")
    return binding


def _judge_coro(
    aio: Client, proposal: Proposal, binding: AgentBinding, options: _Options
) -> Coroutine[Any, Any, _Verdict]:
    pending = _RESUME.get()
    if pending is not None and pending.tool == options.name:
        return _resume(aio, proposal, pending, binding, options)
    return _govern(aio, proposal, binding, options)


async def _judge_async(binding: AgentBinding, proposal: Proposal, options: _Options) -> _Verdict:
    client = binding.client
    if isinstance(client, SyncClient):
        return await client.bridge(_judge_coro(client.aio, proposal, binding, options))
    return await _judge_coro(client, proposal, binding, options)


def _judge_blocking(binding: AgentBinding, proposal: Proposal, options: _Options) -> _Verdict:
    client = binding.client
    if not isinstance(client, SyncClient):
        raise NoAgentContext("a sync governed tool needs a SyncClient in its agent_context")
    return client.run(_judge_coro(client.aio, proposal, binding, options))


# ---------------------------------------------------------------------------- decorator


@overload
def governed_tool(fn: Callable[P, R], /) -> Callable[P, R]: ...


@overload
def governed_tool(
    *,
    name: str | None = None,
    target: str | Callable[[dict[str, Any]], str] | None = None,
    targets: Mapping[str, str] | None = None,
    envelopes: tuple[str, ...] = (),
    exclude: tuple[str, ...] = (),
    posture: Posture | str | None = None,
    deadline_s: float | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def governed_tool(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    target: str | Callable[[dict[str, Any]], str] | None = None,
    targets: Mapping[str, str] | None = None,
    envelopes: tuple[str, ...] = (),
    exclude: tuple[str, ...] = (),
    posture: Posture | str | None = None,
    deadline_s: float | None = None,
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Make a sync or async function a governed tool (module docstring). Name, signature
    and docstring are kept (`functools.wraps`); `posture` and `deadline_s` override the
    agent context's."""

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        options = _Options(
            name=name or default_tool_name(func),
            target=target,
            envelopes=frozenset(envelopes),
            exclude=frozenset(exclude),
            posture=None if posture is None else Posture(posture),
            deadline_s=deadline_s,
            roles=_roles(targets),
        )
        signature = inspect.signature(func)
        if isinstance(options.target, str) and options.target not in signature.parameters:
            raise ArgumentMappingError(f"target={options.target!r} is not a parameter")
        for role, param in options.roles:
            if param not in signature.parameters:
                raise ArgumentMappingError(f"targets[{role!r}]={param!r} is not a parameter")

        if inspect.iscoroutinefunction(func):
            async_func = cast(Callable[..., Coroutine[Any, Any, Any]], func)

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                binding = _binding()
                proposal = build_proposal(options, signature, args, kwargs, binding)
                call = _admit(options.name, await _judge_async(binding, proposal, options))
                args, kwargs = _rebound(options, signature, args, kwargs, call)
                token = _CALL.set(call)
                try:
                    return await async_func(*args, **kwargs)
                finally:
                    _CALL.reset(token)

            return cast(Callable[P, R], async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            binding = _binding()
            proposal = build_proposal(options, signature, args, dict(kwargs), binding)
            call = _admit(options.name, _judge_blocking(binding, proposal, options))
            args, kwargs = _rebound(options, signature, args, kwargs, call)  # type: ignore[assignment]
            token = _CALL.set(call)
            try:
                return func(*args, **kwargs)
            finally:
                _CALL.reset(token)

        return wrapper

    if fn is not None:
        return decorate(fn)
    return decorate


# ---------------------------------------------------------------------------- by name


@dataclass(frozen=True)
class _Registered:
    options: _Options
    fn: Callable[..., Any] | None


def proposal_from_dict(
    options: _Options, arguments: Mapping[str, Any], binding: AgentBinding
) -> Proposal:
    """The Proposal of a by-name call: the target is the argument `options.target` names
    (none when it is None), every other argument is sent by name, in name order."""
    values = dict(arguments)
    target: Any = ""
    if callable(options.target):
        target = options.target(values)
    elif options.target is not None:
        target = values.pop(options.target, "")
    if not isinstance(target, str):
        raise ArgumentMappingError(f"the target of tool {options.name!r} must be text")
    further = _role_targets(options, values)
    for _, param in options.roles:
        values.pop(param, None)
    args = [
        _argument(name, values[name], name in options.envelopes)
        for name in sorted(values)
        if name not in options.exclude and values[name] is not None
    ]
    if len(args) > limits.ARGUMENTS_MAX:
        raise ArgumentMappingError(f"tool {options.name!r}: more than {limits.ARGUMENTS_MAX} args")
    try:
        return Proposal(
            run_id=binding.proposal_run_id,
            tool=options.name,
            target=target,
            arguments=tuple(args),
            grant=binding.proposal_grant,
            targets=further,
        )
    except ValueError:
        raise ArgumentMappingError(f"tool {options.name!r}: name or target too long") from None


class Gate:
    """Governed tool calls by name with an argument dict (module docstring, "By name").
    Which agent and run: the `agent_context` of the caller, as for `governed_tool`."""

    def __init__(self) -> None:
        self._tools: dict[str, _Registered] = {}

    def tool(
        self,
        name: str,
        fn: Callable[..., Any] | None = None,
        *,
        target: str | Callable[[dict[str, Any]], str] | None = None,
        targets: Mapping[str, str] | None = None,
        envelopes: tuple[str, ...] = (),
        exclude: tuple[str, ...] = (),
        posture: Posture | str | None = None,
        deadline_s: float | None = None,
    ) -> None:
        """Register tool `name`: `target` names the argument that is its target (None: the
        tool takes none), `targets` maps each role of further targets to the argument
        that holds them (a text or a list of texts); `fn`, called with the arguments as
        keywords, is the body that runs once the call is certified (None: `authorize`
        only)."""
        self._tools[name] = _Registered(
            _Options(
                name=name,
                target=target,
                envelopes=frozenset(envelopes),
                exclude=frozenset(exclude),
                posture=None if posture is None else Posture(posture),
                deadline_s=deadline_s,
                roles=_roles(targets),
            ),
            fn,
        )

    @property
    def tools(self) -> list[str]:
        return sorted(self._tools)

    def _registered(self, tool: str) -> _Registered:
        found = self._tools.get(tool)
        if found is None:
            raise ArgumentMappingError(
                f"tool {tool!r} is not registered with this gate (Gate.tool(name, fn, target=...))"
            )
        return found

    def authorize(self, tool: str, arguments: Mapping[str, Any] | None = None) -> GovernedCall:
        """Judge a call without running anything: the certified call, or the exception
        a governed tool raises (`ActionDenied`, `ConfirmationRequired`...)."""
        registered = self._registered(tool)
        binding = _binding()
        proposal = proposal_from_dict(registered.options, arguments or {}, binding)
        return _admit(tool, _judge_blocking(binding, proposal, registered.options))

    async def aauthorize(
        self, tool: str, arguments: Mapping[str, Any] | None = None
    ) -> GovernedCall:
        registered = self._registered(tool)
        binding = _binding()
        proposal = proposal_from_dict(registered.options, arguments or {}, binding)
        return _admit(tool, await _judge_async(binding, proposal, registered.options))

    def call(self, tool: str, arguments: Mapping[str, Any] | None = None) -> Any:
        """Judge, then run the registered body with the arguments as keywords."""
        registered = self._registered(tool)
        fn = _body(registered)
        call = self.authorize(tool, arguments)
        token = _CALL.set(call)
        try:
            return fn(**_with_canonical_target(registered.options, arguments or {}, call))
        finally:
            _CALL.reset(token)

    async def acall(self, tool: str, arguments: Mapping[str, Any] | None = None) -> Any:
        registered = self._registered(tool)
        fn = _body(registered)
        call = await self.aauthorize(tool, arguments)
        return await _run_body(
            fn, call, _with_canonical_target(registered.options, arguments or {}, call)
        )

    async def call_many(self, calls: Sequence[tuple[str, Mapping[str, Any] | None]]) -> list[Any]:
        """Many calls of this agent and run: proposed in one `submit_many` (in order),
        their certificates awaited together, each certified body run in order. One result
        per call: the body's return value, or the exception that call raised."""
        binding = _binding()
        prepared: list[tuple[_Registered, Proposal] | BaseException] = []
        for tool, arguments in calls:
            try:
                registered = self._registered(tool)
                _body(registered)
                prepared.append(
                    (registered, proposal_from_dict(registered.options, arguments or {}, binding))
                )
            except ArgumentMappingError as err:
                prepared.append(err)
        proposals = [item[1] for item in prepared if isinstance(item, tuple)]
        verdicts = await _judge_many(
            binding, proposals, [item[0].options for item in prepared if isinstance(item, tuple)]
        )
        results: list[Any] = []
        judged = iter(verdicts)
        for (tool, arguments), item in zip(calls, prepared, strict=True):
            if not isinstance(item, tuple):
                results.append(item)
                continue
            verdict = next(judged)
            try:
                if isinstance(verdict, BaseException):
                    raise verdict
                call = _admit(tool, verdict)
                given = _with_canonical_target(item[0].options, arguments or {}, call)
                results.append(await _run_body(_body(item[0]), call, given))
            except Exception as err:  # this call's outcome, handed back in its place
                results.append(err)
        return results


def _body(registered: _Registered) -> Callable[..., Any]:
    if registered.fn is None:
        raise ArgumentMappingError(
            f"tool {registered.options.name!r} has no body registered; use authorize()"
        )
    return registered.fn


async def _run_body(
    fn: Callable[..., Any], call: GovernedCall, arguments: Mapping[str, Any]
) -> Any:
    token = _CALL.set(call)
    try:
        if inspect.iscoroutinefunction(fn):
            return await fn(**dict(arguments))
        return fn(**dict(arguments))
    finally:
        _CALL.reset(token)


async def _govern_many(
    aio: Client, binding: AgentBinding, proposals: list[Proposal], options: list[_Options]
) -> list[_Verdict | BaseException]:
    """One `submit_many`, then every certificate awaited together (each under its tool's
    posture, as `_govern` does for one call)."""
    deliveries = await aio.submit_many(proposals)
    judged = await asyncio.gather(
        *(
            _govern(aio, proposal, binding, opts, delivery)
            for proposal, opts, delivery in zip(proposals, options, deliveries, strict=True)
        ),
        return_exceptions=True,
    )
    return list(judged)


async def _judge_many(
    binding: AgentBinding, proposals: list[Proposal], options: list[_Options]
) -> list[_Verdict | BaseException]:
    if not proposals:
        return []
    client = binding.client
    if isinstance(client, SyncClient):
        return await client.bridge(_govern_many(client.aio, binding, proposals, options))
    return await _govern_many(client, binding, proposals, options)
