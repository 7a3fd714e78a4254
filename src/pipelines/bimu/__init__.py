"""BiMU: metaplastic Bayesian binary NN with bounded-memory updates for online continual and active learning (the contract: spec.py)."""
