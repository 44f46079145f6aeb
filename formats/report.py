"""The verification report every format's ``verify`` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import FormatError, printable


@dataclass
class Report:
    """Outcome of verifying one file.

    ``ok`` is True only when every check held (and every demanded key/signature was present).
    ``failure`` is the first failing check; ``notes`` are non-fatal findings such as
    unauthenticated arrays or a missing signature.
    """

    path: str
    format: str
    ok: bool = True
    failure: FormatError | None = None
    notes: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    arrays: int = 0
    raw_bytes: int = 0
    details: dict[str, Any] = field(default_factory=dict)

    def fail(self, error: FormatError) -> "Report":
        self.ok = False
        self.failure = error.located(self.path)
        return self

    def passed(self, check: str) -> None:
        if check not in self.checks:
            self.checks.append(check)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "ok": self.ok,
            "failure": self.failure.to_dict() if self.failure else None,
            "notes": list(self.notes),
            "checks": list(self.checks),
            "arrays": self.arrays,
            "raw_bytes": self.raw_bytes,
            "details": self.details,
        }

    def summary(self) -> str:
        """One line, then one per note; the path and notes (which name arrays from the file)
        are escaped as every message is (``printable``): they cannot forge lines."""
        if self.ok:
            text = (f"OK {printable(self.path)}: {self.format}, {self.arrays} arrays, "
                    f"{self.raw_bytes} bytes")
        else:
            text = f"FAIL {self.failure}"
        return "\n".join([text, *(f"  note: {printable(n)}" for n in self.notes)])
