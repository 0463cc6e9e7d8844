"""Generates the protobuf/gRPC stubs before setuptools collects the package (metadata is in
pyproject.toml). Without the repository's proto/ directory (an sdist), the stubs already in the
tree are used."""

import os
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithStubs(build_py):
    def run(self):
        subprocess.run(["bash", os.path.join(HERE, "generate_stubs.sh")], check=True)
        super().run()


setup(cmdclass={"build_py": BuildPyWithStubs})
