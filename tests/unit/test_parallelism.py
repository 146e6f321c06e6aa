"""The plans people run (issue 7): ZeRO-0..3 / FSDP / HSDP, schedules, CP variants, document
masks, recompute granularity, fine-grained offload, and the memory ledger in bytes."""

import numpy as np
import pytest

from conftest import PROBLEMS
from costmodel.configs import CP_COMM_CODES, OFFLOAD_MODULE_BITS, PP_SCHEDULE_CODES, RECOMPUTE_MODULE_BITS, ConfigBatch
from costmodel.documents import document_mask_work
from costmodel.evaluate import evaluate, layer_costs
from costmodel.layout import vee_split
from costmodel.loader import ProblemError, load_problem
from costmodel.memory import MEMORY_KEYS
from costmodel.rules import violations
from costmodel.specs import ConfigSpec
from costmodel.units import GIB

LLAMA3_8K = str(PROBLEMS / "tuning" / "llama3_405b_16384xh100_seq8k.yaml")
LLAMA3_128K = str(PROBLEMS / "tuning" / "llama3_405b_16384xh100_seq128k.yaml")
SMALL = str(PROBLEMS / "tuning" / "llama2_70b_128gpu.yaml")

# Meta's layouts (Chu et al. ISCA'25 Table 2 and sections 3.1.2-3.1.3, 3.2.2): TP 8, PP 16,
# 126 layers with one fewer on the first and last stage (the embedding/loss-accounted split),
# one transformer layer per virtual stage ((126 + 2)/16 = 8), ZeRO-2 with all-forward-all-
# backward since bs = 16 < 2*pp, no recompute, micro-batches of one sequence.
META = ["tp=8", "pp=16", "vp=8", "mbs=1", "layer_split=embedding_loss", "zero_stage=2", "pp_schedule=afab",
        "pp_overlap=true", "dp_overlap=true", "recompute=none"]


def run(path, overrides):
    problem = load_problem(path, overrides)
    cfg = ConfigBatch.from_specs(problem, [problem.config])
    return problem, cfg, evaluate(problem, cfg)


def test_llama3_405b_8k_layout_fits_an_h100():
    problem, cfg, ev = run(LLAMA3_8K, META)
    assert int(cfg.dp[0]) == 128 and int(cfg.first_layers[0]) == 7 and ev.microbatches[0] == 16
    assert bool(ev.fits[0]), float(ev.memory_bytes["peak"][0]) / GIB
    assert problem.hardware.memory_bytes == 81559 * 2**20  # what an "80 GB" H100 exposes


def test_llama3_405b_128k_layout_fits_an_h100():
    _, cfg, ev = run(LLAMA3_128K, META + ["cp=16", "cp_comm=all_gather"])
    assert int(cfg.dp[0]) == 8 and ev.microbatches[0] == 16
    assert bool(ev.fits[0]), float(ev.memory_bytes["peak"][0]) / GIB


def test_zero1_interleaved_holds_more_gradient_memory_than_meta_chose():
    """Section 3.1.3: ZeRO-1 keeps every stage's unsharded gradients, ZeRO-2 one stage's."""
    *_, zero2 = run(LLAMA3_8K, META)
    *_, zero1 = run(LLAMA3_8K, [o for o in META if not o.startswith("zero_stage")] + ["zero_stage=1"])
    assert float(zero1.memory_bytes["grads"][0]) > 7 * float(zero2.memory_bytes["grads"][0])


def test_the_ledger_adds_up_and_fits_compares_bytes():
    *_, ev = run(LLAMA3_8K, META)
    total = sum(ev.memory_bytes[k] for k in MEMORY_KEYS)
    np.testing.assert_allclose(total, ev.memory_bytes["peak"])
    assert ev.fits[0] == (ev.memory_bytes["peak"][0] <= ev.capacity_bytes)
    for line in ("comm_buffers", "cuda_context", "fragmentation", "activations", "params", "grads"):
        assert ev.memory_bytes[line][0] > 0, line


def zero_batch(problem, **extra):
    common = dict(tp=8, pp=1, first_layers=80, last_layers=80, mbs=1, recompute=2)
    common.update(extra)
    return ConfigBatch.from_columns(problem.cluster.num_gpus, **common)


def test_zero_stages_shard_what_they_say():
    """ZeRO-1 shards optimizer states over dp*cp, ZeRO-2 gradients too, ZeRO-3 parameters too
    (keeping the gathered layers: the one running and the prefetched one)."""
    problem = load_problem(SMALL, ["config=null", "hardware=h100-sxm"])
    d = problem.cluster.num_gpus // 8
    ledgers = [evaluate(problem, zero_batch(problem, zero_stage=z)).memory_bytes for z in range(4)]
    p0, g0, o0 = (float(ledgers[0][k][0]) for k in ("params", "grads", "optimizer"))
    assert float(ledgers[1]["optimizer"][0]) == pytest.approx(o0 / d)
    assert float(ledgers[1]["grads"][0]) == pytest.approx(g0)
    assert float(ledgers[2]["grads"][0]) < g0 / 4
    assert float(ledgers[2]["params"][0]) == pytest.approx(p0)
    assert float(ledgers[3]["params"][0]) == pytest.approx(p0 / d)
    assert 0 < float(ledgers[3]["gathered_params"][0]) < p0 / 10  # two layers of 80
    no_reshard = evaluate(problem, zero_batch(problem, zero_stage=3, reshard_after_forward=0)).memory_bytes
    assert float(no_reshard["gathered_params"][0]) == pytest.approx(p0 - p0 / d)  # every layer stays gathered


def test_zero3_moves_traffic_into_every_micro_batch():
    problem = load_problem(SMALL, ["config=null", "hardware=h100-sxm"])
    ev = {z: evaluate(problem, zero_batch(problem, zero_stage=z, dp_overlap=0)) for z in (1, 2, 3)}
    assert float(ev[1].breakdown_s["fsdp"][0]) == 0.0
    assert 0 < float(ev[2].breakdown_s["fsdp"][0]) < float(ev[3].breakdown_s["fsdp"][0])  # RS only vs + AG twice
    overlapped = evaluate(problem, zero_batch(problem, zero_stage=3, dp_overlap=1))
    assert float(overlapped.breakdown_s["fsdp"][0]) < float(ev[3].breakdown_s["fsdp"][0])  # FSDP prefetch


def test_hsdp_keeps_the_gathers_inside_the_shard_group():
    """Hybrid sharding over 8 GPUs: the gathers stay on NVLink; the states shard 8 ways."""
    problem = load_problem(SMALL, ["config=null", "hardware=h100-sxm"])
    full = evaluate(problem, zero_batch(problem, tp=1, zero_stage=3, dp_overlap=0))
    hsdp_cfg = zero_batch(problem, tp=1, zero_stage=3, dp_overlap=0, dp_shard=8)
    assert not violations(problem, hsdp_cfg)["dp_shard_valid"][0]
    hsdp = evaluate(problem, hsdp_cfg)
    dp = problem.cluster.num_gpus  # tp = pp = 1
    assert float(hsdp.memory_bytes["optimizer"][0]) == pytest.approx(dp / 8 * float(full.memory_bytes["optimizer"][0]))
    assert float(hsdp.breakdown_s["fsdp"][0]) < float(full.breakdown_s["fsdp"][0])
    assert violations(problem, zero_batch(problem, tp=1, zero_stage=0, dp_shard=8))["dp_shard_valid"][0]  # HSDP needs ZeRO


def cp_batch(problem, comm, **extra):
    cols = dict(tp=8, cp=4, pp=1, first_layers=80, last_layers=80, mbs=1, cp_comm=CP_COMM_CODES[comm])
    cols.update(extra)
    return ConfigBatch.from_columns(problem.cluster.num_gpus, **cols)


def test_cp_variants():
    problem = load_problem(SMALL, ["config=null", "hardware=h100-sxm", "training.seq_len=32768"])
    ring, gather, a2a = (evaluate(problem, cp_batch(problem, c)) for c in ("p2p", "all_gather", "a2a"))
    # the ring without overlap and the all-gather move the same volume: the same exposure
    assert float(gather.breakdown_s["cp"][0]) == pytest.approx(float(ring.breakdown_s["cp"][0]))
    ring_on = evaluate(problem, cp_batch(problem, "p2p", cp_overlap=1))
    assert float(ring_on.breakdown_s["cp"][0]) < float(ring.breakdown_s["cp"][0])
    assert float(a2a.breakdown_s["cp"][0]) > 0
    bad = violations(problem, cp_batch(problem, "all_gather", cp_overlap=1))
    assert bad["cp_overlap_needs_cp"][0]
    # Ulysses needs the heads of a TP rank (64 / 8 = 8) divisible by cp
    assert violations(problem, cp_batch(problem, "a2a", cp=16))["cp_a2a_heads"][0]
    hier = cp_batch(problem, "a2a+p2p", cp=8, cp_a2a=2)
    assert not violations(problem, hier)["cp_a2a_degree"][0]
    assert violations(problem, cp_batch(problem, "a2a+p2p", cp=8, cp_a2a=8))["cp_a2a_degree"][0]


def test_document_masks():
    """Documents of mean length mu cut the attention work to ~2*mu/s of a causal sequence; the
    slowest CP rank does more than the mean, more so with more ranks (Llama 3 7.3.2)."""
    s, mu = 131072, 1024
    w = {cp: document_mask_work(s, mu, cp) for cp in (1, 4, 16)}
    assert w[1].mean_factor == pytest.approx(2 * mu / s, rel=0.1)
    assert w[1].imbalance == 1.0
    assert w[4].slowest_factor > w[4].mean_factor
    assert w[16].imbalance > w[4].imbalance > 1.0
    one_doc = document_mask_work(8192, 10**9, 4)  # one causal sequence: the 2cp sharding balances it
    assert one_doc.slowest_factor == pytest.approx(1.0, abs=1e-3) and one_doc.imbalance == pytest.approx(1.0, abs=1e-3)
    problem = load_problem(SMALL, ["config=null", "hardware=h100-sxm", "training.seq_len=32768", "training.mean_document_tokens=2048"])
    ring, a2a = (evaluate(problem, cp_batch(problem, c)) for c in ("p2p", "a2a"))
    masked = float(ring.breakdown_s["compute"][0])
    causal = float(evaluate(load_problem(SMALL, ["config=null", "hardware=h100-sxm", "training.seq_len=32768"]), cp_batch(problem, "p2p")).breakdown_s["compute"][0])
    assert masked < causal
    assert float(a2a.breakdown_s["compute"][0]) < masked  # Ulysses ranks are balanced


def recompute_batch(problem, **extra):
    cols = dict(tp=8, pp=4, vp=1, first_layers=20, last_layers=20, mbs=1)
    cols.update(extra)
    return ConfigBatch.from_columns(problem.cluster.num_gpus, **cols)


def test_block_recompute_is_linear_in_the_layers_it_covers():
    problem = load_problem(SMALL, ["config=null", "hardware=h100-sxm"])
    n = np.array([1.0, 2.0, 4.0, 8.0])
    ev = evaluate(problem, recompute_batch(problem, recompute=2, recompute_method=1, recompute_layers=n))
    acts, rec = ev.memory_bytes["activations"], ev.breakdown_s["recompute"]
    np.testing.assert_allclose(np.diff(acts) / np.diff(n), (acts[1] - acts[0]), rtol=1e-9)
    assert np.all(np.diff(acts) < 0)
    np.testing.assert_allclose(rec / n, rec[0], rtol=1e-9)
    uniform = evaluate(problem, recompute_batch(problem, recompute=2))
    assert float(uniform.breakdown_s["recompute"][0]) == pytest.approx(20 * float(rec[0]))  # all 20 layers of a stage
    rules = violations(problem, recompute_batch(problem, recompute=2, recompute_method=1, recompute_layers=20))
    assert rules["recompute_method"][0]  # block over a whole stage is uniform: one canonical row


def test_selective_recompute_modules():
    """Each Megatron module drops what it re-creates and costs its forward again."""
    problem = load_problem(SMALL, ["config=null", "hardware=h100-sxm"])
    bits = RECOMPUTE_MODULE_BITS
    masks = np.array([bits["core_attn"], bits["core_attn"] | bits["mlp"], bits["core_attn"] | bits["layernorm"]], dtype=float)
    ev = evaluate(problem, recompute_batch(problem, recompute=1, recompute_modules=masks))
    plain = evaluate(problem, recompute_batch(problem))
    acts = ev.memory_bytes["activations"]
    assert acts[1] < acts[0] <= float(plain.memory_bytes["activations"][0])
    assert acts[2] < acts[0]
    assert ev.breakdown_s["recompute"][1] > ev.breakdown_s["recompute"][2] > ev.breakdown_s["recompute"][0]
    assert violations(problem, recompute_batch(problem, recompute=1, recompute_modules=float(bits["moe_act"])))["recompute_modules"][0]  # a dense model


def test_fine_grained_offload_moves_module_inputs_to_the_host():
    problem = load_problem(SMALL, ["config=null", "hardware=h100-sxm"])
    mask = float(OFFLOAD_MODULE_BITS["core_attn"] | OFFLOAD_MODULE_BITS["attn_proj"])
    plain, off = evaluate(problem, recompute_batch(problem)), evaluate(problem, recompute_batch(problem, activation_offload=mask))
    assert float(off.memory_bytes["activations"][0]) < float(plain.memory_bytes["activations"][0])
    assert float(off.host_bytes[0]) > 0


def test_attn_proj_is_offloaded_only_with_core_attn():
    """attn_proj's saved input is core_attn's output, which core_attn's backward keeps, so
    offloading it alone frees nothing; Megatron-Core 0.16.1's TransformerConfig raises on it (the
    frameworks' test environment's __post_init__). The rule refuses that setting for any
    framework, and `mofa evaluate` names it in one line; with core_attn it passes."""
    problem = load_problem(SMALL, ["config=null", "hardware=h100-sxm"])
    bits = OFFLOAD_MODULE_BITS
    masks = np.array([bits["attn_proj"], bits["attn_proj"] | bits["qkv_linear"], bits["core_attn"] | bits["attn_proj"], bits["core_attn"], 1.0])
    bad = violations(problem, recompute_batch(problem, activation_offload=masks))["offload_attn_proj_alone"]
    assert bad.tolist() == [True, True, False, False, False]
    with pytest.raises(ProblemError, match="config.activation_offload.*core_attn"):
        load_problem(SMALL, ["hardware=h100-sxm", "activation_offload=[attn_proj]"])


def test_dualpipev_holds_both_ends_on_rank_zero():
    problem = load_problem(SMALL, ["config=null", "hardware=h100-sxm"])
    cfg = ConfigBatch.from_columns(128, tp=8, pp=4, vp=2, first_layers=20, last_layers=20, mbs=1,
                                   pp_schedule=PP_SCHEDULE_CODES["dualpipev"], pp_overlap=1)
    assert not any(bad[0] for bad in violations(problem, cfg).values())
    ev = evaluate(problem, cfg)
    assert int(ev.worst_rank[0]) == 0  # embedding, head and loss all on the first rank
    wrong = ConfigBatch.from_columns(128, tp=8, pp=4, vp=1, first_layers=20, last_layers=20, mbs=1, pp_schedule=PP_SCHEDULE_CODES["dualpipev"])
    assert violations(problem, wrong)["schedule_vp"][0]


def test_dualpipev_runs_its_uneven_v_split():
    """Llama 2 70B's 80 layers over pp 6 under DualPipeV: 12 stages do not split them evenly,
    so every rank but the first holds 14 (7 a stage) and rank 0, with both ends of the V, the
    10 left. The rules accept it and resolve 'auto' to it; a split that is not the V's is
    dualpipev_layout's, not layers_split's, to explain."""
    problem = load_problem(SMALL, ["config=null", "hardware=h100-sxm"])
    L = problem.model.num_layers
    first, last = (int(x[0]) for x in vee_split(L, np.array([6])))
    assert first < last and first + 5 * last == L
    row = dict(tp=8, pp=6, vp=2, mbs=1, pp_schedule=PP_SCHEDULE_CODES["dualpipev"], pp_overlap=1)
    G = 8 * 6 * 2
    good = ConfigBatch.from_columns(G, first_layers=first, last_layers=last, **row)
    assert not any(bad[0] for bad in violations(problem, good).values())
    ev = evaluate(problem, good)
    assert int(ev.worst_rank[0]) != 0  # rank 0's fewer layers make up for the embedding and head
    bad = violations(problem, ConfigBatch.from_columns(G, first_layers=last, last_layers=first, **row))
    assert bad["dualpipev_layout"][0] and not bad["layers_split"][0]
    spec = ConfigSpec(tp=8, pp=6, vp=2, pp_schedule="dualpipev")  # 'auto' resolves to the V split
    assert ConfigBatch.from_specs(problem, [spec]).first_layers[0] == first


@pytest.mark.parametrize("override,field", [
    ("pp_schedule=dualpipev", "config.pp_schedule"),
    ("zero_stage=7", "config.zero_stage"),
    ("cp_comm=ring", "config.cp_comm"),
    ("recompute_modules=[mlp]", "config.recompute_modules"),
    ("pp_group=8", "config.pp_group"),
])
def test_new_fields_give_one_line_errors_naming_the_field(override, field):
    with pytest.raises(ProblemError) as err:
        load_problem(SMALL, ["tp=8", "pp=4", "vp=1", override])
    assert err.value.field == field, str(err.value)
    assert "\n" not in str(err.value)


def tp_batch(problem, **extra):
    cols = dict(tp=8, pp=1, first_layers=80, last_layers=80, mbs=1)
    cols.update(extra)
    return ConfigBatch.from_columns(problem.cluster.num_gpus, **cols)


@pytest.mark.parametrize("sp", [True, False])
def test_megatron_hides_the_column_parallel_input_gradient_behind_wgrad(sp):
    """Megatron's column-parallel backward (LinearWithGradAccumulationAndAsyncCommunication)
    launches the input gradient's reduce-scatter (all-reduce without SP) asynchronously beside
    the wgrad GEMM; torchtitan's DTensor TP waits where it issues. Synchronous, the backward moves
    what the forward moved (under SP its reverse, without SP the all-reduce on the other side)."""
    over = ["config=null", "hardware=h100-sxm", f"training.sequence_parallel={str(sp).lower()}"]
    sync_problem = load_problem(SMALL, over + ["training.tp_backward_overlap=false"])
    megatron_problem = load_problem(SMALL, over)
    tp = lambda p, **extra: float(layer_costs(p, tp_batch(p, **extra)).kinds[0].tp[0])  # forward + backward
    sync, megatron = tp(sync_problem), tp(megatron_problem)
    # the forward is the same (sync = 2 x forward); Megatron's backward is hidden in part, never worse
    assert sync / 2 < megatron < sync
    if not sp:  # the row-parallel backward has no collective; the all-reduce hides behind wgrad
        assert megatron < 0.75 * sync
    if sp:  # userbuffer overlap (tp_overlap): the synchronous path takes it whole; Transformer Engine's
        # bulk overlap keeps Megatron's async dgrad collectives, so its backward is never worse than either
        ub_sync, ub_megatron = tp(sync_problem, tp_overlap=1), tp(megatron_problem, tp_overlap=1)
        assert ub_sync < sync
        assert ub_megatron <= min(ub_sync, megatron) * (1 + 1e-12)


def test_a_torchtitan_search_runs_tp_synchronously_unless_told():
    problem = load_problem(SMALL, ["search.framework=torchtitan"])
    assert problem.training.tp_backward_overlap is False
    told = load_problem(SMALL, ["search.framework=torchtitan", "training.tp_backward_overlap=true"])
    assert told.training.tp_backward_overlap is True
    assert load_problem(SMALL, []).training.tp_backward_overlap is True


def test_dtensor_tp_holds_more_activations_unless_async_tp_fuses_the_gathers():
    """torchtitan Table 4 (Llama 3.1 70B, 256 H100s, tp 8): 71.9 GiB with DTensor TP, 67.6 GiB
    with async TP. DTensor's column-parallel matmuls keep their all-gathered inputs for the
    backward; Megatron's and the fused async-TP matmuls keep the sequence-parallel shard. (A
    torchtitan search also repeats K/V to every query head, training.kv_heads_expanded: off here,
    so that the two differ in the TP gathers alone.) Async TP fuses only inside the compiled
    transformer blocks: torchtitan's output projection, outside them, keeps its gathered input
    either way, (T - T/t) x h bf16 values more than Megatron's head, which re-gathers."""
    over = ["config=null", "hardware=h100-sxm"]
    megatron = load_problem(SMALL, over)
    titan = load_problem(SMALL, over + ["search.framework=torchtitan", "training.kv_heads_expanded=false"])
    act = lambda p, **extra: float(evaluate(p, tp_batch(p, **extra)).memory_bytes["activations"][0])
    assert act(titan) > act(megatron) * 1.01
    m, seq = megatron.model, megatron.training.seq_len
    head_gathered = 2 * (seq - seq / 8) * m.hidden_size  # mbs 1, tp 8, one rank (pp 1) holds the head
    assert act(titan, tp_overlap=1) == pytest.approx(act(megatron, tp_overlap=1) + head_gathered, rel=1e-12)
    assert act(megatron) == pytest.approx(act(megatron, tp_overlap=1), rel=1e-12)
