"""Generates the gRPC stubs from the repository's proto/ when the package is built (they
are not checked in): `python3 -m build --no-isolation --wheel` or `pip install .` run
gen_stubs.py into gpumove/v1/ first (before setuptools looks for the package's folders)."""
import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_stubs  # noqa: E402

gen_stubs.generate(gen_stubs.HERE)
setup()
