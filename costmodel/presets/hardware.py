"""GPU presets. Peaks are dense (no sparsity) tensor-core TFLOP/s per GPU; bandwidths are per
GPU and per direction. Efficiency profiles are defaults until calibrated (see profiles/)."""

import math

from costmodel.specs import Curve, EfficiencyProfile, HardwareSpec

HARDWARE: dict[str, HardwareSpec] = {}


def _register(spec: HardwareSpec) -> HardwareSpec:
    HARDWARE[spec.name] = spec
    return spec


def chip_of(hw: HardwareSpec) -> str:
    """The die a GPU is built on: presets on one chip share a calibrated profile."""
    return hw.chip or hw.name


# MoFa's devices A and B (Table 3) are anonymous accelerators. Table 3 gives memory, peak,
# H2D/D2H and CPU memory; everything else is named below as derived from the paper's own
# figures or assumed.
_MOFA_EFFICIENCY = EfficiencyProfile(
    mode="modified_roofline",
    source=(
        "MoFa section 5.7 / Fig. 10: device B's modified roofline passes through (937.2 FLOP/B, "
        "389.3 TFLOP/s) = 0.38 of peak for GEMMs; its attention operator runs at 178.8 TFLOP/s = 0.175 "
        "of peak. Device A assumed alike (same vendor family, Table 5 MFU comparable)."
    ),
    gemm=Curve(peak_fraction=0.38),
    grouped_gemm=Curve(peak_fraction=0.34),
    attention=Curve(peak_fraction=0.175),
)

_register(HardwareSpec(
    name="mofa-device-a",
    source="MoFa Table 3 (device A); unstated values marked as assumptions",
    peak_tflops={"bf16": 512, "fp16": 512},  # Table 3 P^GPU
    memory_mib=32768,  # Table 3 M^GPU = 32 GB, read as 32 GiB (the device's exposed bytes are not published)
    memory_bandwidth_gb_per_s=1200,  # assumption: not in Table 3 (HBM2-class for a 32 GB part)
    host_memory_gb_per_node=2048,  # Table 3 prints M^CPU = 2; read as 2 TB per node (2 GB could not hold eq. 27's offloaded states)
    h2d_gb_per_s=32,  # Table 3 B^H2D
    d2h_gb_per_s=32,  # Table 3 B^D2H
    intra_node_gb_per_s=150,  # assumption: half of device B's scale-up bandwidth
    inter_node_gb_per_s=25,  # assumption: one 200 Gb/s RoCE NIC per accelerator
    cpu_optimizer_params_per_s=4.4e9,  # as device B
    tp_overlap_buffers=0,  # not an NVIDIA part (see device B): no Transformer Engine userbuffers
    efficiency=_MOFA_EFFICIENCY,
))

_register(HardwareSpec(
    name="mofa-device-b",
    source="MoFa Table 3 (device B); unstated values derived from MoFa's Table 6 or marked as assumptions",
    peak_tflops={"bf16": 1024, "fp16": 1024},  # Table 3 P^GPU
    memory_mib=65536,  # Table 3 M^GPU = 64 GB, read as 64 GiB (the device's exposed bytes are not published)
    memory_bandwidth_gb_per_s=1600,  # assumption: not in Table 3 (HBM2e-class for a 64 GB part)
    host_memory_gb_per_node=2048,  # Table 3 M^CPU = 2, read as TB (see device A)
    h2d_gb_per_s=32,  # Table 3 B^H2D
    d2h_gb_per_s=32,  # Table 3 B^D2H
    intra_node_gb_per_s=300,  # derived: Table 6 T_TP = 1.98 s without TP overlap (t8 p8 mbs2) needs ~240 GB/s achieved
    inter_node_gb_per_s=25,  # assumption: one 200 Gb/s RoCE NIC per accelerator
    cpu_optimizer_params_per_s=4.4e9,  # derived: Table 6 T_update = 2.25 s for 6.4e9 params/GPU, minus 2 x 12.75 GB over 32 GB/s links
    # 64 GB with 1,024 TFLOP/s bf16 matches no NVIDIA part: its TP overlap is not Transformer
    # Engine's userbuffer scheme, and MoFa's eq. 6 counts no staging buffers
    tp_overlap_buffers=0,
    efficiency=_MOFA_EFFICIENCY,
))

# NVIDIA data-centre GPUs. Efficiency defaults: large bf16 GEMMs reach ~75-80% of peak
# (cuBLAS); FlashAttention-2 reaches 50-73% of peak on A100 and ~35-50% on H100
# (Dao 2023, arXiv 2307.08691; Shah et al. 2024, arXiv 2407.08608 for FlashAttention-3).
_register(HardwareSpec(
    name="a100-80gb",
    source="NVIDIA A100 datasheet (SXM4 80GB); DGX A100 user guide; Selene network per Narayanan et al. 2021",
    peak_tflops={"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5},
    sm_count=108,  # A100 whitepaper: 108 SMs
    chip="ga100",
    memory_mib=81920,  # nvidia-smi on A100-SXM4-80GB: 81,920 MiB
    memory_bandwidth_gb_per_s=2039,  # HBM2e
    host_memory_gb_per_node=2048,  # DGX A100: 2 TB
    h2d_gb_per_s=32,  # PCIe Gen4 x16
    d2h_gb_per_s=32,
    intra_node_gb_per_s=300,  # NVLink3: 600 GB/s bidirectional
    inter_node_gb_per_s=25,  # 8 x 200 Gb/s HDR InfiniBand per node (calibration.yaml hw.A100_80GB)
    cpu_optimizer_params_per_s=1.0e9,  # ZeRO-Offload (Ren et al. 2021) Table 3 CPU-Adam 4.5e9 params/s per 48-core host, scaled to 16 of DGX A100's 128 cores
    efficiency=EfficiencyProfile(
        source="defaults before calibration: cuBLAS bf16 GEMM ~80% of peak; FlashAttention-2 50-73% on A100",
        gemm=Curve(peak_fraction=0.8),
        grouped_gemm=Curve(peak_fraction=0.7),
        attention=Curve(peak_fraction=0.6),
    ),
))

_register(HardwareSpec(
    name="a100-40gb",
    source="NVIDIA A100 datasheet (SXM4 40GB); MosaicML's A100-40GB cluster per llm-foundry's benchmark README (calibration_more.yaml hw_new.A100_40GB)",
    peak_tflops={"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5},
    sm_count=108,  # the A100 die: 108 SMs
    chip="ga100",
    memory_mib=40960,  # nvidia-smi on A100-SXM4-40GB: 40,960 MiB
    memory_bandwidth_gb_per_s=1555,  # HBM2, A100 datasheet
    host_memory_gb_per_node=1024,  # DGX A100 (320 GB): 1 TB
    h2d_gb_per_s=32,  # PCIe Gen4 x16
    d2h_gb_per_s=32,
    intra_node_gb_per_s=300,  # NVLink3: 600 GB/s bidirectional
    inter_node_gb_per_s=25,  # llm-foundry README: 1600 Gb/s RoCE node to node = 200 GB/s per 8-GPU node
    cpu_optimizer_params_per_s=1.0e9,  # as A100-80GB
    efficiency=EfficiencyProfile(
        source="defaults before calibration, as A100-80GB (the same die)",
        gemm=Curve(peak_fraction=0.8),
        grouped_gemm=Curve(peak_fraction=0.7),
        attention=Curve(peak_fraction=0.6),
    ),
))

_H100_EFF = EfficiencyProfile(
    source="defaults before calibration: cuBLAS bf16 GEMM ~75% of peak; FlashAttention-2 ~35-50% / FlashAttention-3 ~75% on H100",
    gemm=Curve(peak_fraction=0.75),
    grouped_gemm=Curve(peak_fraction=0.65),
    attention=Curve(peak_fraction=0.5),
)

_register(HardwareSpec(
    name="h100-sxm",
    source="NVIDIA H100 datasheet (SXM5); DGX H100 user guide; calibration.yaml hw.H100_SXM",
    peak_tflops={"bf16": 989, "fp16": 989, "fp8": 1979, "tf32": 495, "fp32": 67},
    sm_count=132,  # H100 SXM5 datasheet: 132 SMs
    chip="gh100",
    memory_mib=81559,  # nvidia-smi on H100 80GB HBM3: 81,559 MiB
    memory_bandwidth_gb_per_s=3350,  # HBM3
    host_memory_gb_per_node=2048,  # DGX H100: 2 TB
    h2d_gb_per_s=64,  # PCIe Gen5 x16
    d2h_gb_per_s=64,
    intra_node_gb_per_s=450,  # NVLink4: 900 GB/s bidirectional
    inter_node_gb_per_s=50,  # 8 x 400 Gb/s NDR per node
    cpu_optimizer_params_per_s=1.3e9,  # ZeRO-Offload CPU-Adam rate scaled to 14 of DGX H100's 112 cores (AVX-512)
    efficiency=_H100_EFF,
))

_register(HardwareSpec(
    name="h100-96gb",
    source="Meta Grand Teton H100 with 96 GB HBM2e at 2.4 TB/s and 500 W (torchtitan's benchmark platform; calibration_more.yaml hw_new.H100_GrandTeton_HBM2e); torchtitan says its true peak lies between H100 SXM and NVL, unknown: the SXM peaks are used, as torchtitan's MFU does",
    peak_tflops={"bf16": 989, "fp16": 989, "fp8": 1979, "tf32": 495, "fp32": 67},
    sm_count=132,  # the H100 SXM die
    chip="gh100",
    memory_mib=97871,  # 96 GiB nominal; the exposed size is not published: an 80 GB H100 exposes 81,559 MiB = 99.6% of 80 GiB, applied here
    memory_bandwidth_gb_per_s=2400,  # HBM2e, calibration_more.yaml hw_new
    host_memory_gb_per_node=2048,  # assumption: as DGX H100
    h2d_gb_per_s=64,  # PCIe Gen5 x16
    d2h_gb_per_s=64,
    intra_node_gb_per_s=450,  # NVLink, fully connected (calibration_more.yaml hw_new): as H100 SXM
    inter_node_gb_per_s=50,  # RDMA 400 Gb/s per GPU (calibration_more.yaml hw_new)
    cpu_optimizer_params_per_s=1.3e9,  # as H100 SXM
    efficiency=_H100_EFF,
))

_register(HardwareSpec(
    name="h800",
    source="NVIDIA H800 SXM (export variant of H100: same tensor peaks and HBM3, NVLink 400 GB/s bidirectional); calibration.yaml hw.H800",
    peak_tflops={"bf16": 989, "fp16": 989, "fp8": 1979, "tf32": 495, "fp32": 67},
    sm_count=132,  # as H100 SXM: 132 SMs
    chip="gh100",
    memory_mib=81559,  # as H100 SXM (same HBM3 stack)
    memory_bandwidth_gb_per_s=3350,
    host_memory_gb_per_node=2048,
    h2d_gb_per_s=64,
    d2h_gb_per_s=64,
    intra_node_gb_per_s=200,  # NVLink 400 GB/s bidirectional
    inter_node_gb_per_s=50,  # 400 Gb/s InfiniBand per GPU (DeepSeek-V3 report section 3.1)
    cpu_optimizer_params_per_s=1.3e9,
    efficiency=_H100_EFF,
))

_register(HardwareSpec(
    name="h200",
    source="NVIDIA H200 datasheet (SXM): 141 GB HBM3e at 4.8 TB/s, H100 tensor peaks, NVLink 900 GB/s; NVIDIA DGX H200 datasheet: 2 TB host memory, 8 x 400 Gb/s ConnectX-7",
    peak_tflops={"bf16": 989, "fp16": 989, "fp8": 1979, "tf32": 495, "fp32": 67},  # H200 datasheet (dense: half the sparsity figures)
    sm_count=132,  # H200: the H100 SXM die, 132 SMs
    chip="gh100",
    memory_mib=143771,  # nvidia-smi on H200: 143,771 MiB (141 GB)
    memory_bandwidth_gb_per_s=4800,  # H200 datasheet: 4.8 TB/s HBM3e
    host_memory_gb_per_node=2048,  # DGX H200: 2 TB
    h2d_gb_per_s=64,  # PCIe Gen5 x16
    d2h_gb_per_s=64,
    intra_node_gb_per_s=450,  # H200 datasheet: NVLink 900 GB/s bidirectional
    inter_node_gb_per_s=50,  # DGX H200: 8 x 400 Gb/s ConnectX-7 per node
    cpu_optimizer_params_per_s=1.3e9,  # as H100 SXM
    efficiency=_H100_EFF,
))

_register(HardwareSpec(
    name="b200",
    source="NVIDIA DGX B200 datasheet: 1,440 GB GPU memory over 8 GPUs, 64 TB/s HBM3e, 72 PFLOPS fp8 training (dense 4.5 PF/GPU), NVLink5 1.8 TB/s; calibration.yaml hw.B200",
    # dense peaks: the HGX B200 datasheet's sparsity figures halved; MXFP8 at the FP8 rate
    # (Blackwell datasheets list one FP8/FP6 rate, MX block scaling included; units.FP8_COMPUTE)
    peak_tflops={"bf16": 2250, "fp16": 2250, "fp8": 4500, "mxfp8": 4500, "tf32": 1100, "fp32": 75},
    sm_count=148,  # B200: 148 SMs (2 dies x 74)
    chip="gb100",  # the Blackwell die, shared with GB200 (one calibrated profile)
    memory_mib=183359,  # nvidia-smi on DGX B200: 183,359 MiB (179 GiB of the nominal 180 GB)
    memory_bandwidth_gb_per_s=8000,
    host_memory_gb_per_node=4096,  # DGX B200: 4 TB
    h2d_gb_per_s=64,
    d2h_gb_per_s=64,
    intra_node_gb_per_s=900,  # NVLink5: 1.8 TB/s bidirectional
    inter_node_gb_per_s=50,  # 8 x 400 Gb/s ConnectX-7 per node
    cpu_optimizer_params_per_s=1.3e9,
    efficiency=EfficiencyProfile(
        source="defaults before calibration, as H100",
        gemm=Curve(peak_fraction=0.75),
        grouped_gemm=Curve(peak_fraction=0.65),
        attention=Curve(peak_fraction=0.5),
    ),
))


_register(HardwareSpec(
    name="gb200",
    source="NVIDIA GB200 NVL72 datasheet (72 Blackwell GPUs, 36 Grace CPUs in one NVLink domain): 13.4 TB HBM3e at 576 TB/s, "
    "130 TB/s NVLink, FP8 720 PF and BF16 360 PF with sparsity, 17 TB LPDDR5X; per GPU: 186 GB at 8 TB/s, NVLink 5 1.8 TB/s. "
    "The 72-GPU NVLink domain is the cluster's supernode level (problem files: cluster.supernode_size 72); a node is one "
    "compute tray (2 GB200 superchips, 4 GPUs)",
    # dense peaks per GPU: the NVL72 datasheet's sparsity figures / 72 / 2; MXFP8 at the FP8 rate as on B200
    peak_tflops={"bf16": 2500, "fp16": 2500, "fp8": 5000, "mxfp8": 5000, "tf32": 1250},
    sm_count=148,  # assumption: the B200 die's 148 SMs (the datasheet gives none)
    chip="gb100",  # B200-class: the same Blackwell die, one calibrated profile with b200
    # the datasheet's 186 GB at B200's exposed/nominal ratio (183,359 MiB for 180 GB): 186 x 183,359 / 180 = 189,471 MiB;
    # not read from nvidia-smi on a GB200 (none was available)
    memory_mib=189471,
    memory_bandwidth_gb_per_s=8000,  # 576 TB/s / 72
    host_memory_gb_per_node=960,  # 2 Grace CPUs per tray x 480 GB LPDDR5X (17 TB per rack / 36)
    # NVLink-C2C: 900 GB/s bidirectional between a Grace CPU and its two GPUs; assumed shared evenly: 225 GB/s per direction
    h2d_gb_per_s=225,
    d2h_gb_per_s=225,
    intra_node_gb_per_s=900,  # NVLink 5: 1.8 TB/s bidirectional per GPU (130 TB/s / 72), the same inside the tray and across the rack
    inter_node_gb_per_s=50,  # GB200 NVL72 reference design: one 400 Gb/s ConnectX-7 per GPU for the scale-out fabric
    cpu_optimizer_params_per_s=1.3e9,  # assumption: as B200 (no CPU-Adam rate measured on Grace's Neoverse V2 cores; 36 per GPU)
    efficiency=EfficiencyProfile(
        source="defaults before calibration, as B200",
        gemm=Curve(peak_fraction=0.75),
        grouped_gemm=Curve(peak_fraction=0.65),
        attention=Curve(peak_fraction=0.5),
    ),
))


def _read_shipped_yaml(path) -> dict:
    """A data file shipped with the presets, read with PyYAML's C parser where it has one (the
    calibrated profiles took 0.4 s of every command in the pure-Python one, 0.05 s in C; the
    same data either way)."""
    import yaml

    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _apply_kernel_profiles() -> None:
    """Kernel-level efficiency measured on the GPU itself (kernels/<chip>.yaml, written by
    `python -m calibration.kernels` from timings in calibration/kernels/) replaces the guessed
    defaults of every preset on that chip: GEMM and grouped-GEMM rates and their shape terms,
    fused-attention curves per implementation, the attention backward ratio, the memory-bound
    fraction and the launch floor. Step-time calibration starts from these."""
    from pathlib import Path

    for path in sorted((Path(__file__).parent / "kernels").glob("*.yaml")):
        data = _read_shipped_yaml(path)
        for name, spec in list(HARDWARE.items()):
            if chip_of(spec) != data["chip"]:
                continue
            merged = {**spec.efficiency.model_dump(), **data["efficiency"]}
            merged["source"] = f"{spec.efficiency.source}; kernel terms measured: {data['source']}"
            HARDWARE[name] = spec.model_copy(update={"efficiency": EfficiencyProfile.model_validate(merged)})


_apply_kernel_profiles()

#: the documented defaults, kept for recalibration (calibration starts from these)
DEFAULT_EFFICIENCY = {name: spec.efficiency for name, spec in HARDWARE.items()}


def calibrated_attention_impls(kernel: dict, calibrated: dict) -> dict:
    """The fused-attention curves after a step-level calibration: those it fitted as fitted, and
    each one only the kernel timings have (FlexAttention, which no published step-level run
    uses) at its kernel peak fraction times the geometric mean of calibrated / kernel over the
    implementations both name -- the step-level correction a fused-attention kernel needs
    beyond its isolated timing, an assumption taken as common to the implementations (on the
    H100 profile: te 0.414 / 0.671, sdpa 0.237 / 0.362, so 0.635)."""
    shared = [k for k in calibrated if k in kernel]
    ratio = math.exp(sum(math.log(calibrated[k]["peak_fraction"] / kernel[k]["peak_fraction"]) for k in shared) / len(shared)) if shared else 1.0
    carried = {k: {**curve, "peak_fraction": curve["peak_fraction"] * ratio} for k, curve in kernel.items() if k not in calibrated}
    return {**calibrated, **carried}


def _load_calibrated_profiles() -> None:
    """Calibrated efficiency profiles (written by `mofa calibrate`) replace the defaults of the
    GPUs they were fitted for and of every preset on the same chip: evaluate and solve use them
    unless a problem says otherwise."""
    from pathlib import Path

    from costmodel.specs import EfficiencyProfile

    for path in sorted((Path(__file__).parent / "profiles").glob("*.yaml")):
        data = _read_shipped_yaml(path)
        if data["hardware"] not in HARDWARE:
            continue
        family = chip_of(HARDWARE[data["hardware"]])
        for name, spec in list(HARDWARE.items()):
            if chip_of(spec) == family:
                # a term the profile does not name (measured after it was written: the kernel
                # files' short convolution, a new attention implementation) keeps its kernel value
                kernel = spec.efficiency.model_dump()
                merged = {**kernel, **data["efficiency"]}
                merged["attention_impls"] = calibrated_attention_impls(kernel["attention_impls"], data["efficiency"].get("attention_impls", {}))
                HARDWARE[name] = spec.model_copy(update={"efficiency": EfficiencyProfile.model_validate(merged)})


_load_calibrated_profiles()
