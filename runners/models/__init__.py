"""Where models come from: a name resolved offline to a local folder, the packaged SmolLM2 GGUF
(converted once), or the tiny random model built in-process."""
