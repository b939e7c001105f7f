"""How the test job shares the suite between its pytest-xdist workers (docs/development.md).

`--dist loadscope` keeps each module (or class) whole on one worker, since many start one
cluster per module, and xdist hands the modules out biggest first by their number of
tests. That count says little about time here: a live module of three tests runs clusters
for a minute while a module of a hundred pure tests is done in seconds, and a long module
handed out last leaves the other worker idle until it ends. So the modules that start real
processes or run simulations go first (longest processing time first: Graham, "Bounds on
multiprocessing timing anomalies", 1969), the pure ones fill in at the end, and the chunks
of the seeded simulation sweep, which share nothing, are handed out one by one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

from tests.support import forkserver, nodefork

# Property tests are bounded by their number of examples, never by time: Hypothesis's
# default deadline (200 ms per example) fails a correct test when the shared machine is
# slow, and no test here asserts a speed (docs/development.md).
settings.register_profile("quorumgate", deadline=None)
settings.load_profile("quorumgate")


@pytest.fixture(scope="session", autouse=True)
def _stop_fork_servers() -> Iterator[None]:
    """The fork servers a helper started for this process (tests/support/forkserver.py)
    stop with the session."""
    try:
        yield
    finally:
        forkserver.stop_shared()


@pytest.fixture(scope="session", autouse=True)
def _fork_nodes() -> Iterator[None]:
    """Replicas and sidecars this process starts are forked from a warm process that
    imported them (tests/support/nodefork.py); it stops with the session."""
    nodefork.install()
    try:
        yield
    finally:
        nodefork.uninstall()


# Where a module starts real processes or runs simulations for long: its path holds one of
# these. Such modules are handed out first, in xdist's order among themselves.
LONG_PATHS = (
    "tests/live/",
    "tests/drills/",
    "_live.py",
    "tests/consensus/",
    "tests/bench/",
    "tests/adapters/",
    "tests/audit/",
    "tests/mcpgw/",
)
# Modules whose tests share no fixture wider than a test: each test is its own unit.
PER_TEST_MODULES = ("tests/consensus/test_scenarios.py",)


def is_long(scope: str) -> bool:
    path = scope.split("::", 1)[0]
    return any(marker in path for marker in LONG_PATHS)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`loadscope` with the long modules first; other modes as xdist makes them."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LongFirstScheduling(LoadScopeScheduling):  # type: ignore[misc]
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            if nodeid.split("::", 1)[0] in PER_TEST_MODULES:
                return nodeid
            return str(super()._split_scope(nodeid))

        def _assign_work_unit(self, node: Any) -> None:
            if not self._ordered:
                # `sorted` is stable: within each group the units keep xdist's order.
                queue = sorted(self.workqueue.items(), key=lambda item: not is_long(item[0]))
                self.workqueue = OrderedDict(queue)
                self._ordered = True
            super()._assign_work_unit(node)

    return LongFirstScheduling(config, log)
