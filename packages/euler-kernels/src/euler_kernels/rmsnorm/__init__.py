"""RMSNorm: rmsnorm.py and residual_rmsnorm.py (the residual add fused in front), their launcher
rmsnorm_cuda.py and kernels rmsnorm.cu."""
