"""The engine guide's example (docs/engine.md), run as written: only the names it leaves to
the reader (an owner key, a height, a block time, transactions) are given, and what its
comments claim is checked."""

from __future__ import annotations

import re
from pathlib import Path

from nacl.signing import SigningKey

from quorumgate.proto import tx
from quorumgate.proto.model import Admin, Outcome, RegisterTool, ToolMode, ToolSpec

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def test_the_engine_guides_example_runs_and_its_comments_hold() -> None:
    (source,) = FENCE.findall((ROOT / "docs" / "engine.md").read_text())
    owner = SigningKey(bytes(32))
    register = Admin(op=RegisterTool(spec=ToolSpec(name="files.read", mode=ToolMode.READ)))
    txs = [tx.build("qg-main", 1, register, owner), tx.build("qg-main", 1, register, owner)]
    later = tx.build("qg-main", 2, register, owner)
    namespace: dict[str, object] = {
        "owner_pk": bytes(owner.verify_key),
        "height": 1,
        "block_time_ms": 1_000_000,
        "txs": txs,
        "tx_bytes": later,
    }
    exec(compile(source, "docs/engine.md", "exec"), namespace)
    engine, result = namespace["engine"], namespace["result"]
    assert [v.outcome for v in result.verdicts] == [Outcome.APPLIED, Outcome.REJECTED]
    assert result.state_root == engine.state_root()
    restored = type(engine).from_state_bytes(namespace["config"], engine.state_bytes())
    assert restored.state_bytes() == engine.state_bytes()
    assert restored.state_root() == engine.state_root()
    before = engine.state_bytes()
    assert engine.admission_check(later).accepted
    assert engine.state_bytes() == before  # read-only
