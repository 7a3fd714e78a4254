"""PRISM: gauge-invariant tangent-space DP for LoRA (the contract: spec.py)."""
