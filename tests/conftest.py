"""Shared fixtures: the WTXT test vectors, fresh keys, model-like states; hypothesis profiles."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=200, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", deadline=None, max_examples=100)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

REPO = Path(__file__).resolve().parents[1]
VECTORS = REPO / "tests" / "vectors" / "wtxt"
VECTOR_OPTS = dict(schema="weights/v1", ts="2026-01-02T03:04:05Z", build="vec1", host="cpu",
                   cuda="off")


def pytest_collection_modifyitems(items) -> None:
    """Tests marked ``slow`` run first, so the two workers do not end with one of them
    waiting on a long test the other started last."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def vectors() -> Path:
    assert VECTORS.is_dir(), f"test vectors missing at {VECTORS}"
    return VECTORS


@pytest.fixture(scope="session")
def keydir(tmp_path_factory) -> Path:
    from snapops.formats.keys import generate_keys

    folder = tmp_path_factory.mktemp("keys")
    generate_keys(folder)
    return folder


def sample_state(seed: int = 0) -> dict[str, np.ndarray]:
    """Small state exercising every WTXT dtype, a 0-d and an empty array, chunk boundaries."""
    rng = np.random.default_rng(seed)
    return {
        "emb": rng.standard_normal((40, 24)).astype(np.float32),
        "bias": rng.standard_normal(57),
        "ids": rng.integers(0, 2**32, 9000, dtype=np.uint32),
        "q": rng.integers(-128, 128, (3, 5), dtype=np.int8),
        "step": np.array(7, dtype=np.int64),
        "empty": np.zeros((0, 4), np.float32),
        "big": rng.standard_normal((130, 64)).astype(np.float32),  # 33280 B: crosses 32 KiB
    }


@pytest.fixture(autouse=True)
def no_leaked_threads():
    """Every test must stop the threads it starts (watchdog's rule)."""
    before = {t.ident for t in threading.enumerate()}
    yield
    for _ in range(100):
        leaked = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()
                  and not t.daemon]
        if not leaked:
            return
        threading.Event().wait(0.02)
    raise AssertionError(f"threads leaked: {[t.name for t in leaked]}")
