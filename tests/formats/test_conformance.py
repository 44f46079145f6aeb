"""Every registered format runs the conformance suite (tests/formats/conformance.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from snapops.formats.registry import HANDLER_MODULES
from tests.formats.conformance import PROBE, FormatConformance


def test_every_registered_format_has_a_conformance_class():
    tested = {cls.name for cls in FormatConformance.__subclasses__()}
    assert tested == set(HANDLER_MODULES)


class TestWtxt(FormatConformance):
    name = "wtxt"

    def probe_span(self, path: Path) -> tuple[int, int] | None:
        """The base64 body of the probe's only chunk (the text between its ch and endch)."""
        data = path.read_bytes()
        arr = data.index(b"arr name=probe ")
        start = data.index(b"\n", data.index(b"\nch ", arr) + 1) + 1
        return start, data.index(b"endch", start)


class TestAero(FormatConformance):
    name = "aero"


@pytest.mark.slow     # its flipped-bit walk takes 10-13 s: started early
class TestAeroset(FormatConformance):
    name = "aeroset"

    def target(self, folder: Path, stem: str = "s") -> Path:
        return folder / "set" / "model.aeroset.json"

    def data_file(self, path: Path) -> Path:
        return path.parent / "part-000.aero"


class TestFold(FormatConformance):
    name = "fold"
    refused_dtype = None


class TestFinf(FormatConformance):
    name = "finf"
    probe_options = {"reserve": 0}

    def valid_prefix(self, prefix: bytes) -> bool:
        return prefix == b"%FINF 0.1.0\n"        # the header line alone: an empty file


class TestPycauset(FormatConformance):
    name = "pycauset"


class TestNpz(FormatConformance):
    name = "npz"


class TestSafetensors(FormatConformance):
    name = "safetensors"


@pytest.mark.slow     # its flipped-bit walk takes 10-13 s: started early
class TestPt(FormatConformance):
    name = "pt"


def test_probe_is_distinctive():
    assert len(set(PROBE.tobytes())) > 64 and PROBE.dtype == np.dtype("<u4")
