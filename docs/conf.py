"""The docs site (``make docs``): Sphinx with MyST Markdown pages, as verl's docs are built, so that docstrings'
Sphinx roles render; the configuration and metrics references are generated at build time from where they are
declared (``docs/_ext/references.py``), so they cannot drift from the code."""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS.parent), str(DOCS / "_ext")]

project = "DAPO for verl"
extensions = ["myst_parser", "references"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "figures"]
myst_heading_anchors = 3
html_theme = "alabaster"
html_title = project
