"""FeatJND: task-aligned just-noticeable-difference maps for deep features at a split point (the contract: spec.py)."""
