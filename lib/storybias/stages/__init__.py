"""One package per pipeline stage, each with its ``run()`` (stage 08's ``figures`` draws from the
artifacts only): ``generate``, ``filter``, ``extract``, ``associations``, ``metrics``, ``probes``,
``figures``. No stage imports another; they share the layers below (``stats``, ``engines``,
``evidence``, ``config``, ``core``) and read each other's results as artifacts."""
