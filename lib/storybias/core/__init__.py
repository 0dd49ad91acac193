"""The base layer: where a run's files live (``paths``), how they are written safely (``io``: atomic
writes, append-only shards), the run lock (``locks``), the registry of stages and artifacts
(``artifacts``) and the one reader of story-table files, with short messages (``inputs``). Nothing here
imports another part of storybias."""
