"""Typed specifications: what a problem file (YAML) contains.

A problem names a model, a GPU, a cluster, the training job, which optimisation features
may be used, the fault-tolerance inputs, the search space and optionally one fixed
configuration. This module is pure data: the loader (costmodel.loader) resolves presets and
Hugging Face configs into these types and checks a fixed configuration against the rules
(costmodel.rules). Each class checks only itself; cross-field checks that need the model's
arithmetic live in the rules. Everything is frozen: a resolved problem is a value, hashable by
identity and safe to cache on.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from costmodel.units import DTYPE_BYTES, MIB

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]
#: a GEMM input dtype: a storage dtype, or MXFP8 (block-scaled fp8, Blackwell tensor cores only)
ComputeDtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8", "mxfp8"]
FeatureMode = Literal["allowed", "on", "off"]
RecomputeMode = Literal["none", "selective", "full"]
AttentionType = Literal["full_attention", "sliding_attention", "linear_attention"]
SplitMode = Literal["even", "embedding_loss", "uneven", "layout"]


class Spec(BaseModel):
    """Base: unknown keys are errors (a typo must not be silently ignored), values frozen, types
    strict (no `true` for 1, no "8" for 8, no 8.0 for an integer) and numbers finite."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


#: counts (layers, GPUs, sizes, steps): beyond int32 nothing is physical, and the model's float64
#: arithmetic stays exact
Count = Annotated[int, Field(le=2**31 - 1)]
Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]
Probability = Annotated[float, Field(ge=0, le=1)]


# --------------------------------------------------------------------------------------
# Model architecture
# --------------------------------------------------------------------------------------
class MLASpec(Spec):
    """Multi-head latent attention (DeepSeek-V2/V3)."""

    q_lora_rank: Count | None = Field(default=None, gt=0, description="None: Q is projected directly")
    kv_lora_rank: Count = Field(gt=0)
    qk_nope_head_dim: Count = Field(gt=0)
    qk_rope_head_dim: Count = Field(gt=0)
    v_head_dim: Count = Field(gt=0)


class LinearAttentionSpec(Spec):
    """Gated DeltaNet (Yang et al. 2024, arXiv 2412.06464; Qwen3-Next / Qwen3.5 `linear_*` keys):
    q and k over key heads, v over value heads, a short causal convolution on q, k, v, scalar
    gates per value head, the chunked delta-rule recurrence, a gated output norm."""

    num_key_heads: Count = Field(gt=0, description="HF linear_num_key_heads")
    num_value_heads: Count = Field(gt=0, description="HF linear_num_value_heads")
    key_head_dim: Count = Field(gt=0, description="HF linear_key_head_dim")
    value_head_dim: Count = Field(gt=0, description="HF linear_value_head_dim")
    conv_kernel: Count = Field(default=4, gt=0, description="HF linear_conv_kernel_dim")
    chunk_size: Count = Field(default=64, gt=0, description="chunk of the chunked delta-rule kernels (flash-linear-attention: 64)")


class MoESpec(Spec):
    num_experts: Count = Field(gt=0, description="routed experts")
    top_k: Count = Field(gt=0)
    expert_ffn_hidden_size: Count = Field(gt=0)
    num_shared_experts: Count = Field(default=0, ge=0)
    shared_expert_ffn_hidden_size: Count | None = Field(default=None, gt=0)
    first_dense_layers: Count = Field(default=0, ge=0, description="leading layers with a dense MLP (HF first_k_dense_replace)")
    sparse_step: Count = Field(default=1, gt=0, description="an MoE MLP every k-th layer, the others dense (HF decoder_sparse_step)")
    dense_layers: list[Count] = Field(default=[], description="indices of further layers with a dense MLP (HF mlp_only_layers)")
    max_nodes_per_token: Count | None = Field(
        default=None, gt=0, description="node-limited routing (DeepSeek-V3: 4); caps inter-node copies"
    )

    @model_validator(mode="after")
    def _topk(self):
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k {self.top_k} exceeds num_experts {self.num_experts}")
        return self

    @property
    def shared_ffn(self) -> int:
        return self.shared_expert_ffn_hidden_size or self.expert_ffn_hidden_size


class ModelSpec(Spec):
    name: str
    source: str = ""
    notes: list[str] = Field(default=[], description="what an import did not use (unknown or unmodelled keys of a config.json)")
    num_layers: Count = Field(gt=0)
    hidden_size: Count = Field(gt=0)
    num_heads: Count = Field(gt=0)
    num_kv_heads: Count | None = Field(default=None, gt=0, description="GQA groups; None = MHA")
    head_dim: Count | None = Field(default=None, gt=0)
    ffn_hidden_size: Count = Field(gt=0, description="dense MLP intermediate size g_d")
    vocab_size: Count = Field(gt=0)
    activation: Literal["swiglu", "gelu", "squared_relu"] = "swiglu"
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    tied_embeddings: bool = False
    dropout: bool = Field(default=False, description="dropout after attention and MLP (GPT-3 style)")
    position_embedding: Literal["rope", "learned", "alibi", "none"] = "rope"
    linear_bias: bool = Field(default=False, description="biases on the linear layers (GPT-3, BLOOM); not counted in parameters")
    mla: MLASpec | None = None
    moe: MoESpec | None = None
    layer_types: list[AttentionType] | None = Field(
        default=None, description="attention of each layer (HF layer_types); None: full attention everywhere"
    )
    sliding_window: Count | None = Field(default=None, gt=0, description="keys a sliding-attention layer's query sees (GPT-OSS: 128)")
    linear_attention: LinearAttentionSpec | None = Field(default=None, description="the linear-attention layers' dimensions")
    mtp_layers: Count = Field(
        default=0, ge=0, description="multi-token prediction modules (DeepSeek-V3: 1, HF num_nextn_predict_layers): a layer, a projection and a loss each, after the last layer"
    )
    qk_layernorm: bool = Field(default=False, description="RMSNorm on q and k per head (Qwen3, OLMo 2)")
    attention_output_gate: bool = Field(
        default=False,
        description="gated attention (Qwen3-Next, Qwen3.5; HF attn_output_gate): the query projection also emits a gate of "
        "the attention output's width, and the core output is multiplied by its sigmoid before the output projection",
    )
    attention_sinks: bool = Field(
        default=False,
        description="a learned logit per query head added to the softmax's denominator (GPT-OSS): one parameter per head "
        "and layer; its one extra exponential per score row is not counted",
    )

    @model_validator(mode="after")
    def _consistency(self):
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.moe and self.moe.first_dense_layers > self.num_layers:
            raise ValueError("moe.first_dense_layers exceeds num_layers")
        if self.moe and any(i >= self.num_layers for i in self.moe.dense_layers):
            raise ValueError("moe.dense_layers: a layer index beyond num_layers")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_layers:
                raise ValueError(f"layer_types: {len(self.layer_types)} entries for {self.num_layers} layers")
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                raise ValueError("sliding_window: sliding_attention layers need a window")
            if "linear_attention" in self.layer_types and self.linear_attention is None:
                raise ValueError("linear_attention: linear_attention layers need their dimensions")
        return self

    def layer_kinds(self) -> list[tuple[str, str]]:
        """(attention type, MLP type) of each layer, in order."""
        attention = self.layer_types or ["full_attention"] * self.num_layers
        if self.moe is None:
            return [(a, "dense") for a in attention]
        x = self.moe
        dense = set(x.dense_layers)
        mlp = ["dense" if i < x.first_dense_layers or i in dense or (i + 1) % x.sparse_step else "moe" for i in range(self.num_layers)]
        return list(zip(attention, mlp))

    def kind_counts(self) -> dict[tuple[str, str], int]:
        """How many layers of each kind (sums over layers take a kind's value times its count)."""
        counts: dict[tuple[str, str], int] = {}
        for kind in self.layer_kinds():
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    def kinds(self) -> list[tuple[str, str]]:
        """The distinct layer kinds, in order of first appearance."""
        return list(dict.fromkeys(self.layer_kinds()))

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def num_dense_layers(self) -> int:
        return sum(1 for _, mlp in self.layer_kinds() if mlp == "dense")

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers


# --------------------------------------------------------------------------------------
# Hardware
# --------------------------------------------------------------------------------------
class Curve(Spec):
    """Modified roofline (MoFa eq. 19 with efficiencies): achieved = min(bw_fraction * AI * B_hbm,
    peak_fraction * P_peak). The theoretical roofline is peak_fraction = bw_fraction = 1."""

    peak_fraction: float = Field(gt=0, le=1)
    bandwidth_fraction: float = Field(default=0.8, gt=0, le=1)


class OverlapCoefficients(Spec):
    """Time-increase coefficients under overlap (MoFa eqs. 20-24, 34-35): a computation
    overlapped with communication runs alpha times slower, the communication beta times slower.
    (MoFa's eqs. 23-24 name the communication's coefficient alpha; here alpha is always the
    computation's, beta the communication's.)"""

    alpha: float = Field(default=1.0, ge=1)
    beta: float = Field(default=1.0, ge=1)


class CalibrationStats(Spec):
    """What a calibration measured: residuals of log(predicted / measured) step time."""

    points: Count = Field(gt=0)
    log_residual_sd: float = Field(ge=0, description="root mean square of log(pred/meas), leave-one-out (bias included)")
    mape_pct: float = Field(ge=0)
    loo_mape_pct: float | None = Field(default=None, ge=0, description="MAPE of the cross-validated (held-out) predictions")
    max_abs_error_pct: float = Field(ge=0)
    data: list[str] = Field(default=[], description="the sources (measurement campaigns) of the fitted points")
    cross_validation: Literal["point", "source"] | None = Field(default=None, description="what was held out for loo_mape_pct and the interval")


class EfficiencyProfile(Spec):
    """How fast kernels and collectives run on this GPU, relative to the datasheet.

    `mode` picks MoFa's operator-latency model: 'roofline' (eq. 19, efficiencies ignored),
    'modified_roofline' (eq. 19 scaled by the curves below) or 'profiled' (piecewise-linear
    interpolation of measured (arithmetic intensity, TFLOP/s) points per operator class)."""

    mode: Literal["roofline", "modified_roofline", "profiled"] = "modified_roofline"
    source: str = ""
    gemm: Curve = Curve(peak_fraction=0.75)
    grouped_gemm: Curve = Curve(peak_fraction=0.65)
    fp8_gemm: Curve = Field(default=Curve(peak_fraction=0.6), description="GEMMs in fp8 (Transformer Engine, torchao float8): a fraction of the fp8 peak")
    attention: Curve = Curve(peak_fraction=0.55)
    attention_impls: dict[Literal["te", "sdpa", "triton", "flex"], Curve] = Field(
        default={},
        description="fused-attention implementations with their own efficiency (training.attention_impl): te = "
        "Transformer Engine's cuDNN/flash kernels (Megatron, NeMo), sdpa = PyTorch scaled_dot_product_attention "
        "(FlashAttention-2 backend: torchtitan, FSDP scripts), triton = the Triton flash attention of llm-foundry, "
        "flex = torch.compile'd FlexAttention (torchtitan's sliding-window and document-masked models); "
        "an implementation not listed runs at `attention`",
    )
    linear_attention: Curve = Field(
        default=Curve(peak_fraction=0.3),
        description="the chunked linear-attention kernels (flash-linear-attention's Gated DeltaNet), a fraction of the "
        "bf16 peak at the FLOPs the model counts (architecture.linear_attention_block): measured on Hopper "
        "(kernels/gh100.yaml: ~0.06, the small per-chunk matmuls and the sequential state pass run far below the "
        "GEMM rate); elsewhere an assumption",
    )
    linear_attention_floor_us: float = Field(
        default=0.0,
        ge=0,
        description="the least a linear-attention forward call takes (its backward: this times the ratio): "
        "flash-linear-attention dispatches ~10 Triton kernels a call from Python, and a call with little GPU work "
        "waits on that (measured on Hopper: ~0.65 ms); 0 = no floor",
    )
    linear_attention_backward_ratio: float = Field(
        default=3.0,
        ge=1,
        le=6,
        description="linear-attention backward / forward time (fla recomputes the chunk states and runs the state "
        "pass backwards): measured on Hopper, elsewhere an assumption",
    )
    gemm_k_half: float = Field(
        default=0.0,
        ge=0,
        description="GEMM reduction depth at which the main loop reaches half its peak rate: efficiency x K/(K + k_half) "
        "(prologue/epilogue of each output tile); 0 = no shape dependence",
    )
    gemm_tile: tuple[Count, Count] | None = Field(
        default=(128, 256),
        strict=False,
        description="output tile of the GEMM kernels (M x N); with the GPU's SM count it sets the wave quantization. "
        "None: no wave quantization (persistent / stream-K GEMMs such as cuBLAS's on Hopper, where kernel timings "
        "show the last-wave loss absent: calibration/kernels.py)",
    )
    attention_seq_half: float = Field(
        default=0.0,
        ge=0,
        description="query tokens per attention call at which the fused kernel reaches half its peak rate: "
        "efficiency x L/(L + seq_half) (tile start-up, causal masking of the diagonal); 0 = no shape dependence",
    )
    attention_tail_waves: float = Field(
        default=0.0,
        ge=0,
        description="what the fused kernel's grid pays at its end, in waves of query tiles (128 query rows of one head "
        "on each SM): time x (1 + tail/waves), waves = query rows x heads of a call / (128 x SMs). Few heads per GPU "
        "(TP-thin calls) leave few waves, whose last, longest causal tiles run with SMs idle (Hopper kernel tables: "
        "2-8 heads at 8K tokens run at 0.45-0.85 of the rate of 32; calibration/kernels.py); 0 = no grid term",
    )
    attention_backward_ratio: float = Field(
        default=2.5,
        ge=1,
        le=5,
        description="attention backward / forward time: FlashAttention-2 does 5 matmuls against 2 (2.5); lower kernel "
        "efficiency in the backward raises it",
    )
    stage_overhead_us: float = Field(
        default=0.0,
        ge=0,
        description="fixed cost of one virtual-stage chunk of one micro-batch, forward or backward, on a rank: kernel "
        "launch gaps, pipeline scheduling, P2P synchronisation, per-chunk gradient hooks (MoFa 5.5.1: v is not free)",
    )
    memory_bound_fraction: float = Field(default=0.75, gt=0, le=1, description="HBM fraction for elementwise kernels")
    short_conv_fraction: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="HBM fraction of the short causal convolution of linear-attention layers (flash-linear-attention's "
        "causal_conv1d, width 4): measured on Hopper (kernels/gh100.yaml, from the H200's tables), well under the "
        "elementwise kernels'; None = memory_bound_fraction",
    )
    short_conv_call_us: float = Field(
        default=0.0,
        ge=0,
        description="what a short-convolution forward call costs beyond its bytes (fla dispatches its Triton kernels "
        "from Python; measured on Hopper: ~0.13 ms a call, what ~380 MB of traffic takes at the fitted fraction on an "
        "H200); 0 = none",
    )
    short_conv_backward_ratio: float = Field(
        default=2.0,
        ge=1,
        le=8,
        description="short-convolution backward / forward time (the input gradient and the weight gradient's reduction "
        "over tokens): measured on Hopper; 2 = an elementwise kernel's (its backward reads and writes twice as much)",
    )
    kernel_overhead_us: float = Field(default=4.0, ge=0, description="launch + tail per kernel")
    #: measured points per operator class: {class: [[arithmetic_intensity, tflops], ...]}
    profiled: dict[Literal["gemm", "grouped_gemm", "attention", "linear_attention"], list[tuple[Positive, Positive]]] = Field(default={}, strict=False)
    #: achieved fraction of the nominal per-GPU bandwidth per network level (MoFa eq. 18 lambda)
    comm_efficiency: dict[Literal["node", "supernode", "cluster"], Fraction] = {
        "node": 0.8,
        "supernode": 0.8,
        "cluster": 0.8,
    }
    host_link_efficiency: float = Field(default=0.8, gt=0, le=1)
    #: MoFa eq. 3's beta when the cluster gives no table: scale-out bandwidth of a collective
    #: spanning S GPUs is multiplied by (S / reference)^-exponent beyond the reference size
    scale_decay_exponent: float = Field(default=0.0, ge=0, le=1)
    scale_decay_reference_gpus: Count = Field(default=512, gt=0)
    tp_overlap: OverlapCoefficients = OverlapCoefficients(alpha=1.1, beta=1.1)
    cp_overlap: OverlapCoefficients = OverlapCoefficients(alpha=1.05, beta=1.05)
    ep_overlap: OverlapCoefficients = OverlapCoefficients(alpha=1.1, beta=1.1)
    pp_overlap: OverlapCoefficients = OverlapCoefficients(alpha=1.0, beta=1.0)
    dp_overlap: OverlapCoefficients = OverlapCoefficients(alpha=1.05, beta=1.05)
    offload_overlap: OverlapCoefficients = OverlapCoefficients(alpha=1.05, beta=1.0)  # eqs. 34-35 name the copy's alpha, the layer's beta: swapped to this class's convention
    calibration: CalibrationStats | None = None


class HardwareSpec(Spec):
    name: str
    source: str = ""
    peak_tflops: dict[ComputeDtype, Positive] = Field(
        description="dense tensor-core peak per dtype, per GPU; mxfp8 only where the tensor cores apply MX block scales (Blackwell)"
    )
    memory_mib: Count = Field(
        gt=0,
        description="device memory as the GPU exposes it, in MiB (nvidia-smi's 'Total'; an '80 GB' H100 SXM shows "
        "81,559 MiB): the capacity every peak is compared with, byte for byte",
    )
    memory_bandwidth_gb_per_s: float = Field(gt=0)
    host_memory_gb_per_node: float = Field(gt=0)
    h2d_gb_per_s: float = Field(gt=0)
    d2h_gb_per_s: float = Field(gt=0)
    intra_node_gb_per_s: float = Field(gt=0, description="scale-up (NVLink) bandwidth per GPU, one direction")
    inter_node_gb_per_s: float = Field(gt=0, description="scale-out (NIC) bandwidth per GPU, one direction")
    sm_count: Count | None = Field(default=None, gt=0, description="streaming multiprocessors: the GEMM waves' width (None: no wave quantization)")
    chip: str | None = Field(
        default=None,
        description="the GPU die (ga100, gh100): presets on one chip share a calibrated efficiency profile, since kernel "
        "efficiencies are properties of the die while capacities and bandwidths stay each preset's own (None: its own name)",
    )
    intra_node_latency_us: float = Field(default=3.0, ge=0)
    inter_node_latency_us: float = Field(default=10.0, ge=0)
    cpu_optimizer_params_per_s: float = Field(
        default=2e9, gt=0, description="Adam parameters a GPU's share of host cores updates per second"
    )
    cuda_context_mib: Count = Field(
        default=600,
        ge=0,
        description="memory a training process holds outside PyTorch's allocator: the CUDA context with its loaded "
        "kernels (~400-600 MiB on Ampere/Hopper with CUDA 12 lazy loading) and the cuBLAS/cuBLASLt workspaces "
        "(32 MiB per stream on Hopper, PyTorch's default CUBLAS_WORKSPACE_CONFIG)",
    )
    tp_overlap_buffers: Count = Field(
        default=8,
        ge=0,
        description="activation-sized [s*b, h] staging buffers the TP-overlap kernels keep: Transformer Engine's "
        "userbuffers hold one per overlapped GEMM and direction (QKV, projection, FC1, FC2, forward and data-gradient: 8); "
        "fused compute-communication kernels that stage nothing: 0",
    )
    nccl_mib_per_group: Count = Field(
        default=512,
        ge=0,
        description="NCCL's own buffers per communicator a rank uses: per channel and peer the Simple protocol's "
        "NCCL_BUFFSIZE (4 MiB) and LL128's ~4.5 MiB, up to 32 channels on NVLink, for ring and tree: ~0.5 GiB "
        "(NVLink SHARP adds more)",
    )
    efficiency: EfficiencyProfile = EfficiencyProfile()

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB

    def peak(self, dtype: str) -> float:
        if dtype not in self.peak_tflops:
            raise ValueError(f"hardware {self.name} has no peak for dtype {dtype}")
        return self.peak_tflops[dtype]


# --------------------------------------------------------------------------------------
# Cluster
# --------------------------------------------------------------------------------------
class DecayPoint(Spec):
    gpus: Count = Field(gt=0)
    beta: float = Field(gt=0, le=1)


Dim = Literal["tp", "cp", "ep", "pp", "dp"]


class ClusterSpec(Spec):
    num_gpus: Count = Field(gt=0)
    gpus_per_node: Count = Field(gt=0)
    supernode_size: Count | None = Field(default=None, gt=0, description="GPUs in one scale-up domain")
    intra_node_gb_per_s: float | None = Field(default=None, gt=0, description="override the hardware's")
    supernode_gb_per_s: float | None = Field(default=None, gt=0, description="default: intra-node bandwidth")
    inter_node_gb_per_s: float | None = Field(default=None, gt=0)
    intra_node_latency_us: float | None = Field(default=None, ge=0)
    inter_node_latency_us: float | None = Field(default=None, ge=0)
    #: MoFa eq. 3 beta: achieved/small-scale bandwidth of a collective spanning this many GPUs,
    #: interpolated in log2(GPUs); applies to traffic leaving the scale-up domain
    bandwidth_decay: list[DecayPoint] = []
    placement: list[Dim] = Field(default=["tp", "cp", "ep", "pp", "dp"], description="inner to outer")

    @model_validator(mode="after")
    def _shape(self):
        if self.num_gpus % self.gpus_per_node and self.num_gpus > self.gpus_per_node:
            raise ValueError(f"num_gpus {self.num_gpus} is not a multiple of gpus_per_node {self.gpus_per_node}")
        sn = self.supernode_size
        if sn is not None and sn % self.gpus_per_node:
            raise ValueError(f"supernode_size {sn} is not a multiple of gpus_per_node {self.gpus_per_node}")
        if sorted(self.placement) != sorted(["tp", "cp", "ep", "pp", "dp"]):
            raise ValueError("placement must order exactly tp, cp, ep, pp, dp")
        if self.placement[0] != "tp":
            raise ValueError("placement must start with tp (tensor parallelism is innermost)")
        return self

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_gpus // self.gpus_per_node)

    @property
    def supernode(self) -> int:
        return self.supernode_size or self.gpus_per_node


# --------------------------------------------------------------------------------------
# Training job
# --------------------------------------------------------------------------------------
class DtypeSpec(Spec):
    params: Dtype = Field(default="bf16", description="the weights the forward and backward read (D_para)")
    grads: Dtype = Field(
        default="fp32",
        description="the gradient buffer: accumulation across micro-batches and the data-parallel reduction "
        "(Megatron --accumulate-allreduce-grads-in-fp32 / ddp.grad_reduce_in_fp32, NeMo grad_reduce_in_fp32, "
        "torchtitan mixed_precision_reduce, DeepSpeed data_types.grad_accum_dtype); D_grad",
    )
    optimizer: Dtype = Field(default="fp32", description="master weights and Adam moments (D_opt)")
    activations: Dtype = "bf16"
    compute: ComputeDtype = Field(
        default="bf16",
        description="GEMM input dtype; fp8 (per-tensor scaling, Transformer Engine's delayed or current scaling) and "
        "mxfp8 (MXFP8: E4M3 with an E8M0 scale per 32 elements, Transformer Engine's MXFP8BlockScaling on Blackwell) "
        "run GEMMs at the GPU's fp8 peak with the fp8_gemm efficiency; attention and the rest stay in bf16",
    )


Imbalance = Annotated[float, Field(ge=1)] | Literal["worst"]


class MoERoutingSpec(Spec):
    """How tokens reach the experts while training (MemFine: "Memory-Aware Fine-Grained Scheduling
    for MoE Training", ZTE AIH Team, section 3, eq. 2 and Fig. 2).

    s', the token copies the busiest expert-parallel rank receives in one MoE layer, lies between
    the balanced share (as many copies as its own tokens send: tokens x top_k) and the worst case,
    every token of the EP group routed to this rank's experts (MemFine eq. 2: s' -> e*s; with top_k
    experts per token, at most min(top_k, local experts) copies of each). The imbalance
    factor is s' / balanced share, capped at that worst case. MemFine Fig. 2 shows it growing with
    depth (later layers approach the worst case early in training), so it is given at the first and
    the last MoE layer and interpolated linearly in between; `worst` means the worst case.

    Defaults: 1.0 at both ends (balanced routing), what auxiliary-loss-free balancing (DeepSeek-V3)
    converges to and what every shipped figure was calibrated with; MemFine's early iterations are
    far from it (its Table 4 implies about 18x at iteration 7 on 32 EP ranks), so size memory for
    the imbalance the run will see."""

    imbalance_first_layer: Imbalance = Field(default=1.0, description="s' / balanced share at the first MoE layer (or 'worst')")
    imbalance_last_layer: Imbalance = Field(default=1.0, description="s' / balanced share at the last MoE layer (or 'worst')")
    capacity_factor: float | None = Field(
        default=None,
        gt=0,
        description="token dropping (GShard; Megatron --moe-expert-capacity-factor): an expert keeps at most this times "
        "its balanced share of tokens and drops the rest, which bounds s' (memory and time) at the cost of accuracy; None: dropless",
    )
    dispatcher: Literal["alltoall", "deepep"] = Field(
        default="alltoall",
        description="alltoall: Megatron's all-to-all dispatcher, one copy per (token, expert); deepep: DeepEP's deduplicated "
        "dispatch (Megatron --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep), one copy per (token, node) across nodes, "
        "forwarded over NVLink inside the node",
    )

    @property
    def flat(self) -> bool:
        return self.imbalance_first_layer == self.imbalance_last_layer

    def ends(self) -> tuple[float, float]:
        """(first, last) factors; inf stands for the worst case, which depends on the EP size."""
        return tuple(math.inf if x == "worst" else float(x) for x in (self.imbalance_first_layer, self.imbalance_last_layer))


#: the FLOP-counting conventions of MFU and TFLOP/s figures (costmodel.flops, seed note 004)
FlopsConvention = Literal["palm", "palm_causal", "megatron", "verl", "tgs"]


class TrainingSpec(Spec):
    global_batch_size: Count = Field(gt=0, description="sequences per step")
    seq_len: Count = Field(gt=0)
    steps: Count | None = Field(default=None, gt=0)
    tokens: float | None = Field(default=None, gt=0, description="dataset tokens; steps = ceil(tokens/(GBS*seq))")
    dtypes: DtypeSpec = DtypeSpec()
    attention_kernel: Literal["flash", "unfused"] = "flash"
    attention_impl: Literal["te", "sdpa", "triton", "flex"] | None = Field(
        default=None,
        description="which fused-attention implementation the framework runs (its efficiency: "
        "efficiency.attention_impls); None: the profile's attention curve",
    )
    tp_overlap_impl: Literal["userbuffers", "symmetric_memory"] = Field(
        default="userbuffers",
        description="how TP communication is overlapped when tp_overlap is on: userbuffers = Transformer Engine's "
        "(Megatron-LM, NeMo), which keeps hardware.tp_overlap_buffers activation-sized staging buffers; "
        "symmetric_memory = PyTorch's async TP (torchtitan enable_async_tensor_parallel): fused all-gather/"
        "reduce-scatter matmuls that work in the gathered buffer the unoverlapped path allocates anyway, no "
        "staging buffers (torchtitan Table 4: 71.9 GiB without, 67.6 GiB with it)",
    )
    loss_kernel: Literal["fused", "eager_fp32"] = Field(
        default="fused",
        description="the cross-entropy: fused = Megatron's vocab-parallel kernel (fp32 softmax saved, its gradient "
        "computed in place); eager_fp32 = PyTorch F.cross_entropy(logits.float()) as torchtitan and plain PyTorch "
        "scripts run it: the bf16 logits stay alive and the loss backward allocates fp32 gradients of the log-probs "
        "and of the logits while every activation of the micro-batch is still held (measured on an H100: "
        "calibration/kernels/h100-sxm/steps)",
    )
    optimizer_impl: Literal["fused", "foreach", "per_parameter"] = Field(
        default="fused",
        description="how the GPU Adam step runs (costmodel.update.adam_bytes_per_param): fused = one multi-tensor kernel "
        "(Megatron's Apex/Transformer Engine FusedAdam, torch AdamW(fused=True)); foreach = torch AdamW's multi-tensor "
        "default, eight elementwise passes; per_parameter = the same passes in a Python loop over the parameters "
        "(Composer's DecoupledAdamW, llm-foundry's optimizer)",
    )
    logits_fp32: bool = Field(
        default=False,
        description="the model's forward returns its logits upcast to fp32 (`self.output(h).float()`): torchtitan's "
        "Llama before its loss took over the cast (models/llama/model.py in the Sept 2024 snapshot forked-torchtitan "
        "0.202.2 on PyPI; the Mar 2025 snapshot custom-torchtitan 0.0.2.1 returns self.output(h) and casts in "
        "components/loss.py), as in Meta's reference Llama it was ported from; the logits a pipeline stage keeps per "
        "micro-batch are then 4 bytes each, and the eager loss's .float() is a no-op; false: the head's output in the "
        "activation dtype (Megatron, torchtitan since 2025)",
    )
    logits_freed_before_backward: bool = Field(
        default=False,
        description="eager_fp32 loss: the training loop drops the logits (bf16, or fp32 with logits_fp32) before "
        "loss.backward() (torchtitan's train step: `del pred`, 'need to free to before bwd to avoid peaking memory'), so "
        "the loss backward holds only its own fp32 tensors; without pipelining only, since PyTorch's pipeline schedules "
        "keep every stage's output until its backward. false: a plain script that keeps `logits` (2 or 4 bytes a logit "
        "more at the backward's start)",
    )
    elementwise: Literal["fused", "eager"] = Field(
        default="fused",
        description="the rotary embedding and SwiGLU: fused = one kernel each (Megatron's Apex/Transformer Engine kernels, "
        "torch.compile's Inductor); eager = PyTorch ops without compilation as torchtitan writes them (a complex fp32 "
        "rotary in three kernels a tensor, silu then the product): more HBM traffic and kernels "
        "(costmodel.architecture.rotary_op, _mlp)",
    )
    norm_kernel: Literal["fused", "eager_fp32"] = Field(
        default="fused",
        description="the RMSNorm/LayerNorm: fused = one kernel (Apex, Transformer Engine, a Triton kernel such as "
        "torchtitan's fused_rmsnorm, torch.compile); eager_fp32 = PyTorch composite ops on an fp32 copy (x.float(), "
        "pow, mean, rsqrt, mul, type_as, * weight; torchtitan's norm_type rmsnorm and Hugging Face without "
        "compilation): eight kernels, 4D + 28 bytes an element, and autograd keeps the fp32 copy and the unweighted "
        "output (costmodel.architecture.norm_op)",
    )
    kv_heads_expanded: bool = Field(
        default=False,
        description="grouped-query attention whose model code repeats K and V to every query head before the "
        "attention kernel (repeat_kv then F.scaled_dot_product_attention: torchtitan's Llama, Hugging Face's eager "
        "attention): the copies are written every forward, the kernel keeps them for its backward, and context "
        "parallelism exchanges them; false: the kernel reads the KV heads (Transformer Engine, Megatron-Core, "
        "flash-attn's GQA)",
    )
    fp8_saved_inputs: bool = Field(
        default=True,
        description="with fp8 or mxfp8 GEMMs, the input a GEMM alone keeps for its weight gradient (norm outputs, "
        "the SwiGLU output, the permuted expert tokens) is kept as the fp8 copy it computed with, 1 byte an element: "
        "Transformer Engine 2.x (the quantized input's column-wise data) and torchao's float8 tensorwise linear; "
        "false: kept in the activation dtype, as a framework that re-quantizes in the backward does "
        "(costmodel.architecture.fp8_saved_inputs)",
    )
    sequence_parallel: bool = Field(default=True, description="shard the residual stream over TP (Korthikanti et al. 2022)")
    tp_backward_overlap: bool = Field(
        default=True,
        description="without userbuffer overlap, the column-parallel backward still hides its input-gradient collective "
        "behind the weight-gradient GEMM (and under SP re-gathers its input behind the dgrad GEMM): Megatron's "
        "LinearWithGradAccumulationAndAsyncCommunication and Transformer Engine's Linear (--async-tensor-model-"
        "parallel-allreduce, default since 2022), which keeps the sequence-parallel shard of the input for the backward; "
        "false: torchtitan's DTensor TP, whose collectives wait where issued (costmodel.layer.tp_backward_exposed) and "
        "whose column-parallel matmuls keep the all-gathered input unless async TP fuses them (architecture.Shard."
        "keeps_gathered)",
    )
    flops_convention: FlopsConvention = Field(
        default="palm",
        description="how MFU and TFLOP/s are counted in outputs (costmodel.flops): palm (6N + full attention), palm_causal, "
        "megatron (Narayanan et al.; HFU adds the recompute forward), verl (6N x tokens + 6 sum(s^2) d a L), "
        "tgs (MemFine eq. 10 tokens/GPU/s headline; FLOP figures in palm); it changes no prediction",
    )
    p2p_scatter_gather: bool = Field(
        default=False,
        description="pre-2023 Megatron-LM (--scatter-gather-tensors-in-pipeline, on by default then): without sequence "
        "parallelism each TP rank sends 1/tp of the activation and the receiver all-gathers it",
    )
    pipeline_buffers: Literal["per_transfer", "per_microbatch"] = Field(
        default="per_transfer",
        description="the pipeline's receive buffers: per_transfer = Megatron allocates one for each P2P receive (the "
        "received activation then lives on as the stage's input); per_microbatch = PyTorch's torch.distributed."
        "pipelining (torchtitan) allocates, once for the run, an activation buffer for every micro-batch of every "
        "stage that receives one and an output-gradient buffer for every micro-batch of every stage that sends "
        "(stage.py _setup_forward_recv_info, _create_grad_recv_info): memory grows with the micro-batch count",
    )
    pipeline_return_outputs: bool = Field(
        default=True,
        description="per_microbatch pipelines: PyTorch's schedule step() returns the last stage's outputs merged "
        "(return_outputs=True, its default; schedules.py: the stage appends each micro-batch's output, the logits, "
        "to output_chunks), so the model's last stage keeps every micro-batch's logits until the step ends; false: "
        "step(return_outputs=False)",
    )
    pipeline_every_stage_outputs: bool = Field(
        default=False,
        description="per_microbatch pipelines: every stage, not only the model's last, appends each micro-batch's "
        "output to output_chunks and keeps it until the next step (torch.distributed.pipelining stage.py "
        "forward_one_chunk in the 2.5.1 and 2.6.0 releases; 2.13 keeps the last stage's only), so a stage holds all "
        "m x vp of its chunk outputs by the end of its last forward, not only those in flight",
    )
    grads_freed_between_steps: bool = Field(
        default=False,
        description="ZeRO-2/3: the optimizer's zero_grad frees the sharded gradients before each step (PyTorch's "
        "set_to_none=True under FSDP2, torchtitan), so they exist only from the first reduce-scatter on: not at the "
        "activation peak of a step with one micro-batch and no pipeline, nor under a pipeline, whose micro-batches "
        "accumulate unsharded gradients without sync until the stage's last backward (torch.distributed.pipelining "
        "stage.py backward_maybe_with_nosync: set_requires_gradient_sync(False)); false: a sharded gradient buffer "
        "kept for the run (DeepSpeed ZeRO-3's flat gradient partition, Megatron-FSDP's main_grad buffer)",
    )
    optimizer_memory: Literal["megatron", "mofa_eq4"] = Field(
        default="megatron",
        description="megatron: 3*D_opt states + a D_opt gradient copy at the step; mofa_eq4: 4*D_opt held throughout",
    )
    moe: MoERoutingSpec = Field(
        default_factory=lambda: MoERoutingSpec(),
        description="MoE routing as trained: imbalance by depth, token dropping, dispatcher (MemFine)",
    )
    mean_document_tokens: Count | None = Field(
        default=None,
        gt=0,
        description="document masks (Llama 3): packed sequences hold documents of this mean length and tokens attend "
        "only inside their document; None = one causal sequence. Cuts the attention work and unbalances CP ranks",
    )
    allocator_fragmentation: float = Field(
        default=0.05,
        ge=0,
        lt=1,
        description="share of the transient allocations (activations, gathered parameters, communication buffers, "
        "the optimizer's transient copy) the caching allocator reserves beyond what tensors use",
    )

    @model_validator(mode="before")
    @classmethod
    def _scalar_imbalance(cls, data):
        """The former scalar `moe_routing_imbalance: F` reads as a flat profile (F at every MoE layer)."""
        if isinstance(data, dict) and "moe_routing_imbalance" in data:
            data = dict(data)
            value = data.pop("moe_routing_imbalance")
            moe = data.get("moe")
            moe = dict(moe) if isinstance(moe, dict) else ({} if moe is None else moe)
            if not isinstance(moe, dict) or "imbalance_first_layer" in moe or "imbalance_last_layer" in moe:
                raise ValueError("moe_routing_imbalance: give it or moe.imbalance_first_layer/last_layer, not both")
            moe["imbalance_first_layer"] = moe["imbalance_last_layer"] = value
            data["moe"] = moe
        return data

    @model_validator(mode="after")
    def _steps(self):
        if self.steps is not None and self.tokens is not None:
            raise ValueError("give steps or tokens, not both")
        return self

    @property
    def total_steps(self) -> int | None:
        if self.steps is not None:
            return self.steps
        if self.tokens is not None:
            return math.ceil(self.tokens / (self.global_batch_size * self.seq_len))
        return None

    def bytes_of(self, what: str) -> int:
        return DTYPE_BYTES[getattr(self.dtypes, what)]


# --------------------------------------------------------------------------------------
# Features, fault tolerance, search space, fixed configuration
# --------------------------------------------------------------------------------------
#: on/off switches a configuration carries and a search may leave open
FEATURES = (
    "tp_overlap",
    "cp_overlap",
    "ep_overlap",
    "pp_overlap",
    "dp_overlap",
    "cpu_optimizer",
)

#: pipeline schedules (Megatron-LM, Llama 3 ISCA'25 section 3.1, GPipe, DeepSeek's DualPipeV)
PP_SCHEDULES = ("1f1b", "interleaved_1f1b", "flexible", "afab", "dualpipev")
#: context-parallel attention: ring (Megatron/TE p2p), Llama 3's all-gather, Ulysses all-to-all,
#: Megatron's hierarchical all-to-all inside + ring across (--cp-comm-type a2a+p2p)
CP_COMMS = ("p2p", "all_gather", "a2a", "a2a+p2p")
#: MemFine MACT: the chunk counts it chooses from (section 5.1, Method 3: thresholds [1, 2, 4, 8])
MOE_CHUNK_BINS = (1, 2, 4, 8)
#: Megatron-Core --recompute-modules (selective recompute), and `ops`: torchtitan's per-op
#: selective activation checkpointing (activation_checkpoint.selective_ac_option "op"; the
#: policy is costmodel.architecture.op_sac)
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp", "moe_act", "moe", "shared_experts", "mla_up_proj", "ops")
#: Megatron-Core --offload-modules (fine-grained activation offloading)
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")
RecomputeModule = Literal["core_attn", "layernorm", "mlp", "moe_act", "moe", "shared_experts", "mla_up_proj", "ops"]
OffloadModule = Literal["attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"]
PPSchedule = Literal["1f1b", "interleaved_1f1b", "flexible", "afab", "dualpipev"]
CPComm = Literal["p2p", "all_gather", "a2a", "a2a+p2p"]
#: an activation-offload setting: off, MoFa's whole-layer offload (eqs. 33-35; Megatron's
#: --cpu-offloading), or Megatron's fine-grained offload of these modules' saved inputs
OffloadSetting = Union[bool, Literal["layer"], list[OffloadModule]]


def _yaml_boolean(v):
    """YAML 1.1 reads an unquoted on/off as a boolean."""
    return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v


class FeaturesSpec(Spec):
    """Which optimisation features the search may use ('allowed'), must use ('on') or may not."""

    tp_overlap: FeatureMode = "allowed"
    cp_overlap: FeatureMode = "allowed"
    ep_overlap: FeatureMode = "allowed"
    pp_overlap: FeatureMode = "allowed"
    dp_overlap: FeatureMode = "allowed"
    cpu_optimizer: FeatureMode = "allowed"
    activation_offload: FeatureMode = Field(default="allowed", description="the settings tried are search.activation_offload")
    recompute: list[RecomputeMode] = ["none", "selective", "full"]
    zero_stage: list[Literal[0, 1, 2, 3]] = Field(
        default=[0, 1, 2, 3],
        description="data-parallel sharding the search may use: 0 DDP, 1 optimizer states (Megatron's distributed "
        "optimizer), 2 + gradients, 3 + parameters (FSDP / ZeRO-3)",
    )
    fsdp_reshard_after_forward: FeatureMode = Field(
        default="allowed", description="ZeRO-3: free the gathered parameters after the forward (FSDP's default)"
    )

    @model_validator(mode="before")
    @classmethod
    def _distributed_optimizer_alias(cls, data):
        """`distributed_optimizer: on|off|allowed` (Megatron's switch) reads as zero_stage [1] / [0] / [0, 1]."""
        if isinstance(data, dict) and "distributed_optimizer" in data:
            data = dict(data)
            mode = _yaml_boolean(data.pop("distributed_optimizer"))
            if "zero_stage" in data:
                raise ValueError("distributed_optimizer: give zero_stage or distributed_optimizer, not both")
            choices = {"on": [1], "off": [0], "allowed": [0, 1]}
            if mode not in choices:
                raise ValueError(f"distributed_optimizer: must be on, off or allowed (got {mode!r})")
            data["zero_stage"] = choices[mode]
        return data

    @field_validator(*FEATURES, "activation_offload", "fsdp_reshard_after_forward", mode="before")
    @classmethod
    def _yaml_booleans(cls, v):
        return _yaml_boolean(v)

    @field_validator("recompute", mode="before")
    @classmethod
    def _one_or_many(cls, v):
        if isinstance(v, str):
            return ["none", "selective", "full"] if v == "allowed" else [v]
        return v

    @field_validator("recompute", "zero_stage")
    @classmethod
    def _not_empty(cls, v):
        if not v:
            raise ValueError("an empty list admits no configuration")
        return sorted(set(v), key=v.index)


class FaultToleranceSpec(Spec):
    """Inputs of MoFa's fault-tolerance model (eqs. 36-44)."""

    failure_rate_per_node_day: float = Field(ge=0, description="r_f, failures per node per day")
    recovery_time_s: float | None = Field(default=None, ge=0, description="u_b, mean time to recover one failure")
    recovery_mix: dict[Literal["process", "pod", "job"], Probability] | None = Field(
        default=None, description="eq. 41 probabilities; MoFa: 3:6:1"
    )
    recovery_times_s: dict[Literal["process", "pod", "job"], NonNegative] = {"process": 141.0, "pod": 262.0, "job": 307.0}
    first_init_s: float = Field(default=0.0, ge=0, description="u_0")
    checkpoint_save_s: float | None = Field(default=None, ge=0, description="T_save, blocking time per save")
    checkpoint_write_gb_per_s_per_node: float | None = Field(
        default=None, gt=0, description="derive T_save from the checkpoint size instead"
    )
    checkpoint_interval: Annotated[Count, Field(gt=0)] | Literal["optimal"] = Field(
        default="optimal", description="steps between checkpoints, or 'optimal' (eq. 44)"
    )

    @model_validator(mode="after")
    def _complete(self):
        if self.recovery_time_s is None and self.recovery_mix is None:
            raise ValueError("give recovery_time_s (u_b) or recovery_mix (eq. 41)")
        if self.checkpoint_save_s is None and self.checkpoint_write_gb_per_s_per_node is None:
            raise ValueError("give checkpoint_save_s or checkpoint_write_gb_per_s_per_node")
        if self.recovery_mix is not None and abs(sum(self.recovery_mix.values()) - 1) > 1e-6:
            raise ValueError("recovery_mix probabilities must sum to 1")
        return self

    @property
    def mean_recovery_s(self) -> float:
        """u_b (eq. 41 when a mix is given)."""
        if self.recovery_time_s is not None:
            return self.recovery_time_s
        return sum(p * self.recovery_times_s[k] for k, p in self.recovery_mix.items())


IntChoices = list[Count] | None


def _positive_sorted(v):
    if v is not None:
        if not v:
            raise ValueError("an empty list admits no configuration")
        if any(x <= 0 for x in v):
            raise ValueError("values must be positive")
        return sorted(set(v))
    return v


class GpuRange(Spec):
    """Cluster sizes from `min` to `max`: every `step` GPUs, or (with `factor`) each size
    `factor` times the last -- what a cluster that grows by whole nodes or by doublings offers."""

    min: Count = Field(gt=0)
    max: Count = Field(gt=0)
    step: Count | None = Field(default=None, gt=0, description="arithmetic progression min, min+step, ... <= max")
    factor: Count | None = Field(default=None, gt=1, description="geometric progression min, min*factor, ... <= max")

    @model_validator(mode="after")
    def _one_progression(self):
        if self.max < self.min:
            raise ValueError(f"max {self.max} is below min {self.min}")
        if (self.step is None) == (self.factor is None):
            raise ValueError("give exactly one of step or factor")
        if len(self.sizes()) > MAX_CLUSTER_SIZES:
            raise ValueError(f"spans more than {MAX_CLUSTER_SIZES} cluster sizes")
        return self

    def sizes(self) -> list[int]:
        out, n = [], self.min
        while n <= self.max and len(out) <= MAX_CLUSTER_SIZES:
            out.append(n)
            n = n + self.step if self.step is not None else n * self.factor
        return out


#: cluster sizes one problem may offer (each is a whole solve)
MAX_CLUSTER_SIZES = 256
ClusterObjective = Literal["time_to_train", "gpu_hours", "cost"]


class SearchSpec(Spec):
    """Narrowing of the search space; None = every value the rules admit."""

    tp: IntChoices = None
    cp: IntChoices = None
    pp: IntChoices = None
    vp: IntChoices = None
    ep: IntChoices = None
    etp: IntChoices = None
    mbs: IntChoices = Field(default=None, description="default: powers of two up to 8")
    layer_split: list[SplitMode] = Field(
        default=["even", "embedding_loss", "uneven", "layout"],
        description="layer layouts the search may use (costmodel.layout.split_layers; layout: where Megatron's split flags "
        "admit no split of pp x vp, a --pipeline-model-parallel-layout; DualPipeV takes its V split, costmodel.layout.vee_split, "
        "under uneven, or under even where 2pp divides the layers)"
    )
    pp_schedule: list[PPSchedule] = Field(
        default=list(PP_SCHEDULES), description="pipeline schedules the search may use (where pp > 1)"
    )
    pp_group: IntChoices = Field(
        default=None,
        description="flexible schedule: micro-batches per round nc (> pp); default 2*pp where the micro-batches allow",
    )
    cp_comm: list[CPComm] = Field(default=list(CP_COMMS), description="context-parallel attention variants (where cp > 1)")
    cp_a2a: IntChoices = Field(default=None, description="a2a+p2p: the all-to-all degree inside CP; default every proper divisor > 1")
    dp_shard: IntChoices = Field(
        default=None,
        description="hybrid sharding (HSDP): sharding-group sizes to try besides the whole dp*cp group; default none",
    )
    recompute_modules: list[list[RecomputeModule]] = Field(
        default=[["core_attn"]],
        description="selective recompute: the module sets to try (Megatron --recompute-modules; [ops] is torchtitan's "
        "per-op policy, the default of a torchtitan search)",
    )
    recompute_block_layers: IntChoices = Field(
        default=None,
        description="full recompute with method block: layers per virtual stage recomputed; default the powers of two "
        "below the stage's layer count (method uniform with 1 layer is always tried)",
    )
    activation_offload: list[OffloadSetting] = Field(
        default=[False, "layer"], description="offload settings the search may use when features.activation_offload allows"
    )
    moe_chunks: list[Annotated[Count, Field(gt=0)] | Literal["auto"]] = Field(
        default=[1],
        description="MemFine FCDA chunk counts to try on MoE models (e.g. [1, 2, 4, 8] or ['auto']); default no chunking",
    )
    tp_domain: Literal["node", "supernode"] = Field(default="node", description="TP must stay inside this")
    framework: Literal["any", "megatron", "megatron-bridge", "torchtitan", "deepspeed"] = Field(
        default="any",
        description="search only what this framework runs (costmodel.frameworks: the rules its exporter refuses by); "
        "any: every configuration the model's own rules admit",
    )
    objective: Literal["step", "e2e"] = "step"
    max_interval: Count = Field(default=100000, gt=0)
    # choosing the cluster too (issue 11; optimizer.cluster): each listed GPU count and GPU type
    # is a candidate cluster, solved on its own, and the best is chosen by `cluster_objective`
    num_gpus: list[Annotated[Count, Field(gt=0)]] | GpuRange | None = Field(
        default=None, description="cluster sizes to choose from (a list, or {min, max, step} / {min, max, factor}); default cluster.num_gpus only")
    hardware: list[str] | None = Field(default=None, description="GPU presets to choose from; default the problem's hardware only")
    price_per_gpu_hour: Positive | dict[str, Positive] | None = Field(
        default=None, description="price of one GPU-hour (one number, or per GPU preset name): what objective cost and budget_cost need")
    cluster_objective: ClusterObjective = Field(
        default="time_to_train", description="how clusters are ranked: time to train (s), GPU-hours or cost (GPU-hours x price)")
    deadline_hours: Positive | None = Field(default=None, description="admit only clusters whose time to train is within this")
    budget_gpu_hours: Positive | None = Field(default=None, description="admit only clusters within this many GPU-hours")
    budget_cost: Positive | None = Field(default=None, description="admit only clusters whose cost (price x GPU-hours) is within this")

    @field_validator("num_gpus", mode="before")
    @classmethod
    def _range_or_list(cls, v):
        """One message for the form given (a union's error would list every branch's)."""
        if isinstance(v, dict):
            from pydantic import ValidationError

            try:
                return GpuRange.model_validate(v)
            except ValidationError as exc:
                err = exc.errors(include_url=False)[0]
                where = ".".join(str(x) for x in err["loc"])
                raise ValueError((f"{where}: " if where else "") + str(err["msg"]).removeprefix("Value error, ")) from None
        if v is not None and not isinstance(v, list):
            raise ValueError("must be a list of GPU counts or a range {min, max, step} / {min, max, factor}")
        return v

    @field_validator("price_per_gpu_hour", mode="before")
    @classmethod
    def _price(cls, v):
        def positive(x):
            return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0

        if v is None or positive(v):
            return v
        if isinstance(v, dict):
            bad = next((k for k, x in v.items() if not positive(x)), None)
            if bad is None:
                return v
            raise ValueError(f"the price of '{bad}' must be a positive number")
        raise ValueError("must be a positive number or a mapping of GPU preset names to positive numbers")

    @field_validator("num_gpus")
    @classmethod
    def _sizes(cls, v):
        if isinstance(v, list):
            if not v:
                raise ValueError("an empty list admits no cluster")
            return sorted(set(v))
        return v

    @field_validator("hardware")
    @classmethod
    def _hardware_names(cls, v):
        if v is not None:
            if not v:
                raise ValueError("an empty list admits no cluster")
            if len(set(v)) != len(v):
                raise ValueError(f"lists '{next(x for x in v if v.count(x) > 1)}' twice")
        return v

    @property
    def chooses_cluster(self) -> bool:
        """Whether the problem offers more than its own cluster (or ranks/limits clusters)."""
        return any(x is not None for x in (self.num_gpus, self.hardware, self.deadline_hours, self.budget_gpu_hours, self.budget_cost)) \
            or self.cluster_objective != "time_to_train"

    def gpu_counts(self) -> list[int] | None:
        if self.num_gpus is None:
            return None
        return list(self.num_gpus) if isinstance(self.num_gpus, list) else self.num_gpus.sizes()

    @field_validator("tp", "cp", "pp", "vp", "ep", "etp", "mbs", "pp_group", "cp_a2a", "dp_shard", "recompute_block_layers")
    @classmethod
    def _positive_ints(cls, v):
        return _positive_sorted(v)

    @field_validator("pp_schedule", "cp_comm", "layer_split", "recompute_modules", "activation_offload", "moe_chunks")
    @classmethod
    def _not_empty(cls, v):
        if not v:
            raise ValueError("an empty list admits no configuration")
        if any(isinstance(x, list) and not x for x in v):
            raise ValueError("an empty module list: leave the setting out instead")
        if any(isinstance(x, list) and "ops" in x and len(x) > 1 for x in v):
            raise ValueError("ops (torchtitan's per-op policy) decides for every op of a layer: a set with ops takes no other module")
        return v


class ConfigSpec(Spec):
    """One fixed configuration (a column of MoFa Table 5)."""

    tp: Count = Field(default=1, gt=0)
    cp: Count = Field(default=1, gt=0)
    pp: Count = Field(default=1, gt=0)
    vp: Count = Field(default=1, gt=0, description="virtual pipeline stages per rank (interleaving)")
    ep: Count = Field(default=1, gt=0)
    etp: Count | None = Field(default=None, gt=0, description="expert tensor parallelism; default = tp")
    mbs: Count = Field(default=1, gt=0)
    dp: Count | None = Field(default=None, gt=0, description="derived from the world size; checked if given")
    layer_split: SplitMode | Literal["auto"] = "auto"
    first_stage_layers: Count | None = Field(default=None, gt=0, description="Megatron --decoder-first-pipeline-num-layers")
    last_stage_layers: Count | None = Field(default=None, gt=0, description="Megatron --decoder-last-pipeline-num-layers")
    pp_schedule: PPSchedule | None = Field(default=None, description="default: 1f1b, or interleaved_1f1b when vp > 1")
    pp_group: Count | None = Field(
        default=None, gt=0, description="flexible schedule: consecutive micro-batches per round, nc (Llama 3 section 3.1.1)"
    )
    cp_comm: CPComm = Field(default="p2p", description="Megatron --cp-comm-type")
    cp_a2a: Count | None = Field(
        default=None, gt=1, description="a2a+p2p: all-to-all degree inside CP (Megatron --hierarchical-context-parallel-sizes)"
    )
    zero_stage: Literal[0, 1, 2, 3] = Field(
        default=0, description="0 DDP, 1 optimizer states sharded (Megatron's distributed optimizer), 2 + gradients, 3 + parameters (FSDP)"
    )
    reshard_after_forward: bool | None = Field(
        default=None, description="ZeRO-3: free gathered parameters after the forward; default true (FSDP's default)"
    )
    dp_shard: Count | None = Field(
        default=None, gt=0, description="hybrid sharding (HSDP): ranks in a sharding group; default the whole dp*cp group"
    )
    recompute: RecomputeMode = "none"
    recompute_method: Literal["uniform", "block"] = Field(
        default="uniform", description="full recompute: Megatron --recompute-method"
    )
    recompute_num_layers: Count | None = Field(
        default=None,
        gt=0,
        description="full recompute: uniform = layers per checkpointed group (default 1); block = layers recomputed "
        "in each virtual stage (default all)",
    )
    recompute_modules: list[RecomputeModule] | None = Field(
        default=None,
        description="selective recompute: Megatron --recompute-modules (default core_attn), or [ops]: torchtitan's per-op "
        "policy (keeps the attention kernel's output and every other matmul's, recomputes the rest)",
    )
    moe_chunks: Annotated[Count, Field(gt=0)] | Literal["auto"] = Field(
        default=1,
        description="MemFine's FCDA: split each MoE layer's dispatch / expert computation / combine into this many token "
        "chunks, recomputed chunk by chunk in the backward (peak MoE activation = one chunk); 'auto': MACT, the smallest "
        "of MOE_CHUNK_BINS that fits (MemFine eqs. 8-9); 1: no chunking",
    )
    tp_overlap: bool = False
    cp_overlap: bool = False
    ep_overlap: bool = False
    pp_overlap: bool = False
    dp_overlap: bool = False
    cpu_optimizer: bool = False
    activation_offload: OffloadSetting = Field(
        default=False,
        description="true or 'layer': MoFa's whole-layer offload (eqs. 33-35); a list: Megatron's fine-grained offload of these modules",
    )
    checkpoint_interval: Annotated[int, Field(gt=0)] | Literal["optimal"] | None = Field(
        default=None, description="steps between checkpoints; None: the fault_tolerance section's"
    )

    @model_validator(mode="before")
    @classmethod
    def _distributed_optimizer_alias(cls, data):
        """`distributed_optimizer: true` (Megatron's --use-distributed-optimizer) is zero_stage 1."""
        if isinstance(data, dict) and "distributed_optimizer" in data:
            data = dict(data)
            value = data.pop("distributed_optimizer")
            if not isinstance(value, bool):
                raise ValueError(f"distributed_optimizer: must be true or false (got {value!r})")
            stage = data.get("zero_stage")
            if stage is not None and (stage >= 1) != value:
                raise ValueError(f"distributed_optimizer: {value} contradicts zero_stage {stage}")
            data.setdefault("zero_stage", 1 if value else 0)
        return data

    @field_validator("recompute_modules")
    @classmethod
    def _modules_not_empty(cls, v):
        if v is not None and not v:
            raise ValueError("an empty module list: use recompute: none instead")
        if v is not None and "ops" in v and len(v) > 1:
            raise ValueError("ops (torchtitan's per-op policy) decides for every op of a layer: it takes no other module")
        return v

    @field_validator("recompute_modules", "recompute_method", "recompute_num_layers", "pp_group", "cp_a2a", "reshard_after_forward")
    @classmethod
    def _settings_of_other_modes(cls, v, info):
        """A setting that belongs to a mode the configuration does not use is a mistake, not
        something to ignore silently (each field comes after the mode it depends on)."""
        needs = {
            "recompute_modules": ("recompute", "selective"),
            "recompute_method": ("recompute", "full"),
            "recompute_num_layers": ("recompute", "full"),
            "pp_group": ("pp_schedule", "flexible"),
            "cp_a2a": ("cp_comm", "a2a+p2p"),
            "reshard_after_forward": ("zero_stage", 3),
        }
        mode, value = needs[info.field_name]
        unset = v is None or (info.field_name == "recompute_method" and v == "uniform") or (info.field_name == "reshard_after_forward" and v is False)
        if not unset and mode in info.data and info.data[mode] != value:
            raise ValueError(f"applies to {mode}: {value} only")
        return v


# --------------------------------------------------------------------------------------
# The problem
# --------------------------------------------------------------------------------------
class Problem(Spec):
    name: str = ""
    description: str = ""
    model: ModelSpec
    hardware: HardwareSpec
    cluster: ClusterSpec
    training: TrainingSpec
    features: FeaturesSpec = FeaturesSpec()
    fault_tolerance: FaultToleranceSpec | None = None
    search: SearchSpec = SearchSpec()
    config: ConfigSpec | None = None

    @model_validator(mode="after")
    def _framework_kernels(self):
        """A problem searched for torchtitan runs TP the way its exporter launches it, unless
        training says: overlapped by PyTorch's async TP (--compile.enable-async-tensor-parallel)
        where tp_overlap is on, else DTensor's synchronous collectives; its pipeline is PyTorch's,
        with a receive buffer per micro-batch; its Llama repeats K/V to every query head
        (torchtitan models/llama3 Attention.forward: repeat_kv before the attention call); its
        optimizers' zero_grad frees the sharded gradients (set_to_none)."""
        if self.search.framework == "torchtitan":
            given = self.training.model_fields_set
            update = {k: v for k, v in (("tp_overlap_impl", "symmetric_memory"), ("tp_backward_overlap", False), ("pipeline_buffers", "per_microbatch"),
                                        ("kv_heads_expanded", True), ("grads_freed_between_steps", True))
                      if k not in given}
            object.__setattr__(self, "training", self.training.model_copy(update=update))
            if "recompute_modules" not in self.search.model_fields_set:  # its selective AC is the per-op policy
                object.__setattr__(self, "search", self.search.model_copy(update={"recompute_modules": [["ops"]]}))
        return self

    @model_validator(mode="after")
    def _compute_dtype_has_a_peak(self):
        dtype = self.training.dtypes.compute
        if dtype == "mxfp8" and dtype not in self.hardware.peak_tflops:
            raise ValueError(
                f"training.dtypes.compute: mxfp8 needs tensor cores that apply MX block scales (Blackwell: b200, gb200); "
                f"{self.hardware.name} has none{' -- use fp8 (per-tensor scaling)' if 'fp8' in self.hardware.peak_tflops else ''}"
            )
        if dtype not in self.hardware.peak_tflops:
            raise ValueError(f"training.dtypes.compute: {self.hardware.name} has no peak for {dtype} (it lists {', '.join(self.hardware.peak_tflops)})")
        return self

