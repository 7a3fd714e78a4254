"""MESA: MoE safety alignment by expert capacity reallocation (the contract: spec.py)."""
