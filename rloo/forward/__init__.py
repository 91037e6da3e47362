"""The training forward: log-probs (and entropies) of completions under a model, in passes that fit a memory
budget. What the log-prob passes (:mod:`rloo.training.passes`) and the gradient-variance probe run, and
nothing the sampler needs: a pass's layout (plain, shared prompts, packed rows: :mod:`.packing`,
:mod:`.shared_prompt`), the LM head in chunks or fused (:mod:`.lm_head`, :mod:`.fused_head`), and the fixed
cost of one forward that the layouts weigh (:mod:`.forward_overhead`). It builds on :mod:`rloo.generation`
(the KV cache, image inputs, a model's device) and never the other way round."""
