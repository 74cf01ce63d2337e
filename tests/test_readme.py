"""The README's library snippet runs, and the library pulls in nothing but its four dependencies."""

import pathlib
import re
import subprocess
import sys
import tomllib

import pytest

pytestmark = pytest.mark.quick  # in the quick subset: python -m pytest -q -n 2 -m quick

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


def test_the_guides_python_snippets_run():
  for page in sorted((ROOT / "docs").rglob("*.md")):
    for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.S):
      exec(compile(block, str(page.relative_to(ROOT)), "exec"), {})


def test_the_repository_url_is_pyproject_s_everywhere():
  """pyproject.toml's [project.urls] holds the repository's address; the README, the notebook and
  the docs use that one, and the README's images are absolute (it is shown off-site too)."""
  urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
  repository, documentation = urls["Repository"], urls["Documentation"]
  readme = (ROOT / "README.md").read_text()
  assert f'pip install "git+{repository}"' in readme
  notebook = (ROOT / "notebooks" / "colab_quickstart.ipynb").read_text()
  texts = {"README.md": readme, "notebooks/colab_quickstart.ipynb": notebook}
  texts.update({str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "docs").rglob("*.md")})
  assert repository in texts["notebooks/colab_quickstart.ipynb"]
  for name, text in texts.items():
    for url in re.findall(r"https?://(?:github\.com|raw\.githubusercontent\.com|colab\.research"
                          r"\.google\.com/github)/[\w.-]+/[\w.-]+", text):
      owner_repo = "/".join(url.split("/")[-2:])
      assert repository.endswith("/" + owner_repo), f"{name}: {url} is not {repository}"
    for url in re.findall(r"https?://[\w.-]*readthedocs\.io", text):
      assert url == documentation, f"{name}: {url} is not {documentation}"
  for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme):
    assert image.startswith("https://"), f"README image {image} is relative: it breaks off-site"


def test_the_first_screen_commands_are_the_same_in_the_readme_and_the_docs_index():
  """What a newcomer runs first (install, the main job, the quick tests) is said once, in both."""
  first = lambda text: re.search(r"```bash\n(.*?)```", text, re.S).group(1)
  readme = first((ROOT / "README.md").read_text())
  assert "pip install -r requirements.txt" in readme and "experiments.train" in readme
  assert "pytest" in readme
  assert first((ROOT / "docs" / "index.md").read_text()) == readme
