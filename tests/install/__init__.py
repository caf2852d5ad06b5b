"""The install lane: the Dockerfile's install steps in a fresh folder, serving /health."""
