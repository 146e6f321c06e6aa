"""The layout search's report (issue 11): what `mofa solve --pipeline-layouts` and `mofa evaluate
--pipeline-layout` print and launch. layout_report runs the searches of one skeleton
(optimizer.layout_search: regular layouts then free ones, two_phase, and where the skeleton
recomputes the layouts Megatron launches, one --recompute-num-layers N; DualPipeV's own,
optimizer.layout_vee; a space of at most ENUMERATED_LAYOUTS scored whole) and reports the answer
against the configuration's own split with its proven gap, the makespan's and the step's
(step_floor_s: what any layout that fits adds to its makespan). given_layout_report scores a
layout the user gives; launch_recompute turns an answer's recompute counts into launch flags.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from costmodel.stage_layout import (
    LayoutContext,
    LayoutError,
    StageLayout,
    layout_context,
    score_layout,
    step_overhead_floor_s,
)
from optimizer.layout_bounds import work_bound_s
from optimizer.layout_linear import LinearLayouts, fewest_recompute, least_recompute
from optimizer.layout_oracles import enumerate_layouts
from optimizer.layout_rounds import LayoutSolution, layout_makespan, memo_scorer, with_launched_recompute
from optimizer.layout_search import solve_layout, two_phase
from optimizer.layout_seeds import packed_seeds
from optimizer.layout_vee import vee_layout_search


#: layout_report scores every layout (layout_oracles.enumerate_layouts, the exact model on each)
#: where there are at most this many: a single stage (pp = vp = 1: one layout, with full recompute
#: one per recompute count) or a few stages of few layers; ~2-10 ms a layout
ENUMERATED_LAYOUTS = 256


def enumerated_solutions(ctx: LayoutContext) -> tuple[LayoutSolution, LayoutSolution] | None:
    """(the best layout, the best with one --recompute-num-layers N) of a skeleton with at most
    ENUMERATED_LAYOUTS layouts, every one scored by the exact model: least makespan among those
    that fit (the searches' objective), then least step; the bound is that makespan, proven by
    enumeration. None where the space is larger. Raises LayoutError where none fits."""
    from costmodel.stage_layout import space_size

    if space_size(len(ctx.kind_of_layer), ctx.pp * ctx.vp, ctx.recompute_allowed) > ENUMERATED_LAYOUTS:
        return None
    start = time.perf_counter()
    scored = [(layout, score) for layout, score in enumerate_layouts(ctx) if score.fits]
    if not scored:
        raise LayoutError("no layout of this configuration fits the GPU memory (every layout scored)")
    elapsed = time.perf_counter() - start

    def best(pairs) -> LayoutSolution:
        layout, score = min(pairs, key=lambda pair: (layout_makespan(pair[1]), pair[1].step_time_s))
        makespan = layout_makespan(score)
        return LayoutSolution(layout, score.step_time_s, makespan, score.bound_s, makespan, True, elapsed, True, 0, "enumerated")

    expressible = [pair for pair in scored if not ctx.recompute_allowed or pair[0].uniform_recompute() is not None]
    return best(scored), best(expressible) if expressible else best(scored)


def own_layout(ctx: LayoutContext) -> StageLayout:
    """The configuration's own Megatron split (costmodel.stage_layout.megatron_layout) with its
    own recompute: block N recomputes min(N, layers) of every stage; uniform recomputes every
    layer (its groups of N > 1 keep fewer inputs, which per-stage counts do not express: the
    layout model scores them as N = 1)."""
    from costmodel.stage_layout import megatron_layout

    cfg, m = ctx.cfg, ctx.problem.model
    own = megatron_layout(m.num_layers, m.mtp_layers, ctx.pp, ctx.vp, int(cfg.first_layers[0]), int(cfg.last_layers[0]), ctx.vee)
    if not ctx.recompute_allowed:
        return own
    return with_launched_recompute(own, int(cfg.recompute_layers[0]) if int(cfg.recompute_method[0]) == 1 else None)


def launch_recompute(layout: StageLayout) -> dict:
    """The launch plan's recompute fields for a layout whose recompute counts one N gives
    (StageLayout.uniform_recompute): block method with that N (Megatron's
    --recompute-num-layers, the first N layers of every virtual stage), none where N = 0."""
    n = layout.uniform_recompute()
    if n is None:
        raise LayoutError(f"recompute counts {layout.recompute} are not min(N, layers) for one N: Megatron cannot launch them")
    if n == 0:
        return {"recompute": "none", "recompute_method": None, "recompute_num_layers": None}
    return {"recompute": "full", "recompute_method": "block", "recompute_num_layers": n}


_BOUND_NOTES = {
    "cp-sat": "proven by CP-SAT over the critical-path cuts, for every layout of the skeleton",
    "work": "no CP-SAT round proved more in time: the busiest rank's least work (work_bound_s), for every layout of the skeleton",
    "recompute-split": ("proven by recompute_split_bound (recompute as a yes/no per rank: a rank that recomputes is over its "
                        "capacity without it and pays at least one recomputed layer), for every layout and recompute vector"),
    "rank-lp": ("proven by the integer rank totals a faster layout needs (rank_order_region) and the schedule graph's LP "
                "relaxation within them (lp_region_bound), for every layout of the skeleton"),
    "relaxed": ("proven by the search's model without what a stage pays for holding a layer (relaxed_bound: ZeRO-3's "
                "first gather, the gradient windows), for every layout of the skeleton; the jumps along a path are the gap"),
    "rank-totals": ("no CP-SAT round proved more in time: the ranks' integer layer totals under their busy time, order and "
                    "memory (rank_totals_bound), for every layout of the search's space"),
    "per-stage": ("the search with any recompute count per stage proved it, for all its layouts: those with one "
                  "--recompute-num-layers N among them"),
    "levels": ("every --recompute-num-layers N >= 1 ruled out by the ranks' busy time (level_work_bounds: with one N every "
               "chunk that holds a layer recomputes one), the layouts without recompute bounded by the search without recompute"),
    "free": "the search over free layouts proved it, for all of them: the regular layouts among them",
    "enumerated": f"every layout of the skeleton scored by the exact model (it has at most {ENUMERATED_LAYOUTS})",
    "vee-cp-sat": ("DualPipeV: proven by CP-SAT over the critical-path cuts of the V's schedule graph (forward, input- and "
                   "weight-gradient passes) and its memory rows (vee_rounds), for every V layout of the skeleton"),
    "vee-rank": ("DualPipeV, CP-SAT's rounds over the V (vee_rounds) proved no more in time, or no layout fits: each rank's "
                 "work after the forward chain to its first stage, least over the integer layer counts (vee_rank_bound), for "
                 "every layout of the skeleton"),
    "vee-work": ("DualPipeV, CP-SAT's rounds over the V (vee_rounds) proved no more in time, or no layout fits: the ranks' "
                 "mean work (work_bound_s), for every layout of the skeleton"),
    "level-work": ("no CP-SAT round proved more in time: the ranks' busy time under one --recompute-num-layers N, least over "
                   "the N (level_work_bounds), for every layout with one N"),
}


def one_n_after_ctrl_c(ctx: LayoutContext, own: StageLayout, found: tuple[LayoutSolution, ...], scores: dict) -> LayoutSolution:
    """A Ctrl-C ended the search over per-stage recompute counts before the search with one N
    (layout_report) on an answer no one N gives, which Megatron cannot launch. The one-N
    layouts at hand: the configuration's own split, the layers of each answer `found` with the
    fewest N that fits them (fewest_recompute, uniform) and the one-N search's packed seeds
    (packed_seeds, N = 1 and 2: Llama 3 405B cp 1, 7.40 s against the split's 7.67 s), ranked
    on the schedule graph with the linear memory test (milliseconds, so that a Ctrl-C still
    ends the search at once), the fastest the exact model confirms taken; with the per-stage
    search's bound (it holds for the one-N layouts among its own: within_superset).
    KeyboardInterrupt where none of them fits (mofa solve then keeps the configuration's own
    split)."""
    lin = LinearLayouts(ctx)
    score_of = memo_scorer(ctx, scores)
    repaired = [fewest_recompute(ctx, s.layout.with_recompute([0] * s.layout.stages), lin, uniform=True) for s in found]
    standard = found[0].layout.mtp
    candidates = [x for x in dict.fromkeys((own, *repaired, *packed_seeds(ctx, (1, 2))))
                  if x is not None and x.mtp == standard]
    screened = lin.screen([x.decoders + x.recompute for x in candidates])
    order = np.argsort(screened.makespan_s, kind="stable")  # ties: the order above, deterministic
    layout = next((candidates[k] for k in order if screened.fits[k] and score_of(candidates[k]).fits), None)
    if layout is None:
        raise KeyboardInterrupt
    score = score_of(layout)
    makespan = layout_makespan(score)
    floor = min(work_bound_s(ctx, lin), makespan)
    answer = LayoutSolution(layout, score.step_time_s, makespan, score.bound_s, floor, floor >= makespan * (1 - 1e-9), 0.0, True, 0, "work",
                            interrupted=True)
    return within_superset(answer, found[0])


def step_floor_s(ctx: LayoutContext, answers, tables: dict | None = None) -> float:
    """What every layout that fits adds to its makespan in the step, at least
    (costmodel.stage_layout.step_overhead_floor_s): memory left out, unless an answer's busiest
    rank updates more than that floor and the model has one kind of decoder layer; then each
    rank's least_recompute table (`tables`: solve_layout's table_cache, keyed by the most layers
    a rank may hold, filled here where the search did not) keeps each rank to the layer totals
    it can fit, so that the floor holds for those that fit (Llama 3 405B cp 1, no recompute:
    0.33 s -> 0.49 s, in 0.4 s, against the answer's 0.50 s)."""
    plain = step_overhead_floor_s(ctx)
    busiest = max((a.step_time_s - a.makespan_s for a in answers), default=0.0)
    if busiest <= plain * (1 + 1e-9) or len(set(ctx.kind_of_layer)) != 1:
        return plain
    tables = {} if tables is None else tables
    most = len(ctx.kind_of_layer)
    if most not in tables:
        try:
            lin = LinearLayouts(ctx)
        except LayoutError:  # a skeleton the linear model does not hold (one enumerated instead): memory left out
            return plain
        tables[most] = [least_recompute(ctx, lin, r, most) for r in range(ctx.pp)]
    return step_overhead_floor_s(ctx, tables[most])


def step_bound(solution: LayoutSolution, overhead_floor_s: float) -> dict:
    """The step's proven bound and gap for a search's answer: its makespan bound plus
    `overhead_floor_s` (costmodel.stage_layout.step_overhead_floor_s), which every layout adds
    at least; a layout whose busiest rank updates more than the least has a step gap above its
    makespan gap (Llama 3 405B cp 1, free layouts: 12 layers on a rank)."""
    bound = min(solution.lower_bound_s + overhead_floor_s, solution.step_time_s)
    return {"step_lower_bound_s": bound, "step_gap": (solution.step_time_s - bound) / solution.step_time_s}


def within_superset(solution: LayoutSolution, superset: LayoutSolution, source: str = "per-stage") -> LayoutSolution:
    """A search's answer with the bound of a search over a larger space of the same skeleton
    where that is higher (the one-N layouts are among the per-stage recompute layouts, "per-stage";
    the regular layouts among the free ones, "free"): no layout of the smaller space beats a
    bound proven for all of the larger's."""
    if superset.lower_bound_s <= solution.lower_bound_s:
        return solution
    proven = solution.optimal or superset.lower_bound_s >= solution.makespan_s * (1 - 1e-9)
    return dataclasses.replace(solution, lower_bound_s=min(superset.lower_bound_s, solution.makespan_s), optimal=proven,
                               bound_source=source)


def given_layout_report(problem, cfg, text: str, block_layers: int | None = None) -> tuple[dict, StageLayout]:
    """A layout the user gives (`mofa evaluate --pipeline-layout`, Megatron-Core's layout
    string) scored on one configuration next to the configuration's own split, both by the
    layout model (costmodel.stage_layout: the simulated schedule, every rank's own ledger).
    Under full recompute each stage recomputes as Megatron launches it on this layout: the
    first min(N, layers) with the block method's N (`block_layers`, the problem's
    recompute_num_layers: the configuration row turns a block N that covers its own split's
    stages into uniform), every layer with the uniform method. LayoutError where the layout
    does not fit the configuration or the model."""
    ctx = layout_context(problem, cfg)
    layout = StageLayout.from_megatron(text, ctx.pp, ctx.vp, ctx.vee)
    if ctx.recompute_allowed:
        layout = with_launched_recompute(layout, block_layers)
    own = own_layout(ctx)
    score, own_score = score_layout(ctx, layout), score_layout(ctx, own)
    report = {
        "layout": layout.to_megatron(),
        "step_time_s": score.step_time_s,
        "pipeline_s": score.pipeline_s,
        "update_s": score.update_s,  # the busiest rank's DP reduce and optimizer update (rank_update_s)
        "peak_bytes": [float(b) for b in score.peak_bytes],
        "worst_rank": int(np.argmax(score.peak_bytes)),
        "host_bytes": [float(b) for b in score.host_bytes],  # each rank's host memory at its most (rank_host_bytes)
        "host_share_bytes": float(ctx.mc.host_share_bytes),  # a GPU's share of its node's
        "fits": score.fits,  # every GPU's memory and every rank's host share
        "megatron_split": own.to_megatron(),
        "megatron_split_step_time_s": own_score.step_time_s,
        "megatron_split_update_s": own_score.update_s,
        "megatron_split_fits": own_score.fits,
        "gain": own_score.step_time_s / score.step_time_s - 1.0,
    }
    if ctx.recompute_allowed:
        report["recompute"] = list(layout.recompute)
    return report, layout


def layout_report(problem, cfg, time_limit_s: float = 10.0, workers: int = 2) -> tuple[dict, StageLayout | None]:
    """The layout search on one solved configuration (`mofa solve --pipeline-layouts`): a JSON
    report and the layout to launch (None where the search is refused or finds nothing better
    than the configuration's own Megatron split). Step times here are the simulated
    schedule's (costmodel.stage_layout), the split's and the layout's alike.
    With full recompute in the configuration the layouts also choose how many layers of each
    stage to recompute. Megatron takes one --recompute-num-layers N for every stage (block
    method: r_s = min(N, layers_s)), so after the search over any per-stage counts (two thirds
    of the time) a search over the layouts with one N (the rest, seeded with its regular and free
    answers, sharing their scores and cuts) gives the answer reported and launched, with the better of the two
    bounds; where the first answer's counts are not of that form, the report says so
    (`recompute_expressible`: false) and keeps it as `best_any_recompute`. DualPipeV skeletons
    get vee_layout_search instead (a descent, then CP-SAT rounds over the V: vee_rounds).
    Ctrl-C ends the search at once with the best layout so far and its proven gap
    (`interrupted`: true) and skips the searches after it; where that answer recomputes per
    stage what no one N gives (the search with one N had not run), the answer launched is
    one_n_after_ctrl_c's. In the DualPipeV search likewise: its best V layout so far, which
    recomputes what Megatron launches. A Ctrl-C before any layout fits reaches the caller:
    mofa solve then keeps the configuration's own split."""
    from costmodel.stage_layout import space_size

    try:
        ctx = layout_context(problem, cfg)
        own = own_layout(ctx)
        own_score = score_layout(ctx, own)
        start = time.perf_counter()
        scores, paths, tables = {}, set(), {}  # shared by the searches of this skeleton
        enumerated = enumerated_solutions(ctx)
        if enumerated is not None:  # few enough to score every one
            regular_solution, (free, solution) = None, enumerated
        else:
            if ctx.vee:  # the V's own search: a descent scored by the exact model, then CP-SAT rounds over the V's graph
                regular_solution, solution = None, vee_layout_search(ctx, time_limit_s, own, scores, workers)
            else:
                regular_solution, solution = two_phase(ctx, time_limit_s * (2 / 3 if ctx.recompute_allowed else 1.0), workers, (own,),
                                                       scores=scores, paths=paths, tables=tables)
            free = solution
        expressible = not ctx.recompute_allowed or free.layout.uniform_recompute() is not None
        if free.interrupted and not expressible:  # before the search with one N: its answer's layers with the fewest N that fits
            solution = one_n_after_ctrl_c(ctx, own, (free,) + ((regular_solution,) if regular_solution is not None else ()), scores)
        if ctx.recompute_allowed and not ctx.vee and not free.interrupted and enumerated is None:
            # the layouts Megatron launches (one N) are searched whether or not the answer above
            # is one of them: their own bounds (level_work_bounds) can certify what the search
            # over any per-stage counts does not (DeepSeek-V3: no N >= 1 beats the optimum without)
            remaining = max(time_limit_s - (time.perf_counter() - start), 0.05)
            more = (regular_solution.layout,) if regular_solution is not None else ()  # often recomputes less than the free answer
            solution = solve_layout(ctx, remaining, workers, seeds=(own, free.layout) + more, uniform_recompute=True, scores=scores,
                                    paths=paths, table_cache=tables)
            solution = within_superset(solution, free)
    except LayoutError as exc:
        return {"refused": str(exc)}, None
    better = solution.step_time_s < own_score.step_time_s * (1 - 1e-9) or (solution.fits and not own_score.fits)
    # what any layout that fits adds to its makespan in the step, at least (its time counts in the
    # search's); after a Ctrl-C without memory, whose tables can take seconds
    floor_start = time.perf_counter()
    if regular_solution is not None:  # the regular layouts are among the free ones: the free search's bound holds for them
        regular_solution = within_superset(regular_solution, free, "free")
    answers = [] if solution.interrupted else [x for x in (solution, free, regular_solution) if x is not None]
    overhead_floor = step_floor_s(ctx, answers, tables)
    floor_s = time.perf_counter() - floor_start
    report = {
        "layout": solution.layout.to_megatron(),
        "applied": bool(better),
        "step_time_s": solution.step_time_s,
        # the busiest rank's DP reduce and optimizer update in each step (rank_update_s): the
        # search minimises the makespan, the step adds this
        "update_s": (scores.get(solution.layout) or score_layout(ctx, solution.layout)).update_s,
        "megatron_split_step_time_s": own_score.step_time_s,
        "megatron_split_update_s": own_score.update_s,
        "megatron_split_fits": own_score.fits,
        "gain": own_score.step_time_s / solution.step_time_s - 1.0,
        "makespan_lower_bound_s": solution.lower_bound_s,
        "gap": solution.gap,
        # the search minimises the makespan; the step adds the exposed P2P and the busiest rank's
        # update, which a layout that piles layers on a rank raises: the step's own bound is the
        # makespan's plus the least of those over every layout (step_overhead_floor_s)
        **step_bound(solution, overhead_floor),
        "bound": _BOUND_NOTES[solution.bound_source],
        "optimal": solution.optimal,
        "rounds": solution.rounds,
        "interrupted": solution.interrupted,
        "search_time_s": (solution.solve_s + (regular_solution.solve_s if regular_solution else 0.0) + (free.solve_s if free is not solution else 0.0)
                          + floor_s),
        "regular": None if regular_solution is None else {
            "note": "among layouts whose chunks on one rank differ by at most one layer",
            "step_time_s": regular_solution.step_time_s, "optimal": regular_solution.optimal, "gap": regular_solution.gap,
            **step_bound(regular_solution, overhead_floor)},
        "space_size": float(space_size(len(ctx.kind_of_layer), ctx.pp * ctx.vp, ctx.recompute_allowed)),
    }
    if ctx.recompute_allowed:
        report.update({
            "recompute": list(solution.layout.recompute),
            "recompute_num_layers": solution.layout.uniform_recompute(),
            "recompute_expressible": expressible,
            "megatron_split_recompute": list(own.recompute),
        })
        if not expressible:
            report["best_any_recompute"] = {
                "note": "per-stage recompute counts that no one --recompute-num-layers gives: not launchable by Megatron",
                "layout": free.layout.to_megatron(), "recompute": list(free.layout.recompute), "step_time_s": free.step_time_s,
                "makespan_lower_bound_s": free.lower_bound_s, "optimal": free.optimal, "gap": free.gap, **step_bound(free, overhead_floor),
                "bound": _BOUND_NOTES[free.bound_source]}
    return report, solution.layout if better else None
