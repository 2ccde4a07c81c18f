"""gpuest cli."""
