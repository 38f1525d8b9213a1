"""The Triton server: the bundled binary and its backends found, started, watched and stopped."""
