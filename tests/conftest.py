"""Shared test setup: markers that skip cleanly, the real-data mirror, hypothesis profiles."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
MIRROR_MISSING = "needs the real-data mirror: set EULER_DATA_MIRROR or put it at ../shared/data"

# --- hypothesis: a CI profile with more examples and no deadline, selected by CI=true -------------
try:
    from hypothesis import HealthCheck, settings
    from hypothesis import core as _hypothesis_core

    settings.register_profile("dev", max_examples=25, deadline=None)
    settings.register_profile(
        "ci",
        max_examples=60,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    _PROFILE = "ci" if os.environ.get("CI", "").lower() in ("1", "true", "yes") else "dev"
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", _PROFILE))
except ImportError:  # hypothesis is a test dependency; tests that need it import it themselves
    _hypothesis_core = None
    _PROFILE = "none"


def data_mirror() -> Path | None:
    """The real-data mirror: $EULER_DATA_MIRROR, else ../shared/data beside the repo; None if absent."""
    path = Path(os.environ.get("EULER_DATA_MIRROR", REPO_ROOT.parent / "shared" / "data"))
    return path if path.is_dir() else None


def cuda_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def cupy_with_a_device() -> Any:
    """CuPy, for a GPU test module that needs a device at import (its module-level code or imports);
    without one the whole module is skipped with the reason."""
    if not cuda_available():
        pytest.skip("needs a CUDA device and CuPy", allow_module_level=True)
    import cupy

    return cupy


def pytest_configure(config: pytest.Config) -> None:
    # In CI, pin a printed random seed so that any hypothesis failure can be replayed with it.
    if _PROFILE == "ci" and _hypothesis_core is not None and config.getoption("hypothesis_seed") is None:
        seed = int(os.environ.get("HYPOTHESIS_SEED", random.randrange(2**32)))
        _hypothesis_core.global_force_seed = seed
        config._euler_seed = seed


def pytest_report_header(config: pytest.Config) -> list[str]:
    seed = getattr(config, "_euler_seed", None)
    mirror = data_mirror()
    lines = [
        f"euler: hypothesis profile={_PROFILE}"
        + (f", seed={seed} (replay: HYPOTHESIS_SEED={seed})" if seed is not None else "")
    ]
    lines.append(f"euler: data mirror={mirror if mirror else 'absent (tests marked data are skipped)'}")
    return lines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    have_cuda = cuda_available()
    have_mirror = data_mirror() is not None
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device and CuPy")
    skip_data = pytest.mark.skip(
        reason="needs the real-data mirror: set EULER_DATA_MIRROR or put it at ../shared/data"
    )
    for item in items:
        # markers only: item.keywords would also match a parametrize id that happens to be "gpu"
        if item.get_closest_marker("gpu") and not have_cuda:
            item.add_marker(skip_gpu)
        if item.get_closest_marker("data") and not have_mirror:
            item.add_marker(skip_data)


@pytest.fixture(scope="session")
def mirror() -> Path:
    """The real-data mirror folder; tests using it should also be marked `data`."""
    path = data_mirror()
    if path is None:
        pytest.skip(MIRROR_MISSING)
    return path
