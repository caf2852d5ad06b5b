"""Helpers the environments share (parsing answers, package catalogs, RNG slots, tool calls).

Discovery lists only the top-level files of an environments folder; helpers live here.
"""
