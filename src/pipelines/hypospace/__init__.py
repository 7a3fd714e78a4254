"""HypoSpace: Validity, Uniqueness and Recovery of set-valued hypothesis samplers (the contract: spec.py)."""
