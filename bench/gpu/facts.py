"""What the lent machine has (printed first by run_on_device.sh): Python, the GPU as torch sees it, and the versions
of the image's packages that check_wheels.py could only assume (bench/gpu/device_packages.txt)."""

import importlib.metadata as md
import os
import sys

NAMES = ("torch transformers sentence-transformers tokenizers accelerate pyarrow pandas numpy protobuf grpcio "
         "setuptools pillow psutil fsspec filelock aiohttp pyyaml click typing-extensions")


def version(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "MISSING"


if __name__ == "__main__":
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    print(f"python {sys.version.split()[0]} at {sys.executable}; {os.cpu_count()} CPUs; {gpu}")
    print(" ".join(f"{n}={version(n)}" for n in NAMES.split()))
