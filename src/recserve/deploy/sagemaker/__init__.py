"""SageMaker in the cloud: the inference images by region, and deployment and invocation with boto3."""
