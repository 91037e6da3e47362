# Copyright 2020-2026 The HuggingFace Team. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

# TRL's examples/scripts/rloo.py, kept as TRL wrote it except for two changes, so that a TRL
# user's script is seen to run unchanged: the imports name rloo instead of trl, and the vLLM
# arguments (use_vllm, vllm_mode, vllm_gpu_memory_utilization) are removed (rloo samples with
# its own KV-cached sampler). tests/test_examples.py runs it offline on a tiny stand-in model.
#
# NEEDS THE NETWORK (the hub's Qwen/Qwen3-0.6B and the AI-MO/NuminaMath-TIR dataset) and a GPU. The examples
# that run offline, on a tiny model built on the spot, are examples/rloo_*.py (each with --gpu for its GPU twin).

"""
NuminaMath example: RLOO on math dataset.

  pip install -e PATH_TO_RLOO_CLONE peft   # rloo is not on the package index (docs/installation.md)
  accelerate launch examples/trl_rloo.py
"""

import torch
from datasets import load_dataset
from peft import LoraConfig

from rloo import RLOOConfig, RLOOTrainer
from rloo.rewards import accuracy_reward, think_format_reward


def main():
    # Dataset
    train_dataset, eval_dataset = load_dataset("AI-MO/NuminaMath-TIR", split=["train[:5%]", "test[:5%]"])

    SYSTEM_PROMPT = (
        "A conversation between user and assistant. The user asks a question, and the assistant solves it. The "
        "assistant first thinks about the reasoning process in the mind and then provides the user with the answer. "
        "The reasoning process and answer are enclosed within <think></think> tags, i.e., <think>\nThis is my "
        "reasoning.\n</think>\nThis is my answer."
    )

    def make_conversation(example):
        return {
            "prompt": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": example["problem"]},
            ],
        }

    train_dataset = train_dataset.map(make_conversation, remove_columns=["messages", "problem"])
    eval_dataset = eval_dataset.map(make_conversation, remove_columns=["messages", "problem"])

    # Training
    training_args = RLOOConfig(
        output_dir="Qwen3-0.6B-RLOO",
        model_init_kwargs={"dtype": torch.bfloat16},
        learning_rate=1e-5,
        log_completions=True,
        num_completions_to_print=2,
        max_completion_length=1024,
        gradient_accumulation_steps=2,
        steps_per_generation=8,
        run_name="Qwen3-0.6B-RLOO-NuminaMath-TIR",
    )

    trainer = RLOOTrainer(
        model="Qwen/Qwen3-0.6B",
        args=training_args,
        reward_funcs=[think_format_reward, accuracy_reward],
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        peft_config=LoraConfig(),
    )

    trainer.train()

    # Save and push to hub
    trainer.save_model(training_args.output_dir)
    trainer.push_to_hub(dataset_name="AI-MO/NuminaMath-TIR")


if __name__ == "__main__":
    main()
