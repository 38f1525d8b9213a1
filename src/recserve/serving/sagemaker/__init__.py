"""SageMaker's containers: the handler, what /invocations takes, model.tar.gz packaging, and local
endpoints run as each container runs its package."""
