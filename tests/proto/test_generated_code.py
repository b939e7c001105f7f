"""The committed protobuf code is exactly what the pinned generator produces."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "proto"


def test_regenerating_the_protobuf_code_changes_nothing(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--out", str(tmp_path)],
        check=True,
    )
    fresh = tmp_path
    generated = sorted(p.name for p in fresh.iterdir() if p.suffix in {".py", ".pyi"})
    committed = sorted(
        p.name for p in PACKAGE.iterdir() if p.name.endswith(("_pb2.py", "_pb2.pyi", "_grpc.py"))
    )
    assert generated, "the generator produced nothing"
    assert generated == committed, "generated files differ from the committed set"
    for name in generated:
        assert filecmp.cmp(fresh / name, PACKAGE / name, shallow=False), (
            f"{name} is stale: run `python scripts/gen_proto.py` and commit the result"
        )
