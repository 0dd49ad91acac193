"""The stories explorer (``make explorer``): one self-contained HTML page to browse a run's stories, their
extractions and its associations, its own product beside the figures (stage 08). ``data`` builds what the
page shows from the run's artifacts, ``page`` fills the page's files (``assets/``: HTML, CSS,
JavaScript) with it and writes ``figures/<run>/explorer.html``."""

from __future__ import annotations

from storybias.stages.explorer.page import build_explorer, explorer_payload, render_html

__all__ = ["build_explorer", "explorer_payload", "render_html"]
