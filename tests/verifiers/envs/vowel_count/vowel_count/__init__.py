from vowel_count.taskset import VowelTaskset

__all__ = ["VowelTaskset"]
