"""A stand-in for NVIDIA Transformer Engine, for Megatron-Bridge's configuration code only.

Megatron-Bridge 0.3.1 imports `transformer_engine.pytorch` unconditionally (its LoRA layers,
reached from `megatron.bridge`), and Transformer Engine needs CUDA to build, so the framework
environment cannot install it (../../shared/reference/framework_validation.md). This package
lets the import succeed; every class it hands out refuses to be instantiated, so nothing that
would need the real kernels can run by accident. It is put on sys.path only by
test_megatron_bridge.py's checker, in its own process."""

__version__ = "2.10.0"  # what Megatron-Bridge 0.3.1 requires (>= 2.10, < 2.13): version queries see a real launch's
