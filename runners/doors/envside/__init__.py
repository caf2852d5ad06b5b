"""Scripts every door's interpreter runs by path (stdlib only)."""
