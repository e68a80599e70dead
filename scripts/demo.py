"""The quick start's main job. It grows with the project: for now it reports what exists."""

import importlib

for name in ["euler_bpe", "euler_kernels", "euler_model", "euler_data", "euler_train"]:
    module = importlib.import_module(name)
    print(f"{name} {module.__version__}")
