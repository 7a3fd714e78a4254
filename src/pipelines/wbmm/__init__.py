"""WBMM: windowed batch matrix multiplication vs large-kernel depthwise convolution (operator benchmark + small accuracy check; the contract: spec.py)."""
