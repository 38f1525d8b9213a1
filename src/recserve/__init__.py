"""recserve: real-time sequential recommendations, from interaction logs to NVIDIA Triton."""

__version__ = "0.1.0"
