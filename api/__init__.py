"""gpuest api."""
