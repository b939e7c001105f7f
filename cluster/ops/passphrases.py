"""Where the command line gets a principal's passphrase, and `quorumgate passphrase`.

A person types it on the terminal (`getpass`: read from the controlling terminal, not
echoed). A script gives it on a file descriptor it opened (`--passphrase-fd N`, one
line), never in an environment variable or an argument: an environment is inherited by
every child the script starts (an agent among them) and, like the command line, can be
read from /proc by any process of the same user, while a descriptor is read once here
and not passed on (Python's descriptors are not inherited, PEP 446). Without a terminal
and without a descriptor a command refuses, naming both (docs/security/approvals.md).
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from pathlib import Path

from quorumgate.proto.clusterfile import ClusterFileError
from quorumgate.proto.sealedkey import (
    KDF_COST_DEFAULT,
    KDF_COSTS,
    PASSPHRASE_BYTES_MAX,
    KdfCost,
    check_new_passphrase,
    is_sealed_file,
)
from quorumgate.sdk.keys import change_passphrase, seal_key_file

FD_READ_BYTES = 4096


class PassphraseUnavailable(ClusterFileError):
    """No terminal to ask on and no descriptor to read from."""


def read_passphrase_fd(fd: int) -> str:
    """One line from descriptor `fd` (its newline removed), at most PASSPHRASE_BYTES_MAX
    bytes; the descriptor is left open (it is the caller's)."""
    data = b""
    while b"\n" not in data and len(data) <= PASSPHRASE_BYTES_MAX:
        try:
            chunk = os.read(fd, FD_READ_BYTES)
        except OSError as err:
            raise PassphraseUnavailable(f"cannot read descriptor {fd}: {err.strerror}") from err
        if not chunk:
            break
        data += chunk
    line = data.split(b"\n", 1)[0].removesuffix(b"\r")
    if len(line) > PASSPHRASE_BYTES_MAX:
        raise PassphraseUnavailable(f"a passphrase is at most {PASSPHRASE_BYTES_MAX} bytes")
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        raise PassphraseUnavailable(f"descriptor {fd} did not hold UTF-8 text") from None


def _terminal() -> bool:
    return sys.stdin.isatty()


def ask_passphrase(what: Path | str, fd: int | None) -> str:
    """The passphrase of `what`: from `fd` when given, else typed on the terminal."""
    if fd is not None:
        return read_passphrase_fd(fd)
    if not _terminal():
        raise PassphraseUnavailable(
            f"{what} is sealed with a passphrase: run this on a terminal to type it, or "
            f"give it on a file descriptor with --passphrase-fd N (scripts)"
        )
    return getpass.getpass(f"Passphrase for {what}: ")


def new_passphrase(what: Path | str, fd: int | None, option: str) -> str:
    """A new passphrase: one line from `fd`, or typed twice on the terminal; `option`
    names the command's descriptor option in the refusal."""
    if fd is not None:
        chosen = read_passphrase_fd(fd)
    elif not _terminal():
        raise PassphraseUnavailable(
            f"a new passphrase for {what}: run this on a terminal to type it, or give it "
            f"on a file descriptor with {option} N (scripts)"
        )
    else:
        chosen = getpass.getpass(f"New passphrase for {what}: ")
        if getpass.getpass("The same again: ") != chosen:
            raise ClusterFileError("the two passphrases differ; nothing was changed")
    check_new_passphrase(chosen)
    return chosen


def kdf_cost(name: str) -> KdfCost:
    return KDF_COSTS[name]


def add_kdf_cost_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kdf-cost",
        choices=sorted(KDF_COSTS),
        default=KDF_COST_DEFAULT.name,
        help="Argon2id work per passphrase guess (default %(default)s; `interactive` "
        "only for a generated passphrase)",
    )


def cmd_passphrase(args: argparse.Namespace) -> int:
    """`quorumgate passphrase --key FILE`: seal a key file kept in the clear, or change
    the passphrase of a sealed one (the new file replaces the old whole)."""
    path = Path(args.key)
    try:
        if is_sealed_file(path):
            old = ask_passphrase(path, args.passphrase_fd)
            new = new_passphrase(path, args.new_passphrase_fd, "--new-passphrase-fd")
            public = change_passphrase(path, old, new, cost=kdf_cost(args.kdf_cost))
            done = "changed the passphrase of"
        else:
            new = new_passphrase(path, args.new_passphrase_fd, "--new-passphrase-fd")
            public = seal_key_file(path, new, cost=kdf_cost(args.kdf_cost))
            done = "sealed"
    except ClusterFileError as err:
        print(f"quorumgate: {err}", file=sys.stderr)
        return 2
    print(f"{done} {path} (public key {public.hex()})")
    return 0


def add_passphrase_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = sub.add_parser(
        "passphrase", help="seal a principal's key file with a passphrase, or change it"
    )
    command.add_argument("--key", required=True, metavar="FILE")
    command.add_argument("--passphrase-fd", type=int, metavar="N", help="the current one")
    command.add_argument("--new-passphrase-fd", type=int, metavar="N", help="the new one")
    add_kdf_cost_argument(command)
    command.set_defaults(func=cmd_passphrase)
