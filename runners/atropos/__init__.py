"""Atropos environments, trained unchanged: the runner side (docs/atropos.md)."""
