"""`trsp`: fair transit stop placement (JR, core, ECA, GC-TrSP, λ-hybrid); the contract is in spec.py."""
