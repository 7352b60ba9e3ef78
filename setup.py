"""The package layout, which pyproject.toml cannot express on its own: the repository keeps the model providers in
the top-level `resources/` folder (the product's layout), and they install as `batch_assets.resources`, so the only
import name this product puts into a virtualenv is `batch_assets` (a top-level `resources` would collide with a
user's own module). The repository's instance config, `dagster.yaml`, is kept at the top (where `make ui`, the demo
and the tests use it) and shipped inside the package as `batch_assets/dagster.yaml`, so an installed wheel carries
it (`python -m batch_assets.instance` puts it into a DAGSTER_HOME). Everything else is in pyproject.toml."""

from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

INSTANCE_CONFIG = "dagster.yaml"


class BuildWithInstanceConfig(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable checkout reads the repository's own file (batch_assets/instance.py)
            return
        if not Path(INSTANCE_CONFIG).is_file():  # an sdist without it would ship a package that cannot set up an instance
            raise FileNotFoundError(f"{Path(INSTANCE_CONFIG).resolve()} is missing: the wheel ships it as "
                                    f"batch_assets/{INSTANCE_CONFIG}")
        target = Path(self.build_lib) / "batch_assets" / INSTANCE_CONFIG
        target.parent.mkdir(parents=True, exist_ok=True)
        self.copy_file(INSTANCE_CONFIG, str(target))


packages = find_packages(include=["batch_assets", "batch_assets.*"]) + [
    f"batch_assets.{name}" for name in find_packages(include=["resources", "resources.*"])]
setup(packages=packages, package_dir={"batch_assets.resources": "resources"},
      cmdclass={"build_py": BuildWithInstanceConfig})
