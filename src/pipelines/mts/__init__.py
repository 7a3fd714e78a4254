"""Meta-learned training-data selection over real + synthetic data: meta-gradient GSNR vs batch size and informative features"""
