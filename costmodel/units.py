"""Unit constants.

Memory is counted in bytes. Capacities are what the GPU exposes (nvidia-smi's MiB); reports
print GiB (2**30 bytes, PyTorch's and torchtitan's unit). MoFa's Tables 5-7 use decimal GB
(its Table 7 rows differ by exactly 4 bytes x 8 layers x 398.46M params = 12.75e9 bytes), so
checks against MoFa convert with GB = 1e9."""

GB = 1e9
MIB = 2**20
GIB = 2**30
TFLOP = 1e12
US = 1e-6
SECONDS_PER_DAY = 86400.0

#: bytes per element of the data types a problem file may name
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "mxfp8": 1}
#: GEMM input dtypes that run at a GPU's fp8 rate: fp8 with per-tensor scaling (Transformer
#: Engine's delayed / current scaling) and MXFP8, E4M3 values with one power-of-two (E8M0)
#: scale per 32 consecutive elements (OCP Microscaling Formats spec v1.0), which Blackwell's
#: tensor cores apply in the MMA. MXFP8's scales add 1/32 byte per element, not counted.
FP8_COMPUTE = ("fp8", "mxfp8")


def optimizer_state_bytes(d_para: int, d_opt: int) -> int:
    """Bytes of Adam state per parameter (MoFa eq. 4's optimizer term as Megatron keeps it):
    the two moments in D_opt, plus a D_opt master copy of the weights when the weights are
    narrower than D_opt."""
    return (3 if d_para < d_opt else 2) * d_opt
