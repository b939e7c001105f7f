"""The `rotate-members` drill (docs/drills.md): under load, every member's keys are rotated
in turn, exactly as an operator does: its consensus key with `quorumgate admin rotate-key
--member I`, then its sidecar's receipt key with `--receipt I`, each rotation one epoch
(docs/consensus/epochs.md, "The live replica" and "Receipt keys"). After each one every
replica must reach the new epoch and commits must go on, and the calls certified after a
receipt key changed carry the new key's signature (the SDK checks each certificate with
its epoch's keys); the drill's usual
checks then say that nothing acknowledged was lost or committed twice, that every
replica holds the same block at every height, and that nobody equivocated.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter

from quorumgate.ops.drills.bounds import (
    FAULT_CYCLES_MAX,
    POLL_S,
    RECOVERY_TIMEOUT_S,
    RESUME_TIMEOUT_S,
    poll,
)
from quorumgate.ops.drills.context import Drill
from quorumgate.ops.drills.report import Abort, Fault

# The command's own wait for 2f+1 replicas in the next epoch, and the time it may take
# beyond that to start, sign and submit.
ROTATE_DEADLINE_S = 60.0
ROTATE_COMMAND_TIMEOUT_S = ROTATE_DEADLINE_S + 60.0


# The keys of a member the drill rotates, in this order, each with its own command flag.
KEYS = ("member", "receipt")


def rotate_members(d: Drill) -> None:
    """Rotate the keys of members 0, 1, ... in turn (`KEYS`): every key of every member
    once however short `--seconds` is, then on while they last."""
    for k in range(FAULT_CYCLES_MAX):
        if k >= d.n * len(KEYS) and time.monotonic() >= d.fault_deadline:
            break
        member, key = divmod(k, len(KEYS))
        rotate_once(d, k, member % d.n, KEYS[key])
    epochs = {i: s.epoch for i, s in d.statuses().items()}
    last = max(epochs.values(), default=0)
    behind = [
        f"replica {i} in epoch {e}, not {last}" for i, e in sorted(epochs.items()) if e != last
    ]
    missing = [f"replica {i} did not answer" for i in range(d.n) if i not in epochs]
    d.check(
        "every_replica_in_the_last_epoch",
        behind + missing,
        f"all {d.n} replicas in epoch {last} after {len(d.report.faults)} rotations",
    )


def epoch_now(d: Drill) -> int:
    """The epoch f+1 replicas report (the newest such)."""
    counts = Counter(s.epoch for s in d.statuses().values())
    agreed = [epoch for epoch, count in counts.items() if count >= d.spec.f + 1]
    if not agreed:
        raise Abort(f"fewer than f+1 replicas agree on an epoch: {dict(counts)}")
    return max(agreed)


def _all_in(d: Drill, epoch: int) -> float | None:
    statuses = d.statuses()
    if len(statuses) == d.n and all(s.epoch >= epoch for s in statuses.values()):
        return time.monotonic()
    return None


def rotate_once(d: Drill, k: int, member: int, key: str = "member") -> None:
    """Rotate `member`'s `key` (a flag of `admin rotate-key`: `member` for its consensus
    key, `receipt` for its sidecar's receipt key) and wait for every replica to reach the
    next epoch and for commits to go on."""
    epoch = epoch_now(d)
    height = d.top()
    started = time.monotonic()
    kind = "rotate-member" if key == "member" else f"rotate-{key}"
    fault = d.fault(Fault(kind, member, started - d.t0, height_at_fault=height))
    done = subprocess.run(
        [
            sys.executable, "-m", "quorumgate", "admin", "rotate-key",
            "--dir", str(d.spec.directory), f"--{key}", str(member),
            "--json", "--deadline", str(ROTATE_DEADLINE_S),
        ],
        capture_output=True,
        text=True,
        timeout=ROTATE_COMMAND_TIMEOUT_S,
        check=False,
    )  # fmt: skip
    in_quorum = time.monotonic()
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        raise Abort(f"rotate-key --{key} {member} exited {done.returncode}: {tail[0]}")
    answer = json.loads(done.stdout)
    fault.details.update(
        {
            "epoch_before": epoch,
            "epoch_after": answer["next_epoch"],
            "public_key_prefix": str(answer["public_key"])[:16],
            "quorum_in_next_epoch_s": round(in_quorum - started, 3),
        }
    )
    everyone = poll(lambda: _all_in(d, epoch + 1), RECOVERY_TIMEOUT_S, POLL_S)
    if everyone is None:
        epochs = {i: s.epoch for i, s in d.statuses().items()}
        raise Abort(f"not every replica reached epoch {epoch + 1}: {epochs}")
    fault.details["all_in_next_epoch_s"] = round(everyone - started, 3)
    resumed = d.wait_commits(d.top(), list(range(d.n)), RESUME_TIMEOUT_S)
    if resumed is None:
        raise Abort(f"commits did not go on after epoch {epoch + 1} began: {d.heights()}")
    fault.recovery_s = resumed - started
    d.say(
        f"rotation {k + 1}: member {member}'s {answer['key']} key, epoch {epoch} -> "
        f"{epoch + 1}; 2f+1 replicas in it after {in_quorum - started:.2f} s, all {d.n} after "
        f"{everyone - started:.2f} s, commits going on after {fault.recovery_s:.2f} s"
    )
