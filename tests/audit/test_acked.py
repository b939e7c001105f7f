"""The acknowledged-height files `quorumgate ship` writes for pruning (cluster/audit/acked.py,
docs/pruning.md): a cursor inside a height acknowledges only the heights below it; the
file never goes back; with two copies the lower height is written, and only once both
told one; one log line per height written."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from quorumgate.audit.acked import AckedFiles, acked_height, local_node_dirs, write_acked
from quorumgate.audit.records import Cursor
from quorumgate.proto.clusterfile import init_cluster
from quorumgate.sidecar.ledger import GENESIS_PREV_HASH
from quorumgate.sidecar.pruning import ACKED_FILE, read_acked

HEAD = bytes(32)


def cursor(height: int, index: int, entries: int = 10) -> Cursor:
    return Cursor(height, index, HEAD, entries)


def test_a_cursor_inside_a_height_acknowledges_only_the_heights_below() -> None:
    assert acked_height(Cursor(0, 0, GENESIS_PREV_HASH, 0), None) == 0  # nothing shipped
    assert acked_height(cursor(40, 2), 3) == 40  # the last of its height's three verdicts
    assert acked_height(cursor(40, 1), 3) == 39  # the third is not in the copy yet
    assert acked_height(cursor(40, 0), 2) == 39
    assert acked_height(cursor(40, 2), None) == 39  # the height's count unknown
    assert acked_height(cursor(1, 0), 2) == 0


def test_the_file_never_goes_back(tmp_path: Path) -> None:
    assert write_acked(tmp_path, 100)
    assert read_acked(tmp_path) == 100
    assert not write_acked(tmp_path, 50)  # a larger height already there stays
    assert not write_acked(tmp_path, 100)
    assert read_acked(tmp_path) == 100
    assert write_acked(tmp_path, 120)
    assert json.loads((tmp_path / ACKED_FILE).read_text()) == {"height": 120}
    assert (tmp_path / ACKED_FILE).stat().st_mode & 0o777 == 0o644
    assert list(tmp_path.glob("*.tmp")) == []


def test_the_file_is_readable_whatever_the_umask(tmp_path: Path) -> None:
    """A sidecar run as another user reads it: 0644, even under a umask of 077."""
    old = os.umask(0o077)
    try:
        write_acked(tmp_path, 3)
    finally:
        os.umask(old)
    assert (tmp_path / ACKED_FILE).stat().st_mode & 0o777 == 0o644


def test_a_file_that_holds_no_height_is_replaced(tmp_path: Path) -> None:
    (tmp_path / ACKED_FILE).write_text("not json")
    assert write_acked(tmp_path, 7)
    assert read_acked(tmp_path) == 7


def test_a_shipper_started_again_does_not_lower_what_is_there(tmp_path: Path) -> None:
    write_acked(tmp_path, 500)
    files = AckedFiles([tmp_path], ["postgresql"])
    files.report("postgresql", 300)  # a conservative height read back from a cursor
    assert read_acked(tmp_path) == 500


def test_two_copies_write_the_lower_height_once_both_told(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nodes = [tmp_path / "node-0", tmp_path / "node-1"]
    for node in nodes:
        node.mkdir()
    files = AckedFiles(nodes, ["postgresql", "otlp"])
    caplog.set_level(logging.INFO, logger="quorumgate.ship")
    files.report("postgresql", 90)
    assert [read_acked(n) for n in nodes] == [0, 0]  # the OTLP copy has told nothing yet
    files.report("otlp", 60)
    assert [read_acked(n) for n in nodes] == [60, 60]
    files.report("otlp", 60)
    files.report("postgresql", 95)  # the lower copy has not moved: nothing to write
    files.report("otlp", 120)
    assert [read_acked(n) for n in nodes] == [95, 95]
    files.report("otlp", 100)  # a copy's height never goes back either
    assert files.heights == {"postgresql": 95, "otlp": 120}
    lines = [r.getMessage() for r in caplog.records if "acked_written" in r.getMessage()]
    assert lines == [
        "event=acked_written height=60 nodes=2",
        "event=acked_written height=95 nodes=2",
    ]
    assert files.registry.get_sample_value("qg_ship_acked_height") == 95
    with pytest.raises(ValueError, match="unknown copy"):
        files.report("elsewhere", 1)


def test_a_file_that_cannot_be_written_is_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = tmp_path / "node-0"
    files = AckedFiles([node], ["postgresql"])  # its directory is not there
    files.report("postgresql", 10)
    assert "event=acked_failed height=10" in caplog.text
    node.mkdir()
    files.report("postgresql", 10)
    assert read_acked(node) == 10


def test_only_the_node_directories_on_this_host(tmp_path: Path) -> None:
    spec = init_cluster(tmp_path / "c", 4)
    for index in (1, 3):
        for path in spec.node_dir(index).iterdir():
            path.unlink()
        os.rmdir(spec.node_dir(index))
    assert local_node_dirs(spec) == (spec.node_dir(0), spec.node_dir(2))
