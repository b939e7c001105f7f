"""The methods read statements name: one table (runtime/readauth.py) that the servers check
against and the clients sign, each entry a real RPC, and a statement signed for one method
opening no other."""

from __future__ import annotations

import ast
import itertools
import time
from pathlib import Path

from google.protobuf import descriptor_pool
from nacl.signing import SigningKey

from quorumgate.proto import client_pb2, sidecar_pb2
from quorumgate.runtime import readauth
from quorumgate.runtime.readauth import READ_METHODS, caller_key, read_auth_metadata

ROOT = Path(__file__).resolve().parents[2]
SOURCE_FOLDERS = ("proto", "runtime", "replica", "sidecar", "cluster")
CHAIN = "qg-read-methods"


def test_the_table_lists_every_method_constant_once() -> None:
    constants = {v for k, v in vars(readauth).items() if k.startswith("METHOD_")}
    assert sorted(READ_METHODS) == sorted(constants)
    assert len(set(READ_METHODS)) == len(READ_METHODS) == 12  # Ledger, snapshots, epoch ends


def test_each_method_is_an_rpc_the_generated_stubs_call_by_that_path() -> None:
    """The channels' interceptors sign the path gRPC's generated stubs call: the table's
    strings must be those paths, or the server would check another statement."""
    pool = descriptor_pool.Default()
    assert client_pb2.DESCRIPTOR and sidecar_pb2.DESCRIPTOR  # both loaded into the pool
    for method in READ_METHODS:
        _, service, name = method.split("/")
        assert name in pool.FindServiceByName(service).methods_by_name, method


def test_a_statement_for_one_method_opens_no_other() -> None:
    key = SigningKey.generate()
    public = bytes(key.verify_key)
    now_ms = int(time.time() * 1000)
    for signed, asked in itertools.product(READ_METHODS, repeat=2):
        metadata = read_auth_metadata(
            CHAIN, signed, public, lambda m: bytes(key.sign(m).signature), now_ms
        )
        opened = caller_key(CHAIN, asked, metadata, now_ms)
        assert opened == (public if signed == asked else None), (signed, asked)


def test_no_module_writes_a_method_path_beside_the_table() -> None:
    """The servers and clients import the table; generated stubs hold the paths they call."""
    written: dict[str, str] = {}
    for folder in SOURCE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name.endswith("_pb2_grpc.py"):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and node.value in READ_METHODS:
                    written[f"{path.relative_to(ROOT)}:{node.lineno}"] = str(node.value)
    files = {where.split(":")[0] for where in written}
    assert "runtime/readauth.py" in files  # the scan reads the table itself
    assert files == {"runtime/readauth.py"}, sorted(written)
