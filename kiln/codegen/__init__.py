"""Code generation: C++ kernels and the Python wrapper that calls them."""
