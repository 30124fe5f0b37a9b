"""``BatchInferenceComponent``: a batch job as a folder with a ``defs.yaml``, for ``dg``.

The YAML's attributes are every :class:`JobSpec` field (same names, defaults, checks and
descriptions: the schema is generated from ``JobSpec``) plus where the job plugs into Dagster:
``engine`` (the :class:`VLLMResource` settings, generated from its fields), ``resource_key``,
``upstream``, ``key_prefix``, ``group_name``, ``pool`` and ``max_partitions_per_run``. It
builds what :func:`build_batch_assets` builds: the same seven assets, keys, partitions and code
versions, and the engine resource under ``resource_key``.
"""

from __future__ import annotations

import inspect
import json
import operator
import os
import re
from collections.abc import Mapping, Sequence
from functools import cache, reduce
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import dagster as dg
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, create_model
from pydantic.fields import FieldInfo

from ..errors import ConfigError
from ..spec import JobSpec
from .factory import build_batch_assets
from .resource import VLLMResource
from .scaffold import BatchInferenceScaffolder

#: A value with ``{{ ... }}`` or ``{% ... %}`` in it: rendered when the YAML loads (``env``,
#: ``context``, template vars), then checked as the field's own type.
TemplateStr = Annotated[str, StringConstraints(pattern=r"\{[{%]")]
_TEMPLATE_RE = re.compile(r"\{[{%]")
#: Jinja over each input row, rendered by the job itself: dg never renders these.
ROW_TEMPLATES = ("system_prompt", "user_template")
#: Paths that resolve against the defs.yaml's folder when relative.
PATHS = ("input", "home", "result_store", "cache_dir")
_FACTORY = inspect.signature(build_batch_assets).parameters


def _by_type(schema: dict[str, Any]) -> None:
    """Rewrite each ``anyOf`` whose branches are of distinct JSON types (a template is a string,
    ``None`` null, a model an object) as if/then/else on the type: ``dg check yaml`` then reports
    the branch's own error (``0 is less than the minimum of 1`` at its line) instead of "is not
    valid under any of the given schemas"."""
    for prop in schema.get("properties", {}).values():
        branches = prop.get("anyOf") or []
        if any(b.get("type") == "string" and "pattern" not in b for b in branches):
            branches = [b for b in branches if "pattern" not in b]  # a plain string takes templates too
        types = [b.get("type", "object" if "$ref" in b else None) for b in branches]
        if len(branches) < 2 or None in types or len(set(types)) < len(types):
            continue
        node: dict[str, Any] = branches[-1]
        for kind, branch in reversed(list(zip(types[:-1], branches[:-1], strict=True))):
            node = {"if": {"type": kind}, "then": branch, "else": node}
        del prop["anyOf"]
        prop.update(node)


class _Schema(dg.Model):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_by_type)


class _Located(JobSpec):
    """JobSpec's checks with pydantic's own errors, whose locations map to YAML lines (JobSpec
    turns them into a ConfigError that names fields but not lines)."""

    __init__ = BaseModel.__init__  # type: ignore[assignment]


class EnvRef(dg.Model):
    """``{env: NAME}``: an engine setting Dagster reads from the environment when a run starts
    (a ``dg.EnvVar``): its value never enters the config the UI shows."""

    env: str = Field(description="Name of the environment variable.")


def _loose(info: FieldInfo, *extra: Any) -> tuple[Any, Any]:
    """A field as YAML may write it: its own type and checks, or a template (and ``extra``).
    A nested spec (``output``, ``sampling``, ``estimate``, ``sink``) is literal, so that an error inside
    it is reported at its own line."""
    ann = info.rebuild_annotation()
    # A nested spec, or an optional one (``sink``: ``SinkSpec | None``): literal too.
    options = get_args(ann) if get_origin(ann) in (Union, UnionType) else (ann,)
    nested = all(a is type(None) or isinstance(a, type) and issubclass(a, BaseModel) for a in options)
    kinds = (ann,) if ann is str or nested else (ann, TemplateStr)
    typ: Any = reduce(operator.or_, (*kinds, *extra))
    if info.is_required():
        return typ, Field(description=info.description)
    if info.default_factory is not None:
        return typ, Field(default_factory=info.default_factory, description=info.description)
    return typ, Field(default=info.default, description=info.description)


@cache
def engine_model() -> type[BaseModel]:
    """``engine:``'s schema: every :class:`VLLMResource` field, as that class declares it."""
    fields: dict[str, Any] = {n: _loose(f, EnvRef) for n, f in VLLMResource.model_fields.items()}
    return create_model("EngineSettings", __base__=_Schema, __doc__="VLLMResource settings.", **fields)


@cache
def wiring_model() -> type[BaseModel]:
    """The attributes that are not JobSpec's: where the job plugs into Dagster (checked after
    templates render; the defaults are :func:`build_batch_assets`' own)."""
    return create_model(
        "Wiring", __base__=dg.Model,
        resource_key=(str, Field(default=_FACTORY["resource_key"].default,
                                 description="Key of the engine resource; jobs with one key share one engine.")),
        upstream=(list[str], Field(default_factory=list,
                                   description="Asset keys ('a/b') of the assets that write the input.")),
        key_prefix=(str | list[str] | None, Field(
            default=_FACTORY["key_prefix"].default, description="Asset key prefix; None: the job name.")),
        group_name=(str | None, Field(
            default=_FACTORY["group_name"].default, description="Asset group; None: the job name.")),
        pool=(str | None, Field(default=_FACTORY["pool"].default, description=(
            "Dagster concurrency pool of the assets that start an engine (limit it to the number of GPUs); "
            "None: no pool."))),
        max_partitions_per_run=(int | None, Field(default=None, ge=1, description=(
            "A backfill of labeled_outputs in runs of this many partitions (e.g. one run per GPU machine); "
            "None: one run, one engine start, for the whole backfill."))),
    )


@cache
def attributes_model() -> type[BaseModel]:
    """The defs.yaml ``attributes`` schema: JobSpec's fields, ``engine``, then the wiring."""
    fields: dict[str, Any] = {}
    for name, info in JobSpec.model_fields.items():
        fields[name] = (info.annotation, info) if name in ROW_TEMPLATES else _loose(info)
    fields["engine"] = (engine_model() | TemplateStr, Field(
        default_factory=engine_model(), description="VLLMResource settings (unset ones: VLLMResource's defaults; "
        "`{env: NAME}` reads one from the environment when a run starts), or a template that gives a VLLMResource."))
    fields.update({n: _loose(f) for n, f in wiring_model().model_fields.items()})
    return create_model("BatchInferenceAttributes", __base__=_Schema, **fields)


@dg.scaffold_with(BatchInferenceScaffolder)
class BatchInferenceComponent(dg.Component, dg.Resolvable):
    """A batch inference job (one prompt over every row of an input) declared in a defs.yaml.

    Example (``defs/tickets/defs.yaml``)::

        type: sparkbatch_dagster.BatchInferenceComponent
        attributes:
          name: tickets
          input: data/tickets/*.parquet          # relative to this folder; or s3://...
          id_column: ticket_id
          text_columns: [subject, body]
          system_prompt: You route support tickets.
          user_template: "Subject: {{ subject }}\\n{{ body }}\\nWhich team?"   # per row, not by dg
          output: {kind: label, labels: [billing, tech, sales]}
          shard_count: "{{ env('TICKET_SHARDS', 8) }}"
          gold_column: team
          engine: {model: /models/qwen-7b, max_num_seqs: 1024, api_key: {env: VLLM_KEY}}
          upstream: [raw/tickets]

    Attributes are :class:`JobSpec`'s fields plus ``engine``, ``resource_key``, ``upstream``,
    ``key_prefix``, ``group_name``, ``pool`` and ``max_partitions_per_run`` (:func:`attributes_model`
    is the schema ``dg check yaml`` uses). Templates (``{{ env.X }}``, ``{{ env('X', default) }}``,
    ``{{ context.project_root }}``, template vars) work in every value except ``system_prompt`` and
    ``user_template`` (Jinja over each row, rendered by the job) and inside ``output``,
    ``sampling`` and ``estimate`` (literal, so that an error there has its own line).
    Relative ``input``, ``home`` and ``result_store`` resolve against the defs.yaml's folder.

    In Python: ``BatchInferenceComponent(spec=JobSpec(...), engine={"max_num_seqs": 1024})``.
    """

    def __init__(
        self, *, spec: JobSpec | None = None, engine: VLLMResource | Mapping[str, Any] | None = None,
        resource_key: str = _FACTORY["resource_key"].default, upstream: Sequence[str | dg.AssetKey] = (),
        key_prefix: str | Sequence[str] | None = None, group_name: str | None = None,
        pool: str | None = _FACTORY["pool"].default, max_partitions_per_run: int | None = None,
    ) -> None:
        if spec is None:  # a defs.yaml without attributes
            required = [n for n, f in JobSpec.model_fields.items() if f.is_required()]
            raise ConfigError(f"BatchInferenceComponent needs `attributes:` with at least {', '.join(required)}: "
                              "`dg scaffold defs sparkbatch_dagster.BatchInferenceComponent <path>` writes an example")
        self.spec = spec
        self.engine = engine if isinstance(engine, VLLMResource) else VLLMResource(**dict(engine or {}))
        self.resource_key = resource_key
        self.upstream = [k if isinstance(k, dg.AssetKey) else dg.AssetKey.from_user_string(k) for k in upstream]
        self.key_prefix = key_prefix
        self.group_name = group_name
        self.pool = pool
        self.max_partitions_per_run = max_partitions_per_run

    @classmethod
    def model(cls) -> type[BaseModel]:
        return attributes_model()

    @classmethod
    def resolve_from_model(cls, context: dg.ResolutionContext, model: BaseModel) -> BatchInferenceComponent:
        given = {n: getattr(model, n) for n in model.model_fields_set}
        values = {n: v if n in ROW_TEMPLATES else _render(context.at_path(n), v) for n, v in given.items()}
        base = Path(context.source_position_tree.position.filename).parent if context.source_position_tree else None
        for name in PATHS:
            if base is not None and isinstance(values.get(name), str):
                values[name] = _relative_to(base, values[name])
        engine = _engine(values.pop("engine", None), context.at_path("engine"))
        wiring = {n: values.pop(n) for n in wiring_model().model_fields if n in values}
        for model_cls, given_values in ((_Located, values), (wiring_model(), wiring)):
            try:
                model_cls.model_validate(given_values)
            except ValidationError as exc:
                raise ConfigError(_explain(exc, context, given_values)) from None
        wired = wiring_model().model_validate(wiring).model_dump(exclude_unset=True)
        return cls(spec=JobSpec(**values), engine=engine, **wired)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        resource = _shared_engine(self, context)
        policy = dg.BackfillPolicy.multi_run(self.max_partitions_per_run) if self.max_partitions_per_run else None
        job = build_batch_assets(spec=self.spec, key_prefix=self.key_prefix, group_name=self.group_name,
                                 resource_key=self.resource_key, upstream=self.upstream, resource=resource,
                                 pool=self.pool, backfill_policy=policy)
        return dg.Definitions(assets=job.assets, resources={self.resource_key: resource})


def _render(context: dg.ResolutionContext, value: Any) -> Any:
    """Render templated strings (only those: other strings stay strings, never parsed as YAML)."""
    if isinstance(value, str):
        return context.resolve_value(value) if _TEMPLATE_RE.search(value) else value
    if isinstance(value, list | tuple):
        return [_render(context.at_path(i), v) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _render(context.at_path(k), v) for k, v in value.items()}
    return value  # a validated nested spec (output, sampling, estimate, sink): literal, as written


def _relative_to(base: Path, value: str) -> str:
    if "://" in value:
        return value
    path = os.path.expanduser(value)
    return path if os.path.isabs(path) else os.path.normpath(base / path)


def _engine(value: Any, context: dg.ResolutionContext) -> VLLMResource | dict[str, Any]:
    """The engine: a VLLMResource from a template, or the YAML's settings (``{env: X}`` read at run time)."""
    if value is None:
        return {}
    if isinstance(value, VLLMResource):
        return value
    if isinstance(value, BaseModel):  # EngineSettings: only what the YAML sets, so defaults stay VLLMResource's
        value = {n: dg.EnvVar(v.env) if isinstance(v, EnvRef) else _render(context.at_path(n), v)
                 for n, v in ((n, getattr(value, n)) for n in value.model_fields_set)}
    if not isinstance(value, dict):
        raise ConfigError(f"{_where(context, [])}: engine gave {value!r}: write VLLMResource settings "
                          "(a mapping) or a template that gives a VLLMResource")
    try:
        VLLMResource(**value)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, context, value)) from None
    return value


def _where(context: dg.ResolutionContext, loc: Sequence[str | int]) -> str:
    path = [*context.path, *loc]
    dotted = ".".join(str(p) for p in path)
    if context.source_position_tree is None:
        return dotted
    pos, _ = context.source_position_tree.lookup_closest_and_path(path, None)
    return f"{pos.filename}:{pos.start.line}: {dotted}"


def _explain(exc: ValidationError, context: dg.ResolutionContext, values: Mapping[str, Any]) -> str:
    """One line per error: file, line, field, what is wrong, the value."""
    lines = []
    for err in exc.errors():
        msg = str(err["msg"]).removeprefix("Value error, ")
        loc = list(err["loc"]) or _named_field(msg, values)
        shown = "" if isinstance(err.get("input"), dict) or not err["loc"] else f" (got {err.get('input')!r})"
        lines.append(f"{_where(context, loc)}: {msg}{shown}")
    return "invalid BatchInferenceComponent attributes:\n  " + "\n  ".join(lines)


def _named_field(msg: str, values: Mapping[str, Any]) -> list[str | int]:
    """A check across fields has no location: the field its message names first."""
    found = [(m.start(), n) for n in values if (m := re.search(rf"\b{re.escape(n)}\b", msg))]
    return [min(found)[1]] if found else []


#: The engine resource of each key in the load being built: (component tree, settings, the
#: resource, which job). Jobs with one key and the same settings get the same object, so
#: their Definitions merge; different settings under one key are an error naming both.
_CLAIMS: dict[str, tuple[object, str, VLLMResource, str]] = {}


def _settings(resource: VLLMResource) -> str:
    def shown(v: Any) -> Any:
        name = getattr(v, "env_var_name", None)
        return f"EnvVar({name!r})" if name else v

    return json.dumps({"class": type(resource).__qualname__,
                       **{n: shown(getattr(resource, n)) for n in type(resource).model_fields}},
                      sort_keys=True, default=repr)


def _shared_engine(component: BatchInferenceComponent, context: dg.ComponentLoadContext) -> VLLMResource:
    key, tree, mine = component.resource_key, context.component_tree, _settings(component.engine)
    who = f"{component.spec.name!r} ({context.path})"
    claim = _CLAIMS.get(key)
    if claim is not None and claim[0] is tree:
        if claim[1] == mine:
            return claim[2]
        theirs, ours = json.loads(claim[1]), json.loads(mine)
        diff = ", ".join(f"{n}: {theirs.get(n)!r} vs {ours.get(n)!r}"
                         for n in sorted(ours) if theirs.get(n) != ours.get(n))
        raise ConfigError(
            f"jobs {claim[3]} and {who} both use resource_key {key!r} with different engine settings ({diff}); "
            f"one key is one engine: give one job its own key (e.g. `resource_key: {key}_{component.spec.name}` "
            "in its defs.yaml: it then starts its own engine) or make their `engine` sections equal (they then "
            "share one engine)")
    _CLAIMS[key] = (tree, mine, component.engine, who)
    return component.engine
