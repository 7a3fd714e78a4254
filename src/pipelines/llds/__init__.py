"""LLDS: gated likelihood-preserving regulariser against lazy likelihood displacement in GRPO."""
