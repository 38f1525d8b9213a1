"""Export of the inference graph to serving backends, parity validation and the speed/accuracy report."""
