"""atlas-gb10: the ``cuda`` backend of Atlas on CuPy, with kernels per hardware target."""
