"""The words the echo environment asks for (a helper module, imported by its bare name as
Atropos environments import theirs)."""

WORDS = ["apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "piano"]
