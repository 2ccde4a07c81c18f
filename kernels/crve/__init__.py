"""Cluster-robust variance estimation: the wild (cluster) bootstrap and the CGM Monte Carlo (docs/crve.md)."""

BOOTSTRAP_KIND = "crve_bootstrap"
MONTECARLO_KIND = "crve_montecarlo"
