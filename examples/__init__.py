"""Example problems and kernels (RMSNorm on Hopper)."""
