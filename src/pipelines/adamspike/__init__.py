"""Loss spikes in Adam from second-moment decoupling: five stages and a gradient-directional-curvature predictor (the contract: spec.py)."""
