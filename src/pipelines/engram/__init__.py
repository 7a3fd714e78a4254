"""AI Engram: closed-form memory traces W·Σ_S·Σ_R⁺ — erase and compose memories by linear arithmetic (the contract: spec.py)."""
