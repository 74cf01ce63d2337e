"""The README's library snippet runs, and the library pulls in nothing but its four dependencies."""

import pathlib
import re
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_readme_python_snippet_runs():
  blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
  assert blocks, "README has no python snippet"
  for block in blocks:
    exec(compile(block, "README.md", "exec"), {})


def test_library_depends_only_on_jax_flax_chex_numpy():
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  names = {re.split(r"[<>=!~ \[]", dep)[0] for dep in project["dependencies"]}
  assert names == {"jax", "flax", "chex", "numpy"}
  code = ("import sys, attention_jax; "
          "print(sorted({m.split('.')[0] for m in sys.modules} & "
          "{'optax', 'tensorflow', 'tensorflow_datasets', 'ml_collections', 'matplotlib', "
          "'orbax', 'torch', 'experiments'}))")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=True)
  assert result.stdout.strip() == "[]", result.stdout


def test_every_public_function_and_class_documents_an_example():
  import inspect
  import attention_jax
  for name in dir(attention_jax):
    obj = getattr(attention_jax, name)
    if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
      continue
    assert ">>>" in (obj.__doc__ or ""), f"attention_jax.{name} has no example in its docstring"


def test_api_reference_is_current():
  result = subprocess.run([sys.executable, "scripts/api_reference.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True)
  assert result.returncode == 0, result.stderr
