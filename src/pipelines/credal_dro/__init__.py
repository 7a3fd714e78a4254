"""Bulk-calibrated credal ambiguity sets: mean+sup robust objective as LP/SOCP (the contract: spec.py)."""
