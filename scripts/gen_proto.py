#!/usr/bin/env python3
"""Regenerate the committed protobuf and gRPC Python code in proto/ (`quorumgate.proto`).

    python scripts/gen_proto.py            # write into proto/
    python scripts/gen_proto.py --out DIR  # write elsewhere (the freshness test does this)

The .proto files import each other as `quorumgate/proto/NAME.proto`, so that the generated
modules import `quorumgate.proto.NAME_pb2`: protoc derives Python import paths from the
proto paths. They are staged under that path in a temporary include root first. The
output depends on the pinned grpcio-tools version in pyproject.toml's dev extra.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
PACKAGE_PATH = Path("quorumgate", "proto")


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def generate(out: Path) -> None:
    import grpc_tools
    from grpc_tools import protoc  # dev dependency only

    include = Path(grpc_tools.__file__).parent / "_proto"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        staged, built = Path(tmp, "src"), Path(tmp, "out")
        (staged / PACKAGE_PATH).mkdir(parents=True)
        built.mkdir()
        for proto in proto_files():
            shutil.copyfile(proto, staged / PACKAGE_PATH / proto.name)
        for proto in proto_files():
            args = [
                "protoc",
                f"-I{staged}",
                f"-I{include}",
                f"--python_out={built}",
                f"--pyi_out={built}",
                f"--grpc_python_out={built}",
                str(PACKAGE_PATH / proto.name),
            ]
            rc = protoc.main(args)
            if rc != 0:
                raise SystemExit(f"protoc failed on {proto.name} (exit {rc})")
        for module in sorted((built / PACKAGE_PATH).iterdir()):
            # grpc_tools writes a service module even for files without services: drop those
            if module.name.endswith("_pb2_grpc.py") and "class " not in module.read_text():
                continue
            shutil.copyfile(module, out / module.name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTO_DIR)
    args = parser.parse_args()
    generate(args.out.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
