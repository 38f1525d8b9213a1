"""The floor of artifacts: one module a folder or wire format that passes between stages, each written and read
only there. ``catalogue`` (``item_ids.npy`` and its ID type), ``run_record`` (a run's ``run.json``),
``export_manifest`` (an export's ``export.json``), ``served`` (the served models' contracts and the layouts as
their clients see them) and ``repository_record`` (a repository's ``recserve.json``). The stages import these
and the names layer, never each other's files."""
