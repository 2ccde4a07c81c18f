"""The self-controlled case series (docs/sccs.md)."""

FIT_KIND = "sccs_fit"
ANALYSES_KIND = "sccs_analyses"
ERAS_KIND = "sccs_eras"
