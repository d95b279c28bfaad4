"""Build configuration that pyproject.toml cannot state: the built-in recipes.

The recipes stay at the top of the checkout (``recipes/``) and ship inside the package as
``orchestrator/_recipes`` (package data, found with ``importlib.resources``; see
``orchestrator/recipes.py``). Everything else is in pyproject.toml.
"""
from setuptools import find_namespace_packages, setup

setup(
    packages=[*find_namespace_packages(include=["orchestrator", "orchestrator.*"]),
              "orchestrator._recipes"],
    package_dir={"orchestrator._recipes": "recipes"},
)
