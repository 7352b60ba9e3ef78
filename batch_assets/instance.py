"""The instance config this product is tested with (run queue, pools, run retries), put into a DAGSTER_HOME:

    python -m batch_assets.instance [FOLDER]        (default: $DAGSTER_HOME)

Dagster reads `dagster.yaml` from $DAGSTER_HOME; without it a project runs with Dagster's defaults: no run queue,
so two runs of one partition are not kept apart, no pool limits on an endpoint, no run retries. The file ships in the
wheel as `batch_assets/dagster.yaml` (setup.py copies the repository's top-level one there); in a checkout installed
in editable mode the repository's own file is the one used. An existing, different `dagster.yaml` is never
overwritten unless `--force` is given: it may hold the user's own storage or launcher settings.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

FILE = "dagster.yaml"


def instance_config() -> Path:
    """The shipped dagster.yaml: inside the installed package, else (an editable checkout) the repository's."""
    package = Path(__file__).resolve().parent
    for candidate in (package / FILE, package.parent / FILE):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no {FILE} in {package} (the wheel ships it) nor in {package.parent} (a checkout): "
                            "reinstall batch-assets")


def install_instance_config(home: Path, force: bool = False) -> tuple[Path, bool]:
    """Copy the config into `home` (created if missing); (its path, whether it was written)."""
    source = instance_config()
    target = home / FILE
    if target.exists() and target.read_bytes() == source.read_bytes():
        return target, False
    if target.exists() and not force:
        raise FileExistsError(f"{target} exists and differs from the config this product ships ({source}); "
                              "merge the two by hand, or run again with --force to replace it")
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return target, True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m batch_assets.instance", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", help="the DAGSTER_HOME folder (default: $DAGSTER_HOME)")
    parser.add_argument("--force", action="store_true", help="replace a dagster.yaml that differs")
    args = parser.parse_args(argv)
    folder = args.folder or os.environ.get("DAGSTER_HOME")
    if not folder:
        parser.error("give the folder, or set DAGSTER_HOME (the folder Dagster reads dagster.yaml from)")
    try:
        target, written = install_instance_config(Path(folder).expanduser().resolve(), args.force)
    except FileExistsError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"{'wrote' if written else 'already up to date:'} {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
