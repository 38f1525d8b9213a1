"""Serving: the framework-free predictor and the Triton and SageMaker shells around it."""
