"""Paths of the exact model that no other test reaches (issue 12): the hierarchical network and
its bandwidth decay (eqs. 3, 18), the 'roofline' and 'profiled' compute modes (eqs. 1, 17,
19), placement orders, each overlap formula (eqs. 20-24), the recovery mix (eq. 41),
node-limited MoE routing, and invariants of the whole model on the shipped tuning problems.

Expected values are computed here from the equations (hand arithmetic on the spec's inputs),
or checked as limits and monotone properties, never copied from the code's output."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import PROBLEMS
from costmodel.compute import ComputeModel
from costmodel.configs import ConfigBatch
from costmodel.evaluate import evaluate, layer_costs
from costmodel.layer import overlapped
from costmodel.loader import load_problem
from costmodel.memory import communicator_count, nccl_and_context
from costmodel.network import Network
from costmodel.pipeline import pipeline_time
from costmodel.placement import place, stage_groups
from costmodel.reliability import end_to_end_s, failure_rate_per_s
from costmodel.rules import feasible
from costmodel.specs import ClusterSpec, DecayPoint, FaultToleranceSpec, OverlapCoefficients
from costmodel.units import GB, TFLOP, US
from optimizer.space import SearchSpace

TUNING = PROBLEMS / "tuning"
_cache = {}


def problem(name):
    if name not in _cache:
        _cache[name] = load_problem(str(TUNING / f"{name}.yaml"))
    return _cache[name]


def a(x):
    return np.array([float(x)])


def sample(p, n, seed=0):
    """Up to n admissible configurations of problem p drawn from its search space."""
    space = SearchSpace.from_problem(p)
    rng = np.random.default_rng(seed)
    k = 40 * n
    cfg = space.combine(rng.integers(len(space.skeletons), size=k), rng.integers(space.num_features, size=k))
    ok = np.flatnonzero(feasible(p, cfg))[:n]
    assert len(ok) > 0
    return cfg.take(ok)


def with_efficiency(p, **update):
    hw = p.hardware.model_copy(update={"efficiency": p.hardware.efficiency.model_copy(update=update)})
    return p.model_copy(update={"hardware": hw})


# --------------------------------------------------------------------------------------
# Network: hierarchical collectives (eq. 3 with eq. 18's lambda) and bandwidth decay
# --------------------------------------------------------------------------------------
def net_of(num_gpus=64, per_node=8, supernode=None, decay=(), exponent=None):
    hw = problem("llama2_70b_128gpu").hardware
    if exponent is not None:
        hw = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"scale_decay_exponent": exponent, "scale_decay_reference_gpus": 512})})
    cl = ClusterSpec(num_gpus=num_gpus, gpus_per_node=per_node, supernode_size=supernode, bandwidth_decay=[DecayPoint(gpus=g, beta=b) for g, b in decay])
    return hw, Network(hw, cl)


def level_bandwidths(hw):
    eff = hw.efficiency.comm_efficiency
    return hw.intra_node_gb_per_s * eff["node"] * GB, hw.intra_node_gb_per_s * eff["supernode"] * GB, hw.inter_node_gb_per_s * eff["cluster"] * GB


def test_reduce_scatter_inside_a_node_is_the_ring_formula():
    """8 ranks on one node: (n-1)/n * S / (lambda_node * B_node) + (n-1) latencies."""
    hw, net = net_of()
    b_node, _, _ = level_bandwidths(hw)
    g = net.group([(a(1), a(8))])
    assert [float(x[0]) for x in g.n] == [8, 1, 1]
    size = 1e9
    expected = 7 / 8 * size / b_node + 7 * hw.intra_node_latency_us * US
    assert float(net.reduce_scatter(a(size), g)[0]) == pytest.approx(expected, rel=1e-12)
    assert float(net.all_reduce(a(size), g)[0]) == pytest.approx(2 * expected, rel=1e-12)
    assert float(net.reduce_scatter(a(0), g)[0]) == 0.0


def test_reduce_scatter_across_nodes_is_hierarchical():
    """16 consecutive ranks on nodes of 8: reduce inside the node, then across the 2 nodes on
    the remaining 1/8 share."""
    hw, net = net_of()
    b_node, _, b_out = level_bandwidths(hw)
    g = net.group([(a(1), a(16))])
    assert [float(x[0]) for x in g.n] == [8, 1, 2]
    size = 3e8
    expected = 7 / 8 * size / b_node + 1 / 2 * size / 8 / b_out + 7 * hw.intra_node_latency_us * US + hw.inter_node_latency_us * US
    assert float(net.reduce_scatter(a(size), g)[0]) == pytest.approx(expected, rel=1e-12)
    # a strided group (one rank per node) crosses nodes at every step
    g = net.group([(a(8), a(4))])
    assert [float(x[0]) for x in g.n] == [1, 1, 4]
    assert float(net.reduce_scatter(a(size), g)[0]) == pytest.approx(3 / 4 * size / b_out + 3 * hw.inter_node_latency_us * US, rel=1e-12)


def test_supernode_level_uses_the_supernode_links():
    """Nodes of 8 inside supernodes of 32: a group of 32 consecutive ranks never leaves the
    supernode; without the supernode it crosses the scale-out network."""
    hw, net = net_of(num_gpus=128, supernode=32)
    b_node, b_super, b_out = level_bandwidths(hw)
    g = net.group([(a(1), a(32))])
    assert [float(x[0]) for x in g.n] == [8, 4, 1]
    size = 1e9
    expected = 7 / 8 * size / b_node + 3 / 4 * size / 8 / b_super + 7 * hw.intra_node_latency_us * US + 3 * hw.intra_node_latency_us * US
    assert float(net.reduce_scatter(a(size), g)[0]) == pytest.approx(expected, rel=1e-12)
    _, flat = net_of(num_gpus=128)
    assert [float(x[0]) for x in flat.group([(a(1), a(32))]).n] == [8, 1, 4]


def test_decay_table_is_interpolated_in_log2_gpus_and_slows_only_the_outer_level():
    """Eq. 3's beta from the cluster's table: 1.0 at 8 GPUs, 0.5 at 1024; at 2^6.5 GPUs (half
    way in log2) it is 0.75; beyond the table it stays at the last point."""
    hw, net = net_of(num_gpus=4096, decay=[(8, 1.0), (1024, 0.5)])
    assert float(net.decay(a(2**6.5))[0]) == pytest.approx(0.75)
    assert float(net.decay(a(4096))[0]) == pytest.approx(0.5)
    assert float(net.decay(a(2))[0]) == pytest.approx(1.0)
    b_node, _, b_out = level_bandwidths(hw)
    g = net.group([(a(1), a(1024))])
    assert float(g.bandwidth[0]) == pytest.approx(b_node)
    assert float(g.bandwidth[2][0]) == pytest.approx(0.5 * b_out)
    size = 2e9
    expected = 7 / 8 * size / b_node + 127 / 128 * size / 8 / (0.5 * b_out) + 7 * hw.intra_node_latency_us * US + 127 * hw.inter_node_latency_us * US
    assert float(net.reduce_scatter(a(size), g)[0]) == pytest.approx(expected, rel=1e-12)


def test_decay_power_law_of_the_profile():
    """Without a table: (span / reference)^-exponent beyond the reference size, 1 below it."""
    hw, net = net_of(num_gpus=8192, exponent=0.2)
    assert float(net.decay(a(2048))[0]) == pytest.approx(4**-0.2)
    assert float(net.decay(a(256))[0]) == 1.0
    _, b_out = level_bandwidths(hw)[0], level_bandwidths(hw)[2]
    assert float(net.group([(a(8), a(256))]).bandwidth[2][0]) == pytest.approx(b_out * 4**-0.2)  # spans 2048 GPUs


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 16), st.integers(1, 16), st.sampled_from([None, 0.1, 0.35]))
def test_decay_never_rises_with_span(e1, e2, exponent):
    decay = [] if exponent is not None else [(8, 1.0), (512, 0.8), (4096, 0.55)]
    _, net = net_of(num_gpus=65536, decay=decay, exponent=exponent)
    lo, hi = sorted((2.0**e1, 2.0**e2))
    assert float(net.decay(a(hi))[0]) <= float(net.decay(a(lo))[0]) <= 1.0


def test_all_to_all_shares_and_the_node_limited_cap():
    """Each rank sends S spread evenly over n ranks; the node share (NVLink) and the off-node
    share (NIC) travel concurrently: time = max(f_node / B_node, f_out / B_out) * S + latency of the outer
    level. 32 ranks on 4 nodes: f_node = 7/32, f_out = 24/32. Node-limited routing caps the
    off-node share (DeepSeek-V3: 4 nodes of a token's 8 experts, 1/2)."""
    hw, net = net_of()
    b_node, _, b_out = level_bandwidths(hw)
    g = net.group([(a(1), a(32))])
    size = 1e8
    lat = hw.inter_node_latency_us * US
    free = max(7 / 32 / b_node, 24 / 32 / b_out) * size + lat
    assert float(net.all_to_all(a(size), g)[0]) == pytest.approx(free, rel=1e-12)
    capped = max(7 / 32 / b_node, 0.5 / b_out) * size + lat
    assert float(net.all_to_all(a(size), g, inter_node_cap=0.5)[0]) == pytest.approx(capped, rel=1e-12)
    assert capped < free
    # a cap above the off-node share changes nothing
    assert float(net.all_to_all(a(size), g, inter_node_cap=0.9)[0]) == pytest.approx(free, rel=1e-12)


def test_all_to_all_node_and_supernode_shares_use_the_same_ports():
    """Inside a supernode the node share and the rest-of-supernode share leave through the same
    scale-up ports, so their times add: 16 ranks over 2 nodes of one 16-GPU supernode take
    (7/16 / B_node + 8/16 / B_super) * S. Counted as concurrent links (max of the two) they took
    8/16 / B * S, less than 8 ranks inside one node (7/8 / B * S) at the same bandwidth: a wider
    EP group looked faster for the same bytes per rank."""
    hw, net = net_of(supernode=16)
    b_node, b_super, _ = level_bandwidths(hw)
    size = 1e8
    lat = hw.intra_node_latency_us * US
    wide = net.group([(a(1), a(16))])
    assert [float(x[0]) for x in wide.n] == [8, 2, 1]
    assert float(net.all_to_all(a(size), wide)[0]) == pytest.approx((7 / 16 / b_node + 8 / 16 / b_super) * size + lat, rel=1e-12)
    node = net.group([(a(1), a(8))])
    assert float(net.all_to_all(a(size), wide)[0]) >= float(net.all_to_all(a(size), node)[0])


def test_node_limited_cap_bounds_all_traffic_leaving_the_node():
    """The node-limited cap bounds what leaves the node, to the rest of the supernode and beyond
    together, split in proportion to their uniform shares. 64 ranks: nodes of 8, supernodes of 16:
    f_node = 7/64, f_super = 8/64, f_out = 48/64; a cap of 1/2 keeps (1/2) / (56/64) of each:
    f_super = 1/14, f_out = 3/7 (capped one by one they sent 1/8 + 1/2 = 5/8 > 1/2 off the node)."""
    hw, net = net_of(num_gpus=64, supernode=16)
    b_node, b_super, b_out = level_bandwidths(hw)
    g = net.group([(a(1), a(64))])
    assert [float(x[0]) for x in g.n] == [8, 2, 4]
    size = 1e8
    expected = max(7 / 64 / b_node + 1 / 14 / b_super, 3 / 7 / b_out) * size + hw.inter_node_latency_us * US
    assert float(net.all_to_all(a(size), g, inter_node_cap=0.5)[0]) == pytest.approx(expected, rel=1e-12)


def test_p2p_hop_mean_over_the_ring():
    """A pipeline group of 4 ranks one per node: every hop crosses the network."""
    hw, net = net_of()
    _, _, b_out = level_bandwidths(hw)
    g = net.group([(a(16), a(4))])
    assert float(net.p2p_hop(a(1e7), g)[0]) == pytest.approx(1e7 / b_out + hw.inter_node_latency_us * US, rel=1e-12)
    g = net.group([(a(1), a(4))])  # inside a node
    b_node = level_bandwidths(hw)[0]
    assert float(net.p2p_hop(a(1e7), g)[0]) == pytest.approx(1e7 / b_node + hw.intra_node_latency_us * US, rel=1e-12)


# --------------------------------------------------------------------------------------
# Compute modes (eqs. 1, 17, 19)
# --------------------------------------------------------------------------------------
def compute_of(mode, **update):
    hw = problem("llama2_70b_128gpu").hardware
    eff = hw.efficiency.model_copy(update={"mode": mode, **update})
    hw = hw.model_copy(update={"efficiency": eff})
    return hw, ComputeModel(hw, "bf16", 2)


def test_roofline_mode_is_eq19():
    """Compute-bound GEMM: 2MNK / P_peak; memory-bound: bytes moved / B_hbm (AI * B_hbm is the
    rate), each plus the per-kernel overhead; elementwise kernels at the full HBM bandwidth."""
    hw, comp = compute_of("roofline")
    peak, hbm, over = hw.peak("bf16") * TFLOP, hw.memory_bandwidth_gb_per_s * GB, hw.efficiency.kernel_overhead_us * US
    m = n = k = 8192.0
    assert float(comp.gemm_time_of(a(m), a(n), a(k))[0]) == pytest.approx(2 * m * n * k / peak + over, rel=1e-12)
    m, n, k = 8192.0, 8192.0, 1.0
    moved = 2 * (m * k + k * n + m * n)
    assert 2 * m * n * k / moved * hbm < peak  # memory-bound indeed
    assert float(comp.gemm_time_of(a(m), a(n), a(k))[0]) == pytest.approx(moved / hbm + over, rel=1e-12)
    assert float(comp.memory_time(a(1e9), 3)[0]) == pytest.approx(1e9 / hbm + 3 * over, rel=1e-12)


def test_profiled_mode_interpolates_in_log_intensity():
    """Points (AI 1, 100 TFLOP/s) and (AI 1000, 400 TFLOP/s): at AI 10^1.5 (half way in log) the
    rate is 250 TFLOP/s; beyond the last point it stays 400. A square GEMM of side k has
    AI = 2k^3 / (2 * 3k^2) = k/3 in bf16."""
    hw, comp = compute_of("profiled", profiled={"gemm": [(1.0, 100.0), (1000.0, 400.0)]})
    over = hw.efficiency.kernel_overhead_us * US
    k = 3 * 10**1.5
    assert float(comp.gemm_time_of(a(k), a(k), a(k))[0]) == pytest.approx(2 * k**3 / (250 * TFLOP) + over, rel=1e-9)
    k = 30000.0
    assert float(comp.gemm_time_of(a(k), a(k), a(k))[0]) == pytest.approx(2 * k**3 / (400 * TFLOP) + over, rel=1e-12)
    # a class without measured points falls back to its efficiency curve (no shape terms)
    flops = 1e12
    attention = float(comp.attention_time(a(flops), a(4096))[0])
    assert attention == pytest.approx(flops / (hw.efficiency.attention.peak_fraction * hw.peak("bf16") * TFLOP) + over, rel=1e-12)


@settings(max_examples=80, deadline=None)
@given(st.floats(1, 1e5), st.floats(1, 1e5), st.floats(1, 1e5))
def test_roofline_is_a_lower_bound_of_the_modified_roofline(m, n, k):
    """Eq. 17's lambda <= 1 and the shape terms <= 1: the ideal roofline is never slower."""
    _, ideal = compute_of("roofline")
    _, real = compute_of("modified_roofline", gemm_k_half=64.0)
    assert float(ideal.gemm_time_of(a(m), a(n), a(k))[0]) <= float(real.gemm_time_of(a(m), a(n), a(k))[0]) * (1 + 1e-12)


def test_compute_mode_moves_the_whole_model():
    """Through evaluate: roofline (efficiencies ignored) gives a lower compute time than the
    shipped modified roofline on every configuration."""
    p = problem("llama2_70b_128gpu")
    cfg = sample(p, 16)
    real = evaluate(p, cfg).breakdown_s["compute"]
    ideal = evaluate(with_efficiency(p, mode="roofline"), cfg).breakdown_s["compute"]
    assert np.all(ideal < real)


# --------------------------------------------------------------------------------------
# Placement orders
# --------------------------------------------------------------------------------------
def layout_batch(G, **cols):
    return ConfigBatch.from_columns(G, first_layers=20, last_layers=20, **cols)


def levels(group):
    return [float(x[0]) for x in group.n]


def test_default_order_keeps_pp_inside_the_node_and_spreads_dp():
    """64 GPUs, nodes of 8, tp 2, pp 2, dp 16, order [tp, cp, ep, pp, dp]: PP has stride 2
    (both stages in one node), DP stride 4 (2 members per node, 8 nodes)."""
    _, net = net_of()
    cfg = layout_batch(64, tp=2, pp=2)
    g = stage_groups(["tp", "cp", "ep", "pp", "dp"], cfg, net, experts=False)
    assert levels(g.pp) == [2, 1, 1]
    assert levels(g.dp) == [2, 1, 8]
    assert levels(place(["tp", "cp", "ep", "pp", "dp"], cfg, net).tp) == [2, 1, 1]


def test_dp_placed_before_pp_swaps_their_locality():
    """Order [tp, cp, ep, dp, pp]: DP stride 2 (4 members per node), PP stride 32 (across nodes)."""
    _, net = net_of()
    cfg = layout_batch(64, tp=2, pp=2)
    g = stage_groups(["tp", "cp", "ep", "dp", "pp"], cfg, net, experts=False)
    assert levels(g.dp) == [4, 1, 4]
    assert levels(g.pp) == [1, 1, 2]
    # and the order reaches the step time: the DP reduction is faster with more members per node
    hw, _ = net_of()
    size = 1e9
    default = stage_groups(["tp", "cp", "ep", "pp", "dp"], cfg, net, experts=False)
    assert float(net.reduce_scatter(a(size), g.dp)[0]) < float(net.reduce_scatter(a(size), default.dp)[0])


def test_cp_placement_order():
    """tp 2, cp 4: [tp, cp, ...] puts the CP ring inside the node (stride 2); with CP after PP
    (pp 4) its stride is 8: one member per node."""
    _, net = net_of()
    cfg = layout_batch(64, tp=2, cp=4, pp=4)
    assert levels(place(["tp", "cp", "ep", "pp", "dp"], cfg, net).cp) == [4, 1, 1]
    assert levels(place(["tp", "pp", "cp", "ep", "dp"], cfg, net).cp) == [1, 1, 4]


ORDERS = [["tp", *rest] for rest in itertools.permutations(["cp", "ep", "pp", "dp"])]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(ORDERS), st.sampled_from([1, 2, 4]), st.sampled_from([2, 4, 8]))
def test_expert_group_takes_the_innermost_ranks_in_any_order(order, tp, ep):
    """Megatron's MoE folding: the ETP x EP block takes the innermost ranks of a pipeline
    stage (tp, then the dp and ep slots here, cp being 1), so an EP group of at most a node's
    GPUs stays in the node when PP is placed outside both; with PP (2) inside both a node holds
    8/2 ranks of each stage, so min(ep, 4) EP members. TP stays in the node in every order."""
    _, net = net_of(num_gpus=128)
    cfg = layout_batch(128, tp=tp, pp=2, ep=ep)
    g = place(order, cfg, net)
    after = [order.index("pp") > order.index(dim) for dim in ("ep", "dp")]
    if all(after) or not any(after):
        inside = min(ep, 8 if all(after) else 4)
        assert levels(g.ep) == [inside, 1, ep / inside]
    assert float(g.ep.size[0]) == ep
    assert levels(g.tp) == [tp, 1, 1]
    groups = stage_groups(order, cfg, net)
    assert float(groups.dp.size[0]) == 128 / (tp * 2)
    assert float(groups.pp.size[0]) == 2


# --------------------------------------------------------------------------------------
# Overlap formulas (eqs. 20-24)
# --------------------------------------------------------------------------------------
def test_eq20_21_overlap_arithmetic():
    """Eq. 20: T_c + T_m -> min(T_c, T_m)/s_n + max(alpha*T_c, beta*T_m); the exposed part is that
    minus T_c. T_c 10, T_m 4, s_n 4, alpha 1.1, beta 1.2: 1 + 11 - 10 = 2. Communication-bound
    (T_c 2, T_m 8, s_n 2, alpha beta 1): 1 + 8 - 2 = 7."""
    coef = OverlapCoefficients(alpha=1.1, beta=1.2)
    assert float(overlapped(a(10), a(4), a(4), coef)[0]) == pytest.approx(2.0)
    ideal = OverlapCoefficients(alpha=1.0, beta=1.0)
    assert float(overlapped(a(2), a(8), a(2), ideal)[0]) == pytest.approx(7.0)
    # the limit of infinitely many chunks with no contention: only the excess is exposed
    assert float(overlapped(a(2), a(8), a(1e12), ideal)[0]) == pytest.approx(6.0)


@settings(max_examples=100, deadline=None)
@given(st.floats(0, 1e3), st.floats(0, 1e3), st.integers(1, 64))
def test_eq20_without_contention_never_exposes_more_than_the_communication(t_c, t_m, s_n):
    exposed = float(overlapped(a(t_c), a(t_m), a(s_n), OverlapCoefficients())[0])
    assert -1e-9 <= exposed <= t_m * (1 + 1e-12) + 1e-12


def test_eq22_ep_overlap_through_the_layer_model():
    """Eq. 22 on DeepSeek-V3's MoE layer: with EP overlap the layer's exposed EP time is
    max(alpha * (C_f + C_b), beta * (E_f + E_b)) - (C_f + C_b), with C and E the compute and the
    (fully exposed) EP communication of the same layer without overlap."""
    p = problem("deepseek_v3_1024gpu_sn8")
    cols = dict(tp=2, pp=8, ep=64, mbs=1, first_layers=8, last_layers=8)
    off = layer_costs(p, ConfigBatch.from_columns(1024, **cols, ep_overlap=0)).kinds
    on = layer_costs(p, ConfigBatch.from_columns(1024, **cols, ep_overlap=1)).kinds
    coef = p.hardware.efficiency.ep_overlap
    moe = [i for i, k in enumerate(off) if float(k.ep[0]) > 0]
    assert moe, "DeepSeek-V3 has MoE layers"
    for i in moe:
        c, e = float(off[i].compute[0]), float(off[i].ep[0])
        assert float(on[i].compute[0]) == pytest.approx(c)
        assert float(on[i].ep[0]) == pytest.approx(max(coef.alpha * c, coef.beta * e) - c, rel=1e-9)


def test_eq23_pp_overlap_hand_arithmetic():
    """pp 4, vp 1, m 8 micro-batches, hop 1 s, chunks 0.3 s forward / 0.6 s backward, alpha beta 1:
    without overlap (2*m*vp + 2*(pp-1)) hops = 22 s; with overlap the warm-up and cool-down
    chains 2*(vp*pp - 1) = 6 hops plus, per steady chunk, max(0, beta*hop - chunk):
    8 * ((1 - 0.3) + (1 - 0.6)) = 8.8 s, so 14.8 s. With alpha 1.5 and a hop of 0.2 s (hidden),
    each hop adds (alpha - 1) * min(chunk, beta*hop) = 0.1 s: 6 * 0.2 + 8 * 2 * 0.1 = 2.8 s."""
    cfg = ConfigBatch.from_columns(64, pp=4, first_layers=20, last_layers=20, pp_overlap=1)
    work = [a(10.0)] * 3
    ideal = OverlapCoefficients()
    t = pipeline_time(work, cfg, 8.0, a(1.0), a(0.3), a(0.6), a(0.0), ideal)
    assert float(t.pp_without_overlap[0]) == pytest.approx(22.0)
    assert float(t.pp_exposed[0]) == pytest.approx(14.8)
    t = pipeline_time(work, cfg, 8.0, a(0.2), a(0.3), a(0.6), a(0.0), OverlapCoefficients(alpha=1.5, beta=1.0))
    assert float(t.pp_exposed[0]) == pytest.approx(2.8)
    off = ConfigBatch.from_columns(64, pp=4, first_layers=20, last_layers=20, pp_overlap=0)
    assert float(pipeline_time(work, off, 8.0, a(1.0), a(0.3), a(0.6), a(0.0), ideal).pp_exposed[0]) == pytest.approx(22.0)


def test_eq24_dp_overlap_hand_arithmetic():
    """Eq. 24 as the model counts it: first unit exposed, the rest (slowed by beta) against the
    window (slowed by alpha). 10 s in 5 units, window 3 s, alpha 1.1, beta 1.2: first 2 s, rest
    9.6 s, exposed 2 + max(9.6 - 3, 0.1 * 3) = 8.6 s. Window 20 s: 2 + max(-10.4, 0.1 * 9.6) =
    2.96 s. Without overlap all 10 s."""
    from costmodel.update import exposed_after_overlap

    coef = OverlapCoefficients(alpha=1.1, beta=1.2)
    assert float(exposed_after_overlap(a(10), a(5), a(3), coef, a(1))[0]) == pytest.approx(8.6)
    assert float(exposed_after_overlap(a(10), a(5), a(20), coef, a(1))[0]) == pytest.approx(2.96)
    assert float(exposed_after_overlap(a(10), a(5), a(3), coef, a(0))[0]) == pytest.approx(10.0)


OVERLAPS = ("tp_overlap", "cp_overlap", "ep_overlap", "dp_overlap")


def test_zero2_3_windows_and_prefetch_share_one_overlap_budget():
    """A gradient reduce-scatter hides only behind compute the parameter prefetches do not
    already overlap: 3 s of gathers and 4 s of reduce-scatter behind a 5 s window expose
    7 - 5 = 2 s (counted twice, the same 5 s would hide both: 0 s exposed)."""
    from costmodel.update import hidden, window_used

    ideal, on = OverlapCoefficients(), a(1)
    gathers, rs, window = a(3.0), a(4.0), a(5.0)
    left = window - window_used(gathers, window, ideal, on)
    exposed = hidden(gathers, window, ideal, on) + hidden(rs, left, ideal, on)
    assert float(exposed[0]) == pytest.approx(2.0)
    assert float(window_used(gathers, window, ideal, a(0))[0]) == 0.0


@pytest.mark.parametrize("name", ["llama3_405b_16384xh100_seq128k", "deepseek_v3_1024gpu_sn8"])
def test_overlap_without_contention_never_slows_a_step(name):
    """With every alpha and beta at 1, switching on TP, CP, EP or DP overlap never raises the
    step time of an admissible configuration (each formula hides at most the communication)."""
    p = problem(name)
    ideal = OverlapCoefficients()
    p = with_efficiency(p, **{f: ideal for f in (*OVERLAPS, "pp_overlap", "offload_overlap")})
    cfg = sample(p, 200, seed=1)
    checked = 0
    for switch in OVERLAPS:
        cols = {f.name: getattr(cfg, f.name) for f in cfg.__dataclass_fields__.values() if f.name != "dp"}
        on = ConfigBatch.from_columns(p.cluster.num_gpus, **{**cols, switch: np.ones(len(cfg))})
        off = ConfigBatch.from_columns(p.cluster.num_gpus, **{**cols, switch: np.zeros(len(cfg))})
        keep = feasible(p, on) & feasible(p, off)
        if not keep.any():
            continue
        t_on, t_off = evaluate(p, on.take(keep)).step_time_s, evaluate(p, off.take(keep)).step_time_s
        assert np.all(t_on <= t_off * (1 + 1e-12)), switch
        checked += 1
    assert checked >= 3


def test_zero3_forward_gathers_lengthen_the_forward_chunk():
    """DualPipeV's bubble, (pp - 1)(F + 2B - 3W), weighs the backward chunk twice: ZeRO-3's
    forward parameter gathers block the forward, so what they expose belongs to F. Booked to B,
    switching TP overlap on (4.2 s less TP, about as much more gather exposure: the gathers
    outlast the compute) moved time from F to B and made this Llama2-70B step slower with
    alpha = beta = 1."""
    from costmodel.specs import ConfigSpec

    p = problem("llama2_70b_128gpu")
    ideal = OverlapCoefficients()
    p = with_efficiency(p, **{f: ideal for f in (*OVERLAPS, "pp_overlap", "offload_overlap")})
    row = dict(tp=8, cp=2, pp=4, vp=2, mbs=1, pp_schedule="dualpipev", zero_stage=3, reshard_after_forward=True,
               activation_offload="layer", cp_overlap=True, pp_overlap=True, dp_overlap=True)
    on, off = (ConfigBatch.from_specs(p, [ConfigSpec.model_validate({**row, "tp_overlap": flag})]) for flag in (True, False))
    assert feasible(p, on)[0] and feasible(p, off)[0]
    e_on, e_off = evaluate(p, on), evaluate(p, off)
    assert float(e_on.breakdown_s["tp"][0]) < float(e_off.breakdown_s["tp"][0]) - 1.0
    assert float(e_on.step_time_s[0]) <= float(e_off.step_time_s[0])


# --------------------------------------------------------------------------------------
# Fault model: recovery mix (eq. 41)
# --------------------------------------------------------------------------------------
def test_eq41_recovery_mix():
    """u_b = alpha*u_bc + beta*u_bp + gamma*u_bj: MoFa's 3:6:1 over 141, 262, 307 s = 230.2 s."""
    ft = FaultToleranceSpec(failure_rate_per_node_day=0.005, recovery_mix={"process": 0.3, "pod": 0.6, "job": 0.1}, checkpoint_save_s=5.0)
    assert ft.mean_recovery_s == pytest.approx(0.3 * 141 + 0.6 * 262 + 0.1 * 307)
    assert ft.mean_recovery_s == pytest.approx(230.2)
    custom = FaultToleranceSpec(failure_rate_per_node_day=0.005, recovery_mix={"process": 0.5, "job": 0.5},
                                recovery_times_s={"process": 10.0, "pod": 20.0, "job": 90.0}, checkpoint_save_s=5.0)
    assert custom.mean_recovery_s == pytest.approx(50.0)
    with pytest.raises(ValueError, match="sum to 1"):
        FaultToleranceSpec(failure_rate_per_node_day=0.005, recovery_mix={"process": 0.3, "pod": 0.3}, checkpoint_save_s=5.0)


def test_recovery_mix_reaches_the_end_to_end_time():
    """The DeepSeek-V3 problem gives the 3:6:1 mix: evaluate's end-to-end time is eqs. 37-39
    with u_b = 230.2 s, and a worse mix (all job restarts, 307 s) lengthens it."""
    p = problem("deepseek_v3_1024gpu_sn8")
    cfg = sample(p, 4)
    ev = evaluate(p, cfg)
    ft = p.fault_tolerance
    rate = failure_rate_per_s(p.cluster.num_nodes, ft.failure_rate_per_node_day)
    expected = end_to_end_s(p.training.total_steps, ev.step_time_s, ev.checkpoint_interval, rate, 230.2, ev.checkpoint_save_s, ft.first_init_s)
    np.testing.assert_allclose(ev.e2e_time_s, expected, rtol=1e-12)
    worse = p.model_copy(update={"fault_tolerance": ft.model_copy(update={"recovery_mix": {"job": 1.0}})})
    assert np.all(evaluate(worse, cfg).e2e_time_s > ev.e2e_time_s)


# --------------------------------------------------------------------------------------
# Node-limited MoE routing
# --------------------------------------------------------------------------------------
def without_node_limit(p):
    moe = p.model.moe.model_copy(update={"max_nodes_per_token": None})
    return p.model_copy(update={"model": p.model.model_copy(update={"moe": moe})})


def test_node_limited_routing_cuts_only_off_node_traffic():
    """DeepSeek-V3 routes each token to at most 4 nodes of its 8 experts: the off-node share of
    the dispatch is capped at 4/8. EP 64 over 8 nodes (off-node share 7/8) gets faster; EP 8
    inside one node is unchanged."""
    p = problem("deepseek_v3_1024gpu_sn8")
    assert p.model.moe.max_nodes_per_token == 4 and p.model.moe.top_k == 8
    free = without_node_limit(p)
    for ep, faster in ((64, True), (8, False)):
        cfg = ConfigBatch.from_columns(1024, tp=1, pp=8, ep=ep, mbs=1, first_layers=8, last_layers=8)
        limited = [float(k.ep[0]) for k in layer_costs(p, cfg).kinds]
        unlimited = [float(k.ep[0]) for k in layer_costs(free, cfg).kinds]
        moe = [i for i, t in enumerate(unlimited) if t > 0]
        for i in moe:
            if faster:
                assert limited[i] < unlimited[i]
            else:
                assert limited[i] == pytest.approx(unlimited[i], rel=1e-12)


# --------------------------------------------------------------------------------------
# Invariants on the shipped tuning problems
# --------------------------------------------------------------------------------------
INVARIANT_PROBLEMS = ["llama2_70b_128gpu", "llama3_405b_2048gpu_gbs512", "llama3_405b_16384xh100_seq128k", "deepseek_v3_1024gpu_sn8"]


@pytest.mark.parametrize("name", ["llama2_70b_128gpu", "llama3_405b_2048gpu_gbs512", "deepseek_v3_1024gpu_sn8"])
def test_tp_one_has_no_tp_communication(name):
    p = problem(name)
    cfg = sample(p, 400, seed=2)
    ev = evaluate(p, cfg)
    one = cfg.tp == 1
    assert one.any() and (~one).any()
    assert np.all(ev.breakdown_s["tp"][one] == 0.0)
    assert np.all(ev.breakdown_s["tp"][~one] > 0.0)


@pytest.mark.parametrize("name", INVARIANT_PROBLEMS)
def test_more_data_parallel_gpus_never_raise_memory_per_gpu(name):
    """The same layout on 2x and 4x the GPUs (more DP, same global batch): the peak per GPU
    never grows, except by one NCCL communicator's buffers for each group that more DP brings
    into existence (an expert-data-parallel group of 2 where there was 1, say)."""
    p = problem(name)
    cfg = sample(p, 150, seed=3)
    cols = {f: getattr(cfg, f) for f in cfg.__dataclass_fields__ if f != "dp"}
    base = evaluate(p, cfg)
    G = p.cluster.num_gpus
    compared = 0
    for factor in (2, 4):
        bigger = p.model_copy(update={"cluster": p.cluster.model_copy(update={"num_gpus": G * factor})})
        wide = ConfigBatch.from_columns(G * factor, **cols)
        # the same global batch must still split into whole micro-batches
        ok = (p.training.global_batch_size % (wide.mbs * wide.dp) == 0) & (wide.dp > 0)
        if not ok.any():
            continue
        ev = evaluate(bigger, wide.take(ok))
        moe = p.model.moe is not None
        new_groups = communicator_count(wide, wide.derived(), moe)[ok] - communicator_count(cfg, cfg.derived(), moe)[ok]
        assert np.all(new_groups >= 0)
        allowance = new_groups * nccl_and_context(p.hardware)[1]
        assert np.all(ev.memory_bytes["peak"] <= base.memory_bytes["peak"][ok] * (1 + 1e-12) + allowance)
        compared += int(ok.sum())
    assert compared > 0


@pytest.mark.parametrize("name", INVARIANT_PROBLEMS)
def test_batch_and_single_evaluation_agree(name):
    """evaluate on a batch equals evaluate on each configuration alone (no state, no batch-wide
    shortcut that changes a row's answer)."""
    p = problem(name)
    cfg = sample(p, 24, seed=4)
    batch = evaluate(p, cfg)
    for i in range(len(cfg)):
        one = evaluate(p, cfg.take(np.array([i])))
        assert one.step_time_s[0] == pytest.approx(batch.step_time_s[i], rel=1e-12)
        for key, values in batch.breakdown_s.items():
            assert one.breakdown_s[key][0] == pytest.approx(values[i], rel=1e-12, abs=1e-15), key
        for key, values in batch.memory_bytes.items():
            assert one.memory_bytes[key][0] == pytest.approx(values[i], rel=1e-12), key
        assert one.fits[0] == batch.fits[i]
        if batch.e2e_time_s is not None:
            assert one.e2e_time_s[0] == pytest.approx(batch.e2e_time_s[i], rel=1e-12)
            assert one.checkpoint_interval[0] == batch.checkpoint_interval[i]


def test_the_two_overlap_forms_hand_arithmetic():
    """costmodel.overlap: eq. 20's pair slows the whole computation (max(alpha*T_c, beta*T_m) -
    T_c), eq. 24's window only the part the transfer overlaps. A 1 s collective beside a 10 s GEMM,
    alpha 1.1, beta 1.2: the pair adds 1.0 s (0.1 x 10), the window form 0.12 s (0.1 x 1.2); a 12 s
    collective: both expose what outlasts the compute, 14.4 - 10 = 4.4 s."""
    from costmodel.overlap import beyond_window, contended

    coef = OverlapCoefficients(alpha=1.1, beta=1.2)
    assert float(contended(a(10.0), a(1.0), coef)[0]) == pytest.approx(1.0)
    assert float(beyond_window(a(1.0), a(10.0), coef)[0]) == pytest.approx(0.12)
    assert float(contended(a(10.0), a(12.0), coef)[0]) == pytest.approx(4.4)
    assert float(beyond_window(a(12.0), a(10.0), coef)[0]) == pytest.approx(4.4)


def test_megatron_async_tp_backward_collective_slows_only_what_it_overlaps():
    """Megatron's input-gradient reduce-scatter runs beside the wgrad GEMM (eq. 24's form): it
    exposes (alpha - 1) * beta * T_comm when the GEMM outlasts it, never (alpha - 1) * T_gemm."""
    from costmodel.layer import tp_backward_exposed
    from costmodel.specs import EfficiencyProfile

    eff = EfficiencyProfile(tp_overlap=OverlapCoefficients(alpha=1.1, beta=1.2))
    comm, dgrad, wgrad = a(1.0), a(10.0), a(10.0)
    assert float(tp_backward_exposed("ag", comm, dgrad, wgrad, eff, True, True)[0]) == pytest.approx(2 * 0.12)
    assert float(tp_backward_exposed("ag", comm, dgrad, wgrad, eff, False, True)[0]) == pytest.approx(0.24)  # all-reduce: 2 x volume
    assert float(tp_backward_exposed("ag", comm, dgrad, wgrad, eff, True, False)[0]) == pytest.approx(1.0)  # DTensor: waits


def test_unfused_adam_moves_the_bytes_of_its_elementwise_passes():
    """A fused Adam step reads and writes each state once (bf16 weights, fp32 states: master,
    m, v read and written, the fp32 gradient read, the bf16 weight written: 30 bytes); the
    multi-tensor and per-parameter implementations run eight elementwise passes, 20 fp32 reads
    and writes, plus the bf16 copy of the master (86 bytes). The update time follows."""
    from costmodel.update import adam_bytes_per_param

    assert adam_bytes_per_param(2, 4) == 30
    assert adam_bytes_per_param(2, 4, "foreach") == adam_bytes_per_param(2, 4, "per_parameter") == 86
    assert adam_bytes_per_param(4, 4, "per_parameter") == 80  # fp32 weights: no copy
    p = problem("llama2_70b_128gpu")
    cfg = ConfigBatch.from_columns(p.cluster.num_gpus, tp=8, pp=4, first_layers=20, last_layers=20, mbs=1, zero_stage=1)
    fused = evaluate(p, cfg).breakdown_s["update"][0]
    loop = p.model_copy(update={"training": p.training.model_copy(update={"optimizer_impl": "per_parameter"})})
    assert float(evaluate(loop, cfg).breakdown_s["update"][0]) == pytest.approx(float(fused) * 86 / 30, rel=0.02)
