"""Build configuration that pyproject.toml cannot state: where the built-in recipes go.

The recipes stay at the top of the checkout (``recipes/``) and ship inside the package as
``orchestrator/_recipes`` (package data, found with ``importlib.resources``; see
``orchestrator/recipes.py``). Everything else is in pyproject.toml.
"""
from setuptools import find_namespace_packages, setup

RECIPES = "orchestrator._recipes"

setup(
    packages=[*find_namespace_packages(include=["orchestrator", "orchestrator.*"]), RECIPES,
              *(f"{RECIPES}.{sub}" for sub in find_namespace_packages(where="recipes"))],
    package_dir={RECIPES: "recipes"},
)
