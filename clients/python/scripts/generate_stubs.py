"""Regenerates the gRPC stubs shipped in the package from the repository's proto/ directory.

    python scripts/generate_stubs.py            # writes src/countersign/v1/approval_pb2*.py(i)

The proto package `countersign.v1` maps onto the subpackage `countersign.v1`, so the generated
imports (`from countersign.v1 import approval_pb2`) resolve inside this package. A test
(tests/test_stubs.py) regenerates into a temporary directory and fails when the shipped files
differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = PACKAGE_ROOT.parent.parent / "proto"
PROTO_FILE = "countersign/v1/approval.proto"
SOURCE_ROOT = PACKAGE_ROOT / "src"
GENERATED = (
    "countersign/v1/approval_pb2.py",
    "countersign/v1/approval_pb2.pyi",
    "countersign/v1/approval_pb2_grpc.py",
)


def generate(out_dir: Path) -> None:
    """Writes the stubs of PROTO_FILE under out_dir (which must exist)."""
    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        PROTO_FILE,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO_ROOT / PROTO_FILE}")


def main() -> int:
    generate(SOURCE_ROOT)
    for name in GENERATED:
        print(f"wrote {SOURCE_ROOT / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
