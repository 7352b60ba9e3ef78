"""`python -m batch_assets.instance`: the shipped instance config put into a DAGSTER_HOME, as
docs/adding-to-a-project.md tells a user to (the installed-wheel test runs it from a wheel)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import user_env

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # five CLI processes, each importing Dagster


def _instance(*args: str, home: Path | None = None) -> subprocess.CompletedProcess:
    env = user_env(**({"DAGSTER_HOME": str(home)} if home else {}))
    if home is None:
        env.pop("DAGSTER_HOME", None)
    return subprocess.run([sys.executable, "-m", "batch_assets.instance", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_config_goes_into_dagster_home_and_a_users_own_is_never_overwritten(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = _instance(home=home)
    assert first.returncode == 0 and "wrote" in first.stdout, first.stderr
    assert (home / "dagster.yaml").read_bytes() == (ROOT / "dagster.yaml").read_bytes()
    assert "already up to date" in _instance(home=home).stdout

    own = "storage:\n  postgres: {}\n"  # a user's own settings: kept unless --force
    (home / "dagster.yaml").write_text(own)
    refused = _instance(home=home)
    assert refused.returncode == 1 and "--force" in refused.stderr and str(home / "dagster.yaml") in refused.stderr
    assert (home / "dagster.yaml").read_text() == own
    assert _instance(str(home), "--force").returncode == 0
    assert (home / "dagster.yaml").read_bytes() == (ROOT / "dagster.yaml").read_bytes()


def test_without_a_folder_or_dagster_home_it_says_what_to_give() -> None:
    proc = _instance()
    assert proc.returncode == 2 and "DAGSTER_HOME" in proc.stderr
