"""Attention: training, prefill and decode.

qkv.py (the joint q/k/v product and RoPE), attention.py (causal GQA attention: forward, backward, NumPy
reference, GPU dispatch) and decode_attention.py (one decode step against the KV cache). On the GPU:
flash_attention.py (every FlashAttention launcher: flash_attention.cu exact fp32, _tf32.cu, _bf16.cu, with
flash_common.cuh), flash_attention_sm90.py + .cu (Hopper: wgmma.cuh, TMA through tma.cuh and
tensor_map.py), decode_attention_cuda.py over decode_attention.cu.
"""
