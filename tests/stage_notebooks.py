"""A tiny stage notebook for the tests of `storybias.cli run-stage` (papermill with the storybias kernel)."""

from __future__ import annotations

import nbformat


def tiny_stage_notebook(parameters: str, body: str) -> nbformat.NotebookNode:
    """A notebook with a tagged parameters cell and one code cell, runnable by papermill."""
    nb = nbformat.v4.new_notebook(
        metadata={
            "kernelspec": {"name": "storybias", "language": "python", "display_name": "storybias"},
            "language_info": {"name": "python"},
        }
    )
    cell = nbformat.v4.new_code_cell(parameters)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, nbformat.v4.new_code_cell(body)]
    return nb
