"""The Krusell-Smith heterogeneous-agent model (docs/ks.md)."""

SOLVE_KIND = "ks_solve"
