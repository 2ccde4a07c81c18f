"""Plots of finished jobs, drawn server-side with matplotlib from the stored result JSON and artifacts only
(never by running a kernel): one module per estimator, :mod:`plots.registry` for the lookup and rendering."""
