"""Experiments on top of attention_jax: tasks, input pipeline, training, checkpoints."""
