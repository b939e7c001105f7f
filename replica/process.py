"""What every QuorumGate server process does around its asyncio service: arguments, the
cluster file, logging, a pid file, signals, uvloop when importable, and exit codes."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from quorumgate.proto.clusterfile import ClusterFileError, ClusterSpec, load_cluster

log = logging.getLogger("quorumgate.process")


class Service(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def _serve(make: Callable[[], Awaitable[Service]]) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    service = await make()
    await service.start()
    await stop.wait()
    await service.stop()
    return 0


def process_main(
    argv: list[str] | None,
    *,
    kind: str,
    description: str,
    make: Callable[[ClusterSpec, int], Awaitable[Service]],
) -> int:
    """`python -m <kind module> --dir DIR --node I`: run one `kind` process of a member
    until SIGTERM/SIGINT. Exit 2 for a bad cluster file or member, 1 for a fatal start
    error (a port in use, a key that does not match), 0 after a clean stop."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--node", required=True, type=int)
    parser.add_argument("--log-stderr", action="store_true")
    args = parser.parse_args(argv)
    try:
        spec = load_cluster(args.dir)
        spec.member(args.node)
    except ClusterFileError as err:
        print(f"quorumgate {kind}: {err}", file=sys.stderr)
        return 2
    node_dir = spec.node_dir(args.node)
    handlers: list[logging.Handler] = [logging.FileHandler(node_dir / f"{kind}.log")]
    if args.log_stderr:
        handlers.append(logging.StreamHandler(sys.stderr))
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s level=%(levelname)s {kind}={args.node} %(message)s",
        handlers=handlers,
    )
    pid_path = node_dir / f"{kind}.pid"
    pid_path.write_text(f"{os.getpid()}\n")

    async def main() -> int:
        return await _serve(lambda: make(spec, args.node))

    try:
        try:
            import uvloop
        except ImportError:
            return asyncio.run(main())
        result: int = uvloop.run(main())
        return result
    except (OSError, ClusterFileError) as err:
        log.error("event=fatal kind=%s error=%s", kind, err)
        print(f"quorumgate {kind} {args.node}: {err}", file=sys.stderr)
        return 1
    except Exception as err:
        # Any other failure ends the process too (fail-stop): the traceback goes to the
        # log file, and one line with the reason to stderr, which `up` shows.
        log.exception("event=fatal kind=%s error=%s", kind, type(err).__name__)
        print(
            f"quorumgate {kind} {args.node}: cannot go on: {type(err).__name__}: {err} "
            f"(traceback in {node_dir / f'{kind}.log'})",
            file=sys.stderr,
        )
        return 1
    finally:
        with contextlib.suppress(FileNotFoundError):
            if pid_path.read_text().strip() == str(os.getpid()):
                pid_path.unlink()
