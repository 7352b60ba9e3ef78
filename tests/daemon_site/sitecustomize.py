"""What the tests' processes get from this folder on PYTHONPATH: each part is off unless its variable is set.

1. `BATCH_TEST_NET_AUDIT=<file>`: every attempt to reach another host is written to the file (net_audit.py).
2. `BATCH_TEST_BACKFILL_INTERVAL_S`: the test instances' shorter backfill-daemon interval, for the processes the
   tests start under `dagster dev`.

Dagster's backfill daemon waits a fixed 30 s between iterations (`DEFAULT_DAEMON_INTERVAL_SECONDS` of
dagster/_daemon/controller.py, read by backfill.py at each iteration; dagster.yaml has no setting for it), so a
backfill the tests launch was submitted, and then seen finished, up to 30 s late: minutes of an idle test worker per
run of the suite. When `BATCH_TEST_BACKFILL_INTERVAL_S` is set, this module (put on PYTHONPATH by
tests/daemon_helpers.dev_server) sets that constant as soon as `dagster._daemon.controller` is imported; it is also
the asset daemon's interval where dagster.yaml sets none. Test instances poll their run queue every second instead
of 5 s for the same reason (TEST_INSTANCE_OVERRIDES). The daemon's code is otherwise Dagster's own; production and
`make ui` outside the tests never load this file.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

if os.environ.get("BATCH_TEST_NET_AUDIT"):
    from net_audit import install

    install(os.environ["BATCH_TEST_NET_AUDIT"])

_MODULE = "dagster._daemon.controller"
_ENV = "BATCH_TEST_BACKFILL_INTERVAL_S"


class _PatchAfterLoad(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            module.DEFAULT_DAEMON_INTERVAL_SECONDS = float(os.environ[_ENV])

        spec.loader.exec_module = exec_and_patch
        return spec


if os.environ.get(_ENV):
    sys.meta_path.insert(0, _PatchAfterLoad())
