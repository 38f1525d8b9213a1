"""Training (Lightning), ranking metrics and evaluation protocols."""
