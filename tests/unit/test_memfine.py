"""MoE memory and time under routing imbalance: MemFine (ZTE AIH Team, "MemFine: Memory-Aware
Fine-Grained Scheduling for MoE Training") -- eq. 2, FCDA (section 4.1), MACT (eqs. 8-9),
Table 4 for the reduced DeepSeek models of Table 3 (problems/memfine/, which say what the paper
leaves open). GB here is 10^9 bytes, as MemFine prints it; tolerance 10% throughout."""

from pathlib import Path

import numpy as np
import pytest

from costmodel import architecture as arch
from costmodel.configs import ConfigBatch
from costmodel.evaluate import evaluate, layer_costs, model_kinds
from costmodel.loader import load_problem
from costmodel.memory import mact_chunks, mact_max_tokens
from costmodel.presets import MODELS
from costmodel.specs import TrainingSpec
from costmodel.units import GB

ROOT = Path(__file__).resolve().parents[2]
MODEL_I = ROOT / "problems/memfine/table4_model_i.yaml"
MODEL_II = ROOT / "problems/memfine/table4_model_ii.yaml"
TOLERANCE = 0.10
GPU_GB = 64.0  # MemFine 5.1: 64 GB per GPU; eq. 3 with alpha = 1
#: MemFine Table 4: (static, activations) in GB by model and method
TABLE4_STATIC = {"I": 43.0, "II": 39.5}
TABLE4_ACTIVATIONS = {1: 22.9, 2: 3.7, 3: 11.9}
#: the chunks of each method: 1 none; 2 fixed c_k = 8; 3 MACT, which "derives an optimal c_k = 2" for model I
METHOD_CHUNKS = {1: 1, 2: 8, 3: 2}


def problem_of(path):
    return load_problem(str(path))


def batch(problem, **update):
    return ConfigBatch.from_specs(problem, [problem.config.model_copy(update=update)])


def eq2_activations(problem, chunks) -> float:
    """MemFine eq. 2 with full recompute (m_g = 1): the working set of the MoE layer being
    recomputed, the largest on any stage (the deepest, whose imbalance is largest)."""
    lc = layer_costs(problem, batch(problem, moe_chunks=chunks))
    moe = [k for k, kind in zip(lc.kinds, model_kinds(problem.model, problem.training)) if kind[1] == "moe"]
    return max(float(k.saved_full[0]) for k in moe)


@pytest.mark.parametrize("path,model", [(MODEL_I, "I"), (MODEL_II, "II")])
@pytest.mark.parametrize("method", [1, 2, 3])
def test_table4_activations(path, model, method):
    """MemFine Table 4, 'active mem.': 22.9 GB without chunks, 3.7 GB with c = 8, 11.9 GB with
    MACT's c = 2, for both models, within 10%."""
    got = eq2_activations(problem_of(path), METHOD_CHUNKS[method]) / GB
    assert got == pytest.approx(TABLE4_ACTIVATIONS[method], rel=TOLERANCE)


def non_expert_and_per_copy(problem):
    """(bytes of the recomputed layer that do not scale with s', bytes per received copy, s'')."""
    cfg = batch(problem)
    kinds = model_kinds(problem.model, problem.training)
    deepest = next(k for k in reversed(kinds) if k[1] == "moe")
    d = 2
    shard = arch.Shard(t=cfg.tp, c=cfg.cp, e=cfg.ep, etp=cfg.etp, b=cfg.mbs, seq=problem.training.seq_len)
    work = arch.layer_work(problem.model, problem.training, shard, d, deepest)
    received = arch.routed_tokens(problem.model, problem.training, shard, deepest[2])
    chunked = work.chunked_bytes
    return float((work.saved_bytes - chunked)[0]), float((chunked / received)[0]), float(received[0])


def test_eq9_chunk_count_model_i():
    """MemFine 5.1: 'Under the MACT algorithm, MemFine derives an optimal c_k = 2' for model I:
    eq. 8's s'_max with Table 4's static memory on a 64 GB GPU, eq. 9's c = ceil(s''/s'_max) and
    the bin of [1, 2, 4, 8]."""
    problem = problem_of(MODEL_I)
    fixed, per_copy, received = non_expert_and_per_copy(problem)
    s_max = mact_max_tokens(GPU_GB * GB - TABLE4_STATIC["I"] * GB - fixed, per_copy)
    assert 1 < received / s_max <= 2  # eq. 9 before the bin: c = 2
    assert mact_chunks(received, s_max) == 2


def test_mact_bins():
    """The bin is the smallest of [1, 2, 4, 8] at least eq. 9's c, the largest beyond them."""
    s_max = 100.0
    received = np.array([50.0, 100.0, 101.0, 300.0, 401.0, 5000.0])
    assert mact_chunks(received, s_max).tolist() == [1, 1, 2, 4, 8, 8]
    assert mact_chunks(np.array([10.0]), -1.0).tolist() == [8]  # the static memory alone overflows


@pytest.mark.parametrize("path,model,method,fits", [
    (MODEL_I, "I", 1, False), (MODEL_I, "I", 2, True), (MODEL_I, "I", 3, True),
    (MODEL_II, "II", 1, True), (MODEL_II, "II", 2, True), (MODEL_II, "II", 3, True),
])
def test_table4_which_methods_train(path, model, method, fits):
    """MemFine Table 4, 'training': method 1 overflows model I's 64 GB GPU (eq. 3), methods 2 and
    3 train, and all three train model II -- with Table 4's static memory (model I's is not
    reproduced, see STATIC_NOT_REPRODUCED)
    and the model's activations."""
    total = TABLE4_STATIC[model] + eq2_activations(problem_of(path), METHOD_CHUNKS[method]) / GB
    assert (total <= GPU_GB) == fits


#: model I's static memory is not reproduced: DeepSeek-V3's layers at t1 p4 e32 (8 of 256 experts
#: per GPU) give its first and last stage (4 layers and the embedding or the head) ~3.26e9
#: parameters, 58.8 GB at Megatron's 18 bytes per parameter against Table 4's 43.0 GB (its middle
#: stages: 2.34e9, 42.1 GB). Model II's 37.7 GB is within 4.6% of 39.5 GB. Table 4's two figures
#: differ by 3.5 GB for twice the layers per stage, which no reading of eq. 1 we found (bytes per
#: parameter, which stage, GB or GiB) gives.
STATIC_NOT_REPRODUCED = pytest.mark.xfail(strict=True, reason="MemFine Table 4 model I static memory: 58.8 GB predicted, 43.0 GB printed")


@pytest.mark.parametrize("path,model", [pytest.param(MODEL_I, "I", marks=STATIC_NOT_REPRODUCED), (MODEL_II, "II")])
def test_table4_static_memory(path, model):
    """MemFine Table 4, 'static mem.' (eq. 1: parameters, gradients, optimizer states of the worst stage)."""
    problem = problem_of(path)
    m = evaluate(problem, batch(problem)).memory_bytes
    static = float((m["params"] + m["grads"] + m["optimizer"])[0]) / GB
    assert static == pytest.approx(TABLE4_STATIC[model], rel=TOLERANCE)


# --------------------------------------------------------------------------------------
# imbalance, FCDA, MACT in the scorer, token dropping, dispatch
# --------------------------------------------------------------------------------------
def shard(e=8, b=1, seq=4096, chunks=1.0):
    f = lambda x: np.array([float(x)])
    return arch.Shard(t=f(1), c=f(1), e=f(e), etp=f(1), b=f(b), seq=seq, chunks=f(chunks))


def training(**moe):
    return TrainingSpec(global_batch_size=64, seq_len=4096, moe=moe)


def test_imbalance_is_capped_at_the_worst_case():
    """MemFine eq. 2: s' -> e*s. DeepSeek-V3 on ep 8 (32 local experts >= top 8): at most 8x the
    balanced share; on ep 64 (4 local experts): 64 * 4 / 8 = 32x."""
    m = MODELS["deepseek-v3"]
    worst = training(imbalance_first_layer="worst", imbalance_last_layer="worst")
    assert float(arch.imbalance_factor(m, worst, shard(e=8))[0]) == 8.0
    assert float(arch.imbalance_factor(m, worst, shard(e=64))[0]) == 32.0
    assert float(arch.imbalance_factor(m, training(imbalance_first_layer=50.0, imbalance_last_layer=50.0), shard(e=8))[0]) == 8.0
    assert float(arch.imbalance_factor(m, worst, shard(e=1))[0]) == 1.0  # one rank holds every expert


def test_capacity_factor_bounds_memory_and_time():
    m = MODELS["deepseek-v3"]
    skewed = training(imbalance_first_layer=6.0, imbalance_last_layer=6.0)
    dropping = training(imbalance_first_layer=6.0, imbalance_last_layer=6.0, capacity_factor=1.5)
    a, b = arch.moe_layer(m, skewed, shard(), 2), arch.moe_layer(m, dropping, shard(), 2)
    assert float(b.chunked_bytes[0]) == pytest.approx(float(a.chunked_bytes[0]) * 1.5 / 6.0)
    assert float(b.ep_a2a_bytes[0]) == pytest.approx(float(a.ep_a2a_bytes[0]) * 1.5 / 6.0)


def test_depth_profile_loads_the_last_stage():
    """MemFine Fig. 2: imbalance grows with depth. With balanced first layers and the worst case
    at the last, the last stage pays more for its experts than a middle one, in memory (without
    recompute every layer keeps its own s') and in time (the busiest rank sets each layer's pace)."""
    problem = problem_of(MODEL_I)
    cfg = batch(problem, recompute="none")
    flat = problem.model_copy(update={"training": problem.training.model_copy(update={"moe": problem.training.moe.model_copy(update={"imbalance_last_layer": 1.0})})})
    kinds = model_kinds(problem.model, problem.training)
    assert len([k for k in kinds if k[1] == "moe"]) > 1  # costed in depth bands
    lc = layer_costs(problem, cfg)
    moe = [k for k, kind in zip(lc.kinds, kinds) if kind[1] == "moe"]
    assert float(moe[-1].activation[0]) > float(moe[0].activation[0])
    assert float(moe[-1].compute[0]) > float(moe[0].compute[0])
    assert float(moe[-1].ep[0]) > float(moe[0].ep[0])
    skew, even = evaluate(problem, cfg), evaluate(flat, batch(flat, recompute="none"))
    assert float(skew.step_time_s[0]) > float(even.step_time_s[0])
    assert float(skew.memory_bytes["activations"][0]) > float(even.memory_bytes["activations"][0])


def test_fcda_without_recompute_trades_memory_for_recompute_time():
    """FCDA (MemFine eqs. 6-7) without full recompute: the routed experts' tensors are not kept
    (one chunk is alive at a time) and the backward re-runs the chunks' dispatch, expert GEMMs
    and combine."""
    problem = problem_of(MODEL_I)
    plain, chunked = (evaluate(problem, batch(problem, recompute="none", moe_chunks=c)) for c in (1, 4))
    assert float(chunked.memory_bytes["activations"][0]) < 0.5 * float(plain.memory_bytes["activations"][0])
    assert float(chunked.breakdown_s["recompute"][0]) > float(plain.breakdown_s["recompute"][0])
    assert float(chunked.step_time_s[0]) > float(plain.step_time_s[0])


def test_auto_is_the_smallest_bin_that_fits():
    """moe_chunks: auto scores MACT's choice: the smallest bin whose peak fits (here on a GPU
    large enough for some bin), the largest when none does."""
    problem = problem_of(MODEL_I)
    big = problem.model_copy(update={"hardware": problem.hardware.model_copy(update={"memory_mib": 76 * 1024})})
    fits = {c: bool(evaluate(big, batch(big, moe_chunks=c)).fits[0]) for c in (1, 2, 4, 8)}
    expected = min((c for c, ok in fits.items() if ok), default=8)
    assert not fits[1] and any(fits.values())  # the case is not trivial
    auto = evaluate(big, batch(big, moe_chunks="auto"))
    assert int(auto.moe_chunks[0]) == expected and bool(auto.fits[0])
    assert int(evaluate(problem, batch(problem, moe_chunks="auto")).moe_chunks[0]) == 8  # nothing fits at 64 GiB


def test_deepep_dispatch_sends_less_across_nodes():
    """DeepEP's deduplicated dispatch sends a token once per node: on an EP group spanning nodes
    the all-to-all is shorter than Megatron's per-copy all-to-all."""
    problem = problem_of(MODEL_I)
    wide = problem.model_copy(update={"cluster": problem.cluster.model_copy(update={"gpus_per_node": 8})})
    dedup = wide.model_copy(update={"training": wide.training.model_copy(update={"moe": wide.training.moe.model_copy(update={"dispatcher": "deepep"})})})
    ep = {name: float(evaluate(p, batch(p)).breakdown_s["ep"][0]) for name, p in (("alltoall", wide), ("deepep", dedup))}
    assert ep["deepep"] < ep["alltoall"]
