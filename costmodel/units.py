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
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def optimizer_state_bytes(d_para: int, d_opt: int) -> int:
    """Bytes of Adam state per parameter (MoFa eq. 4's optimizer term as Megatron keeps it):
    the two moments in D_opt, plus a D_opt master copy of the weights when the weights are
    narrower than D_opt."""
    return (3 if d_para < d_opt else 2) * d_opt
