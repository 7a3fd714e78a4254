"""WeDLM: diffusion decoding on causal attention with streaming commits (the contract: spec.py)."""
