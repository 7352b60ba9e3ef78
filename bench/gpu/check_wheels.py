"""Checks, here, the wheels carried to a lent GPU machine (bench/gpu/run_on_device.sh installs them there with
`pip --no-deps`, so nothing there would say what is missing until an import fails, minutes into the device time):

1. every wheel installs on the device's CPython 3.12 x86_64 (cp312, abi3 or py3 tags; manylinux x86_64 or any);
2. one version of each distribution (two stop the whole install);
3. pip's own resolver finds every requirement of the carried wheels and of our package's core dependencies
   (pyproject.toml: run_on_device.sh installs the package with --no-deps too) among them and the device's
   packages: it runs `pip install --dry-run --no-index` for Python 3.12 over the wheels plus empty stand-in wheels
   of the device's packages (bench/gpu/device_packages.txt; a version not recorded there is assumed to be this venv's, and listed).

    .venv/bin/python bench/gpu/check_wheels.py /work/main/.gpu/wheels
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

HERE = Path(__file__).resolve().parent
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_28_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_35_x86_64", "manylinux1_x86_64"]


def device_packages() -> tuple[dict[str, str], list[str]]:
    """{name: version} of the device's image, and the names whose version was assumed from this venv."""
    out, assumed = {}, []
    for line in (HERE / "device_packages.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, version = line.partition("==")
        if not version:
            try:
                version = md.version(name)
            except md.PackageNotFoundError:
                version = "0"
            assumed.append(f"{name}=={version}")
        out[canonicalize_name(name)] = version
    return out, assumed


def core_dependencies() -> list[str]:
    import tomllib

    return tomllib.loads((HERE.parents[1] / "pyproject.toml").read_text())["project"]["dependencies"]


def stub_wheel(folder: Path, name: str, version: str) -> None:
    """An empty wheel that only says `name==version` is installed, for pip's resolver."""
    dist = f"{name.replace('-', '_')}-{version}"
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as z:
        z.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: stub\nRoot-Is-Purelib: true\n"
                   "Tag: py3-none-any\n")
        z.writestr(f"{dist}.dist-info/RECORD", "")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("wheels", type=Path)
    args = ap.parse_args()
    problems: list[str] = []
    carried: dict[str, str] = {}
    total = 0
    for whl in sorted(args.wheels.glob("*.whl")):
        name, version, _build, tags = parse_wheel_filename(whl.name)
        total += whl.stat().st_size
        if not any(t.interpreter in ("cp312", "py3", "py2.py3") and t.abi in ("cp312", "abi3", "none")
                   and (t.platform == "any" or t.platform.endswith("x86_64") and "linux" in t.platform)
                   for t in tags):
            problems.append(f"{whl.name}: no tag installs on CPython 3.12 x86_64 Linux")
        if name in carried:
            problems.append(f"two wheels of {name} ({carried[name]} and {version}): pip --target would stop")
        carried[name] = str(version)
    device, assumed = device_packages()
    shadowed = sorted(n for n in carried if n in device)
    print(f"{len(carried)} wheels, {total / 2**20:.1f} MiB; carried over a device package (ours shadow theirs on "
          f"PYTHONPATH): {shadowed or 'none'}")
    print(f"device versions assumed from this venv ({len(assumed)}): {' '.join(assumed)}")
    with tempfile.TemporaryDirectory() as tmp:
        stubs = Path(tmp) / "stubs"
        stubs.mkdir()
        for name, version in device.items():
            if name not in carried:
                stub_wheel(stubs, name, version)
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(Path(tmp) / "r.json"),
               "--no-index", "--find-links", str(args.wheels), "--find-links", str(stubs), "--python-version", "3.12",
               "--implementation", "cp", "--abi", "cp312", *[f"--platform={p}" for p in PLATFORMS],
               "--only-binary=:all:", "--target", str(Path(tmp) / "target"),
               *[f"{n}=={v}" for n, v in carried.items()], *core_dependencies()]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            problems.append("pip's resolver over the wheels and the device's packages failed:\n" + proc.stderr[-3000:])
        else:
            import json

            report = json.loads((Path(tmp) / "r.json").read_text())
            names = sorted(canonicalize_name(i["metadata"]["name"]) for i in report["install"])
            from_device = [n for n in names if n not in carried]
            print(f"pip resolved {len(names)} distributions: {len(names) - len(from_device)} carried, "
                  f"{len(from_device)} from the device: {' '.join(from_device)}")
    for p in problems:
        print("PROBLEM:", p)
    print("OK" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
