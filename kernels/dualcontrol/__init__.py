"""The dual-control (learning and control) dynamic programme (docs/dualcontrol.md)."""

SOLVE_KIND = "dualcontrol_solve"
