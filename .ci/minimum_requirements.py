"""Prints the library's declared minimum versions (pyproject.toml's dependencies, ">=" read as
"==") and the test tools' pins from requirements.txt: what the minimum-version job installs."""

import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
TEST_TOOLS = ("pytest", "pytest-xdist", "execnet", "hypothesis", "filelock")

dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
for requirement in dependencies:
  name, floor = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9][^,;\s]*)", requirement).groups()
  print(f"{name}=={floor}")
  if name == "jax":
    print(f"jaxlib=={floor}")
for line in (ROOT / "requirements.txt").read_text().splitlines():
  if line.split("==")[0].strip() in TEST_TOOLS:
    print(line.split("#")[0].strip())
