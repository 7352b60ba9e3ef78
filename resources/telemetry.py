"""Nothing phones home: the usage reporting of every library the product brings in is off in every process that
imports the product, whatever `CI` says, without writing to the user's home (docs/RELIABILITY.md, "Nothing phones
home").

Imported first by `resources/__init__.py` and `batch_assets/__init__.py`, so it runs before any of these libraries
is imported (they read their switches at import time), in the code server, every run worker, step process and pod:

- OpenVINO (`import openvino` -> openvino/tools/ovc/__init__.py) sends a Google Analytics event from a forked child
  and writes a client id under ~/intel, unless `CI=true` or a consent file under ~/intel says no. A missing consent
  file counts as consent; the forked child of a multithreaded process once deadlocked and held its parent at exit
  for 21 minutes. Its own fallback is used instead: ovc imports `openvino_telemetry` in a try block and, when that
  import fails, uses its no-op `telemetry_stub`. Blocking the import here (no consent file written, nothing sent,
  no child forked) keeps the user's home untouched.
- huggingface_hub / transformers: `HF_HUB_DISABLE_TELEMETRY` (and the generic `DO_NOT_TRACK`).
- vLLM's usage statistics (stats.vllm.ai): `VLLM_NO_USAGE_STATS`, `DO_NOT_TRACK`.
- Dagster's log upload (telemetry.dagster.io) in processes this product starts: `DAGSTER_DISABLE_TELEMETRY`. The
  webserver, daemon and `dg` do not import the product: the shipped dagster.yaml (`telemetry: enabled: false`, which
  `make ui` and `make demo` use, and which stops Dagster and `dg` writing the usage log that the webserver and
  daemon upload) and the Makefile's `DAGSTER_DISABLE_TELEMETRY` keep them quiet.
- onnxruntime reports only on Windows (ETW); resources/hf/onnx_encoder.py turns that off where it loads a session.

The variables are set in `os.environ`, so every process the product starts (run workers, step processes, Kubernetes
Jobs launched from here take the pod's own environment: each pod imports the product itself) inherits them.
"""

from __future__ import annotations

import os
import sys

OFF_SWITCHES: dict[str, str] = {
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DAGSTER_DISABLE_TELEMETRY": "1",
}
# Modules that send when imported; None in sys.modules makes `import x` raise ImportError, which OpenVINO's ovc
# catches to fall back to its no-op stub.
BLOCKED_MODULES = ("openvino_telemetry",)


def turn_off_telemetry() -> None:
    os.environ.update(OFF_SWITCHES)
    for name in BLOCKED_MODULES:
        if name in sys.modules and sys.modules[name] is not None:
            # Imported before the product (a user's own `import openvino` first): the import event is gone already,
            # but no later event leaves. The library keeps a singleton whose `consent` gates every send.
            telemetry = getattr(sys.modules[name], "Telemetry", None)
            instance = getattr(telemetry, "_SingletonMetaClass__single_instance", None)
            if instance is not None:
                instance.consent = False
            continue
        sys.modules[name] = None  # type: ignore[assignment]


turn_off_telemetry()
