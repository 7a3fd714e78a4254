"""Loss spikes in Adam from second-moment decoupling: five stages and a gradient-directional-curvature predictor"""
from pipelines.adamspike.pipeline import create_pipeline

__all__ = ["create_pipeline"]
