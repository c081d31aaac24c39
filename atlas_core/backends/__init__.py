"""Array backends (the GpuBackend plug point) and backend selection."""
