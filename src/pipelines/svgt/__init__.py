"""Stable value guidance: an independent value module steers a frozen LM through learnable bridge tokens (the contract: spec.py)."""
