"""The RFC 6962 verdict tree (sidecar/receipts.py): every path the sidecar stores leads from
its leaf to the root it signs, for every tree shape."""

from __future__ import annotations

import hashlib

import pytest

from quorumgate.sidecar.receipts import (
    EMPTY_ROOT,
    CertificateError,
    all_paths,
    merkle_path,
    merkle_root,
    root_and_paths,
    root_from_path,
)

SIZES = [*range(0, 70), 127, 128, 129, 300]


def leaves(n: int) -> list[bytes]:
    return [hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(n)]


@pytest.mark.parametrize("n", SIZES)
def test_root_and_paths_agree_with_the_one_leaf_definitions(n: int) -> None:
    hashes = leaves(n)
    root, paths = root_and_paths(hashes)
    assert root == merkle_root(hashes)
    assert paths == [merkle_path(hashes, i) for i in range(n)] == all_paths(hashes)
    for i, path in enumerate(paths):
        assert root_from_path(hashes[i], i, n, path) == root


def test_the_empty_tree_has_the_empty_root_and_no_paths() -> None:
    assert root_and_paths([]) == (EMPTY_ROOT, [])


def test_a_path_for_another_index_or_count_does_not_lead_to_the_root() -> None:
    hashes = leaves(13)
    root, paths = root_and_paths(hashes)
    assert root_from_path(hashes[5], 6, 13, paths[5]) != root
    with pytest.raises(CertificateError):
        root_from_path(hashes[5], 5, 6, paths[5])  # a 6-leaf tree has shorter paths
