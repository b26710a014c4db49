"""Package layout: the top-level source folders map onto `fedldp.*` (see DESIGN.md).

Everything else lives in pyproject.toml; this file only computes the package list,
which setuptools cannot express declaratively for several source roots.
"""

from setuptools import find_packages, setup

# Python package -> the folder that holds its source. The ONE list of package folders:
# deploy/Containerfile copies each (and .dockerignore admits it); tests/deploy/
# test_containerfile.py builds the wheel from exactly what the Containerfile copies.
SOURCE_ROOTS = {
    "fedldp": "fedldp",
    "fedldp.client": "client",
    "fedldp.collector": "collector",
    "fedldp.aggregator": "aggregator",
    "fedldp.authoring": "authoring",
    "fedldp.v1": "proto/fedldp/v1",
}

packages: list[str] = []
package_dir: dict[str, str] = {}
for package, folder in SOURCE_ROOTS.items():
    packages.append(package)
    package_dir[package] = folder
    packages.extend(f"{package}.{sub}" for sub in find_packages(folder))

setup(packages=packages, package_dir=package_dir)
