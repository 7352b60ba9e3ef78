"""The package layout, which pyproject.toml cannot express on its own: the repository keeps the model providers in
the top-level `resources/` folder (the product's layout), and they install as `batch_assets.resources`, so the only
import name this product puts into a virtualenv is `batch_assets` (a top-level `resources` would collide with a
user's own module). Everything else about the package is in pyproject.toml."""

from setuptools import find_packages, setup

packages = find_packages(include=["batch_assets", "batch_assets.*"]) + [
    f"batch_assets.{name}" for name in find_packages(include=["resources", "resources.*"])]
setup(packages=packages, package_dir={"batch_assets.resources": "resources"})
