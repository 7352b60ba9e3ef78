"""The product's telemetry switch (resources/telemetry.py) in one process, fast: importing the product, then
OpenVINO, in a user's environment (no `CI`) with a fresh home folder, sends nothing and writes nothing under the
home folder; a process that imported OpenVINO first sends its import event (nothing the product can undo) but no
later one. The whole product, every launch path, is tests/test_nothing_phones_home.py.

Shown red once each: with `import batch_assets.resources.telemetry` taken out of batch_assets/__init__.py and
resources/__init__.py, both failed (the first recorded the www.google-analytics.com attempts; the second saw a second
sending child); with the already-imported branch not switching `consent` off, the second failed (2 sending children).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import user_env
from tests.daemon_helpers import ROOT, with_net_audit
from tests.daemon_site import net_audit

# No sleeps needed: OpenVINO queues each event on a thread pool when it is sent (if consent holds at that moment),
# and the pool finishes its queue at exit, so every event sent is seen by the audit before the process ends.
PRODUCT_FIRST = '''
    import batch_assets
    import openvino
'''
OPENVINO_FIRST = '''
    import openvino
    import batch_assets
    from openvino.tools.ovc.telemetry_utils import init_ovc_telemetry
    init_ovc_telemetry("OpenVINO").send_event("ov", "after", "the product was imported")
'''


def _run(tmp_path: Path, script: str) -> tuple[list[dict], Path, str]:
    home, audit = tmp_path / "home", tmp_path / "audit.jsonl"
    home.mkdir()
    env = with_net_audit(user_env(HOME=str(home)), audit)
    assert "CI" not in env
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [r for r in net_audit.read(str(audit)) if r["kind"] == "outside"], home, proc.stdout


def test_the_product_imported_first_turns_openvino_telemetry_off(tmp_path: Path) -> None:
    outside, home, _ = _run(tmp_path, PRODUCT_FIRST)
    assert outside == [], [(r["event"], r["host"]) for r in outside]
    assert not (home / "intel").exists()


def test_openvino_imported_first_sends_no_event_after_the_product_is_imported(tmp_path: Path) -> None:
    outside, _, _ = _run(tmp_path, OPENVINO_FIRST)
    # the import event left before the product could act (so the audit sees it: this machine would send it) ...
    assert any(r["host"] == "www.google-analytics.com" for r in outside), outside
    # ... and none after: every attempt was made before the product was imported, by the import event's one child
    assert len({r["pid"] for r in outside}) == 1, [(r["pid"], r["event"]) for r in outside]
