"""Fields of TRL 1.16's ``RLOOConfig``/``GRPOConfig`` (and transformers' ``TrainingArguments``
under them) that ``RLOOConfig`` does not have, each with what rloo does instead.

A TRL user who writes one gets that sentence, from the Python API and from ``rloo train``'s flags,
instead of "unknown field" and a "did you mean" that points at a field that only looks alike
(``loss_type`` is not ``lora_task_type``). ``tests/config/test_elsewhere.py`` checks that every
such field of the installed TRL has an entry. The vLLM and other engine fields are in
:data:`rloo.config.trl.legacy.UNSUPPORTED`; GRPO's ``loss_type``, ``scale_rewards`` and
``importance_sampling_level`` are translated (:mod:`rloo.config.trl.grpo_names`).
"""

from __future__ import annotations

_NO_DATALOADER = (
    "rloo uses no DataLoader: every process draws the same seeded prompt order (seed, shuffle_dataset) and keeps "
    "its share; remove it"
)
_NO_DDP = "rloo wraps no DistributedDataParallel: it all-reduces the gradients itself once per step; remove it"
_NO_LABELS = (
    "evaluation samples completions and scores them with the reward functions (no labels or predictions); remove it"
)
_ONE_METRICS_CALL = (
    "compute_metrics is called once per evaluation with every eval completion, its prompt, dataset columns and "
    "rewards (rloo.training.monitoring.compute_metrics); remove it"
)
_MAIN_PROCESS = "the main process writes the run folder and prints; the others stay quiet; remove it"
_TRACKERS = (
    "rloo starts report_to's trackers through accelerate with the run's name; set the tracker's own environment "
    "variables (WANDB_PROJECT, ...) instead"
)
_ENTROPY = "rloo has a fixed entropy bonus (entropy_coef) and no adaptive entropy control; remove it"

# field -> what rloo does instead (a sentence ending in what to do)
ELSEWHERE: dict[str, str] = {
    **dict.fromkeys(
        (
            "dataloader_drop_last",
            "dataloader_in_order",
            "dataloader_multiprocessing_context",
            "dataloader_persistent_workers",
            "dataloader_pin_memory",
            "dataloader_prefetch_factor",
            "train_sampling_strategy",
            "length_column_name",
        ),
        _NO_DATALOADER,
    ),
    "data_seed": "the prompt order follows seed (shuffle_dataset=False keeps the dataset's order); remove data_seed",
    "ignore_data_skip": "a resume continues the prompt order exactly where the checkpoint left it; remove it",
    **dict.fromkeys(
        (
            "label_names",
            "label_smoothing_factor",
            "prediction_loss_only",
            "eval_do_concat_batches",
            "eval_accumulation_steps",
            "eval_use_gather_object",
        ),
        _NO_LABELS,
    ),
    **dict.fromkeys(("include_for_metrics", "batch_eval_metrics"), _ONE_METRICS_CALL),
    **dict.fromkeys(
        ("do_train", "do_eval", "do_predict"),
        "transformers' example scripts read these, not the trainer: rloo trains when train() is called and "
        "evaluates eval_dataset every eval_steps; remove it",
    ),
    "eval_on_start": "call trainer.evaluate() before trainer.train()",
    "vllm_importance_sampling_cap": "TRL deprecated it for vllm_importance_sampling_clip_max (same meaning): rename it",
    "eval_delay": "evaluations start at the first multiple of eval_steps; remove it",
    **dict.fromkeys(
        ("bf16_full_eval", "fp16_full_eval"), "evaluation runs in the training precision (bf16/fp16); remove it"
    ),
    **dict.fromkeys(
        ("ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "ddp_static_graph"), _NO_DDP
    ),
    **dict.fromkeys(
        ("ddp_backend", "ddp_timeout", "local_rank"),
        "the launcher (torchrun, accelerate launch) sets up the process group and the ranks; remove it",
    ),
    **dict.fromkeys(
        ("fsdp", "fsdp_config", "parallelism_config"),
        "FSDP2 comes from the launcher: accelerate launch --use_fsdp --fsdp_version 2 (docs/scaling.md); remove it",
    ),
    **dict.fromkeys(
        ("deepspeed", "ds3_gather_for_generation"),
        "rloo does not run on DeepSpeed; shard with FSDP2 instead (accelerate launch --use_fsdp --fsdp_version 2)",
    ),
    **dict.fromkeys(
        ("activation_checkpointing", "activation_checkpointing_kwargs"),
        "set gradient_checkpointing=True (gradient_checkpointing_kwargs), also under FSDP2",
    ),
    **dict.fromkeys(("save_on_each_node", "log_on_each_node"), _MAIN_PROCESS),
    **dict.fromkeys(
        ("log_level", "log_level_replica"),
        "rloo prints its run log on the main process; transformers' own logging follows TRANSFORMERS_VERBOSITY; "
        "remove it",
    ),
    "disable_tqdm": "the progress line is drawn only on a terminal; piped output gets plain log lines; remove it",
    "logging_strategy": "metrics are logged every logging_steps optimizer steps; set logging_steps",
    "logging_nan_inf_filter": "a step with a NaN/inf loss or gradient is skipped and counted (max_nonfinite_steps), "
    "never averaged into the logs; remove it",
    "skip_memory_metrics": "rloo logs no memory metrics; remove it",
    "include_num_input_tokens_seen": "rloo always counts num_input_tokens_seen; remove it",
    **dict.fromkeys(("project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id"), _TRACKERS),
    **dict.fromkeys(
        ("hub_strategy", "hub_always_push", "hub_revision"),
        "push_to_hub uploads the final model once, at the end of training (or trainer.push_to_hub()); remove it",
    ),
    "save_only_model": "a checkpoint always holds what an exact resume needs (optimizer, RNG states, prompt order); "
    "remove it",
    "restore_callback_states_from_checkpoint": "rloo saves no callback states; remove it",
    "torch_empty_cache_steps": "not supported; remove it",
    "full_determinism": "a run repeats exactly given seed, the hardware and the process count (sampler_compaction="
    "None to compare across process counts); remove it",
    "tf32": "rloo leaves TF32 as torch has it; set torch.backends.cuda.matmul.allow_tf32 = True in your script",
    "use_cpu": "rloo trains on the GPU when one is visible; hide it with CUDA_VISIBLE_DEVICES= to train on the CPU",
    "auto_find_batch_size": "set per_device_train_batch_size; max_logits_memory_mb bounds the logits' memory",
    "average_tokens_across_devices": "loss_aggregation decides the normalization (token_mean: the tokens of the "
    "optimizer step); remove it",
    "neftune_noise_alpha": "NEFTune's embedding noise is for supervised fine-tuning; rloo adds none; remove it",
    **dict.fromkeys(
        ("use_liger_kernel", "liger_kernel_config"),
        "rloo computes log-probs with its own chunked LM head (max_logits_memory_mb), not Liger's; remove it",
    ),
    "optim_target_modules": "GaLore/APOLLO-style optimizers are not supported; choose optim among rloo's",
    **dict.fromkeys(("debug", "enable_jit_checkpoint"), "not supported; remove it"),
    "use_cache": "the sampler always uses its KV cache and the training passes never do; remove it",
    "log_unique_prompts": "log_completions=True writes every prompt with its completions to completions.jsonl",
    "cast_lm_head_to_fp32": "rloo takes the log-softmax in float32 (the head's matmul runs in the training "
    "precision); casting the head is not supported; remove it",
    # GRPOConfig's
    "delta": "INTELLECT-2's two-sided clipping is not in rloo; epsilon and epsilon_high clip the ratio",
    **dict.fromkeys(
        ("entropy_coef_delta", "entropy_coef_max", "entropy_coef_min", "entropy_target", "use_adaptive_entropy"),
        _ENTROPY,
    ),
    "top_entropy_quantile": "not supported: every completion token stays in the loss; remove it",
    **dict.fromkeys(
        ("vespo_k_neg", "vespo_k_pos", "vespo_lambda_neg", "vespo_lambda_pos"), "rloo has no VESPO objective"
    ),
    **dict.fromkeys(("sapo_temperature_neg", "sapo_temperature_pos"), "rloo has no SAPO objective"),
    "use_bias_correction_kl": "rloo's KL term in the loss is not multiplied by the ratio (with beta=0, TRL GRPO's "
    "default, there is none); remove it",
    "log_completions_hub_repo": "log_completions=True writes output_dir/completions.jsonl; upload it yourself",
    # TRL 1.16's AsyncGRPOConfig (trl.experimental.async_grpo): max_staleness, weight_sync_steps and
    # heartbeat_stale_after_s are RLOOConfig's own fields, with their meanings; dtype goes to model_init_kwargs
    # (rloo.config.trl.passthrough.lift_dtype); its vLLM server's names are the GRPO ones rloo has
    **dict.fromkeys(
        ("max_inflight_tasks", "queue_maxsize"),
        "rloo's asynchronous generation samples whole generation batches ahead, never more than max_staleness of "
        "them, in rollout_workers processes (or in this one): nothing is generated to be discarded as stale; "
        "remove it and set max_staleness and rollout_workers",
    ),
    "request_timeout": "a vLLM server's requests wait as long as its generation takes, and a server that stops "
    "answering fails the run at once, naming it; set vllm_server_timeout for its start-up; remove it",
    "weight_sync_timeout": "a weight sync that fails raises at once, naming the server and its answer (an adapter "
    "the server refuses falls back to merged weights); remove it",
    "token_budget": "rloo cuts a micro-batch into passes by max_logits_memory_mb and packs rows end to end "
    "(padding_free); per_device_train_batch_size bounds the rows; remove it",
    "fork_threshold_tokens": "rloo appends each tool result to the episode as tokens and never re-tokenizes the "
    "conversation, so a turn never forks a row; remove it",
}
