from vowel_duo.env import DuoEnv
from vowel_duo.taskset import DuoTaskset

__all__ = ["DuoEnv", "DuoTaskset"]
