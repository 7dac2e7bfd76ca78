"""Package layout for setuptools (metadata lives in pyproject.toml).

The `server/` and `tui/` folders sit at the top of the repository but install as
`ninfer_nb.server` and `ninfer_nb.tui`, so a wheel adds no top-level `server` / `tui` package.
Subpackages are found on disk, so a new folder with an `__init__.py` needs no edit here; `dev/` and
`tests/` are not packaged."""
from setuptools import find_packages, setup

MAPPED_FOLDERS = {"ninfer_nb.server": "server", "ninfer_nb.tui": "tui"}


def mapped_packages(package: str, folder: str) -> list[str]:
    return [package] + [f"{package}.{sub}" for sub in find_packages(folder)]


setup(
    packages=find_packages(include=["ninfer_nb", "ninfer_nb.*"])
    + [name for package, folder in MAPPED_FOLDERS.items() for name in mapped_packages(package, folder)],
    package_dir=MAPPED_FOLDERS,
    package_data={"ninfer_nb.tui": ["*.tcss"]},
)
