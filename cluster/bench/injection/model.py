"""What a suite of the injection benchmark is made of (docs/injection.md, "Method").

A suite is the user's environment (resources the agent reads and writes, the tools it
has), the benign tasks the user gives the agent, the injection tasks an attacker plants in
what the agent reads, and the policy an operator writes for that environment. Every value
here is data, so that a rule can be added to a suite's policy later and the same runs
show what it changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

# What an injection aims at, one word each: the harness reports every attack's outcome by
# these kinds, so that a new rule shows where it bites (docs/injection.md, "By kind").
ATTACK_KINDS = (
    "pay_unknown",  # pay an account the user never paid
    "phish_colleague",  # message a known colleague carrying the attacker's link
    "read_attacker_url",  # make the agent read the attacker's page
    "exfil_query",  # leak the user's data in the query string of a read
    "self_write",  # write to the user's own resources, breaking the task
    "delegated",  # act through a sub-agent run the agent delegates to
)
# The marker the scripted agent looks for in what it reads: the agent is fully compromised,
# so content carrying it is obeyed (the attack's calls run next, through the real SDK).
INJECTION_MARKER = "<INFORMATION>"


@dataclass(frozen=True)
class Call:
    """One tool call as the agent makes it: the tool, its main target, its plain arguments
    (text), and further targets by role."""

    tool: str
    target: str
    args: tuple[tuple[str, str], ...] = ()
    also: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def of(tool: str, target: str, also: Mapping[str, str] | None = None, **args: str) -> Call:
        return Call(tool, target, tuple(sorted(args.items())), tuple(sorted((also or {}).items())))

    def arg(self, name: str) -> str:
        return dict(self.args).get(name, "")


@dataclass
class World:
    """The user's environment during one run: what the tools read and change."""

    files: dict[str, str]  # paths: files, channels, mailboxes, calendars
    web: dict[str, str]  # page URL (without its query) -> text
    fetched: list[str] = field(default_factory=list)  # every URL read, query included
    payments: list[tuple[str, str]] = field(default_factory=list)  # (account, amount)
    sent: list[tuple[str, str, str]] = field(default_factory=list)  # (tool, to, body)
    shares: list[tuple[str, str]] = field(default_factory=list)  # (path, grantee)


Check = Callable[[World], bool]


@dataclass(frozen=True)
class UserTask:
    """The benign work: the calls the user means, in order, and what must hold after.
    A read among them is where an injection planted in that resource is read."""

    name: str
    prompt: str
    calls: tuple[Call, ...]
    done: Check


@dataclass(frozen=True)
class InjectionTask:
    """The attacker's goal: the calls a compromised agent makes, whether through a
    sub-agent it delegates to (`delegated`), and what holds when the attack had its effect."""

    name: str
    kind: str
    goal: str  # the instruction as planted
    calls: tuple[Call, ...]
    effect: Check
    delegated: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ATTACK_KINDS:
            raise ValueError(f"unknown attack kind {self.kind}")


@dataclass(frozen=True)
class SuitePolicy:
    """An operator's policy for one suite, written from the user's environment only (its
    known payees, members, channels, contacts and domains), in the policy file's own words
    (docs/policies.md): `rules` is `[agents.X.rules]` (tool -> {"targets": [...], "args":
    {...}}), `sets` is `[sets.X]`. The agent's helper (the sub-agent a run may delegate
    to) has the same tools and no rules, so it defers to the agent's."""

    tools: tuple[str, ...]
    rules: Mapping[str, Mapping[str, object]]
    sets: Mapping[str, tuple[Mapping[str, str], ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Suite:
    name: str
    principal: str  # the user, who answers the agent's cards
    world: Callable[[], World]  # a fresh environment, without injections
    slots: tuple[str, ...]  # resources (paths, URLs) an attacker can write into
    user_tasks: tuple[UserTask, ...]
    injection_tasks: tuple[InjectionTask, ...]
    policy: SuitePolicy
