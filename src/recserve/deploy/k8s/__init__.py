"""Kubernetes: manifests for Triton replicas serving a recserve repository, from one settings object."""
