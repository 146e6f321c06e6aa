"""The launch plan: one configuration of a problem, typed and complete, as the exporters read it.

A plan is built once from a problem and one configuration row (a `ConfigSpec`, as a solve
result or an evaluation hands it over) and carries every decision a launcher needs: the
world, every parallel degree and the pipeline layout (layers on the first and last rank,
schedule, round size), the CP variant, the data-parallel sharding (ZeRO stage, FSDP options,
HSDP groups), the batch, recompute and offload, the overlaps, the dtypes (gradient reduction
included), the checkpoint interval, the number of iterations and the model architecture. The
exporters (mofa.launch.megatron, .torchtitan, .deepspeed) translate it and nothing else; they
never re-derive a layout. `result.json` stores each configuration's plan, so `mofa export`
validates it back into this type.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from costmodel.specs import CPComm, DtypeSpec, ModelSpec, OffloadModule, PPSchedule, RecomputeModule


class LaunchPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # where it comes from
    problem: str = Field(description="the problem's name")
    hardware: str = Field(description="the GPU the plan was sized for")
    model: ModelSpec = Field(description="the architecture")

    # the world
    num_gpus: int = Field(gt=0)
    gpus_per_node: int = Field(gt=0)
    num_nodes: int = Field(gt=0)

    # parallel degrees: world = tp * cp * pp * dp; experts: ep * etp within a stage
    tp: int = Field(gt=0)
    cp: int = Field(gt=0)
    pp: int = Field(gt=0)
    vp: int = Field(gt=0, description="virtual stages per pipeline rank")
    dp: int = Field(gt=0)
    ep: int = Field(gt=0)
    etp: int = Field(gt=0)
    sequence_parallel: bool = Field(description="TP shards the residual stream (only meaningful with tp > 1)")

    # pipeline layout and schedule
    layer_split: Literal["single", "even", "embedding_loss", "uneven", "layout"] = Field(
        description="single: pp = 1; even: L/(pp*vp) per virtual stage; embedding_loss: the embedding and the loss count as "
        "a layer each; uneven: first and last rank as given, the middle ranks split the rest evenly; layout: the same where "
        "vp does not divide the first or last rank's layers, launched as the pipeline_layout (costmodel.layout)"
    )
    first_stage_layers: int = Field(ge=0, description="transformer layers on the first pipeline rank")
    last_stage_layers: int = Field(ge=0, description="transformer layers on the last pipeline rank")
    middle_stage_layers: int = Field(ge=0, description="transformer layers on each middle rank (0 when pp <= 2)")
    pipeline_layout: str | None = Field(
        default=None, description="a heterogeneous layout (Megatron-Core's --pipeline-model-parallel-layout: E t m L per virtual "
        "stage, `|` between stages) found by `mofa solve --pipeline-layouts`, or the layout split written out; it replaces "
        "the split above")
    pp_schedule: PPSchedule
    pp_group: int | None = Field(default=None, description="flexible schedule: micro-batches per round (nc)")

    # context parallelism
    cp_comm: CPComm
    cp_a2a: int | None = Field(default=None, description="a2a+p2p: the all-to-all degree inside CP")

    # data-parallel sharding over the dp*cp ranks of a stage
    zero_stage: Literal[0, 1, 2, 3]
    reshard_after_forward: bool = Field(description="ZeRO-3: free gathered parameters after the forward")
    dp_shard: int = Field(gt=0, description="ranks in a sharding group (dp*cp unless HSDP)")
    dp_replicate: int = Field(gt=0, description="sharding groups that replicate each other (HSDP; 1 otherwise)")

    # batch
    micro_batch_size: int = Field(gt=0)
    global_batch_size: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    microbatches: int = Field(gt=0, description="micro-batches per data-parallel rank per step (gradient accumulation)")

    # memory
    recompute: Literal["none", "selective", "full"]
    recompute_method: Literal["uniform", "block"] | None = None
    recompute_num_layers: int | None = None
    recompute_modules: list[RecomputeModule] | None = None
    activation_offload: Literal[False, "layer"] | list[OffloadModule] = False
    cpu_optimizer: bool
    moe_chunks: int | Literal["auto"] = Field(default=1, description="MemFine FCDA token chunks per MoE layer (1: none)")

    # MoE routing (training.moe)
    moe_dispatcher: Literal["alltoall", "deepep"] = "alltoall"
    moe_capacity_factor: float | None = Field(default=None, description="token dropping: an expert's capacity / its balanced share")

    # overlaps
    tp_overlap: bool
    cp_overlap: bool
    ep_overlap: bool
    pp_overlap: bool
    dp_overlap: bool

    # numerics and optimizer
    dtypes: DtypeSpec = Field(description="params, gradient accumulation/reduction, optimizer states, activations, GEMM inputs")
    optimizer: Literal["adam"] = "adam"
    attention_kernel: Literal["flash", "unfused"] = "flash"
    compiled: bool = Field(default=True, description="the norms, rotary and SwiGLU run fused (training.elementwise and "
                           "norm_kernel fused): torchtitan is launched with torch.compile, which fuses them")

    # length and checkpoints
    train_iters: int | None = Field(description="training.steps, or tokens / (global batch x sequence); None when the problem gives neither")
    checkpoint_interval: int | None = Field(description="steps between checkpoints (eq. 44's optimum or as given); None: no fault-tolerance section")

    @property
    def world(self) -> int:
        return self.num_gpus

    @property
    def dp_cp(self) -> int:
        return self.dp * self.cp

    @property
    def hsdp(self) -> bool:
        return self.dp_replicate > 1

    def label(self) -> str:
        from costmodel.configs import config_label, features_label

        row = {"tp": self.tp, "cp": self.cp, "pp": self.pp, "vp": self.vp, "dp": self.dp, "ep": self.ep, "etp": self.etp,
               "mbs": self.micro_batch_size, "first_stage_layers": self.first_stage_layers, "last_stage_layers": self.last_stage_layers,
               "pipeline_layout": self.pipeline_layout,
               "pp_schedule": self.pp_schedule, "pp_group": self.pp_group, "cp_comm": self.cp_comm, "cp_a2a": self.cp_a2a,
               "zero_stage": self.zero_stage, "reshard_after_forward": self.reshard_after_forward,
               "dp_shard": self.dp_shard if self.hsdp else None, "recompute": self.recompute, "recompute_method": self.recompute_method,
               "recompute_num_layers": self.recompute_num_layers, "recompute_modules": self.recompute_modules,
               "activation_offload": self.activation_offload, "tp_overlap": self.tp_overlap, "cp_overlap": self.cp_overlap,
               "ep_overlap": self.ep_overlap, "pp_overlap": self.pp_overlap, "dp_overlap": self.dp_overlap, "cpu_optimizer": self.cpu_optimizer}
        return f"{config_label(row)} {features_label(row)}"

    def facts(self):
        """What costmodel.frameworks' rules read besides the configuration."""
        from costmodel.frameworks import RunFacts

        return RunFacts(model=self.model, dtypes=self.dtypes, num_gpus=self.num_gpus, gpus_per_node=self.gpus_per_node,
                        train_iters=self.train_iters, moe_dispatcher=self.moe_dispatcher, moe_capacity_factor=self.moe_capacity_factor,
                        attention_kernel=self.attention_kernel)

    def batch(self):
        """The plan as a one-row ConfigBatch, the table costmodel.frameworks' rules read (the
        search hands them millions of rows; an exporter this one)."""
        from costmodel.configs import (CP_COMM_CODES, PP_SCHEDULE_CODES, RECOMPUTE_CODES, RECOMPUTE_METHOD_CODES,
                                       RECOMPUTE_MODULE_BITS, ConfigBatch, chunks_code, mask_of, offload_code)

        return ConfigBatch.from_columns(
            self.num_gpus, tp=self.tp, cp=self.cp, pp=self.pp, vp=self.vp, ep=self.ep, etp=self.etp, mbs=self.micro_batch_size,
            first_layers=self.first_stage_layers, last_layers=self.last_stage_layers,
            pp_schedule=PP_SCHEDULE_CODES[self.pp_schedule], pp_group=self.pp_group or 0,
            cp_comm=CP_COMM_CODES[self.cp_comm], cp_a2a=self.cp_a2a or 0, dp_shard=self.dp_shard if self.hsdp else 0,
            recompute=RECOMPUTE_CODES[self.recompute], recompute_method=RECOMPUTE_METHOD_CODES[self.recompute_method or "uniform"],
            recompute_layers=self.recompute_num_layers or 0,
            recompute_modules=mask_of(self.recompute_modules or [], RECOMPUTE_MODULE_BITS),
            activation_offload=offload_code(self.activation_offload), moe_chunks=chunks_code(self.moe_chunks),
            zero_stage=self.zero_stage, reshard_after_forward=int(self.reshard_after_forward), cpu_optimizer=int(self.cpu_optimizer),
            tp_overlap=int(self.tp_overlap), cp_overlap=int(self.cp_overlap), ep_overlap=int(self.ep_overlap),
            pp_overlap=int(self.pp_overlap), dp_overlap=int(self.dp_overlap))


def build_plan(problem, spec, checkpoint_interval: int | None = None) -> LaunchPlan:
    """The plan of one configuration. `spec` is a ConfigSpec with the layer split explicit
    (ConfigBatch.spec gives one); `checkpoint_interval` is the interval the evaluation chose
    (eq. 44) where the configuration leaves it to the optimum."""
    from costmodel.configs import ConfigBatch
    from costmodel.layout import layout_name
    from costmodel.rules import config_violations

    broken = config_violations(problem, spec)
    if broken:
        field, message = broken[0]
        raise ValueError(f"not a runnable configuration ({field}): {message}")
    row = ConfigBatch.from_specs(problem, [spec])  # the canonical row: defaults resolved once, by the model's own rules
    spec = row.spec(0)
    m, tr, cl = problem.model, problem.training, problem.cluster
    L, pp, vp = m.num_layers, spec.pp, spec.vp
    first, last = spec.first_stage_layers, spec.last_stage_layers
    dp = int(row.dp[0])
    dp_cp = dp * spec.cp
    shard = spec.dp_shard or dp_cp
    interval = spec.checkpoint_interval if isinstance(spec.checkpoint_interval, int) else checkpoint_interval
    split = "single" if pp == 1 else layout_name(L, pp, vp, first, last, spec.pp_schedule)
    layout = None
    if split == "layout":  # no split flag expresses it: the layout string is the launch's only way
        from costmodel.stage_layout import megatron_layout

        layout = megatron_layout(L, m.mtp_layers, pp, vp, first, last).to_megatron()
    return LaunchPlan(
        problem=problem.name or "",
        hardware=problem.hardware.name,
        model=m,
        num_gpus=cl.num_gpus,
        gpus_per_node=min(cl.gpus_per_node, cl.num_gpus),
        num_nodes=cl.num_nodes,
        tp=spec.tp, cp=spec.cp, pp=pp, vp=vp, dp=dp, ep=spec.ep, etp=spec.etp,
        sequence_parallel=spec.tp > 1 and tr.sequence_parallel,
        layer_split=split,
        first_stage_layers=first, last_stage_layers=last,
        middle_stage_layers=(L - first - last) // (pp - 2) if pp > 2 else 0,
        pipeline_layout=layout,
        pp_schedule=spec.pp_schedule, pp_group=spec.pp_group,
        cp_comm=spec.cp_comm, cp_a2a=spec.cp_a2a,
        zero_stage=spec.zero_stage, reshard_after_forward=bool(spec.reshard_after_forward),
        dp_shard=shard, dp_replicate=dp_cp // shard,
        micro_batch_size=spec.mbs, global_batch_size=tr.global_batch_size, seq_len=tr.seq_len,
        microbatches=tr.global_batch_size // (spec.mbs * dp),
        recompute=spec.recompute,
        recompute_method=spec.recompute_method if spec.recompute == "full" else None,
        recompute_num_layers=spec.recompute_num_layers,
        recompute_modules=spec.recompute_modules,
        activation_offload=spec.activation_offload,
        cpu_optimizer=spec.cpu_optimizer,
        moe_chunks=spec.moe_chunks,
        moe_dispatcher=tr.moe.dispatcher,
        moe_capacity_factor=tr.moe.capacity_factor,
        tp_overlap=spec.tp_overlap, cp_overlap=spec.cp_overlap, ep_overlap=spec.ep_overlap,
        pp_overlap=spec.pp_overlap, dp_overlap=spec.dp_overlap,
        dtypes=tr.dtypes,
        attention_kernel=tr.attention_kernel,
        compiled=tr.elementwise == "fused" and tr.norm_kernel == "fused",
        train_iters=tr.total_steps,
        checkpoint_interval=interval,
    )


def with_pipeline_layout(plan: LaunchPlan, layout) -> LaunchPlan:
    """The plan launching a heterogeneous layout (costmodel.stage_layout.StageLayout, the layout
    search's or the user's): by the split flags where they build exactly its stages (the first
    and last ranks' layer counts, as build_plan writes a split: every framework reads them, where
    DeepSpeed reads no layout string and older Megatron-LM has none), else as the layout string,
    which replaces the split. Its recompute fields are the caller's (launch_recompute)."""
    from types import SimpleNamespace

    import numpy as np

    from costmodel.layout import flag_split_ok, layout_name
    from costmodel.stage_layout import LayoutError, megatron_layout

    L, pp, vp = plan.model.num_layers, plan.pp, plan.vp
    first, last = sum(layout.decoders[0::pp]), sum(layout.decoders[pp - 1::pp])
    row = SimpleNamespace(pp=np.array([pp]), vp=np.array([vp]), first_layers=np.array([first]), last_layers=np.array([last]))
    if pp > 1 and plan.pp_schedule != "dualpipev" and flag_split_ok(L, row)[0]:
        try:
            flags = megatron_layout(L, plan.model.mtp_layers, pp, vp, first, last)
        except LayoutError:
            flags = None
        if flags is not None and (flags.decoders, flags.mtp) == (layout.decoders, layout.mtp):
            return plan.model_copy(update={
                "layer_split": layout_name(L, pp, vp, first, last, plan.pp_schedule), "first_stage_layers": first,
                "last_stage_layers": last, "middle_stage_layers": (L - first - last) // (pp - 2) if pp > 2 else 0,
                "pipeline_layout": None})
    return plan.model_copy(update={"pipeline_layout": layout.to_megatron()})
