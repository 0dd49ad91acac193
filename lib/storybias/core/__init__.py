"""The base layer: where a run's files live (``paths``), how they are written safely (``io``: atomic
writes, append-only shards), the run lock (``locks``) and the registry of stages and artifacts
(``artifacts``). Nothing here imports another part of storybias."""
