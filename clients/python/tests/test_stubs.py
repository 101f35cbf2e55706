"""The stubs shipped in the package are what grpcio-tools generates from proto/ today."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import generate_stubs


def test_shipped_stubs_match_the_proto(tmp_path: Path) -> None:
    generate_stubs.generate(tmp_path)
    stale = [
        name
        for name in generate_stubs.GENERATED
        if (tmp_path / name).read_bytes() != (generate_stubs.SOURCE_ROOT / name).read_bytes()
    ]
    assert not stale, f"stale stubs {stale}: run python clients/python/scripts/generate_stubs.py"


def test_every_wire_enum_value_has_a_python_member() -> None:
    """A value the server sends that the package cannot name would end a watch."""
    from countersign import model

    for name, (wire, prefix) in model._WIRE_ENUMS.items():
        python = getattr(model, name)
        for number in wire.values():
            member = python.of(number)
            if wire.Name(number) == prefix + "UNSPECIFIED":
                assert member is None
            else:
                assert member.number == number, (name, wire.Name(number))
