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
An all-to-all sends each level's share of the data over that level's links concurrently.
"""

from __future__ import annotations

import numpy as np

from costmodel.specs import ClusterSpec, HardwareSpec
from costmodel.units import GB, US

Factors = list[tuple[np.ndarray, np.ndarray]]  # (stride, count) per dimension of the group


class Network:
    def __init__(self, hw: HardwareSpec, cluster: ClusterSpec):
        eff = hw.efficiency.comm_efficiency
        intra = cluster.intra_node_gb_per_s or hw.intra_node_gb_per_s
        superbw = cluster.supernode_gb_per_s or intra
        inter = cluster.inter_node_gb_per_s or hw.inter_node_gb_per_s
        intra_lat = cluster.intra_node_latency_us if cluster.intra_node_latency_us is not None else hw.intra_node_latency_us
        inter_lat = cluster.inter_node_latency_us if cluster.inter_node_latency_us is not None else hw.inter_node_latency_us
        self.blocks = (cluster.gpus_per_node, cluster.supernode)
        self.bandwidth = np.array([intra * eff["node"], superbw * eff["supernode"], inter * eff["cluster"]]) * GB
        self.latency = np.array([intra_lat, intra_lat, inter_lat]) * US
        points = sorted(cluster.bandwidth_decay, key=lambda p: p.gpus)
        self._decay_x = np.log2([p.gpus for p in points]) if points else None
        self._decay_y = np.array([p.beta for p in points]) if points else None
        self.num_gpus = cluster.num_gpus

    def decay(self, span: np.ndarray) -> np.ndarray:
        """beta of eq. 3 for a collective spanning `span` GPUs (1 if the cluster gives none)."""
        if self._decay_x is None:
            return np.ones_like(span, dtype=float)
        return np.interp(np.log2(np.maximum(span, 1)), self._decay_x, self._decay_y)

    def fanout(self, factors: Factors):
        """Members of the group per level: (inside a node, nodes per supernode, supernodes)
        and the number of GPUs the group spans."""
        def members(block):
            k = 1
            for stride, count in factors:
                k = k * np.clip(block // stride, 1, count)
            return k

        n = 1
        span = 1
        for stride, count in factors:
            n = n * count
            span = np.maximum(span, stride * count)
        k_node = members(self.blocks[0])
        k_super = np.maximum(members(self.blocks[1]), k_node)
        return k_node, k_super // k_node, n // k_super, np.minimum(span, self.num_gpus)

    def _levels(self, factors: Factors):
        n0, n1, n2, span = self.fanout(factors)
        bw_outer = self.bandwidth[2] * self.decay(span)
        return (n0, n1, n2), (self.bandwidth[0], self.bandwidth[1], bw_outer)

    def reduce_scatter(self, full_bytes: np.ndarray, factors: Factors) -> np.ndarray:
        """Reduce-scatter (or all-gather) of a buffer of `full_bytes` over the group."""
        (n0, n1, n2), bw = self._levels(factors)
        time = 0.0
        share = full_bytes
        for n, b, lat in zip((n0, n1, n2), bw, self.latency):
            time = time + (n - 1) / n * share / b + (n - 1) * lat
            share = share / n
        return np.where(full_bytes > 0, time, 0.0)

    all_gather = reduce_scatter

    def all_reduce(self, full_bytes: np.ndarray, factors: Factors) -> np.ndarray:
        return 2.0 * self.reduce_scatter(full_bytes, factors)

    def all_to_all(self, bytes_per_rank: np.ndarray, factors: Factors, inter_node_cap=None) -> np.ndarray:
        """All-to-all where each rank sends `bytes_per_rank` spread evenly over the group;
        the shares for the node, the supernode and beyond travel concurrently on their links.
        `inter_node_cap` (fraction of the data, e.g. DeepSeek's node-limited routing) bounds the
        share that leaves the node."""
        (n0, n1, n2), bw = self._levels(factors)
        n = n0 * n1 * n2
        f_node = (n0 - 1) / n
        f_super = n0 * (n1 - 1) / n
        f_out = n0 * n1 * (n2 - 1) / n
        if inter_node_cap is not None:
            f_out = np.minimum(f_out, inter_node_cap)
            f_super = np.minimum(f_super, inter_node_cap)
        t = np.maximum(np.maximum(f_node * bytes_per_rank / bw[0], f_super * bytes_per_rank / bw[1]), f_out * bytes_per_rank / bw[2])
        lat = np.where(n2 > 1, self.latency[2], np.where(n1 > 1, self.latency[1], self.latency[0]))
        return np.where((n > 1) & (bytes_per_rank > 0), t + lat, 0.0)

    def p2p_hop(self, nbytes: np.ndarray, stride: np.ndarray, count: np.ndarray) -> np.ndarray:
        """Mean time of one point-to-point hop between neighbours of a ring of `count` ranks
        `stride` apart (the pipeline): hops inside a node use NVLink, the others the level
        that separates the two ranks."""
        n0, n1, n2, span = self.fanout([(stride, count)])
        nodes = n1 * n2
        crossing_node = np.where(nodes > 1, nodes, 0)  # ring boundaries between two nodes
        crossing_out = np.where(n2 > 1, n2, 0)  # ... of which between two supernodes
        crossing_super = crossing_node - crossing_out
        inside = count - crossing_node
        t_out = nbytes / (self.bandwidth[2] * self.decay(span)) + self.latency[2]
        t_super = nbytes / self.bandwidth[1] + self.latency[1]
        t_node = nbytes / self.bandwidth[0] + self.latency[0]
        mean = (inside * t_node + crossing_super * t_super + crossing_out * t_out) / np.maximum(count, 1.0)
        return np.where(count > 1, mean, 0.0)

    def host_copy(self, nbytes, bandwidth_gb_per_s: float, efficiency: float):
        return nbytes / (bandwidth_gb_per_s * efficiency * GB)
