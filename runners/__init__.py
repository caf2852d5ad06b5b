"""Runner-side code: the training entrypoint, backends, model resolution, inference worker."""
