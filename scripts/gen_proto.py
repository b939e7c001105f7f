#!/usr/bin/env python3
"""Regenerate the committed protobuf and gRPC Python code under proto/qgpb/.

    python scripts/gen_proto.py            # write into proto/
    python scripts/gen_proto.py --out DIR  # write elsewhere (the freshness test does this)

The output depends on the pinned grpcio-tools version in pyproject.toml's dev extra.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE = "qgpb"


def proto_files() -> list[Path]:
    return sorted((PROTO_ROOT / PACKAGE).glob("*.proto"))


def generate(out: Path) -> None:
    import grpc_tools
    from grpc_tools import protoc  # dev dependency only

    include = Path(grpc_tools.__file__).parent / "_proto"
    out.mkdir(parents=True, exist_ok=True)
    (out / PACKAGE).mkdir(exist_ok=True)
    for proto in proto_files():
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            str(proto.relative_to(PROTO_ROOT)),
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise SystemExit(f"protoc failed on {proto.name} (exit {rc})")
    # grpc_tools writes a service module even for files without services; drop empty ones
    for grpc_mod in (out / PACKAGE).glob("*_pb2_grpc.py"):
        if "class " not in grpc_mod.read_text():
            grpc_mod.unlink()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTO_ROOT)
    args = parser.parse_args()
    import os

    os.chdir(PROTO_ROOT)  # protoc resolves proto paths relative to the include root
    generate(args.out.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
