"""MedTPE: lossless medical token-pair merges with embedding-only tuning."""
