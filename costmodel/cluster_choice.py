"""Choosing the cluster too (issue 11, MoFa section 6's "optimal hardware configuration"):
a problem whose `search.num_gpus` or `search.hardware` lists several values stands for one
problem per (GPU type, GPU count), each a plain problem the tuner solves as it is.

Pure schema work, kept in costmodel so the loader can check every candidate cluster when it
reads the file (a GPU count that is not a whole number of nodes, a GPU without a peak for the
compute dtype, a price missing for one GPU type are one-line errors naming the field, before
any search starts). The search over the candidates is optimizer.cluster.
"""

from __future__ import annotations

from pydantic import ValidationError

from costmodel.specs import Problem, Spec


class ClusterChoiceError(ValueError):
    """A candidate cluster that cannot be built; `field` is the dotted path concerned."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field, self.message = field, message


class ClusterChoice(Spec):
    """One candidate cluster: the GPU preset, how many GPUs, and the price of one GPU-hour
    (None where the problem gives none)."""

    hardware: str
    num_gpus: int
    price_per_gpu_hour: float | None = None

    @property
    def label(self) -> str:
        return f"{self.num_gpus}x{self.hardware}"


def _price(problem: Problem, name: str) -> float | None:
    price = problem.search.price_per_gpu_hour
    if isinstance(price, dict):
        return price.get(name)
    return price


def cluster_problems(problem: Problem) -> list[tuple[ClusterChoice, Problem]]:
    """[(choice, its problem)] in a fixed order (GPU types as listed, then GPU counts
    ascending). Each problem is the given one with that hardware and GPU count and without the
    cluster-choice fields, validated as a file would be. ClusterChoiceError names the field."""
    from costmodel.presets import resolve_hardware  # presets import the schema

    s = problem.search
    names = s.hardware or [problem.hardware.name]
    counts = s.gpu_counts() or [problem.cluster.num_gpus]
    hardware_of = {}
    for i, name in enumerate(names):  # unknown GPU names first: a price cannot be missing for a GPU that does not exist
        try:
            hardware_of[name] = problem.hardware if name == problem.hardware.name else resolve_hardware(name)
        except (ValueError, ValidationError) as exc:
            raise ClusterChoiceError(f"search.hardware[{i}]" if s.hardware else "hardware", str(exc).splitlines()[0]) from None
    needs_price = s.cluster_objective == "cost" or s.budget_cost is not None
    if needs_price and s.price_per_gpu_hour is None:
        if s.cluster_objective == "cost":
            raise ClusterChoiceError("search.price_per_gpu_hour", "objective cost needs a price per GPU-hour")
        # the budget is what the user wrote; the price is what it lacks
        raise ClusterChoiceError("search.budget_cost", "a budget in cost needs a price per GPU-hour (search.price_per_gpu_hour)")
    if isinstance(s.price_per_gpu_hour, dict):
        missing = [n for n in names if n not in s.price_per_gpu_hour]
        if missing:
            raise ClusterChoiceError("search.price_per_gpu_hour", f"no price for hardware '{missing[0]}'")
    if (s.chooses_cluster or len(names) * len(counts) > 1) and problem.training.total_steps is None:
        raise ClusterChoiceError("training.steps", "choosing the cluster needs the time to train: give training.steps or training.tokens")
    plain_search = s.model_copy(update={"num_gpus": None, "hardware": None})
    out = []
    for i, name in enumerate(names):
        where = f"search.hardware[{i}]" if s.hardware else "hardware"
        hardware = hardware_of[name]
        for n in counts:
            try:
                cluster = type(problem.cluster).model_validate({**dict(problem.cluster), "num_gpus": n})
                sub = Problem.model_validate({**dict(problem), "hardware": hardware, "cluster": cluster, "search": plain_search})
            except ValidationError as exc:
                err = exc.errors(include_url=False)[0]
                field = "search.num_gpus" if s.num_gpus is not None and "num_gpus" in str(err["msg"]) else where
                raise ClusterChoiceError(field, f"{n} x {name}: {str(err['msg']).removeprefix('Value error, ')}") from None
            out.append((ClusterChoice(hardware=name, num_gpus=n, price_per_gpu_hour=_price(problem, name)), sub))
    return out
