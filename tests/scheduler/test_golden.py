"""The core decides exactly what it decided when the golden files were recorded (issue 17's
guard): every scenario file, seeded random streams, the benchmark's busy worlds and a contended
Philly slice, byte for byte. ``golden_record.py`` says how they are made and re-recorded."""

from __future__ import annotations

import difflib

import pytest

from . import golden_record

FILES = golden_record.golden_files()


@pytest.mark.parametrize("name", sorted(FILES), ids=sorted(FILES))
def test_the_core_decides_as_the_golden_file_says(name):
    if name == "philly_slice.txt" and not golden_record.PHILLY.exists():
        pytest.skip(f"{golden_record.PHILLY} is not on this machine")
    want = (golden_record.GOLDEN / name).read_text()
    got = FILES[name]()
    if got != want:
        diff = difflib.unified_diff(
            want.splitlines(), got.splitlines(), "golden", "now", n=2, lineterm=""
        )
        pytest.fail(
            f"{name} differs from what the core decides now:\n" + "\n".join(list(diff)[:60])
        )
