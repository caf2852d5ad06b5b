"""The local engine: Tinker's training and sampling shapes on torch + transformers + peft (LoRA
training, losses, continuous-batching sampler, checkpoints). See README.md here."""
