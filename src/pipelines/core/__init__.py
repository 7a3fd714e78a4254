"""The platform shared by every method: registry, parameters, claims and report, MLflow logging,
runtime (seeding, threads, device), training loop, plots, datasets, scaffold. Import-light: heavy
libraries (torch, matplotlib, mlflow) are imported inside the modules that need them."""
