"""The price of one model's job on each node option, and where each price's speed comes from.

Every priced option carries ``speed_basis``:

* ``measured``: the option is the kind of machine the sample ran on (its ``hardware`` names that
  kind, or is ``this-machine``): the measured rate, scaled by the engines the option runs;
* ``projected``: other declared hardware: the roofline range of :mod:`.roofline`; ``wall_s`` and
  ``cost_usd`` are its slow end (what ``choose`` compares), ``wall_low_s`` and ``cost_low_usd``
  its fast end;
* ``unknown``: no hardware declared, or no model size to project from: no price (``cost_usd``
  None, ``why`` says what is missing), never another machine's speed at this one's price.

The engine start is the one measured on the sample's machine, for every option.

Beside them, :func:`price_hosted` puts the same tokens at the user's hosted batch prices
(:class:`~sparkbatch_dagster.spec.HostedPrice`; none is built in).
"""

from __future__ import annotations

from msgspec.structs import replace

from ..spec import THIS_MACHINE, HostedPrice, NodeOption
from ..spec.hardware import PRESET_NAMES
from .machine import Machine
from .placement import gpus_needed, place
from .records import HostedQuote, OptionPrice, SpeedBasis
from .roofline import ModelShape, Workload, project


def speed_basis(option: NodeOption, machine: Machine) -> SpeedBasis:
    """``measured``, ``projected`` or ``unknown`` for ``option`` when the sample ran on ``machine``."""
    if option.hardware == THIS_MACHINE:
        return "measured"
    figures = option.figures
    if figures is None:
        return "unknown"
    return "measured" if figures.name == machine.kind else "projected"


def hardware_name(option: NodeOption, machine: Machine) -> str:
    """The option's hardware in words."""
    if option.hardware == THIS_MACHINE:
        return machine.description
    figures = option.figures
    return PRESET_NAMES.get(figures.name, figures.name) if figures else "undeclared hardware"


def _cost(hourly: float, wall: float | None, start: float) -> float | None:
    return round(hourly * (wall + start) / 3600, 6) if wall is not None else None


def price_options(options: list[NodeOption], *, wall: float, engines: int, start: float, weights_gb: float | None,
                  machine: Machine, work: Workload | None, shape: ModelShape | None) -> list[OptionPrice]:
    """One price per option: how it runs the model, its speed basis, duration and cost (engine start
    included). ``wall``: measured generation seconds with ``engines`` engines on ``machine``;
    ``work``: the counts to project from (all prompts still to generate)."""
    return [_price(opt, wall=wall, engines=engines, start=start, weights_gb=weights_gb, machine=machine, work=work,
                   shape=shape) for opt in options]


def _price(opt: NodeOption, *, wall: float, engines: int, start: float, weights_gb: float | None,
           machine: Machine, work: Workload | None, shape: ModelShape | None) -> OptionPrice:
    basis = speed_basis(opt, machine)
    base = OptionPrice(name=opt.name, nodes=opt.nodes, gpus_per_node=opt.gpus_per_node, hourly_usd=opt.hourly_usd,
                       hardware=hardware_name(opt, machine), speed_basis=basis)
    if opt.hardware == THIS_MACHINE:  # the sample ran here, so the model fits as configured
        return replace(base, tensor_parallel_size=None, fits=True, engines=engines, settings={},
                       how="as the sample ran: this machine, with the resource's settings",
                       wall_s=round(wall, 1), wall_low_s=round(wall, 1), cost_usd=_cost(opt.hourly_usd, wall, start),
                       cost_low_usd=_cost(opt.hourly_usd, wall, start))
    tp = gpus_needed(weights_gb, opt.gpu_memory_gb)
    layout = place(tp, opt)
    short = f"cannot hold the model: it needs {tp} GPUs of {opt.gpu_memory_gb:g} GB"
    why = projection = None
    low = high = None
    if layout is None:
        why = "the model does not fit"
    elif basis == "measured":  # every engine the option holds labels its share, as fast as one of ours
        low = high = wall * engines / layout.engines
    elif basis == "projected" and work is not None and shape is not None and opt.figures is not None:
        n = layout.engines
        share = Workload(work.requests / n, work.prompt_tokens / n, work.output_tokens / n, work.concurrency,
                         work.cached_share)
        proj = project(share, shape, opt.figures, gpus=layout.tensor_parallel_size)
        low, high = proj.low_s, proj.high_s
        projection = proj.rounded()
    else:
        basis = "unknown"
        why = ("no hardware declared: set NodeOption(hardware=...) to a preset or HardwareSpec figures "
               "to project it, or measure the sample on that machine" if opt.figures is None
               else "the model's size is unknown (no readable config.json): nothing to project from")
    return replace(base, speed_basis=basis, projection=projection, why=why, tensor_parallel_size=tp,
                   fits=layout is not None, engines=layout.engines if layout else 0,
                   settings=layout.settings if layout else None, how=layout.how if layout else short,
                   wall_s=round(high, 1) if high is not None else None,
                   wall_low_s=round(low, 1) if low is not None else None,
                   cost_usd=_cost(opt.hourly_usd, high, start), cost_low_usd=_cost(opt.hourly_usd, low, start))


def price_hosted(prices: list[HostedPrice], input_tokens: float, output_tokens: float) -> list[HostedQuote]:
    """One quote per offer of the user's hosted batch price table: the job's tokens (the prompts
    still to generate, counted as the box's estimate counts them) at its prices. The tokens are
    this model's, by its tokenizer: a hosted model's count and answer length differ."""
    return [HostedQuote(name=p.name, input_tokens=round(input_tokens), output_tokens=round(output_tokens),
                        input_per_million_usd=p.input_per_million_usd, output_per_million_usd=p.output_per_million_usd,
                        cost_usd=round(p.cost_usd(input_tokens, output_tokens), 6), note=p.note) for p in prices]
