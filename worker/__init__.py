"""gpuest worker."""
