"""The training wing of the local engine: training clients, their forward passes, losses and
micro-batch budgets, and provenance against recorded sequences."""
