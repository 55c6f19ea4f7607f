"""Predefined LLM training recipes (Llama, Gemma) launched as Slurm jobs; filled in by the recipes issue."""
