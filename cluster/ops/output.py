"""What the command line prints: plain text tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quorumgate.ops.nodes import NodeStatus


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain text table: numbers right-aligned, text left-aligned, `-` for None."""
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    numeric = [
        all(r[i].lstrip("-").isdigit() or r[i] == "-" for r in cells) for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ).rstrip()

    return "\n".join([line(headers), *(line(r) for r in cells)])


def status_table(statuses: Sequence[NodeStatus]) -> str:
    return table(
        ["node", "address", "alive", "epoch", "height", "view", "leader", "peers", "mempool"],
        [
            [
                st.index,
                st.address,
                "yes" if st.alive else "no",
                st.epoch,
                st.height,
                st.view,
                st.leader,
                st.peers,
                st.mempool,
            ]
            for st in statuses
        ],
    )


def cluster_epoch(f: int, statuses: Sequence[NodeStatus]) -> int | None:
    """The newest epoch at least f+1 live replicas report (one of them is honest), if any
    (docs/consensus/epochs.md)."""
    epochs = [st.epoch for st in statuses if st.alive and st.epoch is not None]
    agreed = [e for e in set(epochs) if epochs.count(e) >= f + 1]
    return max(agreed) if agreed else None


def epoch_line(epoch: int | None, runs_epochs: bool) -> str:
    """The status line under the table that names the cluster's epoch."""
    changes = "changes at owner-signed records" if runs_epochs else "fixed member set"
    shown = "unknown (fewer than f+1 replicas agree)" if epoch is None else str(epoch)
    return f"epoch: {shown} ({changes})"
