"""What every QuorumGate server process does around its asyncio service: arguments, the
cluster file, logging, a pid file, signals, uvloop when importable, and exit codes."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol

from quorumgate.proto.clusterfile import ClusterFileError, ClusterSpec, load_cluster

log = logging.getLogger("quorumgate.process")

EXIT_FAIL_STOP = 70  # EX_SOFTWARE: a task of the service ended unexpectedly
# The collector's youngest generation runs after this many net container allocations
# (CPython's default is 700). A replica or sidecar allocates short-lived messages,
# dataclasses and futures by the thousand per block, few of them in cycles: with the
# default a sidecar collected every 20 transactions or so at W = 256, and each full
# collection walked its whole state (0.05-0.3 s). The older generations keep CPython's
# ratios (10, 10). At most about this many unreachable cyclic objects wait a collection.
GC_GEN0_THRESHOLD = 20_000


def tune_gc() -> None:
    """Once the service has started: move everything alive (modules, the loaded state,
    the store's and the core's tables) to the collector's permanent generation, so full
    collections no longer walk it, and collect the youngest generation less often."""
    gc.collect()
    gc.freeze()
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


class FailStop:
    """The long-lived tasks of a service, each of which must run until the service stops.
    One that ends any other way — an exception, or a return — makes the whole process stop
    with `EXIT_FAIL_STOP` after logging the traceback, so that a supervisor sees the exit
    and restarts it: a replica whose core task had died once kept serving `Status` and
    taking transactions, and nothing said so."""

    def __init__(self) -> None:
        self._failed: asyncio.Future[BaseException] | None = None
        self.tasks: list[asyncio.Task[None]] = []

    @property
    def failed(self) -> asyncio.Future[BaseException]:
        if self._failed is None:
            self._failed = asyncio.get_running_loop().create_future()
        return self._failed

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._done)
        self.tasks.append(task)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception() or RuntimeError(f"task {task.get_name()} returned")
        log.error(
            "event=fail_stop task=%s error=%s",
            task.get_name(),
            type(error).__name__,
            exc_info=(type(error), error, error.__traceback__),
        )
        if not self.failed.done():
            self.failed.set_result(error)

    async def cancel_all(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class Service(Protocol):
    failstop: FailStop

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def serve(service: Service, stop: asyncio.Event) -> int:
    """Run a started service until `stop` is set (0) or one of its tasks fails (fail-stop)."""
    stopping: asyncio.Future[object] = asyncio.ensure_future(stop.wait())
    failed: asyncio.Future[object] = service.failstop.failed  # type: ignore[assignment]
    try:
        await asyncio.wait({stopping, failed}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    await service.stop()
    if failed.done():
        error = service.failstop.failed.result()
        print(
            f"quorumgate: fail-stop: a task ended ({type(error).__name__}: {error}); "
            "the traceback is in the log file",
            file=sys.stderr,
        )
        return EXIT_FAIL_STOP
    return 0


async def _serve(make: Callable[[], Awaitable[Service]]) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    service = await make()
    await service.start()
    tune_gc()
    return await serve(service, stop)


def process_main(
    argv: list[str] | None,
    *,
    kind: str,
    description: str,
    make: Callable[[ClusterSpec, int], Awaitable[Service]],
) -> int:
    """`python -m <kind module> --dir DIR --node I`: run one `kind` process of a member
    until SIGTERM/SIGINT. Exit 2 for a bad cluster file or member, 1 for a fatal start
    error (a port in use, a key that does not match), 70 when a task of the running
    service failed (fail-stop), 0 after a clean stop."""
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
