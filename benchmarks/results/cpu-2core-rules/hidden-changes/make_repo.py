"""A 100k-item random run served fused and native (recserve's backend) with an embedded store, for hide_latency."""

import sys
from pathlib import Path

from recserve.bench.synthetic import make_random_run
from recserve.pipeline import repository_from_run
from recserve.serving.triton_repository.repository_settings import RepositorySettings
from recserve.sessions import embedded_store

root = Path(sys.argv[1])
run = make_random_run(root / "run", num_items=100_000, hidden=64, layers=2, heads=2, window=20)
embedded_store.start(root / "store")
settings = RepositorySettings(session_store=str(root / "store"), native_runtime="recserve", native_instance_count=2)
repository_from_run(run, root / "repo", ("fused", "native"), settings, "torchscript", "fp32")
print("ok")
