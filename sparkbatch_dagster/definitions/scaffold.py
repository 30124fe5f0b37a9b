"""What ``dg scaffold defs sparkbatch_dagster.BatchInferenceComponent <path>`` writes: a job
folder that loads and runs as it is."""

from __future__ import annotations

import re
from typing import Any

import dagster as dg


class BatchInferenceScaffolder(dg.Scaffolder):
    """``dg scaffold defs sparkbatch_dagster.BatchInferenceComponent <path>``: a job that loads
    and runs as it is (three example rows in ``rows.csv``), to edit into yours."""

    def scaffold(self, request: dg.ScaffoldRequest[Any]) -> None:
        from dagster.components.component_scaffolding import scaffold_component

        if request.scaffold_format != "yaml":
            scaffold_component(request)
            return
        name = re.sub(r"[^a-z0-9_]", "_", request.target_path.name.lower()).strip("_") or "job"
        name = name if name[0].isalpha() else f"job_{name}"
        (request.target_path / "defs.yaml").write_text(SCAFFOLD_YAML.format(type=request.type_name, name=name))
        (request.target_path / "rows.csv").write_text(
            "id,text,gold\n1,The invoice was charged twice.,billing\n"
            "2,The app crashes when I log in.,tech\n3,Do you offer a team plan?,sales\n")


SCAFFOLD_YAML = """\
type: {type}

attributes:
  name: {name}   # asset keys {name}/input_shards, {name}/labeled_outputs, ...
  input: rows.csv   # relative to this folder; a glob or s3://... works too
  id_column: id
  text_columns: [text]
  system_prompt: You route support tickets.
  user_template: "Ticket: {{{{ text }}}}\\nWhich team should handle it?"   # Jinja over each row
  output:
    kind: label
    labels: [billing, tech, sales]
  shard_count: 1
  gold_column: gold   # optional: accuracy in analytics and the estimate
  engine: {{}}   # VLLMResource settings, e.g. model: /models/qwen-7b
"""
