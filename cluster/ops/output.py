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
        ["node", "address", "alive", "height", "view", "leader", "peers", "mempool"],
        [
            [
                st.index,
                st.address,
                "yes" if st.alive else "no",
                st.height,
                st.view,
                st.leader,
                st.peers,
                st.mempool,
            ]
            for st in statuses
        ],
    )
