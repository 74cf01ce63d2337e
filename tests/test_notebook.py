"""The Colab notebook runs top to bottom on CPU at its smallest settings (ATTENTION_JAX_QUICK=1)."""

import os
import pathlib

import nbformat
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_colab_notebook_executes_in_quick_mode(tmp_path, monkeypatch):
  monkeypatch.setenv("ATTENTION_JAX_QUICK", "1")
  monkeypatch.setenv("ATTENTION_JAX_WORKDIR", str(tmp_path))
  monkeypatch.setenv("PYTHONPATH", str(ROOT))
  notebook = nbformat.read(ROOT / "notebooks" / "colab_quickstart.ipynb", as_version=4)
  NotebookClient(notebook, timeout=300, kernel_name="python3",
                 resources={"metadata": {"path": str(ROOT)}}).execute()
  outputs = [output for cell in notebook.cells if cell.cell_type == "code"
             for output in cell.outputs]
  text = "".join(output.get("text", "") for output in outputs)
  assert "JAX runs on the runtime's accelerator: cpu." in text  # the install cell checked it
  assert "implementation=None runs" in text
  # the notebook's form of the viewer, and each training's finished bar saved once
  assert "%load_ext tensorboard, then %tensorboard --logdir" in text
  finished = [line for line in text.splitlines() if "100%|" in line]
  assert finished and len(finished) == len(set(finished)), finished
  images = [output for output in outputs if "image/png" in output.get("data", {})]
  assert len(images) >= 5  # learning curves, two sweep plots, two attention maps
  markdown = "".join(output["data"].get("text/markdown", "") for output in outputs
                     if "data" in output)
  assert "| even_pairs-none |" in markdown and "length_61_80_accuracy" in markdown
  assert os.path.exists(tmp_path / "positional_quick" / "results.csv")
