"""SageMaker: the handler, model.tar.gz packaging, a local endpoint and deployment."""
