"""``RLOOConfig``'s fields, one module per feature: each holds its group's ``@dataclass`` of documented
fields (declared with :func:`rloo.config.fields.declare.option`) and the checks of those fields.

The constructor, ``dataclasses.fields(RLOOConfig)`` and the docs' field table list the groups in this order:

=================  =====================================================================================
``run``            the run folder, name, seed and algorithm preset
``generation``     K, lengths, sampling settings, tools, completions per generation batch
``algorithm``      the preset's knobs, clipping, the reference's refresh, combining rewards, loss terms
``optimization``   batch size and accumulation, run length, LR schedule, optimizer, precision, guards
``model``          ``from_pretrained``'s keywords, and the passes' exact speed and memory settings
``reporting``      logs, evaluation, checkpoints, trackers (:data:`~rloo.config.fields.reporting.TRACKERS`)
``plumbing``       hub, ``torch.compile``, activation offloading, the sampler's speed, TRL's data-loader
``vllm``           generation on vLLM, and its importance-sampling correction
``rollouts``       asynchronous generation, rollout workers, dynamic sampling
=================  =====================================================================================

A group's checks look at its own fields; a rule that ties fields of two groups is in
:func:`rloo.config.validation.check_combinations`. CONTRIBUTING.md ("Extension points") says how to add a
field or a group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rloo.config.fields.algorithm import AlgorithmFields, check_algorithm
from rloo.config.fields.generation import GenerationFields, check_generation
from rloo.config.fields.model import ModelFields, check_model
from rloo.config.fields.optimization import OptimizationFields, check_optimization
from rloo.config.fields.plumbing import PlumbingFields, check_plumbing
from rloo.config.fields.reporting import ReportingFields, check_reporting
from rloo.config.fields.rollouts import RolloutFields, check_rollouts
from rloo.config.fields.run import RunFields
from rloo.config.fields.vllm import VLLMFields, check_vllm

if TYPE_CHECKING:
    from rloo.config.rloo_config import RLOOConfig


# A dataclass takes its bases' fields from the last base to the first: the groups are listed here last to first.
@dataclass
class RLOOFields(
    RolloutFields,
    VLLMFields,
    PlumbingFields,
    ReportingFields,
    ModelFields,
    OptimizationFields,
    AlgorithmFields,
    GenerationFields,
    RunFields,
):
    """Every constructor argument of ``RLOOConfig``, group by group, with its default and documentation."""


# each group's checks, in the groups' order (``run``'s one field, ``preset``, is checked as it is resolved)
GROUP_CHECKS: tuple[Callable[[RLOOConfig], None], ...] = (
    check_generation,
    check_algorithm,
    check_optimization,
    check_model,
    check_reporting,
    check_plumbing,
    check_vllm,
    check_rollouts,
)
