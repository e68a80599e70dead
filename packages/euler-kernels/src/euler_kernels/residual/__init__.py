"""The residual add: residual.py (no kernel of its own; on the GPU it is fused into residual_rmsnorm)."""
