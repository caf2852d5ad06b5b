"""Playing environments: loading them, rendering observations to tokens, the sampling policy, and
collecting episodes concurrently. Shared by the training loop and the inference worker."""
