"""HTTP routes: thin wrappers, one service call each."""
