"""The optimizer step: adamw.py, muon.py with newton_schulz.py, grad_norm.py (norm and clip),
grad_accumulate.py (micro-batch sums) and step_control.py (the device-side skip and scale). Launchers and
kernels: multi_tensor.py + .cu (AdamW, the sum of squares, the clip and the step control, each over a whole
list of tensors in one launch), muon_cuda.py + muon.cu, newton_schulz_cuda.py + .cu, grad_accumulate_cuda.py
+ .cu; the tables the multi-tensor kernels read are euler_kernels.cuda.tables'.
"""
