"""Communication over a hierarchical network: MoFa eq. 3 (T = S / (beta * B)) with eq. 18's
lambda as the per-level efficiency.

Levels, inner to outer: the node (NVLink / scale-up island of `gpus_per_node`), the supernode
(a larger scale-up domain such as NVL72; same as the node unless the cluster says otherwise)
and the cluster (the scale-out NIC network). Every bandwidth is per GPU and one direction.

Where a parallel group lands follows the placement order (default inner to outer
[TP, CP, EP, PP, DP], Llama 3 section 5.2): each dimension occupies consecutive rank strides,
so a group is a list of (stride, count) factors and the number of its members inside one
node or supernode follows from the strides alone.

Collectives are hierarchical (NCCL's tree/ring across levels behaves like this in
bandwidth terms): a reduce-scatter first reduces inside the node, then across nodes on the
1/n_node share, and so on outward; an all-gather is the mirror image; an all-reduce is both.
An all-to-all sends the scale-out share over the NIC while the node and supernode shares cross
the scale-up fabric; those two share the GPU's scale-up ports (a supernode is one larger
NVLink-class domain, not a second set of links), so their times add.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.specs import ClusterSpec, HardwareSpec
from costmodel.units import GB, US

Factors = list[tuple[np.ndarray, np.ndarray]]  # (stride, count) per dimension of the group


@dataclass(frozen=True)
class Group:
    """A parallel group resolved onto the hierarchy: members per level (inside a node, nodes
    per supernode, supernodes) and the bandwidth of each level (the outer one decayed by the
    group's span, eq. 3's beta)."""

    n: tuple[np.ndarray, np.ndarray, np.ndarray]
    bandwidth: tuple[np.ndarray, np.ndarray, np.ndarray]
    span: np.ndarray
    ring_seconds_per_byte: np.ndarray  # a reduce-scatter is affine in its size:
    ring_latency: np.ndarray  # time = bytes * ring_seconds_per_byte + ring_latency

    @property
    def size(self) -> np.ndarray:
        return self.n[0] * self.n[1] * self.n[2]


class Network:
    def __init__(self, hw: HardwareSpec, cluster: ClusterSpec):
        eff = hw.efficiency.comm_efficiency
        intra = cluster.intra_node_gb_per_s or hw.intra_node_gb_per_s
        superbw = cluster.supernode_gb_per_s or intra
        inter = cluster.inter_node_gb_per_s or hw.inter_node_gb_per_s
        intra_lat = cluster.intra_node_latency_us if cluster.intra_node_latency_us is not None else hw.intra_node_latency_us
        inter_lat = cluster.inter_node_latency_us if cluster.inter_node_latency_us is not None else hw.inter_node_latency_us
        self.blocks = (float(cluster.gpus_per_node), float(cluster.supernode))
        self.bandwidth = np.array([intra * eff["node"], superbw * eff["supernode"], inter * eff["cluster"]]) * GB
        self.latency = np.array([intra_lat, intra_lat, inter_lat]) * US
        points = sorted(cluster.bandwidth_decay, key=lambda p: p.gpus)
        self._decay_x = np.log2([p.gpus for p in points]) if points else None
        self._decay_y = np.array([p.beta for p in points]) if points else None
        # without a cluster table, the hardware profile's calibrated power law
        self._decay_exponent = 0.0 if points else hw.efficiency.scale_decay_exponent
        self._decay_reference = float(hw.efficiency.scale_decay_reference_gpus)
        self.num_gpus = float(cluster.num_gpus)

    def decay(self, span: np.ndarray) -> np.ndarray:
        """beta of eq. 3 for a collective spanning `span` GPUs: the cluster's table, else the
        profile's power law (1 below its reference size, and 1 if it has none)."""
        if self._decay_x is None:
            if self._decay_exponent == 0.0:
                return np.ones_like(span, dtype=float)
            return np.minimum(1.0, (np.maximum(span, 1.0) / self._decay_reference) ** -self._decay_exponent)
        return np.interp(np.log2(np.maximum(span, 1)), self._decay_x, self._decay_y)

    def group(self, factors: Factors) -> Group:
        """Resolve (stride, count) factors (floats, inner first) onto the hierarchy."""
        def members(block):
            k = 1.0
            for stride, count in factors:
                k = k * np.minimum(np.maximum(np.floor(block / stride), 1.0), count)
            return k

        n = 1.0
        span = 1.0
        for stride, count in factors:
            n = n * count
            span = np.maximum(span, stride * count)
        k_node = members(self.blocks[0])
        k_super = k_node if self.blocks[1] == self.blocks[0] else np.maximum(members(self.blocks[1]), k_node)
        span = np.minimum(span, self.num_gpus)
        outer = self.bandwidth[2] if (self._decay_x is None and self._decay_exponent == 0.0) else self.bandwidth[2] * self.decay(span)
        bw = (self.bandwidth[0], self.bandwidth[1], outer)
        levels = (k_node, k_super / k_node, n / k_super)
        per_byte, latency, share = 0.0, 0.0, 1.0
        for n_j, b, lat in zip(levels, bw, self.latency):
            per_byte = per_byte + (n_j - 1.0) / n_j * share / b
            latency = latency + (n_j - 1.0) * lat
            share = share / n_j
        return Group(levels, bw, span, per_byte, latency)

    def single(self, like: np.ndarray) -> Group:
        """A group of one rank (no communication), for batches where a group is trivial."""
        one, zero = np.ones_like(like, dtype=float), np.zeros_like(like, dtype=float)
        return Group((one, one, one), tuple(self.bandwidth), one, zero, zero)

    def reduce_scatter(self, full_bytes: np.ndarray, g: Group) -> np.ndarray:
        """Reduce-scatter (or all-gather) of a buffer of `full_bytes` over the group:
        sum over levels of (n-1)/n * share / B + (n-1) * latency, the share shrinking by n
        (precomputed per group as an affine function of the size)."""
        return (full_bytes * g.ring_seconds_per_byte + g.ring_latency) * (full_bytes > 0)

    all_gather = reduce_scatter

    def all_reduce(self, full_bytes: np.ndarray, g: Group) -> np.ndarray:
        return 2.0 * self.reduce_scatter(full_bytes, g)

    def all_to_all(self, bytes_per_rank: np.ndarray, g: Group, inter_node_cap=None) -> np.ndarray:
        """All-to-all where each rank sends `bytes_per_rank` spread evenly over the group. The
        share for peers in the node and the share for the rest of the supernode leave through the
        same scale-up ports (their times add: spreading over more of one fabric does not add
        bandwidth); the share beyond the supernode travels concurrently on the NIC.
        `inter_node_cap` (fraction of the data, e.g. DeepSeek's node-limited routing) bounds the
        share that leaves the node, supernode and beyond together; it is taken from the two in
        proportion to their uniform shares."""
        n0, n1, n2 = g.n
        n = n0 * n1 * n2
        f_node = (n0 - 1.0) / n
        f_super = n0 * (n1 - 1.0) / n
        f_out = n0 * n1 * (n2 - 1.0) / n
        if inter_node_cap is not None:
            off = f_super + f_out
            keep = np.minimum(1.0, np.divide(inter_node_cap, off, out=np.ones_like(off * inter_node_cap), where=off > 0))
            f_super, f_out = f_super * keep, f_out * keep
        t = np.maximum(f_node / g.bandwidth[0] + f_super / g.bandwidth[1], f_out / g.bandwidth[2]) * bytes_per_rank
        lat = np.where(n2 > 1, self.latency[2], np.where(n1 > 1, self.latency[1], self.latency[0]))
        return (t + lat) * ((n > 1) & (bytes_per_rank > 0))

    def p2p_hop(self, nbytes: np.ndarray, g: Group) -> np.ndarray:
        """Mean time of one point-to-point hop between neighbours of a ring (the pipeline
        ranks): hops inside a node use the node's links, the others the level that separates
        the two ranks."""
        n0, n1, n2 = g.n
        count = n0 * n1 * n2
        nodes = n1 * n2
        crossing_node = nodes * (nodes > 1)  # ring boundaries between two nodes
        crossing_out = n2 * (n2 > 1)  # ... of which between two supernodes
        crossing_super = crossing_node - crossing_out
        inside = count - crossing_node
        t_out = nbytes / g.bandwidth[2] + self.latency[2]
        t_super = nbytes / g.bandwidth[1] + self.latency[1]
        t_node = nbytes / g.bandwidth[0] + self.latency[0]
        mean = (inside * t_node + crossing_super * t_super + crossing_out * t_out) / count
        return mean * (count > 1)
