"""Deployment artifacts: Kubernetes manifests (Triton replicas, autoscaling, KServe) and monitoring."""
