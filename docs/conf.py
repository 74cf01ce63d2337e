"""Sphinx configuration: the attention-jax documentation site.

Build it from the repository root (what .ci/run and Read the Docs run):

  pip install -r requirements.txt -r docs/requirements.txt
  sphinx-build -W --keep-going -n -b html docs docs/_build/html
"""

import os
import re
import sys
import shutil
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # attention_jax and experiments from this checkout

with open(os.path.join(ROOT, "pyproject.toml"), "rb") as file:
  _PROJECT = tomllib.load(file)["project"]

project = "attention-jax"
author = "The attention-jax authors"
copyright = "The attention-jax authors"  # pylint: disable=redefined-builtin
release = version = _PROJECT["version"]
REPOSITORY = _PROJECT["urls"]["Repository"]

extensions = [
    "myst_nb",  # Markdown pages (MyST) and the notebook (executed: nb_execution_mode below)
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # MathJax served from _static/: formulas render with no network
    "sphinx_copybutton",
]

exclude_patterns = [
    "_build",
    "api/_public.rst",  # included by api/index.md
    "guides/_kernels.md",  # the support table, written below, included by two guides
    # The sweeps' and scripts' own outputs: the results pages include them.
    "results/*/results.md",
    "results/*/*/results.md",
    "results/*/logit_maxima.md",
    "results/*/*/logit_maxima.md",
    "results/theory_checks.md",
    "results/diagnostics/*/head_diagnostics.md",
    "results/*/predictions.md",
    "results/*/*/predictions.md",
    "results/*/probe.md",
    "results/*/predictions_*.md",
    "results/*/*/verdicts.md",
    "results/heads_binding/importance/importance.md",
]
templates_path = []
smartquotes = False  # command lines in docstrings keep their "--" and quotes

# Markdown and notebooks.
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
# The Colab notebook is executed at every build in its quick mode (the smallest settings, on the
# build machine's CPU, about a minute), so the site shows it with the outputs of this checkout.
# The notebook finds this checkout (a parent of docs/notebooks/) and installs nothing in quick mode.
os.environ.setdefault("ATTENTION_JAX_QUICK", "1")
# The notebook's own quick-mode workdir (relative, inside the checkout, under the ignored runs/),
# so the page shows the folder its code names and no path of the build machine; emptied first,
# so that the page shows a run rather than "already finished".
if "ATTENTION_JAX_WORKDIR" not in os.environ:
  shutil.rmtree(os.path.join(ROOT, "runs", "colab_quick"), ignore_errors=True)
nb_execution_mode = "force"
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_merge_streams = True


def _join_streams(outputs):
  """A cell's messages to each stream joined as Jupyter shows them: as written, then each
  carriage return and backspace applied, the streams in the order they began. (myst-nb's own
  coalescing ends every message with a newline first, so each redraw of a progress bar, a
  message of its own, stayed on the page as a line; and it moves stdout before stderr, which put
  the task's generation under the training it preceded.)"""
  joined, streams = [], {}
  for output in outputs or []:
    if output["output_type"] != "stream":
      joined.append(output)
    elif output["name"] in streams:
      streams[output["name"]]["text"] += output["text"]
    else:  # a copy: the execution cache keeps its own
      streams[output["name"]] = type(output)(output)
      joined.append(streams[output["name"]])
  for stream in streams.values():
    text = stream["text"]
    while re.search(r"[^\n\x08]\x08", text):  # a backspace takes back the character before it
      text = re.sub(r"[^\n\x08]\x08", "", text)
    stream["text"] = re.sub(r"[^\n]*\r(?=[^\n])", "", text).rstrip() + "\n"
  return joined


import myst_nb.core.render  # noqa: E402 -- patched here, before any notebook is rendered

myst_nb.core.render.coalesce_streams = _join_streams
nb_render_markdown_format = "myst"  # the notebook's Markdown outputs hold tables

# The API reference, from the docstrings.
autosummary_generate = True
autosummary_ignore_module_all = False
autodoc_default_options = {"members": True, "undoc-members": True}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # Linen modules' "Attributes:" are their dataclass fields

# Broken references fail the build (-n with -W). References into other projects' docs are not
# resolved (no intersphinx: the build works offline), so their types are left as plain text.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(jax|jaxlib|flax|numpy|np|jnp|chex|optax|ml_collections|orbax|nn|nnx)(\..*)?"),
    (r"py:.*", r"(Any|Callable|Mapping|Sequence|Iterable|Iterator|Literal|Optional|Union)"),
    (r"py:.*", r"(typing|collections|dataclasses|enum|pathlib|os)\..*"),
    (r"py:class", r"(Array|ArrayLike|PRNGKey|Shape|Dtype|DTypeLike|PrecisionLike|Initializer)"),
    (r"py:.*", r"(attention_jax|experiments)(\..*)?\._.*"),  # private names
    (r"py:.*", r"_.*"),
    (r"py:class", r"(float|int|str|bool|dict|tuple|list|object|None)"),
]

html_theme = "sphinx_book_theme"
html_title = "attention-jax"
html_theme_options = {
    "repository_url": REPOSITORY,
    "use_repository_button": True,
    "show_toc_level": 2,
    "navbar_persistent": [],  # one search field (the sidebar's), not a second in the header
}
# The theme's colour mode: "auto" follows the reader's system (left empty, the theme logs "Got
# invalid theme mode" on every page and then picks auto itself).
html_context = {"default_mode": "auto"}
html_static_path = ["_static"]
html_css_files = ["custom.css"]  # code scrolls, never wraps mid-token; tables fit the column
html_js_files = ["figures.js",  # a linked figure opens full size instead of downloading
                 "long_tokens.js"]  # a code token wider than its box breaks after a slash
suppress_warnings = ["mystnb.unknown_mime_type"]

# Linen modules are dataclasses: their signatures end in Flax's own fields (parent, name), which
# are not arguments a user passes. Leave them out of the rendered signatures.
def _drop_linen_fields(app, what, name, obj, options, signature, return_annotation):
  del app, what, name, obj, options
  if signature and ", parent" in signature and signature.rstrip(")").split(", parent", 1)[1]:
    return signature[:signature.index(", parent")] + ")", return_annotation
  return None


def _write_public_names():
  """docs/api/_public.rst: the autosummary of the names ``attention_jax`` exports, read from its
  ``__init__.py`` (``from attention_jax.<module> import <name>``), so a new export appears by
  itself."""
  with open(os.path.join(ROOT, "attention_jax", "__init__.py")) as file:
    source = file.read()
  rows = [f"   ~attention_jax.{module}.{name}" for module, name in
          re.findall(r"^from attention_jax\.(\w+) import (\w+)$", source, re.M)]
  rows += [f"   ~attention_jax.{module}" for module in
           re.findall(r"^from attention_jax import (\w+)$", source, re.M)]
  text = ".. autosummary::\n   :nosignatures:\n\n" + "\n".join(rows) + "\n"
  path = os.path.join(ROOT, "docs", "api", "_public.rst")
  if not os.path.exists(path) or open(path).read() != text:
    with open(path, "w") as file:
      file.write(text)


_write_public_names()


def _write_support_table():
  """docs/guides/_kernels.md: the support table, one entry per record of attention.KERNELS (what
  it is, where it runs and is chosen, its transforms, what it does not serve), so that the guides
  cannot drift from what the dispatch does. A list, not a table: six columns of sentences do not
  fit a page."""
  from attention_jax import attention  # pylint: disable=g-import-not-at-top
  runs_on = {None: "everywhere", "gpu": "NVIDIA GPUs", "tpu": "TPUs"}
  entries = []
  for kernel in attention.KERNELS.values():
    chosen = ("by the rules below" if kernel.backend is None else
              f"on {'compute capability ' * (kernel.backend == 'gpu')}{', '.join(kernel.measured_on)}" if kernel.measured_on else "no: by name only")
    if kernel.chosen_for:
      chosen += ", for " + " or ".join(attention.PARTS[part][0] for part in kernel.chosen_for)
    refused = [attention.PARTS[part][0] for part in attention.PARTS if part not in kernel.serves]
    refused += [f"{attention.PARTS[part][0]} (served when named, never chosen for it)"
                for part in kernel.named_only]
    entries.append(f"`\"{kernel.name}\"`\n: {kernel.about}.\n\n  **Runs on** "
                   f"{runs_on[kernel.backend]}; **chosen automatically** {chosen}; **transforms** "
                   f"{kernel.transforms}; **does not serve** "
                   f"{'; '.join(refused) or 'nothing it is asked (it serves every request)'}.")
  text = "\n\n".join(entries) + "\n"
  path = os.path.join(ROOT, "docs", "guides", "_kernels.md")
  if not os.path.exists(path) or open(path).read() != text:
    with open(path, "w") as file:
      file.write(text)


_write_support_table()


def setup(app):
  app.connect("autodoc-process-signature", _drop_linen_fields)
