"""Learned KV-cache indexer with latent memory for bounded-KV long-context inference (IndexMem; the contract: spec.py)."""
